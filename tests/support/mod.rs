//! Test support: real `redis-server` processes on free loopback ports, stopped by PID, and waits
//! on events with deadlines. Every integration test file includes it with `mod support;`.
#![allow(dead_code)]

mod server;

use std::future::Future;
use std::time::{Duration, Instant};

pub use server::RedisServer;

/// Polls `cond` every 10 ms until it holds; panics naming `what` when `deadline` passes first.
pub fn wait_until(deadline: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !cond() {
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Async variant of [`wait_until`].
pub async fn wait_until_async<F, Fut>(deadline: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + deadline;
    while !cond().await {
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Calls of one command in an `INFO commandstats` reply (0 when it never ran).
pub fn command_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Test logs: `RUST_LOG=fairlock=debug cargo test …` shows the library's tracing events.
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    });
}
