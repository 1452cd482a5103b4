//! [`FairLock`]: the public face of the fair lock. The waiting loop is in `engine/acquire/`, the
//! scripts in `lua/fair_*.lua`.
//!
//! No logic and no state of its own: every method is one call into the engine's `Handle`
//! (`engine/acquire/call.rs`; its reads and force-unlock in `lock/handle.rs`).

use crate::keys::Kind;
use std::sync::Arc;

use crate::engine::acquire::Handle;
use crate::engine::inner::Inner;

/// A fair, reentrant distributed lock: waiters are granted the lock **in the order they arrived at
/// Redis**, first come, first served, across every client and process that uses the same name.
/// Its data is Redisson's `RFairLock` layout, so Java services using Redisson can share the lock.
///
/// # The guarantee
///
/// * **Mutual exclusion** while the lock's key lives in Redis: only one owner field holds it. A
///   lock taken without a lease is renewed by the client's watchdog for as long as its guard
///   lives; one taken with a lease expires when the lease runs out. Either way the guard's
///   [`lost`](crate::LockGuard::lost) future tells the holder when the lock can no longer be trusted.
/// * **FIFO**: a waiter joins the queue on its first attempt; only the queue head may take the
///   lock, and only the head is woken when it is released. A later arrival never overtakes an
///   earlier one that is still waiting.
/// * **One call, one holder**: every acquisition call is its own holder, so any two calls
///   exclude each other, whether they run in different processes, threads, tasks, or as futures
///   of **one** task (`join!`, `select!`, `for_each_concurrent`), as with `tokio::sync::Mutex`.
///   A call that locks a lock its own task already holds waits like any other caller (see the
///   example below).
/// * **Explicit re-entry**: a hold is shared only on purpose, from a guard
///   ([`LockGuard::reenter`](crate::LockGuard::reenter)) or through a
///   [`Holder`](crate::Holder) passed to [`with_holder`](Self::with_holder). Each guard is one
///   hold; Redis shows the holder's count as Redisson's reentrant count.
/// * **Liveness**: a waiter whose process died is purged after the client's waiter liveness
///   window (5 s by default), and the lock passes to the next live waiter; a dropped or timed-out
///   wait leaves the queue at once (in the background, without making the caller wait) and
///   wakes the next waiter.
///
/// # What is *not* guaranteed
///
/// * **Failover**: Redis replication is asynchronous. If the master dies before a replica got the
///   lock, the promoted replica does not know it and grants it again. The queue may be lost or
///   reordered the same way.
/// * **Pauses longer than the lease**: a holder stalled (GC, swap, a stopped VM) past its lease
///   may still believe it holds the lock. Use [`fenced`](Self::fenced) tokens at the protected
///   resource when that matters.
/// * **Leases close to the round trip**: a grant that reaches its waiter already run out (its
///   lease, counted from the attempt's send, is gone: a lease of a few milliseconds, a paused
///   process) cannot be trusted and is given back; the lock goes to the next waiter, and this one
///   joins the queue again at the tail after a short backoff. It had its turn and could not use
///   it.
///
/// # Which lock should you use?
///
/// * [`FairLock`] when waiting order matters (no starvation, predictable latency under
///   contention) or a Java service uses `RFairLock` on the same name.
/// * [`NonFairLock`](crate::NonFairLock) when order does not matter or a Java service uses `RLock`: one key per
///   lock, slightly cheaper, but a releasing client can re-acquire before a waiter elsewhere.
/// * [`RedLock`](crate::RedLock) only when you run several independent masters (no replication
///   between them) and want the lock to survive the loss of a minority of them. Each attempt costs
///   a round trip to every master, waiting polls with backoff and is not fair, and it is not a
///   consensus system: it still trusts clocks, bounded pauses and masters that do not forget.
/// * **Java waiters' deadlines** are computed from the Java client's clock and chained one wait per
///   waiter (5 minutes by default); Redisson purges a Java waiter whose deadline has passed, so a
///   Java waiter that waits longer than its chain allows loses its place. fairlock's own waiters
///   are judged by their liveness marks and heartbeats and are never purged while alive (given
///   Java waits within [`Builder::redisson_wait`](crate::Builder::redisson_wait)).
///
/// # Futures of one task exclude each other
///
/// Here the three critical sections never overlap, although one task runs them all: each
/// `lock()` is its own holder, and waits for the others like a caller in another process would.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.fair_lock("orders:42");
/// let section = |n: u32| {
///     let lock = lock.clone();
///     async move {
///         let guard = lock.lock().await?;
///         // ... at most one of the three is here at a time ...
///         guard.unlock().await?;
///         Ok::<u32, fairlock::Error>(n)
///     }
/// };
/// let (a, b, c) = tokio::join!(section(1), section(2), section(3));
/// # let _ = (a?, b?, c?);
/// # Ok(()) }
/// ```
///
/// To share a hold instead (re-entry), say so: `guard.reenter(None).await?` takes one more hold
/// on the guard's owner field at once, and handles given one [`Holder`](crate::Holder) with
/// [`with_holder`](Self::with_holder) are one holder wherever their calls run.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.fair_lock("orders:42");
///
/// // Wait as long as it takes; the watchdog keeps the lock while the guard lives.
/// let guard = lock.lock().await?;
/// guard.unlock().await?;
///
/// // Wait at most 2 s, hold for at most 10 s.
/// if let Some(guard) = lock.try_lock(Duration::from_secs(2), Some(Duration::from_secs(10))).await? {
///     // ...
///     drop(guard); // released in the background
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[doc(alias = "RFairLock")]
#[must_use = "a lock handle does nothing until one of its methods is called"]
pub struct FairLock(Handle);

