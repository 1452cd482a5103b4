//! Riding out an outage, one rule for every kind of waiting call (locks, semaphores, latches):
//! transient errors (see `Error::is_transient`) are retried with a growing backoff until the
//! call's deadline, or, for a call without one, until the outage has lasted a client-wide
//! limit counted from its first failure; then the last error is returned. A call never retries in
//! a tight loop and never waits past its deadline for a retry.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::error::{Error, Result};

/// A run of transient errors met by one call. A call keeps an `Option<Outage>`: `None` while
/// replies come (nothing to keep on the path of a call that meets no error), made by the first
/// transient error of a run ([`pause`]), and set back to `None` by the next reply.
#[derive(Debug)]
pub(crate) struct Outage {
    /// When the run's first error was met.
    since: Instant,
    retries: u32,
}

/// `error` was met by a call with `deadline` (without one: `longest` from the first failure of
/// the run, which a transient error starts in `outage` when none is running). Returns the pause
/// before the next try, or the error when it is not transient or the time to ride it out is
/// over.
pub(crate) fn pause(
    outage: &mut Option<Outage>,
    error: Error,
    deadline: Option<Instant>,
    longest: Duration,
) -> Result<Duration> {
    if !error.is_transient() {
        return Err(error);
    }
    let now = Instant::now();
    let run = outage.get_or_insert(Outage {
        since: now,
        retries: 0,
    });
    let since = run.since;
    let limit = deadline.unwrap_or(since + longest);
    if now >= limit {
        tracing::warn!(error = %crate::error::chain(&error), outage = ?now - since,
            "redis still failing; giving up");
        return Err(error);
    }
    run.retries = run.retries.saturating_add(1);
    let pause = crate::retry::retry_backoff(run.retries).min(limit - now);
    tracing::warn!(error = %crate::error::chain(&error), retry_in = ?pause,
        "transient redis error while waiting");
    Ok(pause)
}

/// Sleeps for `pause`, or until the client shuts down ([`Error::Shutdown`]).
pub(crate) async fn nap(pause: Duration, closed: &mut watch::Receiver<bool>) -> Result<()> {
    tokio::select! {
        _ = tokio::time::sleep(pause) => Ok(()),
        _ = shut_down(closed) => Err(Error::Shutdown),
    }
}

/// Resolves once the client is shut down. (The borrow `wait_for` returns is not `Send`, so it is
/// dropped here rather than held across the caller's awaits.)
pub(crate) async fn shut_down(closed: &mut watch::Receiver<bool>) {
    let _ = closed.wait_for(|c| *c).await.map(|_| ());
}
