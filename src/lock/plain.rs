//! [`NonFairLock`]: the non-fair lock in Redisson's `RLock` layout.
//!
//! No logic and no state of its own: every method is one call into the engine's `Handle`
//! (`engine/acquire/call.rs`; its reads and force-unlock in `lock/handle.rs`).

use crate::keys::Kind;
use std::sync::Arc;

use crate::engine::acquire::Handle;
use crate::engine::inner::Inner;

/// A non-fair, reentrant distributed lock in Redisson's `RLock` layout: one hash per lock, and a
/// release message on `redisson_lock__channel:{NAME}` that every waiter listens to.
///
/// Whoever asks when the lock is free gets it; there is no queue, so a client that releases and
/// immediately asks again can win over a waiter elsewhere. Within one client, waiters on the same
/// name share **one** subscription, and each release message wakes **one** of them (no thundering
/// herd); a woken waiter that loses the race simply waits again. Everything else (reentrancy,
/// watchdog, leases, [`lost`](crate::LockGuard::lost), fencing, cancel safety) is as for
/// [`FairLock`](crate::FairLock), and the same caveats about failover and long pauses apply. In
/// particular every acquisition call is its own holder, so two calls exclude each other even when
/// they run in one task; re-entry is explicit ([`with_holder`](Self::with_holder),
/// [`LockGuard::reenter`](crate::LockGuard::reenter)).
///
/// Releasing a guard whose lease already ran out, or whose lock an operator force-unlocked, is
/// [`Error::NotHeld`](crate::Error::NotHeld), as for every kind of lock (see
/// [`LockGuard::unlock`](crate::LockGuard::unlock)).
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.non_fair_lock("inventory:7");
/// if let Some(guard) = lock.try_lock(Duration::from_millis(200), None).await? {
///     // ...
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[doc(alias = "RLock")]
#[doc(alias = "Lock")]
#[must_use = "a lock handle does nothing until one of its methods is called"]
pub struct NonFairLock(Handle);

/// The name [`NonFairLock`] had before 0.2; it says less about what the lock is.
#[deprecated(since = "0.2.0", note = "renamed to `NonFairLock`")]
pub type Lock = NonFairLock;

impl NonFairLock {
    pub(crate) fn new(inner: Arc<Inner>, name: String) -> Self {
        NonFairLock(Handle::new(inner, name, Kind::NonFair))
    }

    /// The shared handle (for the multi-lock's order and checks).
    pub(crate) fn handle(&self) -> &Handle {
        &self.0
    }

    /// The lock's name (also the Redis key of its owner hash).
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Makes every acquisition call through this handle one holder, so they re-enter rather than
    /// exclude each other (see [`FairLock::with_holder`](crate::FairLock::with_holder)).
    #[must_use = "with_holder() returns a new handle; the original is unchanged"]
    pub fn with_holder(mut self, holder: crate::Holder) -> Self {
        self.0.set_holder(holder.id());
        self
    }

    /// Hands out a fencing token with every acquisition (see
    /// [`FairLock::fenced`](crate::FairLock::fenced)).
    #[must_use = "fenced() returns a new handle; the original is unchanged"]
    pub fn fenced(mut self) -> Self {
        self.0.set_fenced();
        self
    }

    /// Waits as long as it takes, then holds the lock with the watchdog renewing it.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName), [`Error::Redis`](crate::Error::Redis),
    /// [`Error::Shutdown`](crate::Error::Shutdown). Transient failures are retried as
    /// [`FairLock::lock`](crate::FairLock::lock) describes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops waiting without swallowing a wake-up meant for
    /// another local waiter; if the lock was granted after the caller stopped waiting, it is
    /// released again.
    pub async fn lock(&self) -> crate::Result<crate::LockGuard> {
        Ok(crate::LockGuard::new(self.0.acquire_unbounded(None).await?))
    }

    /// Waits as long as it takes, then holds the lock for at most `lease` (never renewed).
    ///
    /// # Errors
    /// As [`lock`](Self::lock), plus [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for a lease under [`MIN_LEASE`](crate::MIN_LEASE) (3 ms) or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(
        &self,
        lease: std::time::Duration,
    ) -> crate::Result<crate::LockGuard> {
        Ok(crate::LockGuard::new(
            self.0.acquire_unbounded(Some(lease)).await?,
        ))
    }

    /// Waits at most `wait`; `lease: None` uses the watchdog. `Ok(None)` when `wait` ran out.
    /// Returns within `wait` plus one round trip (bounded by the command timeout).
    ///
    /// # Errors
    /// As [`lock_with_lease`](Self::lock_with_lease); transient failures are retried only until
    /// `wait` runs out.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(
        &self,
        wait: std::time::Duration,
        lease: Option<std::time::Duration>,
    ) -> crate::Result<Option<crate::LockGuard>> {
        Ok(self
            .0
            .acquire(Some(wait), lease)
            .await?
            .map(crate::LockGuard::new))
    }

    /// Takes the lock as [`lock`](Self::lock) does (no lease: the watchdog keeps it), runs
    /// `work` while the lock is trusted, and releases it when the work is done: the work is
    /// dropped the moment the lock is lost. Returns the work's output or why it stopped; see
    /// [`LockGuard::run`](crate::LockGuard::run), which does the same with a guard taken any
    /// other way (a lease, a bounded wait).
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::Client) -> fairlock::Result<()> {
    /// let rows = client
    ///     .non_fair_lock("cache-rebuild")
    ///     .run(async { /* work under the lock */ 42 })
    ///     .await?;
    /// # let _ = rows; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`Error::Lost`](crate::Error::Lost) when the lock was lost
    /// before the work finished.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future while it waits gives up the wait, as
    /// [`lock`](Self::lock); while the work runs, it drops the work and releases the lock in
    /// the background.
    pub async fn run<F: std::future::Future>(&self, work: F) -> crate::Result<F::Output> {
        self.lock().await?.run(work).await
    }

    /// Deletes the lock whoever holds it and publishes the release. Returns whether it was held.
    ///
    /// # Cancel safety
    /// The delete may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> crate::Result<bool> {
        self.0.force_unlock().await
    }

    /// Whether anyone holds the lock.
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn is_locked(&self) -> crate::Result<bool> {
        self.0.is_locked().await
    }

    /// How many holds this handle's holder ([`with_holder`](Self::with_holder)) has on the lock;
    /// for a handle without one, how many holds all holders of this client have (0 when they
    /// hold none).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn hold_count(&self) -> crate::Result<u32> {
        self.0.hold_count().await
    }

    /// A snapshot of the lock: owner field, hold count and TTL (the queue is always empty).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn state(&self) -> crate::Result<crate::LockState> {
        self.0.state().await
    }
}