impl FairLock {
    pub(crate) fn new(inner: Arc<Inner>, name: String) -> Self {
        FairLock(Handle::new(inner, name, Kind::Fair))
    }

    /// The shared handle (for the multi-lock's order and checks).
    pub(crate) fn handle(&self) -> &Handle {
        &self.0
    }

    /// The lock's name (also the Redis key of its owner hash).
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Makes every acquisition call through this handle (and through every handle given the
    /// same [`Holder`](crate::Holder), in this client) one holder: they re-enter each other's
    /// hold instead of waiting, wherever they run (one task, several tasks or threads). Mint
    /// one with [`Client::holder`](crate::Client::holder); use
    /// [`Holder::from_raw`](crate::Holder::from_raw) only for interop. Without a holder, every
    /// call is its own holder.
    ///
    /// Calls of one holder on one lock reach Redis in the order they were made: whatever a
    /// dropped guard or a dropped call of the holder left to the background (a release, a
    /// give-up) arrives before the holder's next call.
    #[must_use = "with_holder() returns a new handle; the original is unchanged"]
    pub fn with_holder(mut self, holder: crate::Holder) -> Self {
        self.0.set_holder(holder.id());
        self
    }

    /// Makes every acquisition through this handle (re-entries too) increment the lock's fencing
    /// counter `redisson_lock_token:{NAME}` atomically with the grant; the guard's
    /// [`fencing_token`](crate::LockGuard::fencing_token) is the new value. See the crate docs on
    /// [fencing](crate#fencing-tokens) for how to use it at the protected resource.
    #[must_use = "fenced() returns a new handle; the original is unchanged"]
    pub fn fenced(mut self) -> Self {
        self.0.set_fenced();
        self
    }

    /// Waits as long as it takes, then holds the lock with the watchdog renewing it (every third
    /// of the watchdog timeout, 30 s by default) until the guard is released or dropped.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName), [`Error::Redis`](crate::Error::Redis)
    /// when Redis fails (the waiter leaves the queue), [`Error::Shutdown`](crate::Error::Shutdown).
    /// Transient failures ([`Error::is_transient`](crate::Error::is_transient): a dropped
    /// connection, a failover, a slot on the move) are retried with a backoff for as long as the
    /// watchdog timeout (or the waiter liveness, if longer), counted from the call's first
    /// failed attempt; an outage that outlasts it is returned as the last error. A waiting
    /// call makes that attempt as soon as its client sees Redis fail (its pub/sub connection
    /// drops, or a waiter heartbeat fails, every third of the waiter liveness), not at its
    /// next timer, so with Redis gone the error comes about one watchdog timeout after the
    /// outage began. An attempt whose reply was lost is checked before the next one,
    /// so a grant made in the dark is taken up, never counted twice. If the call ends in an error
    /// right after a lost reply, the same holder's next acquisition of the lock checks first and
    /// takes such a grant up; without one, it expires with its lease.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future gives up its place in the queue (from the background, with
    /// no I/O in `Drop`) and wakes the next waiter; if the lock was granted after the caller
    /// stopped waiting, it is released again.
    pub async fn lock(&self) -> crate::Result<crate::LockGuard> {
        Ok(crate::LockGuard::new(self.0.acquire_unbounded(None).await?))
    }

    /// Waits as long as it takes, then holds the lock for at most `lease` (never renewed).
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a
    /// lease under [`MIN_LEASE`](crate::MIN_LEASE) (3 ms) or longer than [`MAX_DURATION`](crate::MAX_DURATION).
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

    /// Waits at most `wait` for the lock. `lease: None` holds it with the watchdog; `Some(lease)`
    /// holds it for at most `lease`. Returns `Ok(None)` when `wait` ran out; the waiter then
    /// leaves the queue in the background (waking the next waiter if the lock is free), before
    /// the same holder's next call on this lock reaches Redis. A zero `wait` tries once
    /// without joining the queue.
    ///
    /// Returns within `wait` plus the round trip of the attempt in flight when it ran out (at
    /// most the client's command timeout; under load a round trip includes the time the tasks
    /// involved wait for a thread), also while Redis is unreachable: then with the Redis error.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a lease under
    /// [`MIN_LEASE`](crate::MIN_LEASE) (3 ms: it would leave no validity), a lease longer than [`MAX_DURATION`](crate::MAX_DURATION) or a wait beyond `i64` milliseconds,
    /// [`Error::InvalidName`](crate::Error::InvalidName),
    /// [`Error::Redis`](crate::Error::Redis), [`Error::Shutdown`](crate::Error::Shutdown).
    /// Transient failures are retried as in [`lock`](Self::lock), but only until `wait` runs out:
    /// then the last Redis error is returned (one command timeout after `wait` at the latest).
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
    ///     .fair_lock("nightly-report")
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

    /// Deletes the lock whoever holds it and wakes the next waiter. Returns whether it was held.
    /// The former holder's guard learns it at its next renewal
    /// ([`LostReason::Gone`](crate::LostReason::Gone)).
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

    /// A snapshot of the lock: owner field and hold count, TTL, and the waiter queue with each
    /// waiter's deadline. Works whoever holds or waits, Java clients included.
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn state(&self) -> crate::Result<crate::LockState> {
        self.0.state().await
    }
}
