//! The client: one command connection, one subscriber connection and one driver task, shared by
//! every lock handle made from it.
//!
//! Background tasks never hold a strong reference to the client: they end when the last handle
//! and guard are gone. Nothing here blocks or does I/O in `Drop`.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use crate::config::{Builder, Config};
use crate::conn::subscriber::Subscriber;
use crate::conn::Conn;
use crate::engine::driver::{DriverHandle, Work};
use crate::engine::field::Helds;
use crate::engine::lane::Lane;
use crate::engine::release::What;
use crate::error::{Error, Result};
use crate::lock::fair::FairLock;
use crate::lock::guard::{release_logged, LostReason};
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

/// Everything a client shares. Background tasks never hold a strong reference to it.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) id: Uuid,
    /// `id` as text, lowercase with dashes (the owner field prefix).
    pub(crate) uuid: String,
    pub(crate) config: Config,
    pub(crate) conn: Conn,
    pub(crate) subscriber: Subscriber,
    pub(crate) driver: DriverHandle,
    /// Every lock and owner field this client works on (see `held.rs`).
    pub(crate) helds: Helds,
    /// `true` once shut down; waiters watch it.
    pub(crate) closed: watch::Sender<bool>,
    /// The last owner field built: a holder taking many locks (or one lock many times) shares
    /// one allocation.
    last_field: std::sync::Mutex<Option<(i64, Arc<str>)>>,
}

impl Inner {
    pub(crate) fn check_open(&self) -> Result<()> {
        if *self.closed.borrow() {
            Err(Error::Shutdown)
        } else {
            Ok(())
        }
    }

    /// The owner field of `holder` in this client.
    pub(crate) fn field(&self, holder: i64) -> Arc<str> {
        let mut last = self.last_field.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((h, field)) if *h == holder => field.clone(),
            _ => {
                let field: Arc<str> = format!("{}:{}", self.uuid, holder).into();
                *last = Some((holder, field.clone()));
                field
            }
        }
    }
}

impl Client {
    /// Connects to a standalone Redis at `url` with every default (see [`Builder`]).
    ///
    /// # Errors
    /// [`Error::Redis`] when the URL is malformed or Redis cannot be reached.
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
        let (conn, link) = Conn::connect(&config).await?;
        let subscriber = Subscriber::start(link, config.connect_timeout, config.command_timeout);
        let driver = DriverHandle::start(conn.clone(), &config);
        let id = Uuid::new_v4();
        check_eviction_policy(&mut conn.clone()).await;
        let inner = Arc::new(Inner {
            id,
            uuid: id.hyphenated().to_string(),
            config,
            conn,
            subscriber,
            driver,
            helds: Helds::default(),
            closed: watch::Sender::new(false),
            last_field: std::sync::Mutex::new(None),
        });
        tracing::debug!(client = %id, "fairlock client started");
        Ok(Client { inner })
    }

    /// This client instance's UUID (the first half of its owner fields).
    pub fn id(&self) -> Uuid {
        self.inner.id
    }

    /// A fair (FIFO) lock handle on `name`, in Redisson's `RFairLock` layout. Creating a handle does
    /// no I/O; an invalid name is reported by the first operation as [`Error::InvalidName`].
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        FairLock::new(self.clone(), name.into())
    }

    /// A non-fair lock handle on `name`, in Redisson's `RLock` layout. No I/O; an invalid name is
    /// reported by the first operation.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.clone(), name.into())
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutdown(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// Shuts the client down: every pending lock call returns [`Error::Shutdown`] (leaving its
    /// queue), every held lock is released and its guards' [`lost`](crate::LockGuard::lost)
    /// resolve with [`LostReason::Shutdown`], and the background tasks stop. A grant that
    /// arrives for a call still in flight is given back at once, and that call returns
    /// [`Error::Shutdown`] too. Later calls return [`Error::Shutdown`]. Calling it again does
    /// nothing.
    ///
    /// # Cancel safety
    /// Not cancel safe in full: the client is marked shut down at once, but if the future is
    /// dropped early some held locks may be left to expire with their leases instead of being
    /// released.
    pub async fn shutdown(&self) {
        if self.inner.closed.send_replace(true) {
            return;
        }
        self.inner.subscriber.wake_all();
        // Each field in its own line: an operation in flight (an attempt whose grant this call
        // may then give back itself) ends first, and what comes after finds the client closed.
        for held in self.inner.helds.all() {
            let turn = Lane::enter(&held).await;
            let _ = release_logged(&held, &turn, What::All).await;
            turn.with(|a| held.holds_vanished(a, LostReason::Shutdown));
        }
        let (tx, rx) = oneshot::channel();
        self.inner.driver.send(Work::Shutdown(tx));
        let _ = rx.await;
        tracing::debug!(client = %self.inner.id, "fairlock client shut down");
    }
}

impl Builder {
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

/// Every lock key carries a TTL, so any eviction policy but `noeviction` may evict a held lock.
async fn check_eviction_policy(conn: &mut Conn) {
    // A flat pair list over RESP2, a map over RESP3 (cluster connections).
    let reply: redis::RedisResult<std::collections::HashMap<String, String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    match reply.as_ref().map(|m| m.get("maxmemory-policy")) {
        Ok(Some(policy)) if policy != "noeviction" => tracing::warn!(
            policy = policy.as_str(),
            "Redis maxmemory-policy is not noeviction: under memory pressure Redis may evict \
             held locks (an evicted lock is a lost lock)"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(error = %e, "could not read maxmemory-policy (CONFIG may be disabled)")
        }
    }
}
