//! Holding a lock: the public [`LockGuard`], one hold on one lock, over the field state that
//! every guard of one holder on one lock shares (`engine/field.rs`).
//!
//! A guard must never do I/O in `Drop`: it leaves the account of its field at once and takes its
//! release's place in the field's line synchronously; the driver sends the release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::lease_ms;
use crate::engine::driver::{Handoff, Work};
use crate::engine::field::{FixedHold, Held};
use crate::engine::lane::Lane;
use crate::engine::release::{release_logged, What};
use crate::engine::validity::LostReason;
use crate::error::{Error, Result};
use crate::lock::holder::Holder;
use crate::wire::Unlocked;

/// What kind of lease a hold has: renewed by the watchdog while the guard lives, or fixed, with
/// the id of the guard's entry in the field's account (one word either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease(Option<std::num::NonZeroU64>);

impl Lease {
    pub(crate) const WATCHDOG: Lease = Lease(None);

    /// A fixed lease whose account entry has `id` (ids start at 1).
    pub(crate) fn fixed(id: u64) -> Lease {
        Lease(std::num::NonZeroU64::new(id))
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
    pub(super) held: Arc<Held>,
    /// The generation of the field's holds this hold belongs to.
    gen: u64,
    /// The field's loss epoch when the hold was taken.
    epoch: u64,
    lease: Lease,
    pub(super) token: Option<u64>,
    armed: bool,
    /// Told when this guard ends, for the [`LostSignal`]s handed out (made on first use).
    ended: std::sync::OnceLock<Arc<Ended>>,
    /// When the hold was granted (for the hold-time metric).
    #[cfg(feature = "metrics")]
    acquired_at: Instant,
}

impl LockGuard {
    pub(crate) fn new(
        held: Arc<Held>,
        gen: u64,
        epoch: u64,
        lease: Lease,
        token: Option<u64>,
    ) -> Self {
        LockGuard {
            held,
            gen,
            epoch,
            lease,
            token,
            armed: true,
            ended: std::sync::OnceLock::new(),
            #[cfg(feature = "metrics")]
            acquired_at: Instant::now(),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// The owner field this hold is recorded under in Redis: `<client uuid>:<holder id>`, and
    /// for the write side of a read-write lock `<client uuid>:<holder id>:write` (Redisson's
    /// layout: a writer's field carries the `:write` suffix, a reader's does not).
    pub fn owner_field(&self) -> &str {
        // Whoever has it can tell this holder from others: its id is never reused for another
        // call (see `Inner::reuse_holder`).
        self.held.expose();
        &self.held.field
    }

    /// The holder this hold belongs to (the second half of [`owner_field`](Self::owner_field)).
    /// Give it to [`FairLock::with_holder`](crate::FairLock::with_holder) (or
    /// [`NonFairLock::with_holder`](crate::NonFairLock::with_holder)) to let other calls, in this task or
    /// others, share this hold.
    pub fn holder(&self) -> Holder {
        // Whoever has it may act as this holder later: its id is never reused for another call.
        self.held.expose();
        Holder::from_field_id(self.held.holder_id())
    }

    /// How many holds this guard's holder has on the lock in this client: the live guards of
    /// its owner field (this one included), or 0 once the holds are known gone from Redis. No
    /// I/O.
    pub fn hold_count(&self) -> u32 {
        self.held.lane.with(|a| {
            if a.gen == self.gen {
                a.watchdog_guards + a.fixed.len() as u32
            } else {
                0
            }
        })
    }

    /// The fencing token of this acquisition, when the handle was [`fenced`](crate::FairLock::fenced).
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// The local validity deadline, on this process's monotonic clock: the send time of the last
    /// acquisition or watchdog renewal that succeeded for the live holds of this lock and owner,
    /// plus its lease, minus a drift margin of 1 % + 2 ms; with several holds, the latest such
    /// deadline among them. Until then no other client can take the lock (barring a failover that
    /// lost it); from then on it may. Once the guard is [lost](Self::lost), the deadline it had
    /// then (or the moment the loss was found, if earlier). Work that must finish under the lock
    /// can be bounded by it.
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until_since(self.epoch)
    }

    /// Whether the lock is known to be lost (cheap, no I/O). See [`lost`](Self::lost).
    pub fn is_lost(&self) -> bool {
        self.held.lost_since(self.epoch).is_some()
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
        wait_lost(&self.held, self.epoch, None).await
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
        LostSignal {
            held: self.held.clone(),
            epoch: self.epoch,
            ended: self.ended.get_or_init(Default::default).clone(),
        }
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
        let ttl_ms = lease_ms("lease", lease)?;
        let Some(id) = self.lease.0 else {
            return Err(Error::invalid_argument(
                "extend",
                "this hold is renewed by the watchdog; only holds taken with a lease are extended",
            ));
        };
        self.held.inner.check_open()?;
        if self.is_lost() {
            return Err(Error::NotHeld);
        }
        // In the field's line, like every operation that changes what Redis holds for it.
        let turn = Lane::enter(&self.held).await;
        if turn.with(|a| a.gen != self.gen) || self.is_lost() {
            return Err(Error::NotHeld);
        }
        let mut conn = self.held.inner.conn.clone();
        let sent = Instant::now();
        let still_held =
            crate::wire::extend(&mut conn, &self.held.spec, &self.held.field, ttl_ms).await?;
        turn.with(|a| {
            if a.gen != self.gen {
                return;
            }
            if !still_held {
                self.held.emptied(a, LostReason::Gone);
                return;
            }
            // A deadline that passed before the extension is marked lost first.
            self.held.revalidate(a);
            if let Some(hold) = a.fixed.iter_mut().find(|h| h.id == id.get()) {
                let extended = FixedHold::new(hold.id, sent, lease);
                if extended.end > hold.end {
                    *hold = extended;
                }
            }
            self.held.revalidate(a);
        });
        drop(turn);
        // The driver's timer for the validity deadline follows the new one.
        self.held.inner.driver.send_lazy(Work::Acquired {
            held: self.held.clone(),
            watchdog: false,
            confirm: None,
        });
        if !still_held || self.is_lost() {
            return Err(Error::NotHeld);
        }
        Ok(())
    }

    /// Tells the lost signals that this guard ends (before its holds are released or its loss
    /// is forgotten), with the loss if there was one.
    fn end_signals(&self) {
        if let Some(ended) = self.ended.get() {
            let reason = self
                .held
                .lost_since(self.epoch)
                .unwrap_or(LostReason::Released);
            ended.end(reason);
        }
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
    pub async fn unlock(mut self) -> Result<()> {
        self.armed = false;
        self.end_signals();
        let known_lost = self.held.lost_since(self.epoch);
        if !self.detach() {
            // The holds of its generation are gone from Redis already.
            return Err(Error::NotHeld);
        }
        let entry = Lane::reserve(&self.held);
        let held = self.held.clone();
        let gen = self.gen;
        let release = Handoff::new(&held.inner.driver.clone(), async move {
            let turn = entry.turn().await;
            release_logged(&held, &turn, What::Guard { gen }).await
        });
        let outcome = release.run().await?;
        match (known_lost, outcome) {
            (Some(_), _) => Err(Error::NotHeld),
            (None, Unlocked::Released | Unlocked::StillHeld) => Ok(()),
            (None, Unlocked::Expired | Unlocked::NotOwner) => Err(Error::NotHeld),
        }
    }

    /// Leaves the field's account (the hold no longer counts for TTLs, validity or the watchdog).
    /// Returns whether the hold is still of the current generation, i.e. whether a release must
    /// be sent for it.
    fn detach(&self) -> bool {
        let held = &self.held;
        #[cfg(feature = "metrics")]
        crate::metrics::held(
            &held.spec,
            held.inner.config.metrics_lock_names,
            self.acquired_at.elapsed(),
        );
        held.lane.with(|a| {
            if a.gen != self.gen {
                return false;
            }
            // A deadline that passed while this hold was live is marked (and reported) first.
            held.revalidate(a);
            match self.lease.0 {
                None => {
                    a.watchdog_guards = a.watchdog_guards.saturating_sub(1);
                    if a.watchdog_guards == 0 {
                        // The next watchdog hold earns its own validity.
                        a.watchdog_valid = None;
                    }
                }
                Some(id) => a.fixed.retain(|h| h.id != id.get()),
            }
            a.pending_releases += 1;
            held.revalidate(a);
            true
        })
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.end_signals();
        self.held.guard_gone(self.epoch);
        if !self.armed || !self.detach() {
            return;
        }
        // No I/O in Drop: the release takes its place in the field's line now, and the driver
        // sends it when its turn comes.
        let held = self.held.clone();
        let gen = self.gen;
        Lane::enter_background(&self.held, move |turn| {
            let driver = held.inner.driver.clone();
            driver.send(Work::Finish(Box::pin(async move {
                let _ = release_logged(&held, &turn, What::Guard { gen }).await;
            })));
        });
    }
}

/// How a guard ended, for its [`LostSignal`]s.
#[derive(Debug, Default)]
pub(crate) struct Ended {
    reason: std::sync::Mutex<Option<LostReason>>,
    notify: tokio::sync::Notify,
}

impl Ended {
    fn end(&self, reason: LostReason) {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(reason);
            drop(slot);
            self.notify.notify_waiters();
        }
    }

    fn get(&self) -> Option<LostReason> {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Until the lock of a guard made at `epoch` on `held` can no longer be trusted, or (with
/// `ended`) until that guard ends.
async fn wait_lost(held: &Held, epoch: u64, ended: Option<&Ended>) -> LostReason {
    loop {
        let changed = held.changed();
        tokio::pin!(changed);
        // Registered before the checks, so a loss, a new deadline or the guard's end after them
        // cannot be missed.
        changed.as_mut().enable();
        let never = tokio::sync::Notify::new();
        let finished = ended.map_or(&never, |e| &e.notify).notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        if let Some(reason) = ended.and_then(Ended::get) {
            return reason;
        }
        if let Some(reason) = held.lost_since(epoch) {
            return reason;
        }
        match held.valid_until() {
            Some(deadline) => {
                tokio::select! {
                    _ = &mut changed => {}
                    _ = &mut finished => {}
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                }
            }
            None => {
                tokio::select! {
                    _ = &mut changed => {}
                    _ = &mut finished => {}
                }
            }
        }
    }
}

/// An owned signal of one guard's end: see [`LockGuard::lost_signal`]. Cheap to clone; every
/// clone sees the same end. It keeps the guard's client alive, not the hold.
#[derive(Debug, Clone)]
pub struct LostSignal {
    held: Arc<Held>,
    epoch: u64,
    ended: Arc<Ended>,
}

impl LostSignal {
    /// Resolves once the lock of the guard can no longer be trusted (with the reason
    /// [`LockGuard::lost`] gives) or the guard was unlocked or dropped
    /// ([`LostReason::Released`]), whichever comes first.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing, and awaiting again later still resolves.
    pub async fn lost(&self) -> LostReason {
        wait_lost(&self.held, self.epoch, Some(&self.ended)).await
    }

    /// Whether [`lost`](Self::lost) would resolve now (no I/O).
    pub fn is_lost(&self) -> bool {
        self.ended.get().is_some() || self.held.lost_since(self.epoch).is_some()
    }
}
