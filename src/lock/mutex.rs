//! The two mutexes and the guard they return, as `tokio::sync::Mutex` and its guard share one
//! file: [`FairLock`] (the fair lock, Redisson's `RFairLock` layout; scripts `lua/fair_*.lua`),
//! [`NonFairLock`] (Redisson's `RLock` layout), and [`LockGuard`] with its [`LostSignal`], one
//! hold on one lock (the read-write lock's sides return it too).
//!
//! No logic and no state of their own: every lock method is one call into the engine's `Handle`
//! (`engine/acquire/call.rs`; its reads and force-unlock in `lock/handle.rs`), and the guard is a
//! documented shell over the engine's hold (`engine/hold.rs`), which keeps the hold in its field's
//! account and releases it. The waiting loop is in `engine/acquire/`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::acquire::Handle;
use crate::engine::hold::{Hold, Signal};
use crate::engine::inner::Inner;
use crate::engine::validity::LostReason;
use crate::error::{Error, Result};
use crate::keys::Kind;
use crate::lock::holder::Holder;

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

/// Proof of one hold on a lock. Dropping it releases that hold in the background; [`unlock`]
/// releases it and reports the outcome.
///
/// Guards of the same holder on the same lock are reentrant holds on one owner field: the lock is
/// free again when the last is released, and they share one fate (see [`lost`](Self::lost)). A
/// guard keeps its client alive.
///
/// # Holds with different leases
///
/// A holder may take the same lock again with another lease (a watchdog hold and a fixed one, or
/// two fixed leases). The lock then lives as long as the longest live hold needs it: taking or
/// renewing it never shortens its TTL, the watchdog renews it while any watchdog hold lives, and
/// releasing a hold sets the TTL to what the remaining ones need. Every guard's `lost()` resolves
/// when the lock can no longer be trusted for the live holds, at the latest when the longest of
/// them runs out: a short fixed lease taken while a watchdog hold lives is kept by that hold.
///
/// [`unlock`]: LockGuard::unlock
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    hold: Hold,
}

impl LockGuard {
    pub(crate) fn new(hold: Hold) -> Self {
        LockGuard { hold }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.hold.name()
    }

    /// The owner field this hold is recorded under in Redis: `<client uuid>:<holder id>`, and
    /// for the write side of a read-write lock `<client uuid>:<holder id>:write` (Redisson's
    /// layout: a writer's field carries the `:write` suffix, a reader's does not).
    pub fn owner_field(&self) -> &str {
        self.hold.owner_field()
    }

    /// The holder this hold belongs to (the second half of [`owner_field`](Self::owner_field)).
    /// Give it to [`FairLock::with_holder`](crate::FairLock::with_holder) (or
    /// [`NonFairLock::with_holder`](crate::NonFairLock::with_holder)) to let other calls, in this task or
    /// others, share this hold.
    pub fn holder(&self) -> Holder {
        Holder::from_field_id(self.hold.holder_id())
    }

    /// How many holds this guard's holder has on the lock in this client: the live guards of
    /// its owner field (this one included), or 0 once the holds are known gone from Redis. No
    /// I/O.
    pub fn hold_count(&self) -> u32 {
        self.hold.count()
    }

    /// The fencing token of this acquisition, when the handle was [`fenced`](crate::FairLock::fenced).
    pub fn fencing_token(&self) -> Option<u64> {
        self.hold.token()
    }

    /// The local validity deadline, on this process's monotonic clock: the send time of the last
    /// acquisition or watchdog renewal that succeeded for the live holds of this lock and owner,
    /// plus its lease, minus a drift margin of 1 % + 2 ms; with several holds, the latest such
    /// deadline among them. Until then no other client can take the lock (barring a failover that
    /// lost it); from then on it may. Once the guard is [lost](Self::lost), the deadline it had
    /// then (or the moment the loss was found, if earlier). Work that must finish under the lock
    /// can be bounded by it.
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// Whether the lock is known to be lost (cheap, no I/O). See [`lost`](Self::lost).
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves once the lock can no longer be trusted, with the reason: a renewal found it gone,
    /// two renewals in a row failed, the validity deadline passed (a fixed lease or the watchdog's
    /// last renewal ran out: see [`valid_until`](Self::valid_until)), or the client was shut
    /// down. It resolves exactly at the validity deadline, not at the next tick of any timer. Any
    /// number of callers may await it; it never resolves for a lock that is still held and renewed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing, and awaiting again later still resolves.
    pub async fn lost(&self) -> LostReason {
        self.hold.lost().await
    }

