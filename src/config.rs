//! Client configuration: the builder, its defaults and its validation.

use std::fmt;
use std::time::Duration;

use crate::client::Client;
use crate::error::{duration_ms, Error, Result};

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

/// Which Redis deployment the client talks to.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One Redis server (or a master whose replicas the client does not follow).
    Standalone(String),
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::Standalone(url) => f.debug_tuple("Standalone").field(&redact(url)).finish(),
        }
    }
}

/// Hides the password of a `redis://user:password@host` URL.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => format!("{}***{}", &url[..scheme + 3], &url[at..]),
            }
        }
        _ => url.to_owned(),
    }
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
}

/// Builds a [`Client`] with every knob explicit. Each setter documents its default.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::builder()
///     .standalone("redis://127.0.0.1:6379")
///     .watchdog_timeout(Duration::from_secs(30))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Builder {
    topology: Option<Topology>,
    watchdog_timeout: Duration,
    waiter_liveness: Duration,
    command_timeout: Duration,
    connect_timeout: Duration,
    timer_tick: Duration,
    timer_slots: usize,
    batch_size: usize,
    replica_sync: Option<ReplicaSync>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            topology: None,
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            waiter_liveness: DEFAULT_WAITER_LIVENESS,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timer_tick: DEFAULT_TIMER_TICK,
            timer_slots: DEFAULT_TIMER_SLOTS,
            batch_size: DEFAULT_BATCH_SIZE,
            replica_sync: None,
        }
    }
}

impl Builder {
    /// A builder with every default. Same as [`Client::builder`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Talk to one Redis server at `url` (`redis://[user:password@]host:port[/db]`). Required
    /// unless another topology is chosen.
    pub fn standalone(mut self, url: impl Into<String>) -> Self {
        self.topology = Some(Topology::Standalone(url.into()));
        self
    }

    /// TTL of locks taken without a lease; the watchdog renews them every third of it.
    /// Defaults to [`DEFAULT_WATCHDOG_TIMEOUT`] (30 s), as in Redisson. Must be at least 30 ms.
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// How long a queued fair waiter of this client survives without a heartbeat. Live waiters
    /// are refreshed every third of it, so they are never purged however long the queue; a waiter
    /// whose process died is purged after at most this long. Defaults to
    /// [`DEFAULT_WAITER_LIVENESS`] (5 s). Must be at least 30 ms.
    pub fn waiter_liveness(mut self, window: Duration) -> Self {
        self.waiter_liveness = window;
        self
    }

    /// Upper bound of one Redis round trip; a command that takes longer fails with a timeout
    /// error. Bounds how long `try_lock` can overrun its wait while Redis is unreachable.
    /// Defaults to [`DEFAULT_COMMAND_TIMEOUT`] (3 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Upper bound for opening a connection. Defaults to [`DEFAULT_CONNECT_TIMEOUT`] (3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Tick of the timing wheel that drives renewals and heartbeats. Defaults to
    /// [`DEFAULT_TIMER_TICK`] (100 ms). Must be between 1 ms and a third of the smaller of the
    /// watchdog timeout and the waiter liveness window.
    pub fn timer_tick(mut self, tick: Duration) -> Self {
        self.timer_tick = tick;
        self
    }

    /// Slots of the timing wheel. Defaults to [`DEFAULT_TIMER_SLOTS`] (1024).
    pub fn timer_slots(mut self, slots: usize) -> Self {
        self.timer_slots = slots;
        self
    }

    /// Locks renewed (or waiters refreshed) per script call; calls due together are pipelined,
    /// ten calls per pipeline.
    /// Defaults to [`DEFAULT_BATCH_SIZE`] (100). Between 1 and 1000.
    pub fn batch_size(mut self, size: usize) -> Self {
        self.batch_size = size;
        self
    }

