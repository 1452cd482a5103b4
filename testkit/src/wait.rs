//! Waiting for an event with a hard deadline: poll a condition at a short interval, panic naming
//! the awaited event when the deadline passes first.

use std::future::Future;
use std::time::{Duration, Instant};

/// The polling interval of [`wait_until`] and [`wait_until_async`].
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `cond` every 10 ms until it holds; panics naming `what` when `deadline` passes first.
pub fn wait_until(deadline: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !cond() {
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for: {what}"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Polls `cond` every 10 ms until it holds (`true`) or `deadline` passes (`false`), for a wait
/// that may legitimately fail and be retried.
pub fn wait_until_or(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + deadline;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Async variant of [`wait_until`]: awaits `cond()` every 10 ms (on the tokio timer, so the
/// runtime's worker stays free in between).
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
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Polls `probe` every 10 ms until it returns `Some`; on timeout panics with `what` and the
/// description `describe` gives of the last state seen (for diagnosable failures).
pub fn wait_for<T>(
    deadline: Duration,
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
    describe: impl Fn() -> String,
) -> T {
    let until = Instant::now() + deadline;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        if Instant::now() >= until {
            panic!(
                "timed out after {deadline:?} waiting for: {what}\n{}",
                describe()
            );
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Awaits a spawned task for at most `deadline`; panics naming `what` if it does not finish in
/// time or panicked itself.
pub async fn joined<T>(task: tokio::task::JoinHandle<T>, deadline: Duration, what: &str) -> T {
    match tokio::time::timeout(deadline, task).await {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => panic!("{what}: the task failed: {e}"),
        Err(_) => panic!("timed out after {deadline:?} waiting for: {what}"),
    }
}