    /// An owned, cheap, cloneable signal of this hold's end, for spawned subtasks that cannot
    /// borrow the guard: its [`lost`](LostSignal::lost) resolves when this guard's
    /// [`lost`](Self::lost) would, or when the guard is unlocked or dropped
    /// ([`LostReason::Released`]), whichever comes first. Work that must stop when the lock can
    /// no longer be trusted waits on it.
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::Client) -> fairlock::Result<()> {
    /// let guard = client.fair_lock("reports").lock().await?;
    /// let stop = guard.lost_signal();
    /// let worker = tokio::spawn(async move {
    ///     tokio::select! {
    ///         _ = stop.lost() => { /* stop writing: the lock is gone or released */ }
    ///         _ = async { /* the work */ } => {}
    ///     }
    /// });
    /// worker.await.ok();
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal(self.hold.signal())
    }

    /// Runs `work` while this hold is trusted: the work future is dropped the moment the lock is
    /// [lost](Self::lost) (at the latest at the validity deadline), and the hold is released when
    /// the work finishes. Returns the work's output, or [`Error::Lost`] with the reason when the
    /// lock was lost first; the output of work that finished in time is returned even if the
    /// release that follows fails (the hold then expires with its lease, and the failure is
    /// logged). Handles have the same as [`FairLock::run`](crate::FairLock::run), which takes
    /// the lock first.
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::Client) -> fairlock::Result<()> {
    /// use std::time::Duration;
    /// let lock = client.fair_lock("nightly-report");
    /// if let Some(guard) = lock.try_lock(Duration::from_secs(1), None).await? {
    ///     let rows = guard.run(async { /* work under the lock */ 42 }).await?;
    ///     # let _ = rows;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Lost`] when the lock was lost before the work finished (the work was dropped).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the work and the guard, which releases the hold in
    /// the background.
    pub async fn run<F: std::future::Future>(self, work: F) -> Result<F::Output> {
        let finished = {
            tokio::pin!(work);
            tokio::select! {
                // A loss found in the same poll as the end of the work wins: the work may have
                // run past the deadline.
                biased;
                reason = self.lost() => Err(reason),
                output = &mut work => Ok(output),
            }
        };
        match finished {
            Ok(output) => {
                let name = self.name().to_owned();
                if let Err(e) = self.unlock().await {
                    tracing::warn!(lock = %name, error = %crate::error::chain(&e),
                        "work under the lock finished; its release failed");
                }
                Ok(output)
            }
            Err(reason) => Err(Error::Lost {
                name: self.name().to_owned(),
                reason,
            }),
        }
    }

    /// Extends this hold's fixed lease to `lease` from now: the lock's TTL in Redis becomes at
    /// least `lease` (never shorter than another hold of it needs), and this guard's
    /// [`valid_until`](Self::valid_until) moves to now + `lease` minus the drift margin, unless
    /// it was later already (an extension never shortens a hold). For work that takes longer
    /// than planned under a lease; holds taken without a lease are renewed by the watchdog and
    /// need no extension.
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::Client) -> fairlock::Result<()> {
    /// use std::time::Duration;
    /// let guard = client.fair_lock("import").lock_with_lease(Duration::from_secs(10)).await?;
    /// // ... the first part took longer than expected ...
    /// guard.extend(Duration::from_secs(10)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a hold renewed by the watchdog, or a lease under
    /// [`MIN_LEASE`](crate::MIN_LEASE) or over [`MAX_DURATION`](crate::MAX_DURATION); [`Error::NotHeld`] when the guard is known
    /// [lost](Self::lost) (its lease ran out before the extension reached Redis) or Redis no
    /// longer has its holds; [`Error::Redis`] when the extension could not be sent (the hold
    /// keeps the lease it had; it may or may not have been extended in Redis);
    /// [`Error::Shutdown`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the hold with the lease it had locally (Redis may
    /// have extended it already, which only keeps the lock longer).
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        self.hold.extend(lease).await
    }

    /// Releases this hold and reports the outcome.
    ///
    /// For a reentrant holder this releases one hold; the lock stays held until the last.
    ///
    /// One rule for every kind of lock (fair, non-fair, either side of a read-write lock):
    /// `Ok(())` means this call released a hold that Redis still had for this guard's owner.
    /// Whenever the hold was no longer there to release, the answer is [`Error::NotHeld`],
    /// whatever took it away: its fixed lease ran out (even if nobody took the lock since), an
    /// operator's [`force_unlock`](crate::FairLock::force_unlock), an eviction or a failover, or
    /// the guard was already known [lost](Self::lost) (gone, renewals failed, validity window
    /// passed, shutdown). The work done under such a guard may not have been protected, and the
    /// error says so. (Redisson's fair unlock answers success for an expired lock and its `RLock`
    /// throws; fairlock answers the same for both.) The lock's waiters are woken either way.
    ///
    /// # Errors
    /// [`Error::NotHeld`] as above; [`Error::Redis`] when the release could not be sent. After an error the
    /// watchdog no longer renews this hold, so the lock expires within its lease.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before the release completes, the client's
    /// background task finishes it, so the hold is still released exactly once; only the outcome
    /// is lost. The release keeps its place in the lock's order either way: a later call of the
    /// same holder on the same lock reaches Redis after it.
    pub async fn unlock(self) -> Result<()> {
        self.hold.unlock().await
    }

    /// Takes one more hold on this guard's lock for the same holder (re-entry): at once, without
    /// waiting or queueing, because the holder holds it. The new guard is a hold of its own (the
    /// count in Redis goes up by one, as Redisson's reentrant count) with its own lease: `None`
    /// for the watchdog, `Some(lease)` for a fixed one; the lock lives as long as the longest
    /// live hold needs it. A fenced guard's re-entry is fenced too (a new token).
    ///
    /// This is the way to re-enter from code that holds a guard; calls that do not have one can
    /// share a hold through [`holder`](Self::holder) and `with_holder`.
    ///
    /// If the holds were taken away without the client knowing yet (a force unlock not yet seen
    /// by a renewal) and the lock is free, the call takes it afresh: the new guard is a valid
    /// hold of its own, and this guard is then reported [lost](Self::lost).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the guard is known [lost](Self::lost) or the lock turns out to be
    /// held by somebody else; [`Error::InvalidArgument`] for a lease under [`MIN_LEASE`](crate::MIN_LEASE); [`Error::Redis`],
    /// [`Error::Shutdown`].
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while its attempt is in flight, a hold granted
    /// too late is given back in the background, in the holder's order.
    pub async fn reenter(&self, lease: Option<Duration>) -> Result<LockGuard> {
        match crate::engine::acquire::reenter(&self.hold, lease).await? {
            Some(hold) => Ok(LockGuard::new(hold)),
            None => Err(Error::NotHeld),
        }
    }
}

