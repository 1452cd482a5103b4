//! Holding a lock: the public [`LockGuard`], one hold on one lock, and its [`LostSignal`]. Both
//! are documented shells over the engine's hold (`engine/hold.rs`), which keeps the hold in its
//! field's account and releases it.

use std::time::{Duration, Instant};

use crate::engine::hold::{Hold, Signal};
use crate::engine::validity::LostReason;
use crate::error::{Error, Result};
use crate::lock::holder::Holder;

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
