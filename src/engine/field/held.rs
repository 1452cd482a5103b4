//! [`Held`]: one lock and owner field in one client, with its account in its lane, the loss
//! epochs its guards ask about and its validity deadline (see the module documentation of
//! `field/`); and the client's registry of them, [`Helds`] (below).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::account::Account;
use super::losses::{from_nanos, to_nanos, DeadlineCell, LossLog, Reading};
use crate::engine::inner::Inner;
use crate::engine::lane::{Lane, LaneOwner, Turn};
use crate::engine::validity::{validity_deadline, LostReason};
use crate::error::{Error, Result};
use crate::keys::LockSpec;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Unique ids for guards and fields.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// One lock and owner field in one client; see the module documentation. Shared by the guards,
/// the calls working on the field and the watchdog (which keeps only a `Weak`).
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) id: u64,
    pub(crate) inner: Arc<Inner>,
    pub(crate) spec: Arc<LockSpec>,
    pub(crate) field: Arc<str>,
    pub(crate) lane: Lane<Held>,
    /// Bumped each time the live holds are lost; a guard made before a bump is lost.
    epoch: AtomicU64,
    /// Why and until when each loss that a live guard may still ask about (see [`LossLog`]).
    losses: Mutex<LossLog>,
    /// Live guards made at the current epoch (changed only under `losses`' lock).
    live_now: std::sync::atomic::AtomicU32,
    /// Wakes `lost()` futures on every bump and every change of the validity deadline.
    notify: Notify,
    /// The validity deadline of the live holds (unset: none).
    valid_until: DeadlineCell,
    /// The watchdog, not a fixed lease, sets `valid_until`.
    valid_by_watchdog: AtomicBool,
    /// The last lapsed deadline marked lost ([`to_nanos`]; 0: none), so one lapse is marked once.
    lapse_marked: AtomicU64,
    /// [`PER_CALL`] and [`EXPOSED`]: whether the holder id may be reused when this is dropped;
    /// [`SUBSCRIBED`]: whether its waiter channel may linger then.
    reuse: std::sync::atomic::AtomicU8,
}

/// The holder is a call's own (no `Holder` was passed).
const PER_CALL: u8 = 1;
/// The holder id was handed to the user (a guard's `holder()`).
const EXPOSED: u8 = 2;
/// A call of the field held a subscription of its waiter channel.
const SUBSCRIBED: u8 = 4;

