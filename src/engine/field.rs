//! What a client knows about one lock and one of its owner fields (`<client uuid>:<holder id>`):
//! the order of its operations on Redis, how many holds Redis has for the field, which local
//! guards those holds belong to, until when they can be trusted, and who must be told when they
//! cannot.
//!
//! # The ordering rule
//!
//! Every operation that changes what Redis holds for the field (an acquire attempt, a release, a
//! give-up, settling an attempt whose caller left, the release at shutdown) runs with the turn of
//! the field's [`Lane`], one at a time, in the order the client issued them. A dropped guard or
//! waiting future takes its place in that order **synchronously, in `Drop`**, even though its
//! work runs later in the background; so `drop(guard); lock.lock().await` reaches Redis exactly as
//! `guard.unlock().await; lock.lock().await` does, on any runtime flavour, and a cancelled wait
//! leaves the queue before the same holder's next attempt joins it again.
//!
//! # The count
//!
//! Because nothing else of ours runs on the field between two operations, the hold count every
//! script replies with is the truth until the next one ([`Account::count`]). Each script is a
//! compare-and-set on that count (`lua/*acquire.lua`, `lua/*unlock.lua`): an attempt whose reply
//! was lost is taken up by the next attempt instead of adding a second hold, and a release sent
//! twice releases once. When Redis shows fewer holds than we count (the lock expired, was
//! force-unlocked or lost in a failover), the holds of that generation are gone: the
//! generation changes and its guards never send a release that could eat a newer hold.
//!
//! # Holds with different leases
//!
//! One rule for every mix of watchdog and fixed-lease holds of one holder on one lock: the lock
//! lives as long as the longest live hold needs it (acquisitions and renewals never shorten its
//! TTL; a release sets it to what the remaining holds need), the watchdog renews it while any
//! watchdog hold lives, and the holds share one fate: every guard's `lost()` resolves when the lock
//! can no longer be trusted for the holds that are live, at the latest when the longest of them
//! runs out. When the last local guard goes, every hold of the field is released (orphans of lost
//! replies included), so the lock is free.
//!
//! This module must never: send a release for a hold of an older generation, let a release or
//! give-up queued by `Drop` run after an operation its task issued later, or move a validity
//! deadline past a moment at which the guards were already lost without marking them lost first.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::engine::inner::Inner;
use crate::engine::lane::{Lane, LaneOwner, Turn};
use crate::engine::validity::{validity_deadline, LostReason};
use crate::error::{Error, Result};
use crate::keys::LockSpec;

/// A fixed point of the monotonic clock that deadlines are stored relative to.
fn clock_base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn to_nanos(at: Instant) -> u64 {
    // 0 means "unset": an instant at the base itself is stored one nanosecond later.
    (at.saturating_duration_since(clock_base()).as_nanos() as u64).max(1)
}

fn from_nanos(nanos: u64) -> Instant {
    clock_base() + Duration::from_nanos(nanos)
}

/// What one field holds, kept in its lane. Only the turn holder changes `count`, `dark` and
/// `gen`; the guard accounting is also changed by a guard that detaches (under the lane's mutex).
///
/// One lives in every held field's [`Held`] (10,000 held locks keep 10,000 of them), so the
/// counters of live guards, releases and calls are `u32` and the flag sits beside them: 96 bytes
/// rather than 112, which keeps `Held` within a 272-byte allocation (see the `sizes` test).
#[derive(Debug, Default)]
pub(crate) struct Account {
    /// Holds Redis has for the field, as of the last script reply.
    pub(crate) count: u64,
    /// Holds released by calls whose outcome is unknown (their replies were lost) since the
    /// last exact count: Redis may have up to this many fewer than `count`.
    pub(crate) uncertain: u64,
    /// Bumped when the holds of the field vanished without us (or at shutdown).
    pub(crate) gen: u64,
    /// Grants so far (a renewal reply only speaks for the grants made before it was sent).
    pub(crate) grants: u64,
    /// Live guards of the current generation taken without a lease.
    pub(crate) watchdog_guards: u32,
    /// Validity earned by the last successful grant or renewal of a watchdog hold.
    pub(crate) watchdog_valid: Option<Instant>,
    /// Live guards of the current generation with a fixed lease.
    pub(crate) fixed: Vec<FixedHold>,
    /// Guards of the current generation that have left the account and whose releases wait in
    /// the line. Until the last of them runs, a release gives back only its own hold: a guard
    /// dropped just before another guard of the same field is unlocked must not release the
    /// other's hold too (that one's unlock would then find nothing and report the hold lost).
    pub(crate) pending_releases: u32,
    /// Calls of this field that may be in the fair queue right now (counted from their first
    /// attempt that can join it until they end). When a call starts while this is zero, no call
    /// of ours owns an entry of the field, so any entry Redis still queues for it was left by a
    /// give-up that failed or never ran (an error, a restart, a cut connection), possibly in a
    /// [`Held`] that is gone since. Such a call drops that entry before it joins: a new call
    /// always joins at the tail, never in a place an ended call left behind.
    pub(crate) waiting_calls: u32,
    /// The nonce of the call whose last attempt left the field queued asking for a direct grant
    /// (PROTOCOL 8), 0 when none: a grant announced for that nonce can be taken up without a
    /// round trip as long as this is still set (any later operation on the field clears or
    /// replaces it, so a grant message that arrives late is never taken for a newer one).
    pub(crate) pending_nonce: u64,
    /// The last acquire attempt's reply was lost: Redis may have `count + 1`.
    pub(crate) dark: bool,
    /// A direct grant (PROTOCOL 8) gave the lock a TTL shorter than its hold needs (at most the
    /// waiter liveness window), and no extension has been answered yet: the watchdog extends
    /// it, with its renewal rules, and until then the hold is trusted for the grant's TTL only.
    pub(crate) unconfirmed: bool,
}

