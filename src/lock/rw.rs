//! [`ReadWriteLock`] and its two sides, [`ReadLock`] and [`WriteLock`]: Redisson's
//! `RReadWriteLock` layout (PROTOCOL 10).
//!
//! No logic of their own: each side is a [`Handle`] of its kind (`Kind::Read`, `Kind::Write`),
//! so waiting, re-entry, the watchdog, leases, loss and cancel safety are the mutex's; what
//! differs is in the scripts (`lua/rw_*.lua`) and in the lock's broadcast channel.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::acquire::Handle;
use crate::engine::inner::Inner;
use crate::error::Result;
use crate::keys::Kind;
use crate::lock::holder::Holder;
use crate::lock::mutex::LockGuard;
use crate::state::RwLockState;

/// A read-write lock in Redisson's `RReadWriteLock` layout: many readers or one writer, shared
/// with Java services that use `getReadWriteLock(name)` on the same name.
///
/// The lock is one hash, `NAME`: field `mode` (`read` or `write`), one field per read holder
/// (`<client uuid>:<holder id>`, its hold count) and the writer's (`…:write`). Every read hold
/// also has a lease key `{NAME}:<field>:rwlock_timeout:<k>` with the hold's lease as TTL, which
/// the watchdog renews with the hash: a Redisson reader leaving counts the other readers alive
/// by those keys, so a reader that crashed stops counting when its lease keys expire.
/// Releases are announced on `redisson_rwlock:{NAME}` (`0`: the last reader left, `1`: a writer
/// left); every local waiter of a client wakes on each message and tries again.
///
/// Like Redisson's, the lock is **not fair**: a reader enters whenever the lock is free or in
/// read mode, so a steady stream of readers keeps a writer waiting. Each side is a handle with
/// the mutex's API ([`ReadLock`], [`WriteLock`]) and hands out the mutex's [`LockGuard`]:
/// watchdog or fixed lease, [`lost`](LockGuard::lost), [`run`](LockGuard::run),
/// [`reenter`](LockGuard::reenter), cancel-safe waits. Every acquisition call is its own
/// holder unless a [`Holder`] is given, as for the mutex.
///
/// * **Downgrade** (write → read): a holder that holds the write lock may take the read lock
///   too (give both sides the same [`Holder`]); releasing the write lock then leaves it in
///   read mode, and other readers are woken.
/// * **Upgrade** (read → write) by **one [`Holder`]** is refused with
///   [`Error::UpgradeRefused`](crate::Error::UpgradeRefused): the writer would wait for ever
///   behind its own holder's read holds (in Redisson it does). A dropped or unlocked read guard
///   of the holder no longer counts: `drop(r); write.lock()` of one holder waits for that
///   release to reach Redis and then takes the write lock, as `r.unlock().await` first would.
/// * **Without a shared holder, a task that holds one side and asks for the other waits for
///   ever on itself**, as with `tokio::sync::RwLock`. Every acquisition call is its own holder,
///   so a read guard and a later `write_lock().lock()` of the same task are two holders: the
///   writer waits for the read guard, which the task never releases because it is waiting. The
///   same goes for a write guard and a later `read_lock().lock()` (only the writer's own holder
///   may downgrade). Nothing refuses these calls, because nothing can tell they come from one
///   task: release the first guard before asking for the other side, or give both sides one
///   [`Holder`] (then an upgrade is refused and a downgrade allowed, as above).
///
///   ```no_run
///   # async fn demo(rw: fairlock::ReadWriteLock) -> fairlock::Result<()> {
///   let r = rw.read_lock().lock().await?;
///   // rw.write_lock().lock().await?;  // would wait for `r` for ever: this task holds it
///   drop(r); // released in the background, before this task's next call reaches Redis
///   let w = rw.write_lock().lock().await?;
///   # drop(w); Ok(()) }
///   ```
/// * **Fencing**: [`WriteLock::fenced`] hands every write acquisition a token from
///   `redisson_lock_token:{NAME}`; readers get none.
/// * **Fixed read leases next to Redisson readers**: Redisson's renewal of a read hold sets the
///   lock's TTL to its watchdog timeout (30 s by default), which can shorten it; a read hold
///   with a longer fixed lease can then end early, unannounced, once that Redisson reader goes
///   away. Keep fixed read leases within Redisson's `lockWatchdogTimeout`, or use the watchdog
///   (PROTOCOL 10, F10).
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let rw = client.read_write_lock("catalog");
///
/// // Many readers at once.
/// let r1 = rw.read_lock().lock().await?;
/// let r2 = rw.read_lock().lock().await?;
/// drop((r1, r2)); // released in the background
///
/// // One writer, then a downgrade: keep reading what was written, let other readers in.
/// let me = client.holder();
/// let w = rw.write_lock().with_holder(me).lock().await?;
/// let r = rw.read_lock().with_holder(me).lock().await?;
/// w.unlock().await?; // now in read mode, other readers may enter
/// r.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[doc(alias = "RReadWriteLock")]
#[doc(alias = "RwLock")]
#[must_use = "a lock handle does nothing until one of its methods is called"]
pub struct ReadWriteLock {
    read: ReadLock,
    write: WriteLock,
}