impl Held {
    /// A field with nothing in it yet (the registry makes them).
    pub(super) fn new(inner: Arc<Inner>, spec: Arc<LockSpec>, field: Arc<str>) -> Self {
        Held {
            id: next_id(),
            inner,
            spec,
            field,
            lane: Lane::new(Account::default()),
            epoch: AtomicU64::new(0),
            losses: Mutex::new(LossLog::default()),
            live_now: std::sync::atomic::AtomicU32::new(0),
            notify: Notify::new(),
            valid_until: DeadlineCell::default(),
            valid_by_watchdog: AtomicBool::new(false),
            lapse_marked: AtomicU64::new(0),
            reuse: std::sync::atomic::AtomicU8::new(0),
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.spec.name()
    }

    /// The holder id: the part of the owner field after the client id.
    pub(crate) fn holder_id(&self) -> i64 {
        // (A writer's field ends in `:write` after the id; `split_field` drops that.)
        crate::keys::split_field(&self.field)
            .1
            .expect("an owner field this client built ends with its holder id")
    }

    /// The field's holder is a call's own: its id may be reused once nothing of it is left.
    pub(crate) fn mark_per_call(&self) {
        self.reuse.fetch_or(PER_CALL, Ordering::Relaxed);
    }

    /// A call of the field holds a subscription of its waiter channel: when the holder id is
    /// reused, the channel may still be subscribed (it lingers), so that call looks for it.
    pub(crate) fn mark_subscribed(&self) {
        self.reuse.fetch_or(SUBSCRIBED, Ordering::Relaxed);
    }

    /// The holder id was handed out: it is never reused.
    pub(crate) fn expose(&self) {
        self.reuse.fetch_or(EXPOSED, Ordering::Relaxed);
    }

    /// The current loss epoch (a new guard records it).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn losses(&self) -> MutexGuard<'_, LossLog> {
        self.losses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new guard: returns the epoch it is made at and counts it live there, in one step with
    /// respect to bumps, so the loss it may later ask about is kept for it.
    pub(crate) fn guard_made(&self) -> u64 {
        let _losses = self.losses();
        self.live_now.fetch_add(1, Ordering::Relaxed);
        self.epoch()
    }

    /// A guard made at `epoch` is gone: a loss only it could ask about is forgotten.
    pub(crate) fn guard_gone(&self, epoch: u64) {
        let mut losses = self.losses();
        if epoch == self.epoch() {
            self.live_now.fetch_sub(1, Ordering::Relaxed);
        } else {
            losses.guard_gone(epoch);
        }
    }

    fn loss(&self, epoch: u64) -> (LostReason, Instant) {
        self.losses().loss(epoch)
    }

    /// Why a guard made at `epoch` is lost, if it is.
    ///
    /// The deadline is read before the epoch: a revalidation bumps the epoch before it stores
    /// the next epoch's deadline, so a reader that sees that deadline also sees the bump.
    pub(crate) fn lost_since(&self, epoch: u64) -> Option<LostReason> {
        loop {
            let read = self.valid_until.read();
            if self.epoch() > epoch {
                return Some(self.loss(epoch).0);
            }
            match read.at(Instant::now()) {
                Reading::Ahead(_) => return None,
                // A guard of the current epoch is made only with a deadline in the future (in
                // one step with its registration), so it always has one; none would mean
                // nothing keeps the lock for it, and the safe answer is then "lost".
                Reading::Unset => return Some(self.validity_reason()),
                // Passed: marked so in the cell, so no revalidation can move it on unseen.
                Reading::Passed(_) if self.valid_until.mark_seen(read) => {
                    return Some(self.validity_reason())
                }
                Reading::Passed(_) => {}
            }
        }
    }

    /// Until when a guard made at `epoch` can be trusted (read in the order `lost_since` reads).
    pub(crate) fn valid_until_since(&self, epoch: u64) -> Instant {
        let read = self.valid_until.read();
        if self.epoch() > epoch {
            return self.loss(epoch).1;
        }
        read.deadline().unwrap_or_else(|| from_nanos(0))
    }

    fn validity_reason(&self) -> LostReason {
        if self.valid_by_watchdog.load(Ordering::Acquire) {
            LostReason::ValidityExpired
        } else {
            LostReason::LeaseExpired
        }
    }

    /// The current validity deadline, if the field has live holds.
    pub(crate) fn valid_until(&self) -> Option<Instant> {
        self.valid_until.read().deadline()
    }

    /// Waits until the next loss or validity change (for `lost()`), registered before the caller
    /// checks, so nothing in between is missed.
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Marks every live guard lost (a new epoch) for `reason`. Must not be called while the
    /// lane's state is borrowed.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let live = self.lane.with(|a| a.has_guards());
        self.bump(reason, Instant::now());
        if live {
            self.report_lost(reason);
        }
    }

    /// Logs and counts a loss that affected live guards.
    fn report_lost(&self, reason: LostReason) {
        if reason == LostReason::Shutdown {
            tracing::debug!(lock = self.name(), field = &*self.field, %reason, "lock released");
        } else {
            tracing::warn!(lock = self.name(), field = &*self.field, %reason, "lock lost");
        }
        let names = self.inner.config.metrics_lock_names;
        crate::metrics::lost(&self.spec, names, reason.label());
    }

    fn bump(&self, reason: LostReason, at: Instant) {
        // The guards of the ending epoch were trusted until their deadline or now, whichever
        // came first; with no deadline they already read as lost (see `lost_since`), and their
        // `valid_until` must not move later than what they reported then.
        let until = match self.valid_until() {
            Some(v) => v.min(at),
            None => from_nanos(0),
        };
        let mut losses = self.losses();
        let live = self.live_now.swap(0, Ordering::Relaxed);
        let epoch = losses.bump(self.epoch(), live, reason, until);
        self.epoch.store(epoch, Ordering::Release);
        drop(losses);
        self.notify.notify_waiters();
    }