/// One live guard with a fixed lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FixedHold {
    /// The guard's id.
    pub(crate) id: u64,
    /// Send time of its grant + its lease: the lock's TTL must reach at least this far.
    pub(crate) end: Instant,
    /// Until when the hold can be trusted: `full`, or less while a direct grant's short TTL is
    /// not extended yet (see [`Account::unconfirmed`]).
    pub(crate) valid: Instant,
    /// `end` minus the drift margin: until when the hold can be trusted once the lock's TTL
    /// covers its whole lease.
    pub(crate) full: Instant,
}

impl FixedHold {
    pub(crate) fn new(id: u64, sent: Instant, lease: Duration) -> Self {
        let valid = validity_deadline(sent, lease);
        FixedHold {
            id,
            end: sent + lease,
            valid,
            full: valid,
        }
    }
}

impl Account {
    /// Whether any live guard of the current generation remains.
    pub(crate) fn has_guards(&self) -> bool {
        self.watchdog_guards > 0 || !self.fixed.is_empty()
    }

    /// Until when the live holds can be trusted, and whether the watchdog is what sets it.
    pub(crate) fn validity(&self) -> Option<(Instant, bool)> {
        let fixed = self
            .fixed
            .iter()
            .map(|h| h.valid)
            .max()
            .map(|valid| (valid, false));
        let watchdog = (self.watchdog_guards > 0)
            .then_some(self.watchdog_valid)
            .flatten()
            .map(|v| (v, true));
        match (fixed, watchdog) {
            (Some(f), Some(w)) => Some(if w.0 >= f.0 { w } else { f }),
            (f, w) => f.or(w),
        }
    }

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

/// One bump of a field's loss epoch: the epoch it ended, why, until when the holds could be
/// trusted, and how many live guards were made in that epoch (the only ones that may ask).
#[derive(Debug, Clone, Copy)]
struct Loss {
    epoch: u64,
    reason: LostReason,
    until: Instant,
    live: u32,
}

/// The losses of a field that live guards may still ask about.
///
/// A guard made at epoch `e` asks only about the bump that ended `e`, so a bump is kept only
/// while a guard made in its epoch lives: one entry per distinct epoch of the live lost guards,
/// not one per bump of the field's history (a loop whose fixed lease ran out every round,
/// dropping its guard each time, used to keep one entry per round for ever). Pure bookkeeping,
/// under the field's `losses` mutex; the field's epoch (an atomic, changed only under that
/// mutex) is passed in.
/// The count of live guards made at the current epoch is kept by the caller (`Held::live_now`,
/// in what would otherwise be padding) and passed to [`bump`](Self::bump).
#[derive(Debug, Default)]
struct LossLog {
    /// By epoch, ascending.
    kept: Vec<Loss>,
}

impl LossLog {
    /// A guard made at an epoch that has ended is gone.
    fn guard_gone(&mut self, epoch: u64) {
        if let Ok(at) = self.kept.binary_search_by_key(&epoch, |l| l.epoch) {
            self.kept[at].live -= 1;
            if self.kept[at].live == 0 {
                self.kept.remove(at);
            }
        }
    }