    /// After every successful acquisition, send `WAIT <replicas> <timeout>` so the lock write
    /// reaches the master's replicas before the caller proceeds (Redisson's replica sync). When
    /// the master has replicas and none acknowledged within `timeout`, the hold just taken is
    /// released again and `on_failure` decides: [`SyncFailure::Error`] returns
    /// [`Error::ReplicasNotSynced`], [`SyncFailure::Retry`] tries again within the caller's wait.
    /// With no replica connected, acquisitions proceed unsynced.
    ///
    /// This narrows, but does not close, the window in which a failover loses a lock: replication
    /// stays asynchronous and a replica that acknowledged can still lose the write. `WAIT` also
    /// holds up the client's shared command connection until it returns. Off by default.
    pub fn replica_sync(mut self, timeout: Duration, on_failure: SyncFailure) -> Self {
        self.replica_sync = Some(ReplicaSync {
            timeout,
            on_failure,
        });
        self
    }

    /// Validates the settings without connecting.
    pub(crate) fn validate(&self) -> Result<Config> {
        let topology = self.topology.clone().ok_or_else(|| {
            Error::invalid_argument("topology", "call .standalone(url) before .build()")
        })?;
        let min = Duration::from_millis(30);
        duration_ms("watchdog_timeout", self.watchdog_timeout)?;
        duration_ms("waiter_liveness", self.waiter_liveness)?;
        duration_ms("command_timeout", self.command_timeout)?;
        duration_ms("connect_timeout", self.connect_timeout)?;
        duration_ms("timer_tick", self.timer_tick)?;
        if self.watchdog_timeout < min {
            return Err(Error::invalid_argument(
                "watchdog_timeout",
                "must be at least 30 ms",
            ));
        }
        if self.waiter_liveness < min {
            return Err(Error::invalid_argument(
                "waiter_liveness",
                "must be at least 30 ms",
            ));
        }
        if self.timer_tick * 3 > self.watchdog_timeout.min(self.waiter_liveness) {
            return Err(Error::invalid_argument(
                "timer_tick",
                "must be at most a third of the watchdog timeout and of the waiter liveness window",
            ));
        }
        if self.timer_slots == 0 || self.timer_slots > 1 << 20 {
            return Err(Error::invalid_argument(
                "timer_slots",
                "must be between 1 and 2^20",
            ));
        }
        if self.batch_size == 0 || self.batch_size > 1000 {
            return Err(Error::invalid_argument(
                "batch_size",
                "must be between 1 and 1000",
            ));
        }
        if let Some(sync) = &self.replica_sync {
            duration_ms("replica_sync timeout", sync.timeout)?;
        }
        Ok(Config {
            topology,
            watchdog_timeout: self.watchdog_timeout,
            waiter_liveness: self.waiter_liveness,
            command_timeout: self.command_timeout,
            connect_timeout: self.connect_timeout,
            timer_tick: self.timer_tick,
            timer_slots: self.timer_slots,
            batch_size: self.batch_size,
            replica_sync: self.replica_sync,
        })
    }

    /// Validates the settings, connects, and starts the client's background tasks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad setting (before any I/O), [`Error::Redis`] when Redis
    /// cannot be reached within the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it completes leaves nothing running.
    pub async fn build(self) -> Result<Client> {
        let config = self.validate()?;
        Client::start(config).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://secret@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        let b = Builder::new().standalone("redis://u:pw@h:1");
        assert!(!format!("{b:?}").contains("pw"));
    }

    #[test]
    fn validation_rejects_bad_settings() {
        assert!(Builder::new().validate().is_err());
        let ok = Builder::new().standalone("redis://127.0.0.1:1");
        assert!(ok.clone().validate().is_ok());
        for b in [
            ok.clone().watchdog_timeout(Duration::ZERO),
            ok.clone().watchdog_timeout(Duration::from_millis(10)),
            ok.clone().watchdog_timeout(Duration::MAX),
            ok.clone().waiter_liveness(Duration::ZERO),
            ok.clone().timer_tick(Duration::from_secs(20)),
            ok.clone().timer_slots(0),
            ok.clone().batch_size(0),
            ok.clone().command_timeout(Duration::from_nanos(10)),
        ] {
            assert!(b.validate().unwrap_err().is_invalid_input());
        }
    }
}
