//! Printing a lock's state with the library API, for when the `fairlock` binary is not at hand
//! (or a service wants to show its own locks): `FairLock::state()` reads the owner, TTL and
//! queue atomically, whoever holds or waits (Redisson clients included).
//!
//! Run with `cargo run --example inspect [NAME]`. Uses `REDIS_URL` when it is set (and then only
//! reads NAME, `orders:42` by default); otherwise starts a throw-away `redis-server`, takes the
//! lock and queues a waiter so there is something to show, and stops the server at the end.

use std::error::Error;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fairlock::{Client, LockState};

/// A `redis-server` that lives as long as this value.
struct ThrowAwayRedis(Child, u16);

impl ThrowAwayRedis {
    fn start() -> Result<Self, Box<dyn Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server ({e}); set REDIS_URL instead"))?;
        let server = ThrowAwayRedis(child, port);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }
}

impl Drop for ThrowAwayRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn print_state(name: &str, state: &LockState) {
    println!(
        "lock {name}: {}",
        if state.is_locked() { "held" } else { "free" }
    );
    for owner in &state.owners {
        println!(
            "  owner  client {}  holder {:?}  holds {}",
            owner.client_id(),
            owner.holder_id(),
            owner.holds
        );
    }
    if let Some(ttl) = state.ttl {
        println!("  ttl    {ttl:?}");
    }
    for (i, waiter) in state.queue.iter().enumerate() {
        let deadline = waiter
            .expires_in
            .map_or("no deadline".to_owned(), |d| format!("deadline in {d:?}"));
        let judged = match (waiter.alive, waiter.is_fairlock()) {
            (true, true) => "alive (fairlock: liveness mark)",
            (true, false) => "alive (by its deadline)",
            (false, _) => "looks dead",
        };
        println!("  #{}  {}  {deadline}  {judged}", i + 1, waiter.field);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "orders:42".into());
    if let Ok(url) = std::env::var("REDIS_URL") {
        let client = Client::connect(&url).await?;
        print_state(&name, &client.fair_lock(name.as_str()).state().await?);
        return Ok(());
    }

    let server = ThrowAwayRedis::start()?;
    let url = format!("redis://127.0.0.1:{}", server.1);
    println!("started a throw-away redis-server at {url}");
    let holder = Client::connect(&url).await?;
    let waiter = Client::connect(&url).await?;
    let guard = holder.fair_lock(name.as_str()).lock().await?;
    let lock = waiter.fair_lock(name.as_str());
    let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(10), None).await });

    // Wait (bounded) until the waiter shows up in the queue, then print.
    let deadline = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let state = holder.fair_lock(name.as_str()).state().await?;
        if !state.queue.is_empty() || Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    print_state(&name, &state);

    guard.unlock().await?;
    if let Ok(Ok(Some(g))) = waiting.await {
        g.unlock().await?;
    }
    println!("\nthe command-line tool shows more (fencing counter, orphans, a live view):");
    println!("  REDIS_URL=redis://… cargo run -p fairlock-cli -- inspect {name}");
    Ok(())
}
