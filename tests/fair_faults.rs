//! Faults: a lost pub/sub connection, flushed scripts, and Redis down or frozen.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::Client;
use redis::Commands;
use support::{wait_until, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_connection_only_delays_the_waiter() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    // No heartbeat within the test: only the resubscribe-and-recheck path can save the waiter.
    let b = Client::builder()
        .standalone(server.url())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let held = a.fair_lock("lost-msg").lock().await.unwrap();
    let lb = b.fair_lock("lost-msg");
    let waiter = tokio::spawn(async move { lb.try_lock(Duration::from_secs(20), None).await });
    wait_until(Duration::from_secs(10), "queued", || {
        raw.llen::<_, i64>("redisson_lock_queue:{lost-msg}")
            .unwrap()
            == 1
    });
    let head: String = raw.lindex("redisson_lock_queue:{lost-msg}", 0).unwrap();
    let channel = format!("redisson_lock__channel:{{lost-msg}}:{head}");
    wait_until(Duration::from_secs(10), "subscribed", || {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut raw)
            .unwrap();
        n == 1
    });
    // Kill every pub/sub connection, then release at once: the release message is published
    // while the waiter's subscriber is down (or reconnecting), so it is lost.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut raw)
        .unwrap();
    assert!(killed >= 1);
    held.unlock().await.unwrap();
    let guard = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("acquired after the subscriber reconnected");
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_script_flush() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let lock = c.fair_lock("flushed");
    for _ in 0..3 {
        let g = lock.lock().await.unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut raw).unwrap();
        g.unlock().await.unwrap();
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut raw).unwrap();
        assert!(lock.state().await.unwrap().owners.is_empty());
        assert!(!lock.force_unlock().await.unwrap());
    }
    // Each NOSCRIPT was answered by sending the same call as EVAL (which caches the script
    // again), never by a separate SCRIPT LOAD.
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    assert_eq!(support::command_calls(&info, "script|load"), 0, "{info}");
    assert!(support::command_calls(&info, "eval") >= 6, "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_returns_the_redis_error_in_bounded_time_when_redis_is_down() {
    let mut server = RedisServer::start();
    let command_timeout = Duration::from_millis(500);
    let c = Client::builder()
        .standalone(server.url())
        .command_timeout(command_timeout)
        .build()
        .await
        .unwrap();
    let lock = c.fair_lock("down");
    server.kill();
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let err = lock.try_lock(wait, None).await.unwrap_err();
    assert!(err.is_redis(), "{err:?}");
    assert!(
        started.elapsed() < wait + command_timeout + Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // Back up: the client reconnects by itself.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match lock.try_lock(Duration::from_secs(1), None).await {
            Ok(Some(g)) => break g,
            _ if Instant::now() < deadline => continue,
            other => panic!("no reconnect: {other:?}"),
        }
    };
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_is_bounded_while_redis_is_frozen() {
    let server = RedisServer::start();
    let command_timeout = Duration::from_millis(500);
    let c = Client::builder()
        .standalone(server.url())
        .command_timeout(command_timeout)
        .build()
        .await
        .unwrap();
    let lock = c.fair_lock("frozen");
    server.pause();
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let result = lock.try_lock(wait, None).await;
    let elapsed = started.elapsed();
    server.resume();
    assert!(result.as_ref().is_err_and(|e| e.is_redis()), "{result:?}");
    assert!(
        elapsed < wait + command_timeout + Duration::from_secs(2),
        "{elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_maxmemory_policy_is_warned_about_at_connect() {
    let warned = support::EventCount::watch("maxmemory-policy is not noeviction", "");
    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let _c = Client::connect(&evicting.url()).await.unwrap();
    assert_eq!(warned.get(), 1);
    let safe = RedisServer::start();
    let _c = Client::connect(&safe.url()).await.unwrap();
    assert_eq!(warned.get(), 1, "noeviction is not warned about");
}
