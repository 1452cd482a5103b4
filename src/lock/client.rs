//! The client: one command connection, one subscriber connection and one driver task, shared by
//! every lock handle made from it.
//!
//! Background tasks never hold a strong reference to the client: they end when the last handle
//! and guard are gone. Nothing here blocks or does I/O in `Drop`.

use std::sync::Arc;

use uuid::Uuid;

use crate::config::{Builder, Config};
use crate::engine::inner::Inner;
use crate::engine::lifecycle;
use crate::error::Result;
use crate::lock::fair::FairLock;
use crate::lock::holder::Holder;
use crate::lock::plain::Lock;

/// A connection to Redis for taking locks. Cheap to clone; every clone shares the same
/// connections and background tasks.
///
/// A client owns one multiplexed command connection (reconnecting on failure), **one** pub/sub
/// connection that carries the channels of all its waiters (on a cluster: a second cluster
/// connection that carries only subscriptions, one node connection per shard), and one
/// driver task (renewals,
/// heartbeats, background releases). Each client has its own random v4 UUID, the first half of
/// every owner field it writes. The background tasks end when the last clone, lock handle and
/// guard are dropped, or at [`shutdown`](Self::shutdown).
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.fair_lock("orders:42");
/// let guard = lock.lock().await?;
/// // ... the critical section ...
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl Client {
    /// Connects to a standalone Redis at `url` with every default (see [`Builder`]).
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) when the URL is malformed or Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it completes leaves nothing running.
    pub async fn connect(url: &str) -> Result<Client> {
        Builder::new().standalone(url).build().await
    }

    /// A builder for every setting.
    pub fn builder() -> Builder {
        Builder::new()
    }

    pub(crate) async fn start(config: Config) -> Result<Client> {
        let inner = lifecycle::start(config).await?;
        Ok(Client { inner })
    }

    /// This client instance's UUID (the first half of its owner fields).
    pub fn id(&self) -> Uuid {
        self.inner.id
    }

    /// Mints a new [`Holder`]: an id no other holder of this process has. Pass it to
    /// [`FairLock::with_holder`] or [`Lock::with_holder`] on the handles whose calls should share
    /// one reentrant hold (in one task or across tasks and threads). Without one, every
    /// acquisition call is its own holder.
    pub fn holder(&self) -> Holder {
        Holder::mint()
    }

    /// A fair (FIFO) lock handle on `name`, in Redisson's `RFairLock` layout. Creating a handle does
    /// no I/O; an invalid name is reported by the first operation as [`Error::InvalidName`](crate::Error::InvalidName).
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        FairLock::new(self.inner.clone(), name.into())
    }

    /// A non-fair lock handle on `name`, in Redisson's `RLock` layout. No I/O; an invalid name is
    /// reported by the first operation.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.inner.clone(), name.into())
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutdown(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// Shuts the client down: every pending lock call returns [`Error::Shutdown`](crate::Error::Shutdown) (leaving its
    /// queue), every held lock is released and its guards' [`lost`](crate::LockGuard::lost)
    /// resolve with [`LostReason::Shutdown`](crate::LostReason::Shutdown), and the background tasks stop. A grant that
    /// arrives for a call still in flight is given back at once, and that call returns
    /// [`Error::Shutdown`](crate::Error::Shutdown) too. Later calls return [`Error::Shutdown`](crate::Error::Shutdown). Calling it again does
    /// nothing.
    ///
    /// Bounded: it waits at most one command timeout for each lock's pending operation (all
    /// locks at once), then sends the releases, each retried for up to three command timeouts
    /// (plus its last send's own timeout) while Redis does not answer; so it returns within about
    /// five command timeouts (15 s with the default 3 s) even while Redis is down. A lock call whose future is alive
    /// but no longer polled (a pinned `lock()` in a `select!` that moved on) does not hold it
    /// up: that call's hold, if any, is given back when the call is polled or dropped, or else
    /// expires with its lease. Waiting fair calls leave the queue even when they are dropped
    /// after `shutdown` returned: the client's background task keeps running what dropped
    /// guards and futures hand it until the last handle of the client is gone.
    ///
    /// # Cancel safety
    /// Not cancel safe in full: the client is marked shut down at once, but if the future is
    /// dropped early some held locks may be left to expire with their leases instead of being
    /// released.
    pub async fn shutdown(&self) {
        lifecycle::shutdown(&self.inner).await;
    }
}

impl Builder {
    /// Validates the settings, connects, and starts the client's background tasks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a bad setting (before any I/O), [`Error::Redis`](crate::Error::Redis) when Redis
    /// cannot be reached within the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it completes leaves nothing running.
    pub async fn build(self) -> Result<Client> {
        let config = self.validate()?;
        Client::start(config).await
    }
}
