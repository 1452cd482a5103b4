//! fairlock quickstart: FIFO hand-over between workers, watchdog renewal, and a lost-lock notice.
//!
//! Run with `bash scripts/quickstart.sh`, or `cargo run --example quickstart`. Uses `REDIS_URL`
//! when it is set; otherwise starts a throw-away `redis-server` on a free port and stops it at the
//! end.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::Client;

#[path = "support/throwaway.rs"]
mod throwaway;
use throwaway::ThrowAwayRedis;
use tokio::sync::Mutex;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = ThrowAwayRedis::start()?;
            let url = server.url();
            println!("started a throw-away redis-server at {url}");
            (Some(server), url)
        }
    };

    // A short watchdog timeout so renewals are visible within seconds (the default is 30 s).
    let client = Client::builder()
        .standalone(url.clone())
        .watchdog_timeout(Duration::from_secs(3))
        .build()
        .await?;
    let name = format!("quickstart:{}", std::process::id());
    let lock = client.fair_lock(name.clone());

    println!("\n1. FIFO hand-over");
    let guard = lock.lock().await?;
    // One client per process, cloned: every lock call is its own holder, so the workers exclude
    // each other (and queue in order) while sharing one command and one subscription connection.
    println!(
        "   main holds {name}; five workers (tasks sharing the client) queue up one after another"
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    // When the previous holder released, to show how fast the next one is woken.
    let released_at = Arc::new(Mutex::new(Instant::now()));
    let mut workers = Vec::new();
    for worker in 1..=5 {
        let worker_client = client.clone();
        let order = order.clone();
        let released_at = released_at.clone();
        let name = name.clone();
        workers.push(tokio::spawn(async move {
            let lock = worker_client.fair_lock(name);
            let guard = lock.lock().await?;
            let gap = released_at.lock().await.elapsed();
            order.lock().await.push(worker);
            println!(
                "   worker {worker} acquired, {:.2} ms after the previous release",
                gap.as_secs_f64() * 1e3
            );
            tokio::time::sleep(Duration::from_millis(50)).await; // the critical section
            *released_at.lock().await = Instant::now();
            guard.unlock().await?;
            Ok::<_, fairlock::Error>(())
        }));
        // Let each worker reach the queue before the next one starts.
        while lock.state().await?.queue.len() < worker {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let queue: Vec<String> = lock
        .state()
        .await?
        .queue
        .into_iter()
        .map(|w| w.field)
        .collect();
    println!("   queue in Redis: {} waiters", queue.len());
    *released_at.lock().await = Instant::now();
    guard.unlock().await?;
    for w in workers {
        w.await??;
    }
    println!("   acquisition order: {:?}", order.lock().await);

    println!("\n2. Watchdog renewal (timeout 3 s, renewed every 1 s)");
    let guard = lock.lock().await?;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let ttl = lock.state().await?.ttl.unwrap_or_default();
        println!("   still held, TTL {} ms", ttl.as_millis());
    }

    println!("\n3. Lost-lock notice");
    println!("   an operator force-unlocks the lock");
    client.fair_lock(name.clone()).force_unlock().await?;
    let started = Instant::now();
    let reason = guard.lost().await;
    println!(
        "   holder told after {} ms: {reason}",
        started.elapsed().as_millis()
    );
    match guard.unlock().await {
        Err(fairlock::Error::NotHeld) => {
            println!("   unlock() of the lost lock: NotHeld, as documented")
        }
        other => println!("   unlock() of the lost lock: {other:?}"),
    }

    client.shutdown().await;
    Ok(())
}