impl ReadWriteLock {
    pub(crate) fn new(inner: Arc<Inner>, name: String) -> Self {
        ReadWriteLock {
            read: ReadLock(Handle::new(inner.clone(), name.clone(), Kind::Read)),
            write: WriteLock(Handle::new(inner, name, Kind::Write)),
        }
    }

    /// Makes both sides of this handle **writer-preferring** among fairlock clients: their
    /// waiters queue in arrival order in keys of fairlock's own (PROTOCOL 10), a reader enters
    /// only when no writer of the queue arrived before it (readers that arrive together enter
    /// together), and a writer only at the head of the queue. So a waiting writer keeps later
    /// readers of such handles out, and a steady stream of them can no longer starve it.
    ///
    /// What it cannot promise: Redisson clients, and fairlock handles without this setting, never
    /// look at the queue; they enter whenever Redisson's rules let them (a reader whenever the
    /// lock is free or in read mode), so their readers can still keep a queued writer waiting.
    /// Nothing is written into the lock's hash, so Java clients see exactly Redisson's data.
    /// Re-entries, and a writer's holder taking the read side (a downgrade), never queue.
    ///
    /// **A second read while holding one can deadlock**, as with `tokio::sync::RwLock`: every
    /// acquisition call is its own holder, so a task that holds a read of such a handle and then
    /// waits for another one (or polls two reads together, `join!(r1.lock(), r2.lock())`) waits
    /// behind any writer that queued in between, and that writer waits for the first read.
    /// Share the guard you hold, re-enter with the same [`Holder`](crate::Holder)
    /// (`read_lock().with_holder(h)`), or take the second read from a handle without this
    /// setting.
    ///
    /// A queued waiter's place is kept alive by its client's heartbeats (every third of
    /// [`Builder::waiter_liveness`](crate::Builder::waiter_liveness)); the place of a waiter
    /// whose process died is dropped within that window, and a waiter that stops waiting leaves
    /// the queue at once. The queue's keys vanish with the last waiter.
    ///
    /// ```no_run
    /// # async fn demo(client: fairlock::Client) -> fairlock::Result<()> {
    /// let rw = client.read_write_lock("catalog").writer_preferring();
    /// let w = rw.write_lock().lock().await?; // later readers of `rw` wait behind this writer
    /// # drop(w); Ok(()) }
    /// ```
    pub fn writer_preferring(mut self) -> Self {
        self.read.0.set_prefer_writers();
        self.write.0.set_prefer_writers();
        self
    }

    /// The lock's name (also the Redis key of its hash).
    pub fn name(&self) -> &str {
        self.read.0.name()
    }

    /// The read side: shared holds.
    pub fn read_lock(&self) -> ReadLock {
        self.read.clone()
    }

    /// The write side: an exclusive hold.
    pub fn write_lock(&self) -> WriteLock {
        self.write.clone()
    }

    /// A snapshot of the lock: mode, writer, readers with their lease keys, TTL. Java holders
    /// are included.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName), [`Error::Redis`](crate::Error::Redis).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn state(&self) -> Result<RwLockState> {
        self.read.0.rw_state().await
    }

    /// Whether anyone holds the lock (either side).
    ///
    /// # Errors
    /// As [`state`](Self::state).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.state().await?.is_locked())
    }

    /// Deletes the lock in whichever mode it is, whoever holds it, and wakes every waiter
    /// (publishes `0` after read mode, `1` after write mode). Holders find out at their next
    /// renewal ([`LostReason::Gone`](crate::LostReason::Gone)). Returns whether it was held.
    ///
    /// # Errors
    /// As [`state`](Self::state).
    ///
    /// # Cancel safety
    /// The delete may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.read.0.rw_force_unlock(None).await
    }
}

