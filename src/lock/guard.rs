//! Holding a lock: the public [`LockGuard`], one hold on one lock, over the field state that
//! every guard of one holder on one lock shares (`engine/field.rs`).
//!
//! A guard must never do I/O in `Drop`: it leaves the account of its field at once and takes its
//! release's place in the field's line synchronously; the driver sends the release.

use std::sync::Arc;
use std::time::Instant;

use crate::engine::driver::{Handoff, Work};
use crate::engine::field::Held;
use crate::engine::lane::Lane;
use crate::engine::release::{release_logged, What};
use crate::engine::validity::LostReason;
use crate::error::{Error, Result};
use crate::keys::Kind;
use crate::lock::holder::Holder;
use crate::ops::Unlocked;

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
            #[cfg(feature = "metrics")]
            acquired_at: Instant::now(),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// The owner field this hold is recorded under in Redis: `<client uuid>:<holder id>`.
    pub fn owner_field(&self) -> &str {
        &self.held.field
    }

    /// The holder this hold belongs to (the second half of [`owner_field`](Self::owner_field)).
    /// Give it to [`FairLock::with_holder`](crate::FairLock::with_holder) (or
    /// [`NonFairLock::with_holder`](crate::NonFairLock::with_holder)) to let other calls, in this task or
    /// others, share this hold.
    pub fn holder(&self) -> Holder {
        let id = self
            .held
            .field
            .rsplit(':')
            .next()
            .and_then(|id| id.parse().ok())
            .expect("an owner field this client built ends with its holder id");
        Holder::from_field_id(id)
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
        loop {
            let changed = self.held.changed();
            tokio::pin!(changed);
            // Registered before the check, so a loss or a new deadline after it cannot be missed.
            changed.as_mut().enable();
            if let Some(reason) = self.held.lost_since(self.epoch) {
                return reason;
            }
            match self.held.valid_until() {
                Some(deadline) => {
                    tokio::select! {
                        _ = &mut changed => {}
                        _ = tokio::time::sleep_until(deadline.into()) => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Releases this hold and reports the outcome.
    ///
    /// For a reentrant holder this releases one hold; the lock stays held until the last.
    ///
    /// On a fair lock, releasing a lock whose lease ran out and that nobody has taken since
    /// succeeds, as in Redisson (the next waiter is woken). Releasing a lock that is known
    /// [lost](Self::lost) for any other reason (gone, renewals failed, validity window passed,
    /// shutdown), or that Redis shows held by somebody else, is [`Error::NotHeld`]; so is a
    /// non-fair [`NonFairLock`](crate::NonFairLock) that expired, as Redisson's `RLock.unlock` throws.
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
        let fair = self.held.spec.kind == Kind::Fair;
        match (known_lost, outcome) {
            // A fixed lease that simply ran out with nobody taking the lock since: Redisson's fair
            // unlock succeeds here, and so do we.
            (Some(LostReason::LeaseExpired), Unlocked::Expired) if fair => Ok(()),
            (Some(_), _) => Err(Error::NotHeld),
            (None, Unlocked::Released | Unlocked::StillHeld) => Ok(()),
            (None, Unlocked::Expired) if fair => Ok(()),
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
