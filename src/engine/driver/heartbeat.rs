//! Deadline heartbeats of fair waiters that are still waiting.
//!
//! A queued fair waiter's deadline is refreshed every third of the client's waiter liveness
//! window, batched over every waiter of the client due in the same tick (`wire/batch.rs`), so a live
//! waiter is never purged however long it waits, while one whose process died is purged once the
//! window lapses. A heartbeat also tells a waiter when to look again: it is the head of a free
//! lock (a lost or never-sent message costs at most one period), it was dropped from the queue,
//! or it became second in line (it then watches the head's deadline).
//!
//! It must never keep a waiter alive after its future is gone: the driver holds only a `Weak`, so
//! a dropped waiter is no longer refreshed and is purged with its window.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::work::Work;
use crate::conn::Conn;
use crate::error::Result;
use crate::keys::LockSpec;
use crate::wire::batch::{self, Beat};

/// A fair waiter the driver keeps alive in the queue while its future waits.
#[derive(Debug)]
pub(crate) struct WaiterBeat {
    pub(crate) spec: Arc<LockSpec>,
    pub(crate) field: Arc<str>,
    /// The waiter's wake-up (shared with its subscription).
    pub(crate) mail: Arc<crate::conn::subscriber::Mailbox>,
    /// A writer-preferring read-write waiter's turns channel, woken too (it may be waiting there).
    pub(crate) turns: Option<Arc<crate::conn::subscriber::Mailbox>>,
}

/// How often a waiter's deadline is refreshed.
pub(super) fn period(liveness: Duration) -> Duration {
    liveness / 3
}

/// Refreshes the live waiters among `waiters` in one batch, from a spawned task that reports back
/// with [`Work::Beaten`].
pub(super) fn send(
    mut conn: Conn,
    waiters: Vec<Weak<WaiterBeat>>,
    liveness: Duration,
    redisson_wait: Duration,
    batch: usize,
    tx: mpsc::UnboundedSender<Work>,
) {
    let live: Vec<Arc<WaiterBeat>> = waiters.iter().filter_map(Weak::upgrade).collect();
    if live.is_empty() {
        return;
    }
    let liveness_ms = liveness.as_millis() as i64;
    let redisson_wait_ms = redisson_wait.as_millis() as i64;
    tokio::spawn(async move {
        let items: Vec<(&LockSpec, &str)> = live.iter().map(|w| (&*w.spec, &*w.field)).collect();
        let result =
            batch::heartbeat(&mut conn, &items, liveness_ms, redisson_wait_ms, batch).await;
        drop(items);
        let waiters = live.iter().map(Arc::downgrade).collect();
        drop(live);
        let _ = tx.send(Work::Beaten { waiters, result });
    });
}

/// Heartbeat replies: wake every waiter that has something to look at.
pub(super) fn on_beaten(waiters: &[Weak<WaiterBeat>], result: Result<Vec<Beat>>) {
    match result {
        Ok(beats) => {
            for (waiter, beat) in waiters.iter().zip(beats) {
                if beat == Beat::Queued {
                    continue;
                }
                if let Some(w) = waiter.upgrade() {
                    tracing::debug!(
                        lock = w.spec.name(),
                        field = &*w.field,
                        ?beat,
                        "heartbeat wakes waiter"
                    );
                    w.mail.wake();
                    if let Some(turns) = &w.turns {
                        turns.wake();
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::error::chain(&e), waiters = waiters.len(), "waiter heartbeat failed");
            // Redis did not answer: the waiters try now instead of at their next timer, so a
            // call's outage clock starts within a heartbeat of the outage (`engine/acquire/outage.rs`).
            for w in waiters.iter().filter_map(Weak::upgrade) {
                w.mail.wake();
                if let Some(turns) = &w.turns {
                    turns.wake();
                }
            }
        }
    }
}