    /// Recomputes the validity deadline from the account. If the deadline in force has passed,
    /// or the new one already lies in the past (the hold that kept the lock alive was released,
    /// and the others' leases ran out meanwhile), the guards are marked lost first, so that a
    /// later grant or renewal never makes a lost guard look valid again. A lapsed deadline is
    /// cleared once it has been marked, so one lapse is marked once.
    pub(super) fn revalidate(&self, account: &Account) {
        self.revalidate_at(account, Instant::now());
    }

    /// [`revalidate`](Self::revalidate) as of `now` (a caller that has just checked a deadline
    /// against `now` passes the same instant, so the two can never disagree).
    pub(super) fn revalidate_at(&self, account: &Account, now: Instant) {
        let new = account.validity();
        let next = match new {
            Some((until, by_watchdog)) if until > now => {
                self.valid_by_watchdog.store(by_watchdog, Ordering::Release);
                Some(until)
            }
            _ => None,
        };
        let marked = self.lapse_marked.load(Ordering::Acquire);
        loop {
            let old = self.valid_until.read();
            let lapsed = match (old.at(now), new) {
                (Reading::Passed(until), _) => Some((self.validity_reason(), until)),
                (_, Some((until, by_watchdog))) if until <= now && to_nanos(until) > marked => {
                    Some((
                        if by_watchdog {
                            LostReason::ValidityExpired
                        } else {
                            LostReason::LeaseExpired
                        },
                        until,
                    ))
                }
                _ => None,
            };
            if let Some((reason, until)) = lapsed {
                self.lapse_marked
                    .fetch_max(to_nanos(until), Ordering::AcqRel);
                // The epoch moves before the next deadline is stored (see `lost_since`).
                self.bump(reason, until);
                if account.has_guards() {
                    self.report_lost(reason);
                }
                self.valid_until.set(next);
                break;
            }
            // Outside the lane's mutex only `lost_since` changes the cell (it marks a passed
            // deadline seen): if it did, the next round finds the deadline passed.
            if self.valid_until.replace(old, next) {
                break;
            }
        }
        self.notify.notify_waiters();
    }

    /// The holds of the current generation are gone from Redis without us: start a new
    /// generation and tell its guards.
    pub(super) fn holds_vanished(&self, account: &mut Account, reason: LostReason) {
        let had_guards = account.has_guards();
        account.gen += 1;
        account.pending_releases = 0;
        account.watchdog_guards = 0;
        account.watchdog_valid = None;
        account.fixed.clear();
        account.unconfirmed = false;
        self.bump(reason, Instant::now());
        self.valid_until.set(None);
        if had_guards {
            self.report_lost(reason);
        }
    }

    /// Redis has no hold of ours for the field any more. That ends the generation: a release
    /// still queued for one of its holds (a guard that detached before everything was released
    /// at once, or before the holds expired) must not take a hold granted later. Live guards of
    /// the generation, if any, are lost.
    pub(super) fn emptied(&self, account: &mut Account, reason: LostReason) {
        account.count = 0;
        account.dark = false;
        account.uncertain = 0;
        if account.has_guards() {
            self.holds_vanished(account, reason);
        } else {
            account.gen += 1;
            account.pending_releases = 0;
        }
    }