    /// The current epoch `now`, in which `live` guards still live were made, ends: for
    /// `reason`, trusted until `until`. Returns the next epoch.
    fn bump(&mut self, now: u64, live: u32, reason: LostReason, until: Instant) -> u64 {
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
    fn loss(&self, epoch: u64) -> (LostReason, Instant) {
        match self.kept.binary_search_by_key(&epoch, |l| l.epoch) {
            Ok(at) => (self.kept[at].reason, self.kept[at].until),
            Err(_) => (LostReason::Gone, Instant::now()),
        }
    }
}

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
    /// The validity deadline of the live holds ([`to_nanos`]; 0: none).
    valid_until: AtomicU64,
    /// The watchdog, not a fixed lease, sets `valid_until`.
    valid_by_watchdog: AtomicBool,
    /// The last lapsed deadline marked lost ([`to_nanos`]; 0: none), so one lapse is marked once.
    lapse_marked: AtomicU64,
    /// [`PER_CALL`] and [`EXPOSED`]: whether the holder id may be reused when this is dropped.
    reuse: std::sync::atomic::AtomicU8,
}

/// The holder is a call's own (no `Holder` was passed).
const PER_CALL: u8 = 1;
/// The holder id was handed to the user (a guard's `holder()`).
const EXPOSED: u8 = 2;

impl Held {
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
    pub(crate) fn lost_since(&self, epoch: u64) -> Option<LostReason> {
        if self.epoch() > epoch {
            return Some(self.loss(epoch).0);
        }
        let v = self.valid_until.load(Ordering::Acquire);
        (v != 0 && Instant::now() >= from_nanos(v)).then(|| self.validity_reason())
    }

