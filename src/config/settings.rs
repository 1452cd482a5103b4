//! The settings every part of the client reads: limits, defaults, the pub/sub mode and the
//! checked conversions of durations to the milliseconds the scripts take.

use std::time::Duration;

use super::topology::Topology;
use crate::error::{Error, Result};

/// The longest duration fairlock sends to Redis (a lease, the watchdog timeout, the waiter
/// liveness window, the Redisson wait, a timeout): 10^12 ms, about 31.7 years. Longer ones are
/// refused with [`Error::InvalidArgument`] before any I/O. The limit keeps every number the
/// scripts compute (server time plus such durations) below 10^14, the largest integer Lua hands
/// to Redis in plain digits: a larger one is written in exponent form, which `PEXPIRE` rejects,
/// and a script that failed half way used to leave a key without a TTL (held for ever) or a
/// queue entry without a deadline.
pub const MAX_DURATION: Duration = Duration::from_millis(1_000_000_000_000);

/// The shortest lease fairlock accepts: 3 ms. Every hold is trusted until its grant's send time
/// plus the lease less a drift margin of 1 % + 2 ms (see
/// [`LockGuard::valid_until`](crate::LockGuard::valid_until)); a lease of 2 ms or less leaves
/// nothing after that margin, so a grant made with it could never be trusted when it arrives.
/// Shorter leases are refused with [`Error::InvalidArgument`] before any I/O, for every lock,
/// semaphore and [`RedLock`](crate::RedLock).
pub const MIN_LEASE: Duration = Duration::from_millis(3);

/// Default watchdog timeout: the TTL of a lock taken without a lease (Redisson's 30 s).
pub const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
/// Default liveness window of a queued fair waiter: a waiter whose client stops refreshing its
/// deadline for this long is purged from the queue.
pub const DEFAULT_WAITER_LIVENESS: Duration = Duration::from_secs(5);
/// Default timeout of one Redis command (one round trip).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(3);
/// Default timeout for establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default tick of the client's timing wheel.
pub const DEFAULT_TIMER_TICK: Duration = Duration::from_millis(100);
/// Default number of slots of the client's timing wheel.
pub const DEFAULT_TIMER_SLOTS: usize = 1024;
/// Default number of locks renewed (or waiters refreshed) by one script call.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// Default bound of the wait a Redisson client passes to its fair lock: the 5 minutes its
/// `lock()` uses (Redisson's `threadWaitTime`).
pub const DEFAULT_REDISSON_WAIT: Duration = Duration::from_secs(300);

/// How release messages travel on a Redis Cluster ([PROTOCOL 5]). Sharded and classic pub/sub do
/// not hear each other, so every client of one lock, Java ones included, must use the same mode.
/// Outside a cluster messages always use classic `PUBLISH` / `SUBSCRIBE`.
///
/// [PROTOCOL 5]: crate::protocol
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PubSubMode {
    /// Sharded on a Redis 7+ cluster, classic on an older one: what Redisson does by default.
    #[default]
    Auto,
    /// `SPUBLISH` / `SSUBSCRIBE` (Redis 7+): a message travels only within the shard that owns
    /// the lock's slot, and a waiter listens on that shard's master.
    Sharded,
    /// `PUBLISH` / `SUBSCRIBE`: every message is broadcast over the cluster bus to every node.
    Classic,
}

/// What an acquisition does when replica sync is on and no replica acknowledged the lock write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyncFailure {
    /// Release what was just taken and return [`Error::ReplicasNotSynced`].
    Error,
    /// Release what was just taken and try again (within the caller's wait), as Redisson does.
    Retry,
}

/// Replica sync settings (see [`Builder::replica_sync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaSync {
    pub(crate) timeout: Duration,
    pub(crate) on_failure: SyncFailure,
}

/// Validated settings shared by everything a client runs.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) topology: Topology,
    pub(crate) watchdog_timeout: Duration,
    pub(crate) waiter_liveness: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) timer_tick: Duration,
    pub(crate) timer_slots: usize,
    pub(crate) batch_size: usize,
    pub(crate) replica_sync: Option<ReplicaSync>,
    pub(crate) redisson_wait: Duration,
    pub(crate) metrics_lock_names: bool,
}

/// Converts a duration to whole milliseconds for Redis, rejecting zero and values beyond `i64` ms.
pub(crate) fn duration_ms(argument: &'static str, d: Duration) -> Result<i64> {
    let ms = d.as_millis();
    if ms == 0 {
        return Err(Error::invalid_argument(
            argument,
            format!("{d:?} is shorter than one millisecond"),
        ));
    }
    if d > MAX_DURATION {
        return Err(Error::invalid_argument(
            argument,
            format!(
                "{d:?} is longer than the longest duration sent to Redis ({:?})",
                MAX_DURATION
            ),
        ));
    }
    Ok(ms as i64)
}