    /// A watchdog renewal (or the extension of a direct grant) sent at `sent`, when the field
    /// had made `grants` grants, succeeded: the watchdog holds are valid for another `timeout`
    /// from then, and a direct grant made before it is extended to its lease (its fixed holds
    /// trusted for their whole lease). A grant made after the renewal was sent is not
    /// confirmed by it. `shortened`: the renewal found another client keeping the lock's TTL
    /// shorter, down to `timeout`: the watchdog holds are trusted only that long from `sent`,
    /// even if an earlier renewal promised more.
    pub(crate) fn renewed(&self, sent: Instant, timeout: Duration, grants: u64, shortened: bool) {
        self.lane.with(|a| {
            if a.unconfirmed && a.grants == grants {
                a.unconfirmed = false;
                for hold in &mut a.fixed {
                    hold.valid = hold.valid.max(hold.full);
                }
            }
            if a.watchdog_guards > 0 {
                let valid = validity_deadline(sent, timeout);
                if shortened || a.watchdog_valid.is_none_or(|v| v < valid) {
                    a.watchdog_valid = Some(valid);
                }
            }
            self.revalidate(a);
        });
    }

    /// Whether the watchdog renews the field: a live watchdog hold, or a direct grant whose
    /// short TTL is not extended yet.
    pub(crate) fn wants_renewal(&self) -> bool {
        self.lane
            .with(|a| a.watchdog_guards > 0 || (a.unconfirmed && a.has_guards()))
    }

    /// The TTL (ms) a renewal of the field sets: the watchdog timeout while a watchdog hold
    /// lives, else (a direct grant of fixed holds being extended) what the fixed holds need.
    pub(crate) fn renewal_ttl_ms(&self, timeout: Duration) -> i64 {
        self.lane.with(|a| {
            if a.watchdog_guards > 0 {
                timeout.as_millis() as i64
            } else {
                a.remaining_ttl_ms(Instant::now()).max(1)
            }
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Nothing refers to this field any more: the driver drops its timers on its next look
        // (lazily: no task wake-up on the uncontended path, and no I/O here).
        self.inner
            .driver
            .send_lazy(crate::engine::driver::Work::Forget { id: self.id });
        // A call's own holder that left nothing Redis may hold unseen can serve a later call
        // (see `Inner::reuse_holder`). Nothing else refers to the field, so no guard, call or
        // work in its line is left; the account says whether Redis may still hold any of it.
        let flags = *self.reuse.get_mut();
        if flags & !SUBSCRIBED == PER_CALL {
            let clean = self
                .lane
                .with(|a| a.count == 0 && a.uncertain == 0 && !a.dark);
            if clean {
                let subscribed = flags & SUBSCRIBED != 0;
                self.inner
                    .holder_idle(self.spec.name(), self.holder_id(), subscribed);
            }
        }
    }
}

/// The turn on a field's lane.
pub(crate) type FieldTurn = Turn<Held>;

impl crate::engine::driver::Tracked for Held {
    fn id(&self) -> u64 {
        self.id
    }

    fn spec(&self) -> &LockSpec {
        &self.spec
    }

    fn field(&self) -> &str {
        &self.field
    }

    fn grants(&self) -> u64 {
        Held::grants(self)
    }

    fn wants_renewal(&self) -> bool {
        Held::wants_renewal(self)
    }

    fn renewal_ttl_ms(&self, timeout: Duration) -> i64 {
        Held::renewal_ttl_ms(self, timeout)
    }

    fn renewed(&self, sent: Instant, timeout: Duration, grants: u64, shortened: bool) {
        Held::renewed(self, sent, timeout, grants, shortened)
    }

    fn unconfirmed(&self) -> bool {
        Held::unconfirmed(self)
    }

    fn check_validity(&self) -> Option<Instant> {
        self.lane.with(|a| self.revalidate(a));
        Held::valid_until(self)
    }

    fn valid_until(&self) -> Option<Instant> {
        Held::valid_until(self)
    }

    fn mark_lost(&self, reason: LostReason) {
        Held::mark_lost(self, reason)
    }
}

impl LaneOwner for Held {
    type State = Account;

    fn lane(&self) -> &Lane<Held> {
        &self.lane
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held lock costs its client about 1 KiB (benches/watchdog_scale.rs); `Held` is the
    /// largest part of it. Its `Arc` allocation (two counts + `Held`) must stay within 272
    /// bytes, which glibc serves from a 288-byte chunk.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn sizes() {
        assert!(
            std::mem::size_of::<Account>() <= 96,
            "Account: {} bytes",
            std::mem::size_of::<Account>()
        );
        assert!(
            std::mem::size_of::<Held>() <= 256,
            "Held: {} bytes",
            std::mem::size_of::<Held>()
        );
    }
}

// -----------------------------------------------------------------------------------------------
// The client's registry of fields: one [`Held`] per lock name and owner field, whatever the
// kind, made on first use and swept away once nobody refers to it.

/// Registry key of a field: (name, field), whatever the kind (see [`Helds::get`]). It shares the spec and field rather than copying
/// the name.
#[derive(Debug, Clone)]
struct HeldKey {
    spec: Arc<LockSpec>,
    field: Arc<str>,
}

impl PartialEq for HeldKey {
    fn eq(&self, other: &Self) -> bool {
        self.spec.name() == other.spec.name() && self.field == other.field
    }
}

impl Eq for HeldKey {}

impl Hash for HeldKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.name().hash(state);
        self.field.hash(state);
    }
}