/// The read side of a [`ReadWriteLock`]: a shared hold, taken whenever the lock is free or in
/// read mode (or held for writing by the same holder: a downgrade). Made by
/// [`ReadWriteLock::read_lock`].
#[derive(Clone, Debug)]
#[must_use = "a lock handle does nothing until one of its methods is called"]
pub struct ReadLock(Handle);

/// The write side of a [`ReadWriteLock`]: an exclusive hold, taken when the lock is free (or
/// re-entered by the holder that has it). Made by [`ReadWriteLock::write_lock`].
#[derive(Clone, Debug)]
#[must_use = "a lock handle does nothing until one of its methods is called"]
pub struct WriteLock(Handle);

impl ReadLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Makes every acquisition call through this handle one holder (see
    /// [`FairLock::with_holder`](crate::FairLock::with_holder)). Give the read and the write
    /// side the same holder to downgrade.
    #[must_use = "with_holder() returns a new handle; the original is unchanged"]
    pub fn with_holder(mut self, holder: Holder) -> Self {
        self.0.set_holder(holder.id());
        self
    }

    /// Waits as long as it takes, then holds the read lock with the watchdog
    /// renewing it.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName), [`Error::Redis`](crate::Error::Redis),
    /// [`Error::Shutdown`](crate::Error::Shutdown), and for the write side
    /// [`Error::UpgradeRefused`](crate::Error::UpgradeRefused). Transient failures are
    /// retried as [`FairLock::lock`](crate::FairLock::lock) describes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops waiting; if the lock was granted after the
    /// caller stopped waiting, it is released again.
    pub async fn lock(&self) -> Result<LockGuard> {
        Ok(crate::LockGuard::new(self.0.acquire_unbounded(None).await?))
    }

    /// Waits as long as it takes, then holds the read lock for at most `lease`
    /// (never renewed).
    ///
    /// # Errors
    /// As [`lock`](Self::lock), plus [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for a lease under [`MIN_LEASE`](crate::MIN_LEASE) (3 ms) or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        Ok(crate::LockGuard::new(
            self.0.acquire_unbounded(Some(lease)).await?,
        ))
    }

    /// Waits at most `wait`; `lease: None` uses the watchdog. `Ok(None)` when `wait` ran
    /// out. Returns within `wait` plus one round trip (bounded by the command timeout).
    ///
    /// # Errors
    /// As [`lock_with_lease`](Self::lock_with_lease); transient failures are retried only
    /// until `wait` runs out.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        Ok(self
            .0
            .acquire(Some(wait), lease)
            .await?
            .map(crate::LockGuard::new))
    }

    /// Takes the read lock as [`lock`](Self::lock) does, runs `work` while it is
    /// trusted and releases it afterwards (see [`LockGuard::run`]).
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`Error::Lost`](crate::Error::Lost) when the lock was lost
    /// before the work finished.
    ///
    /// # Cancel safety
    /// Cancel safe: while waiting, as [`lock`](Self::lock); while the work runs, it drops
    /// the work and releases the lock in the background.
    pub async fn run<F: std::future::Future>(&self, work: F) -> Result<F::Output> {
        self.lock().await?.run(work).await
    }

    /// How many holds of this side this handle's holder has (for a handle without one:
    /// every holder of this client together).
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName), [`Error::Redis`](crate::Error::Redis).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn hold_count(&self) -> Result<u32> {
        self.0.hold_count().await
    }

    /// Whether the lock is held for reading, as Redisson's `isLocked` of that side
    /// says (for the read side: in read mode, or in write mode with read holds of the
    /// writer's).
    ///
    /// # Errors
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn is_locked(&self) -> Result<bool> {
        self.0.is_locked().await
    }

    /// A snapshot of the whole lock (see [`ReadWriteLock::state`]).
    ///
    /// # Errors
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn state(&self) -> Result<RwLockState> {
        self.0.rw_state().await
    }

    /// Deletes the lock only if it is in read mode (Redisson's `forceUnlock` of this
    /// side), whoever holds it, and wakes every waiter. Returns whether it was deleted.
    ///
    /// # Errors
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Cancel safety
    /// The delete may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.0.force_unlock().await
    }
}