    /// Until when a guard made at `epoch` can be trusted.
    pub(crate) fn valid_until_since(&self, epoch: u64) -> Instant {
        if self.epoch() > epoch {
            return self.loss(epoch).1;
        }
        from_nanos(self.valid_until.load(Ordering::Acquire))
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
        let v = self.valid_until.load(Ordering::Acquire);
        (v != 0).then(|| from_nanos(v))
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
        let until = match self.valid_until() {
            Some(v) if v < at => v,
            _ => at,
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
    pub(crate) fn revalidate(&self, account: &Account) {
        let now = Instant::now();
        let old = self.valid_until.load(Ordering::Acquire);
        let new = account.validity();
        let marked = self.lapse_marked.load(Ordering::Acquire);
        let lapsed = if old != 0 && now >= from_nanos(old) {
            Some((self.validity_reason(), from_nanos(old)))
        } else {
            match new {
                Some((until, by_watchdog)) if until <= now && to_nanos(until) > marked => Some((
                    if by_watchdog {
                        LostReason::ValidityExpired
                    } else {
                        LostReason::LeaseExpired
                    },
                    until,
                )),
                _ => None,
            }
        };
        if let Some((reason, until)) = lapsed {
            self.lapse_marked
                .fetch_max(to_nanos(until), Ordering::AcqRel);
            self.bump(reason, until);
            if account.has_guards() {
                self.report_lost(reason);
            }
        }
        match new {
            Some((until, by_watchdog)) if until > now => {
                self.valid_by_watchdog.store(by_watchdog, Ordering::Release);
                self.valid_until.store(to_nanos(until), Ordering::Release);
            }
            _ => self.valid_until.store(0, Ordering::Release),
        }
        self.notify.notify_waiters();
    }

    /// The holds of the current generation are gone from Redis without us: start a new
    /// generation and tell its guards.
    pub(crate) fn holds_vanished(&self, account: &mut Account, reason: LostReason) {
        let had_guards = account.has_guards();
        account.gen += 1;
        account.pending_releases = 0;
        account.watchdog_guards = 0;
        account.watchdog_valid = None;
        account.fixed.clear();
        account.unconfirmed = false;
        self.bump(reason, Instant::now());
        self.valid_until.store(0, Ordering::Release);
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
        if *self.reuse.get_mut() == PER_CALL {
            let clean = self
                .lane
                .with(|a| a.count == 0 && a.uncertain == 0 && !a.dark);
            if clean {
                self.inner.holder_idle(self.spec.name(), self.holder_id());
            }
        }
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
        let held = Arc::new(Held {
            id: next_id(),
            inner: inner.clone(),
            spec: spec.clone(),
            field: field.clone(),
            lane: Lane::new(Account::default()),
            epoch: AtomicU64::new(0),
            losses: Mutex::new(LossLog::default()),
            live_now: std::sync::atomic::AtomicU32::new(0),
            notify: Notify::new(),
            valid_until: AtomicU64::new(0),
            valid_by_watchdog: AtomicBool::new(false),
            lapse_marked: AtomicU64::new(0),
            reuse: std::sync::atomic::AtomicU8::new(0),
        });
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

/// The turn on a field's lane.
pub(crate) type FieldTurn = Turn<Held>;

impl LaneOwner for Held {
    type State = Account;

    fn lane(&self) -> &Lane<Held> {
        &self.lane
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_is_the_longest_need_of_the_live_holds() {
        let t0 = Instant::now();
        let mut a = Account::default();
        assert_eq!(a.validity(), None);
        let five = FixedHold::new(1, t0, Duration::from_secs(5));
        assert_eq!(five.valid, t0 + Duration::from_millis(5000 - 52));
        a.fixed.push(five);
        assert_eq!(a.validity(), Some((five.valid, false)));
        a.watchdog_guards = 1;
        a.watchdog_valid = Some(t0 + Duration::from_secs(30));
        assert_eq!(a.validity(), Some((t0 + Duration::from_secs(30), true)));
        let sixty = FixedHold::new(2, t0, Duration::from_secs(60));
        a.fixed.push(sixty);
        assert_eq!(a.validity(), Some((sixty.valid, false)));
        // Without live watchdog holds, an old renewal counts for nothing.
        a.watchdog_guards = 0;
        a.fixed.clear();
        assert_eq!(a.validity(), None);
    }

    #[test]
    fn a_release_leaves_the_ttl_the_remaining_holds_need() {
        let now = Instant::now();
        let mut a = Account::default();
        assert_eq!(a.remaining_ttl_ms(now), -1);
        a.fixed
            .push(FixedHold::new(1, now, Duration::from_millis(1500)));
        a.fixed
            .push(FixedHold::new(2, now, Duration::from_millis(700)));
        assert_eq!(a.remaining_ttl_ms(now), 1500);
        // A lease that already ran out still leaves a positive TTL (PEXPIRE needs one).
        assert_eq!(a.remaining_ttl_ms(now + Duration::from_secs(9)), 1);
        a.watchdog_guards = 1;
        assert_eq!(a.remaining_ttl_ms(now), -1, "the watchdog keeps it");
    }

    /// A held lock costs its client about 1 KiB (benches/watchdog_scale.rs); `Held` is the
    /// largest part of it. Its `Arc` allocation (two counts + `Held`) must stay within 272
    /// bytes, which glibc serves from a 288-byte chunk.
    #[test]
    fn the_loss_log_keeps_only_what_live_guards_can_ask() {
        let t = Instant::now();
        let mut log = LossLog::default();
        let mut epoch = 0;
        // A loop whose lease runs out every round: make a guard, lose it, drop it.
        for round in 0..1000u64 {
            let made = epoch;
            epoch = log.bump(epoch, 1, LostReason::LeaseExpired, t);
            assert_eq!(epoch, round + 1);
            assert_eq!(log.loss(made).0, LostReason::LeaseExpired);
            log.guard_gone(made);
            assert!(log.kept.is_empty(), "round {round}: {:?}", log.kept);
        }
        // Bumps nobody can ask about keep nothing.
        epoch = log.bump(epoch, 0, LostReason::Gone, t);
        assert!(log.kept.is_empty());
        // Two lost guards of one epoch, one of the next: each asks about its own loss.
        let (a, b) = (epoch, epoch);
        epoch = log.bump(epoch, 2, LostReason::RenewalFailed, t);
        let c = epoch;
        epoch = log.bump(epoch, 1, LostReason::Shutdown, t);
        assert_eq!(log.loss(a).0, LostReason::RenewalFailed);
        assert_eq!(log.loss(b).0, LostReason::RenewalFailed);
        assert_eq!(log.loss(c).0, LostReason::Shutdown);
        assert_eq!(log.kept.len(), 2);
        log.guard_gone(a);
        assert_eq!(log.kept.len(), 2, "b still asks about that loss");
        log.guard_gone(c);
        assert_eq!(log.kept.len(), 1);
        assert_eq!(log.loss(b).0, LostReason::RenewalFailed);
        log.guard_gone(b);
        assert!(log.kept.is_empty());
        assert!(epoch > c);
    }

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