/// The client's registry of fields, keyed by (kind, name, field).
#[derive(Debug, Default)]
pub(crate) struct Helds {
    map: Mutex<HashMap<HeldKey, Weak<Held>>>,
    /// Map size after the last sweep of dead entries: the next sweep comes at twice that.
    swept_at: AtomicU64,
}

impl Helds {
    fn lock(&self) -> MutexGuard<'_, HashMap<HeldKey, Weak<Held>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The field's state, made on first use. Entries of fields nobody refers to any more are
    /// swept away as the map grows (amortised O(1) per call).
    ///
    /// One lock name and owner field have one account, whatever the kind: a fair and a plain
    /// lock of one name write the same owner hash, so two accounts would each believe they
    /// count the field's holds, and one's release would take the other's away. A call of the
    /// other kind while the field's state is in use (a guard, a waiting call, a release or any
    /// operation in its line, or holds Redis may still have) is refused with
    /// [`Error::KindConflict`] before anything is sent; an idle state of the other kind is
    /// replaced.
    pub(crate) fn get(
        &self,
        inner: &Arc<Inner>,
        spec: &Arc<LockSpec>,
        field: &Arc<str>,
    ) -> Result<Arc<Held>> {
        let key = HeldKey {
            spec: spec.clone(),
            field: field.clone(),
        };
        let mut map = self.lock();
        if let Some(held) = map.get(&key).and_then(Weak::upgrade) {
            if held.spec.kind == spec.kind {
                return Ok(held);
            }
            let in_use = !held.lane.is_idle()
                || held.lane.with(|a| {
                    a.has_guards()
                        || a.waiting_calls > 0
                        || a.pending_releases > 0
                        || a.count > 0
                        || a.uncertain > 0
                        || a.dark
                });
            if in_use {
                return Err(Error::KindConflict {
                    name: spec.name().to_owned(),
                    field: field.to_string(),
                    held_as: held.spec.kind.label(),
                });
            }
        }
        let held = Arc::new(Held::new(inner.clone(), spec.clone(), field.clone()));
        map.insert(key, Arc::downgrade(&held));
        let swept = self.swept_at.load(Ordering::Relaxed) as usize;
        if map.len() >= (2 * swept).max(64) {
            // Dropping the dead `Weak`s frees nothing a live caller uses; no `Held` is dropped
            // while the map is locked (upgrades above return before we get here).
            map.retain(|_, w| w.strong_count() > 0);
            self.swept_at.store(map.len() as u64, Ordering::Relaxed);
        }
        Ok(held)
    }

    /// The state of `spec`'s lock and `field` if one lives; none is made.
    pub(crate) fn existing(&self, spec: &Arc<LockSpec>, field: &Arc<str>) -> Option<Arc<Held>> {
        let key = HeldKey {
            spec: spec.clone(),
            field: field.clone(),
        };
        self.lock().get(&key).and_then(Weak::upgrade)
    }

    /// Every field with live state (for shutdown).
    pub(crate) fn all(&self) -> Vec<Arc<Held>> {
        self.lock().values().filter_map(Weak::upgrade).collect()
    }
}