impl WriteLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Makes every acquisition call through this handle one holder (see
    /// [`FairLock::with_holder`](crate::FairLock::with_holder)). Give the read and the write
    /// side the same holder to downgrade.
    #[must_use = "with_holder() returns a new handle; the original is unchanged"]
    pub fn with_holder(mut self, holder: Holder) -> Self {
        self.0.set_holder(holder.id());
        self
    }

    /// Waits as long as it takes, then holds the write lock with the watchdog
    /// renewing it.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName), [`Error::Redis`](crate::Error::Redis),
    /// [`Error::Shutdown`](crate::Error::Shutdown), and for the write side
    /// [`Error::UpgradeRefused`](crate::Error::UpgradeRefused). Transient failures are
    /// retried as [`FairLock::lock`](crate::FairLock::lock) describes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops waiting; if the lock was granted after the
    /// caller stopped waiting, it is released again.
    pub async fn lock(&self) -> Result<LockGuard> {
        Ok(crate::LockGuard::new(self.0.acquire_unbounded(None).await?))
    }

    /// Waits as long as it takes, then holds the write lock for at most `lease`
    /// (never renewed).
    ///
    /// # Errors
    /// As [`lock`](Self::lock), plus [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for a lease under [`MIN_LEASE`](crate::MIN_LEASE) (3 ms) or longer than [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard> {
        Ok(crate::LockGuard::new(
            self.0.acquire_unbounded(Some(lease)).await?,
        ))
    }

    /// Waits at most `wait`; `lease: None` uses the watchdog. `Ok(None)` when `wait` ran
    /// out. Returns within `wait` plus one round trip (bounded by the command timeout).
    ///
    /// # Errors
    /// As [`lock_with_lease`](Self::lock_with_lease); transient failures are retried only
    /// until `wait` runs out.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        Ok(self
            .0
            .acquire(Some(wait), lease)
            .await?
            .map(crate::LockGuard::new))
    }

    /// Takes the write lock as [`lock`](Self::lock) does, runs `work` while it is
    /// trusted and releases it afterwards (see [`LockGuard::run`]).
    ///
    /// # Errors
    /// As [`lock`](Self::lock); [`Error::Lost`](crate::Error::Lost) when the lock was lost
    /// before the work finished.
    ///
    /// # Cancel safety
    /// Cancel safe: while waiting, as [`lock`](Self::lock); while the work runs, it drops
    /// the work and releases the lock in the background.
    pub async fn run<F: std::future::Future>(&self, work: F) -> Result<F::Output> {
        self.lock().await?.run(work).await
    }

    /// How many holds of this side this handle's holder has (for a handle without one:
    /// every holder of this client together).
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName), [`Error::Redis`](crate::Error::Redis).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn hold_count(&self) -> Result<u32> {
        self.0.hold_count().await
    }

    /// Whether the lock is held for writing, as Redisson's `isLocked` of that side
    /// says (for the read side: in read mode, or in write mode with read holds of the
    /// writer's).
    ///
    /// # Errors
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn is_locked(&self) -> Result<bool> {
        self.0.is_locked().await
    }

    /// A snapshot of the whole lock (see [`ReadWriteLock::state`]).
    ///
    /// # Errors
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn state(&self) -> Result<RwLockState> {
        self.0.rw_state().await
    }

    /// Deletes the lock only if it is in write mode (Redisson's `forceUnlock` of this
    /// side), whoever holds it, and wakes every waiter. Returns whether it was deleted.
    ///
    /// # Errors
    /// As [`hold_count`](Self::hold_count).
    ///
    /// # Cancel safety
    /// The delete may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.0.force_unlock().await
    }

    /// Hands out a fencing token with every write acquisition (re-entries too): the lock's
    /// counter `redisson_lock_token:{NAME}`, incremented atomically with the grant (see the
    /// crate docs on [fencing](crate#fencing-tokens)).
    #[must_use = "fenced() returns a new handle; the original is unchanged"]
    pub fn fenced(mut self) -> Self {
        self.0.set_fenced();
        self
    }
}