/// An owned signal of one guard's end: see [`LockGuard::lost_signal`]. Cheap to clone; every
/// clone sees the same end. It keeps the guard's client alive, not the hold.
#[derive(Debug, Clone)]
pub struct LostSignal(Signal);

impl LostSignal {
    /// Resolves once the lock of the guard can no longer be trusted (with the reason
    /// [`LockGuard::lost`] gives) or the guard was unlocked or dropped
    /// ([`LostReason::Released`]), whichever comes first.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing, and awaiting again later still resolves.
    pub async fn lost(&self) -> LostReason {
        self.0.lost().await
    }

    /// Whether [`lost`](Self::lost) would resolve now (no I/O).
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }
}

/// `signal.await` is `signal.lost().await`, for an owned signal moved into a task.
///
/// ```no_run
/// # async fn demo(client: fairlock::Client) -> fairlock::Result<()> {
/// let guard = client.fair_lock("reports").lock().await?;
/// let signal = guard.lost_signal();
/// tokio::spawn(async move {
///     let reason = signal.await;
///     tracing::warn!(%reason, "stop: the lock is gone or released");
/// });
/// # Ok(()) }
/// ```
impl std::future::IntoFuture for LostSignal {
    type Output = LostReason;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = LostReason> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.lost().await })
    }
}
