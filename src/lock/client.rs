//! The client: one command connection, one subscriber connection and one driver task, shared by
//! every lock handle made from it.
//!
//! Background tasks never hold a strong reference to the client: they end when the last handle
//! and guard are gone. Nothing here blocks or does I/O in `Drop`.

use std::sync::Arc;

use uuid::Uuid;

use crate::config::{Builder, Config};
use crate::conn::subscriber::SubscriberState;
use crate::engine::inner::Inner;
use crate::engine::lifecycle;
use crate::error::Result;
use crate::lock::holder::Holder;
use crate::lock::mutex::FairLock;
use crate::lock::mutex::NonFairLock;
use crate::lock::rw::ReadWriteLock;

/// A connection to Redis for taking locks. Cheap to clone; every clone shares the same
/// connections and background tasks.
///
/// **Make one `Client` per process and clone it** wherever locks are needed: every clone, every
/// handle and every guard share its connections, its one subscription connection and its one
/// watchdog. Each `Client` you build opens connections of its own:
///
/// | Topology | Connections to Redis |
/// |---|---|
/// | standalone | 2: one multiplexed command connection (reconnects by itself) and one subscription connection, opened when a call first has to wait |
/// | cluster | 2 per node: a command connection and a subscription-only connection to each node redis-rs talks to |
/// | Sentinel | 2 to the master (command, subscriptions) + 2 to one sentinel (its `+switch-master` messages, a query) + short-lived ones while asking the sentinels where the master is |
///
/// Every connection is named with `CLIENT SETNAME`: `fairlock:<client id>:cmd` for commands and
/// `fairlock:<client id>:sub` for subscriptions (`<client id>` is [`id`](Self::id)), so
/// `CLIENT LIST` shows which process owns which connection; connections that redis-rs reopens
/// by itself are named again after each reconnect. Subscriptions use RESP3, which Redis 6 and
/// later speak. The client also runs one driver task (renewals, heartbeats, background
/// releases). Each client has its own random v4 UUID, the first half of every owner field it
/// writes. The background tasks end when the last clone, lock handle and guard are dropped, or at
/// [`shutdown`](Self::shutdown).
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
    /// Connects to a standalone Redis with every default: anything redis-rs accepts as a
    /// connection info, such as a URL (`redis://[user:password@]host:port[/db]`, as `&str`,
    /// `String` or `&String`) or a [`redis::ConnectionInfo`] (see [`ServerAddr`](crate::ServerAddr),
    /// which also says how to pass one across redis-rs lines). [`from_redis`](Self::from_redis)
    /// takes a [`redis::Client`] of yours.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the URL is malformed (before
    /// any I/O); [`Error::Authentication`](crate::Error::Authentication) when the server refuses
    /// the credentials; [`Error::Redis`](crate::Error::Redis) when Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it completes leaves nothing running.
    pub async fn connect(info: impl crate::ServerAddr) -> Result<Client> {
        Builder::new().standalone(info).build().await
    }

    /// Connects through a [`redis::Client`] you already built (your URL, credentials and TLS
    /// settings), with every default; the same as
    /// `Client::builder().standalone_client(client).build()`.
    ///
    /// # Errors
    /// [`Error::Authentication`](crate::Error::Authentication) when the server refuses the
    /// credentials; [`Error::Redis`](crate::Error::Redis) when Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it completes leaves nothing running.
    pub async fn from_redis(client: redis::Client) -> Result<Client> {
        Builder::new().standalone_client(client).build().await
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
    /// [`FairLock::with_holder`] or [`NonFairLock::with_holder`] on the handles whose calls should share
    /// one reentrant hold (in one task or across tasks and threads). Without one, every
    /// acquisition call is its own holder.
    pub fn holder(&self) -> Holder {
        Holder::mint()
    }

    /// A fair (FIFO) lock handle on `name`, in Redisson's `RFairLock` layout. Creating a handle does
    /// no I/O; an invalid name is reported by the first operation as [`Error::InvalidName`](crate::Error::InvalidName).
    #[must_use = "a lock handle does nothing until one of its methods is called"]
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        FairLock::new(self.inner.clone(), name.into())
    }

    /// A non-fair lock handle on `name`, in Redisson's `RLock` layout. No I/O; an invalid name is
    /// reported by the first operation.
    #[must_use = "a lock handle does nothing until one of its methods is called"]
    pub fn non_fair_lock(&self, name: impl Into<String>) -> NonFairLock {
        NonFairLock::new(self.inner.clone(), name.into())
    }

    /// The old name of [`non_fair_lock`](Self::non_fair_lock). It returns a handle, not a future
    /// that takes the lock (`client.lock("x").await` does not compile): the new name says what
    /// comes back.
    #[deprecated(
        since = "0.2.0",
        note = "use `non_fair_lock`; it returns a handle, not a held lock"
    )]
    #[must_use = "a lock handle does nothing until one of its methods is called"]
    pub fn lock(&self, name: impl Into<String>) -> NonFairLock {
        self.non_fair_lock(name)
    }

    /// A read-write lock on `name`, in Redisson's `RReadWriteLock` layout (see
    /// [`ReadWriteLock`]). No I/O; an invalid name is reported by the first operation.
    #[must_use = "a lock handle does nothing until one of its methods is called"]
    pub fn read_write_lock(&self, name: impl Into<String>) -> ReadWriteLock {
        ReadWriteLock::new(self.inner.clone(), name.into())
    }

    /// A counting semaphore on `name`, in Redisson's `RSemaphore` layout (see [`Semaphore`](crate::Semaphore),
    /// which also says why its permits do not survive a crashed holder). No I/O; an invalid name
    /// is reported by the first operation.
    #[must_use = "a semaphore handle does nothing until one of its methods is called"]
    pub fn semaphore(&self, name: impl Into<String>) -> crate::Semaphore {
        crate::Semaphore::new(self.inner.clone(), name.into())
    }

    /// A semaphore whose permits expire on `name`, in Redisson's `RPermitExpirableSemaphore`
    /// layout (see [`ExpirableSemaphore`](crate::ExpirableSemaphore)): permits taken without a
    /// lease are renewed by the watchdog, so a crashed holder's permits come back. No I/O; an
    /// invalid name is reported by the first operation.
    #[must_use = "a semaphore handle does nothing until one of its methods is called"]
    pub fn expirable_semaphore(&self, name: impl Into<String>) -> crate::ExpirableSemaphore {
        crate::ExpirableSemaphore::new(self.inner.clone(), name.into())
    }

    /// A count-down latch on `name`, in Redisson's `RCountDownLatch` layout (see
    /// [`CountDownLatch`](crate::CountDownLatch)). No I/O; an invalid name (on a cluster, any
    /// name with braces) is reported by the first operation.
    #[must_use = "a latch handle does nothing until one of its methods is called"]
    pub fn count_down_latch(&self, name: impl Into<String>) -> crate::CountDownLatch {
        crate::CountDownLatch::new(self.inner.clone(), name.into())
    }

    /// Checks the client for a readiness probe: one `PING` on its command connection (bounded by
    /// the command timeout) and the state of its subscription connection. Does not open or wait
    /// for anything else.
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::Client) {
    /// let ready = client.health().await.is_ok();
    /// # let _ = ready; }
    /// ```
    ///
    /// # Errors
    /// [`Error::Shutdown`](crate::Error::Shutdown) after [`shutdown`](Self::shutdown);
    /// [`Error::Redis`](crate::Error::Redis) when the `PING` failed or timed out.
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    pub async fn health(&self) -> Result<Health> {
        if self.is_shutdown() {
            return Err(crate::Error::Shutdown);
        }
        let mut conn = self.inner.conn.clone();
        let started = std::time::Instant::now();
        crate::wire::server::ping(&mut conn, self.inner.config.command_timeout).await?;
        Ok(Health {
            round_trip: started.elapsed(),
            subscriber: self.inner.subscriber.state(),
        })
    }

    /// The state of the client's subscription connection (no I/O); also part of
    /// [`health`](Self::health).
    pub fn subscriber_state(&self) -> SubscriberState {
        self.inner.subscriber.state()
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutdown(&self) -> bool {
        *self.inner.helds.closed.borrow()
    }

    /// Shuts the client down: every pending lock call returns [`Error::Shutdown`](crate::Error::Shutdown) (leaving its
    /// queue), every held lock is released and its guards' [`lost`](crate::LockGuard::lost)
    /// resolve with [`LostReason::Shutdown`](crate::LostReason::Shutdown), and the background tasks stop. The same for
    /// [`ExpirableSemaphore`](crate::ExpirableSemaphore) permits (given back, their guards told);
    /// waiting semaphore and latch calls return [`Error::Shutdown`](crate::Error::Shutdown) too.
    /// Permits of a plain [`Semaphore`](crate::Semaphore) are given back when their guards are
    /// dropped or released; shutdown waits for such releases (and for settling semaphore
    /// acquires whose futures were dropped) that are still running, for at most their resend
    /// window (half of a call mark's life, PROTOCOL 11) and one command timeout. A grant that
    /// arrives for a call still in flight is given back at once, and that call returns
    /// [`Error::Shutdown`](crate::Error::Shutdown) too. Later calls return [`Error::Shutdown`](crate::Error::Shutdown). Calling it again does
    /// nothing.
    ///
    /// Bounded: it waits at most one command timeout for each lock's pending operation (all
    /// locks at once), then sends the releases, each retried for up to three command timeouts
    /// (plus its last send's own timeout) while Redis does not answer; so it returns within about
    /// five command timeouts (15 s with the default 3 s) even while Redis is down, plus, while
    /// semaphore work is still running in the background, up to its window (above: 9 s more with
    /// the defaults). A lock call whose future is alive
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

/// What [`Client::health`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// How long the `PING` on the command connection took, on this process's clock.
    pub round_trip: std::time::Duration,
    /// The state of the subscription connection.
    pub subscriber: SubscriberState,
}

// `ClientConfig` is a data type of `config/`; connecting is this layer's work.
#[cfg(feature = "serde")]
impl crate::config::ClientConfig {
    /// Connects with these settings: [`builder`](Self::builder), then
    /// [`Builder::build`](crate::Builder::build).
    ///
    /// # Errors
    /// As [`builder`](Self::builder) and [`Builder::build`](crate::Builder::build).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it completes leaves nothing running.
    pub async fn connect(&self) -> Result<crate::Client> {
        self.builder()?.build().await
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
