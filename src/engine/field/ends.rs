//! How holds leave a field: guards detached, releases and give-ups, replies lost, counts
//! learned, renewals answered, losses and generations; and the registry's walks over every
//! field. Methods of the types in `held.rs`, which are private to `field/`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::held::{
    from_nanos, Account, DeadlineCell, FieldTurn, FixedHold, Held, HeldKey, Helds, HoldRef, Loss,
    LossLog, Reading, Snapshot, What, SEEN_PASSED,
};
use crate::engine::driver::Watch;
use crate::engine::validity::{validity_deadline, LostReason};
use crate::keys::LockSpec;
use crate::wire::ReleaseArgs;

impl Held {
    /// A guard made at `epoch` is gone: a loss only it could ask about is forgotten.
    pub(crate) fn guard_gone(&self, epoch: u64) {
        let mut losses = self.losses();
        if epoch == self.epoch() {
            self.live_now.fetch_sub(1, Ordering::Relaxed);
        } else {
            losses.guard_gone(epoch);
        }
    }

    pub(super) fn loss(&self, epoch: u64) -> (LostReason, Instant) {
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

    pub(super) fn validity_reason(&self) -> LostReason {
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
    pub(super) fn report_lost(&self, reason: LostReason) {
        if reason == LostReason::Shutdown {
            tracing::debug!(lock = self.name(), field = &*self.field, %reason, "lock released");
        } else {
            tracing::warn!(lock = self.name(), field = &*self.field, %reason, "lock lost");
        }
        let names = self.inner.config.metrics_lock_names;
        crate::metrics::lost(&self.spec, names, reason.label());
    }

    pub(super) fn bump(&self, reason: LostReason, at: Instant) {
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

    /// The holds of the current generation are gone from Redis without us: start a new
    /// generation and tell its guards.
    pub(crate) fn holds_vanished(&self, account: &mut Account, reason: LostReason) {
        let had_guards = account.has_guards();
        account.gen += 1;
        account.pending_releases = 0;
        account.watchdog_guards = 0;
        account.set_watchdog_valid(None);
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
    pub(crate) fn emptied(&self, account: &mut Account, reason: LostReason) {
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
                if shortened || a.watchdog_valid().is_none_or(|v| v < valid) {
                    a.set_watchdog_valid(Some(valid));
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

    /// How many live guards the generation `gen` has (0 once it ended).
    pub(crate) fn holds_of(&self, gen: u64) -> u32 {
        self.lane.with(|a| {
            if a.gen == gen {
                a.watchdog_guards + a.fixed.len() as u32
            } else {
                0
            }
        })
    }

    /// A guard of generation `gen` with `hold` leaves the account; its release takes its place in
    /// the line. Returns whether a release must be sent (false: its generation already ended).
    pub(crate) fn guard_detached(&self, gen: u64, hold: HoldRef) -> bool {
        self.lane.with(|a| {
            if a.gen != gen {
                return false;
            }
            // A deadline that passed while this hold was live is marked (and reported) first.
            self.revalidate(a);
            match hold.0 {
                None => {
                    a.watchdog_guards = a.watchdog_guards.saturating_sub(1);
                    if a.watchdog_guards == 0 {
                        // The next watchdog hold earns its own validity.
                        a.set_watchdog_valid(None);
                    }
                }
                Some(id) => a.fixed.retain(|h| h.id != id.get()),
            }
            a.pending_releases += 1;
            self.revalidate(a);
            true
        })
    }

    /// Grants made so far (a renewal reply only speaks for the grants made before it was sent).
    pub(crate) fn grants(&self) -> u64 {
        self.lane.with(|a| a.grants)
    }

    /// Whether a direct grant's short TTL still waits for its extension.
    pub(crate) fn unconfirmed(&self) -> bool {
        self.lane.with(|a| a.unconfirmed)
    }
}

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

    fn watch_look(&self) {
        self.lane.with(|a| a.watch.look())
    }

    fn publish_watch(&self, watch: Watch) -> bool {
        self.lane.with(|a| a.watch.publish(watch))
    }
}

impl Helds {
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

impl Account {
    /// The TTL (ms) the remaining holds need after a release, or -1 to leave the TTL alone (a
    /// watchdog hold remains and the watchdog keeps it, or nothing local needs the lock).
    pub(crate) fn remaining_ttl_ms(&self, now: Instant) -> i64 {
        if self.watchdog_guards > 0 {
            return -1;
        }
        match self.fixed.iter().map(|h| h.end).max() {
            // Rounded up, so the lock never expires before the hold's lease does.
            Some(end) => {
                let left = end.saturating_duration_since(now);
                (left.as_micros().div_ceil(1000) as i64).max(1)
            }
            None => -1,
        }
    }
}

/// The TTL (ms) a release sets, or -1 to leave it alone: what the holds still counted need
/// ([`Account::remaining_ttl_ms`]), but only from the last release waiting in the line. A guard
/// whose release still waits has left the account, yet its hold is in Redis until that release
/// runs: an earlier release that cut the TTL to what the counted guards need (a lapsed lease,
/// perhaps) would expire the lock under a hold still trusted.
fn release_ttl_ms(a: &Account, now: Instant) -> i64 {
    if a.pending_releases > 0 {
        -1
    } else {
        a.remaining_ttl_ms(now)
    }
}

/// The release arguments for `what`, from the account as of `now`; `None` when there is nothing to send.
pub(crate) fn release_plan(a: &Account, what: What, now: Instant) -> Option<ReleaseArgs> {
    match what {
        What::Guard { gen } if gen != a.gen => None,
        What::Guard { .. } | What::Orphan => {
            // The last local hold of the field releases every hold Redis has for it (orphans of
            // lost replies included): nothing local needs them, and the lock is then free. A
            // release of another guard still waiting in the line is the last one, not this.
            let by = if a.has_guards() || a.pending_releases > 0 {
                1
            } else {
                a.count.max(1)
            };
            Some(ReleaseArgs {
                expected: a.count,
                by,
                dark: a.dark,
                remaining_ttl_ms: release_ttl_ms(a, now),
            })
        }
        What::Dark if !a.dark => None,
        What::Dark => Some(ReleaseArgs {
            expected: a.count,
            by: if a.has_guards() || a.pending_releases > 0 {
                0
            } else {
                a.count
            },
            dark: true,
            remaining_ttl_ms: release_ttl_ms(a, now),
        }),
        What::All if a.count == 0 && !a.dark => None,
        What::All => Some(ReleaseArgs {
            expected: a.count,
            by: a.count,
            dark: a.dark,
            remaining_ttl_ms: -1,
        }),
    }
}

impl FieldTurn {
    /// Whether the holds of generation `gen` are still the live ones.
    pub(crate) fn gen_is(&self, gen: u64) -> bool {
        self.with(|a| a.gen == gen)
    }

    /// An attempt was not granted and left the field queued asking for a direct grant for
    /// `nonce` (0: none). Not granted means not re-entered: Redis has no hold of ours.
    pub(crate) fn attempt_waiting(&self, nonce: u64) {
        let held = self.held();
        self.with(|a| {
            if a.count > 0 || a.dark {
                held.emptied(a, LostReason::Gone);
            }
            a.pending_nonce = nonce;
        });
    }

    /// An acquire (or give-up) whose reply was lost: Redis may hold one more than we count until
    /// the next operation compares and sets against it.
    pub(crate) fn reply_lost(&self) {
        self.with(|a| a.dark = true);
    }

    /// A grant message for `nonce` arrived: takes it up as the field's first hold, if the field
    /// is still exactly as the attempt that asked for it left it.
    pub(crate) fn take_up_direct(&self, nonce: u64) -> bool {
        self.with(|a| {
            if a.pending_nonce != nonce || a.count != 0 || a.dark {
                return false;
            }
            a.pending_nonce = 0;
            a.count = 1;
            a.grants += 1;
            true
        })
    }

    /// An extension of the fixed hold `hold` of generation `gen`, sent at `sent` for `lease`,
    /// was answered: `still_held` false means Redis had no hold of ours any more. Returns whether
    /// the hold is still the generation's.
    pub(crate) fn fixed_extended(
        &self,
        gen: u64,
        hold: HoldRef,
        sent: Instant,
        lease: Duration,
        still_held: bool,
    ) -> bool {
        let held = self.held();
        self.with(|a| {
            if a.gen != gen {
                return false;
            }
            if !still_held {
                held.emptied(a, LostReason::Gone);
                return false;
            }
            // A deadline that passed before the extension is marked lost first.
            held.revalidate(a);
            if let Some(id) = hold.0 {
                if let Some(fixed) = a.fixed.iter_mut().find(|h| h.id == id.get()) {
                    let extended = FixedHold::new(fixed.id, sent, lease);
                    if extended.end > fixed.end {
                        *fixed = extended;
                    }
                }
            }
            held.revalidate(a);
            true
        })
    }

    /// A release of `what` begins: a guard's release no longer waits in the line (see
    /// `Account::pending_releases`).
    pub(crate) fn release_started(&self, what: What) {
        if let What::Guard { gen } = what {
            self.with(|a| {
                if a.gen == gen {
                    a.pending_releases = a.pending_releases.saturating_sub(1);
                }
            });
        }
    }

    /// The release arguments for `what` now; `None` when there is nothing to send.
    pub(crate) fn release_plan(&self, what: What) -> Option<ReleaseArgs> {
        self.with(|a| release_plan(a, what, Instant::now()))
    }

    /// A release of `by` holds whose outcome is unknown: Redis may have up to that many fewer.
    pub(crate) fn release_unknown(&self, by: u64) {
        self.with(|a| a.uncertain = a.uncertain.saturating_add(by));
    }

    /// Redis replied with the field's exact count.
    pub(crate) fn count_learned(&self, count: u64) {
        self.with(|a| {
            a.count = count;
            a.dark = false;
            a.uncertain = 0;
        });
    }

    /// Redis showed `count` but the reply does not settle a lost one (a release skipped after
    /// the count kept changing).
    pub(crate) fn count_seen(&self, count: u64) {
        self.with(|a| a.count = count);
    }

    /// Redis has no hold of ours for the field any more (see [`Held::emptied`]).
    pub(crate) fn emptied(&self, reason: LostReason) {
        let held = self.held();
        self.with(|a| held.emptied(a, reason));
    }

    /// The client shut down after releasing the field: every hold of it is lost for good
    /// (see [`Held::holds_vanished`]).
    pub(crate) fn holds_vanished(&self, reason: LostReason) {
        let held = self.held();
        self.with(|a| held.holds_vanished(a, reason));
    }

    /// A give-up is about to be sent: a grant announced for the waiter can no longer be taken
    /// up from here on. Returns the count it expects.
    pub(crate) fn give_up_started(&self) -> u64 {
        self.with(|a| {
            a.pending_nonce = 0;
            a.count
        })
    }

    /// A give-up was answered (`true`) or failed: the field's entry is gone, or may still be
    /// queued (see [`Account::left_queued`]).
    pub(crate) fn give_up_ended(&self, answered: bool) {
        self.with(|a| a.left_queued = !answered);
    }
}

impl LossLog {
    /// A guard made at an epoch that has ended is gone.
    pub(crate) fn guard_gone(&mut self, epoch: u64) {
        if let Ok(at) = self.kept.binary_search_by_key(&epoch, |l| l.epoch) {
            self.kept[at].live -= 1;
            if self.kept[at].live == 0 {
                self.kept.remove(at);
            }
        }
    }

    /// The current epoch `now`, in which `live` guards still live were made, ends: for
    /// `reason`, trusted until `until`. Returns the next epoch.
    pub(crate) fn bump(&mut self, now: u64, live: u32, reason: LostReason, until: Instant) -> u64 {
        if live > 0 {
            self.kept.push(Loss {
                epoch: now,
                reason,
                until,
                live,
            });
        }
        now + 1
    }

    /// The loss that ended `epoch`, asked by a live guard made in it (so it is kept; were it
    /// ever missing, the answer is `Gone` as of now: the guard is lost either way).
    pub(crate) fn loss(&self, epoch: u64) -> (LostReason, Instant) {
        match self.kept.binary_search_by_key(&epoch, |l| l.epoch) {
            Ok(at) => (self.kept[at].reason, self.kept[at].until),
            Err(_) => (LostReason::Gone, Instant::now()),
        }
    }
}

impl DeadlineCell {
    /// For a reader that found `seen` passed: marks it so in the cell. `false` when the cell no
    /// longer holds `seen` (read again).
    pub(crate) fn mark_seen(&self, seen: Snapshot) -> bool {
        seen.0 & SEEN_PASSED != 0
            || self
                .0
                .compare_exchange(
                    seen.0,
                    seen.0 | SEEN_PASSED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// For the mover, once the guards that could have seen the old deadline are marked lost
    /// (their epoch has ended): stores `next` whatever the cell holds.
    pub(crate) fn set(&self, next: Option<Instant>) {
        self.0.store(Self::raw(next), Ordering::Release);
    }
}
