//! The field's data and how calls and grants enter it (see the module documentation of
//! `field/`).
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::engine::driver::Watch;
use crate::engine::inner::Inner;
use crate::engine::lane::{Lane, LaneOwner, Turn};
use crate::engine::validity::{validity_deadline, Lease, LostReason};
use crate::error::{Error, Result};
use crate::keys::LockSpec;

// ===============================================================================================
// The field and the registry of fields.
// [`Held`]: one lock and owner field in one client, with its account in its lane, the loss
// epochs its guards ask about and its validity deadline (see the module documentation of
// `field/`); and the client's registry of them, [`Helds`] (below).

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
    pub(super) epoch: AtomicU64,
    /// Why and until when each loss that a live guard may still ask about (see [`LossLog`]).
    losses: Mutex<LossLog>,
    /// Live guards made at the current epoch (changed only under `losses`' lock).
    pub(super) live_now: std::sync::atomic::AtomicU32,
    /// Wakes `lost()` futures on every bump and every change of the validity deadline.
    pub(super) notify: Notify,
    /// The validity deadline of the live holds (unset: none).
    pub(super) valid_until: DeadlineCell,
    /// The watchdog, not a fixed lease, sets `valid_until`.
    pub(super) valid_by_watchdog: AtomicBool,
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

    /// Whether a later call may take this field's holder over once nothing else refers to the
    /// field, and if so whether its waiter channel may linger (`Some(subscribed)`): the holder
    /// is a call's own and was never handed out, and Redis holds nothing of it by the client's
    /// count. `Drop` asks this before it gives the id back to the registry
    /// ([`Helds::reuse_holder`]); a lock handle that kept the field of its last call asks it
    /// when it is the field's only holder (`Handle::acquire`).
    pub(crate) fn reusable(&self) -> Option<bool> {
        let flags = self.reuse.load(Ordering::Relaxed);
        if flags & !SUBSCRIBED != PER_CALL {
            return None;
        }
        let clean = self
            .lane
            .with(|a| a.count == 0 && a.uncertain == 0 && !a.dark && !a.left_queued);
        clean.then_some(flags & SUBSCRIBED != 0)
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

    pub(super) fn losses(&self) -> MutexGuard<'_, LossLog> {
        self.losses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new guard: returns the epoch it is made at and counts it live there, in one step with
    /// respect to bumps, so the loss it may later ask about is kept for it.
    pub(crate) fn guard_made(&self) -> u64 {
        let _losses = self.losses();
        self.live_now.fetch_add(1, Ordering::Relaxed);
        self.epoch()
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
}

impl Drop for Held {
    fn drop(&mut self) {
        // Nothing refers to this field any more: the driver drops its timers on its next look
        // (lazily: no task wake-up on the uncontended path, and no I/O here).
        self.inner
            .driver
            .send_lazy(crate::engine::driver::Work::Forget { id: self.id });
        // A call's own holder that left nothing Redis may hold unseen can serve a later call
        // (see `Helds::reuse_holder`). Nothing else refers to the field, so no guard, call or
        // work in its line is left; the account says whether Redis may still hold any of it.
        if let Some(subscribed) = self.reusable() {
            self.inner
                .helds
                .holder_idle(self.spec.name(), self.holder_id(), subscribed);
        }
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

// -----------------------------------------------------------------------------------------------
// The client's registry of fields: one [`Held`] per lock name and owner field, whatever the
// kind, made on first use and swept away once nobody refers to it.

/// Registry key of a field: (name, field), whatever the kind (see [`Helds::get`]). It shares the spec and field rather than copying
/// the name.
#[derive(Debug, Clone)]
pub(super) struct HeldKey {
    pub(super) spec: Arc<LockSpec>,
    pub(super) field: Arc<str>,
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
#[derive(Debug)]
pub(crate) struct Helds {
    map: Mutex<HashMap<HeldKey, Weak<Held>>>,
    /// Map size after the last sweep of dead entries: the next sweep comes at twice that.
    swept_at: AtomicU64,
    /// The client's id as text: the prefix of every owner field it builds.
    uuid: Box<str>,
    /// `true` once the client is shut down: no call starts after it; waiters watch it.
    pub(crate) closed: watch::Sender<bool>,
    /// The last owner field built: a holder taking many locks (or one lock many times) shares
    /// one allocation.
    last_field: Mutex<Option<(i64, Arc<str>)>>,
    /// Idle call holders by lock name (see [`reuse_holder`](Self::reuse_holder)).
    idle_holders: Mutex<IdleHolders>,
}

/// Holder ids of ended calls that left nothing behind, by lock name, newest last.
#[derive(Debug, Default)]
struct IdleHolders {
    /// Each id with whether its waiter channel was subscribed (see `Helds::holder_idle`).
    by_name: std::collections::HashMap<Box<str>, Vec<(i64, bool)>>,
    total: usize,
}

/// At most this many idle holders are kept per client (each is a few bytes and, for a while, a
/// subscribed channel: see `conn/subscriber`).
const MAX_IDLE_HOLDERS: usize = 4096;
/// At most this many per lock name.
const MAX_IDLE_HOLDERS_PER_NAME: usize = 256;

impl Helds {
    /// The registry of a client whose id is `uuid` (as text).
    pub(crate) fn new(uuid: &str) -> Self {
        Helds {
            map: Mutex::default(),
            swept_at: AtomicU64::default(),
            uuid: uuid.into(),
            closed: watch::Sender::new(false),
            last_field: Mutex::new(None),
            idle_holders: Mutex::new(IdleHolders::default()),
        }
    }

    /// `Err(Shutdown)` once the client is shut down.
    pub(crate) fn check_open(&self) -> Result<()> {
        if *self.closed.borrow() {
            Err(Error::Shutdown)
        } else {
            Ok(())
        }
    }

    /// The owner field of `holder` in this client.
    pub(crate) fn field(&self, holder: i64) -> Arc<str> {
        let mut last = self.last_field.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((h, field)) if *h == holder => field.clone(),
            _ => {
                let field: Arc<str> = format!("{}:{}", self.uuid, holder).into();
                *last = Some((holder, field.clone()));
                field
            }
        }
    }

    /// The holder of one acquisition call that brought none of its own: an idle one of this
    /// client on lock `name` when there is one (see [`reuse_holder`](Self::reuse_holder)),
    /// else a fresh one; and whether its waiter channel may still be subscribed (a fresh id's
    /// never is, nor that of an idle one whose calls never subscribed).
    pub(crate) fn call_holder(&self, name: &str) -> (i64, bool) {
        self.reuse_holder(name)
            .unwrap_or_else(|| (mint_holder_id(), false))
    }

    /// A holder id for a new call on lock `name` that a call of this client used before and that
    /// left nothing behind, if there is one (the newest first).
    ///
    /// Why: a fair waiter listens on its own channel (PROTOCOL 2), one per owner field, so a
    /// fresh holder per call would cost every waiting call a subscription (a round trip, then a
    /// second attempt to cover the gap) and an unsubscription later. A reused holder's channel
    /// is usually still subscribed (it lingers), so its call waits at once.
    ///
    /// Why it is safe: an id comes back here only from a field whose every trace is gone
    /// ([`Held`](crate::engine::field::Held)'s `Drop`): no guard, no call, no work in its line,
    /// no hold in Redis by the client's count and no reply it never saw, and a holder nobody was
    /// given (a guard's `holder()` keeps it out for good). So two calls that run at the same
    /// time never share a holder, and no `Holder` value a user kept can re-enter a later call's
    /// hold. What Redis may still have of it is what any holder's next call meets and settles:
    /// a queue entry whose give-up failed (dropped by the call's first attempt) and a grant
    /// message that comes late (it names the old call's nonce and is ignored).
    pub(crate) fn reuse_holder(&self, name: &str) -> Option<(i64, bool)> {
        let mut idle = self.idle_holders.lock().unwrap_or_else(|p| p.into_inner());
        let ids = idle.by_name.get_mut(name)?;
        let id = ids.pop();
        if ids.is_empty() {
            idle.by_name.remove(name);
        }
        if id.is_some() {
            idle.total -= 1;
        }
        id
    }

    /// A call holder `id` on lock `name` left nothing behind: a later call may reuse it.
    /// `subscribed`: a call of it subscribed its waiter channel, which may still linger.
    pub(crate) fn holder_idle(&self, name: &str, id: i64, subscribed: bool) {
        let mut idle = self.idle_holders.lock().unwrap_or_else(|p| p.into_inner());
        if idle.total >= MAX_IDLE_HOLDERS {
            return;
        }
        let ids = idle.by_name.entry(name.into()).or_default();
        if ids.len() >= MAX_IDLE_HOLDERS_PER_NAME {
            return;
        }
        ids.push((id, subscribed));
        idle.total += 1;
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<HeldKey, Weak<Held>>> {
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
}

// ===============================================================================================
// The account and its events.
// What one lock and owner field holds, as a client counts it: the account (pure data, no I/O),
// what a release of it asks for, the fixed-lease holds among its guards, and the events that
// change it (below), which nothing else does: the account's fields are private to `field/`,
// and besides them only `Held`'s generation events (`field/ends.rs`) write them.

/// What one field holds, kept in its lane. Its fields are private to `field/`: the turn's
/// events (`Turn<Held>`, below) are the only way to change `count`, `uncertain`,
/// `gen`, `grants`, `dark`, `pending_nonce`, `unconfirmed` and `left_queued`, so only the turn
/// holder can; the
/// guards' bookkeeping (live guards, pending releases, waiting calls) is changed by `Held`'s
/// own events, under the lane's mutex.
///
/// One lives in every held field's [`Held`] (10,000 held locks keep 10,000 of them), so the
/// counters of live guards, releases and calls are `u32` and the flag sits beside them: 96 bytes
/// rather than 112, which keeps `Held` within a 272-byte allocation (see the `sizes` test).
#[derive(Debug, Default)]
pub(crate) struct Account {
    /// Holds Redis has for the field, as of the last script reply.
    pub(super) count: u64,
    /// Holds released by calls whose outcome is unknown (their replies were lost) since the
    /// last exact count: Redis may have up to this many fewer than `count`.
    pub(super) uncertain: u64,
    /// Bumped when the holds of the field vanished without us (or at shutdown).
    pub(super) gen: u64,
    /// Grants so far (a renewal reply only speaks for the grants made before it was sent).
    pub(super) grants: u64,
    /// Live guards of the current generation taken without a lease.
    pub(super) watchdog_guards: u32,
    /// Validity earned by the last successful grant or renewal of a watchdog hold, in
    /// nanoseconds since the clock base (0: none; see [`watchdog_valid`](Self::watchdog_valid)).
    pub(super) watchdog_valid_ns: u64,
    /// Live guards of the current generation with a fixed lease.
    pub(super) fixed: Vec<FixedHold>,
    /// Guards of the current generation that have left the account and whose releases wait in
    /// the line. Until the last of them runs, a release gives back only its own hold: a guard
    /// dropped just before another guard of the same field is unlocked must not release the
    /// other's hold too (that one's unlock would then find nothing and report the hold lost).
    pub(super) pending_releases: u32,
    /// Calls of this field that may be in the fair queue right now (counted from their first
    /// attempt that can join it until they end). When a call starts while this is zero, no call
    /// of ours owns an entry of the field, so any entry Redis still queues for it was left by a
    /// give-up that failed or never ran (an error, a restart, a cut connection), possibly in a
    /// [`Held`] that is gone since. Such a call drops that entry before it joins: a new call
    /// always joins at the tail, never in a place an ended call left behind.
    pub(super) waiting_calls: u32,
    /// The nonce of the call whose last attempt left the field queued asking for a direct grant
    /// (PROTOCOL 8), 0 when none: a grant announced for that nonce can be taken up without a
    /// round trip as long as this is still set (any later operation on the field clears or
    /// replaces it, so a grant message that arrives late is never taken for a newer one).
    pub(super) pending_nonce: u64,
    /// The last acquire attempt's reply was lost: Redis may have `count + 1`.
    pub(super) dark: bool,
    /// A direct grant (PROTOCOL 8) gave the lock a TTL shorter than its hold needs (at most the
    /// waiter liveness window), and no extension has been answered yet: the watchdog extends
    /// it, with its renewal rules, and until then the hold is trusted for the grant's TTL only.
    pub(super) unconfirmed: bool,
    /// A give-up of the field failed since its last grant or answered give-up: an entry of it
    /// may still wait in a queue (the read-write lock's writer-preferring one keeps its place for
    /// a liveness window), so its call holder is not handed to a later call meanwhile.
    pub(super) left_queued: bool,
    /// What the driver's timers for the field cover, as it last published (see [`Watch`]).
    pub(super) watch: WatchWord,
}

/// The driver's [`Watch`] of a field as it last published it, and whether a grant counted on it
/// since the driver last looked at the field, in one word (the account stays within its size,
/// see the `sizes` test): the validity timer's instant in nanoseconds since the clock base in
/// the low 62 bits (0: no timer), then `renewing`, then "relied on".
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WatchWord(u64);

const WATCH_RENEWING: u64 = 1 << 62;
const WATCH_RELIED: u64 = 1 << 63;
const WATCH_AT: u64 = WATCH_RENEWING - 1;

impl WatchWord {
    /// Whether a hold that leaves the field valid until `valid_until` is looked after without
    /// telling the driver (`watchdog`: the hold is renewed by the watchdog): the validity timer
    /// fires no later (and then follows the new deadline), and a watchdog hold finds its
    /// renewals armed.
    pub(crate) fn covers(self, valid_until: Instant, watchdog: bool) -> bool {
        let at = self.0 & WATCH_AT;
        at != 0 && from_nanos(at) <= valid_until && (self.0 & WATCH_RENEWING != 0 || !watchdog)
    }

    /// A grant counted on the published watch instead of telling the driver.
    pub(crate) fn rely(&mut self) {
        self.0 |= WATCH_RELIED;
    }

    /// The driver starts looking at the field.
    pub(crate) fn look(&mut self) {
        self.0 &= !WATCH_RELIED;
    }

    /// Publishes `watch`, unless a grant counted on the old one since the driver looked: what it
    /// counted on may be what the driver just dropped, so it must look again (`false`).
    pub(crate) fn publish(&mut self, watch: Watch) -> bool {
        if self.0 & WATCH_RELIED != 0 {
            return false;
        }
        // An instant too far to store reads as no timer, which only ever costs a message.
        let at = watch.validity_at.map_or(0, to_nanos);
        let at = if at <= WATCH_AT { at } else { 0 };
        self.0 = at | if watch.renewing { WATCH_RENEWING } else { 0 };
        true
    }
}

/// One live guard with a fixed lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FixedHold {
    /// The guard's id.
    pub(super) id: u64,
    /// Send time of its grant + its lease: the lock's TTL must reach at least this far.
    pub(super) end: Instant,
    /// Until when the hold can be trusted: `full`, or less while a direct grant's short TTL is
    /// not extended yet (see [`Account::unconfirmed`]).
    pub(super) valid: Instant,
    /// `end` minus the drift margin: until when the hold can be trusted once the lock's TTL
    /// covers its whole lease.
    pub(super) full: Instant,
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

    /// Validity earned by the last successful grant or renewal of a watchdog hold.
    pub(crate) fn watchdog_valid(&self) -> Option<Instant> {
        (self.watchdog_valid_ns != 0).then(|| from_nanos(self.watchdog_valid_ns))
    }

    pub(crate) fn set_watchdog_valid(&mut self, valid: Option<Instant>) {
        self.watchdog_valid_ns = valid.map_or(0, to_nanos);
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
            .then(|| self.watchdog_valid())
            .flatten()
            .map(|v| (v, true));
        match (fixed, watchdog) {
            (Some(f), Some(w)) => Some(if w.0 >= f.0 { w } else { f }),
            (f, w) => f.or(w),
        }
    }
}

/// What to release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    /// One guard's hold, of generation `gen` (the guard has already left the account).
    Guard { gen: u64 },
    /// A hold granted to a caller that had left (the grant is in the count, no guard has it).
    Orphan,
    /// Only what a dark attempt may have added (nothing else changes).
    Dark,
    /// Every hold of the field (shutdown).
    All,
}

// -----------------------------------------------------------------------------------------------
// The events that change a field's account.
//
// Events that change what we know Redis holds for the field (the count, a lost reply, the
// generation, grants, the pending direct-grant nonce) are methods of the field's turn
// (`Turn<Held>`): only the operation whose turn it is can call them, so the count read at the
// start of an operation is still the truth when its reply is recorded. Events of the local
// bookkeeping (a guard leaving, a call joining or leaving the queue) are methods of [`Held`]
// and run under the lane's mutex, from any thread, synchronously in `Drop` if need be.

/// Which of the account's holds a guard has: the watchdog's, or a fixed lease with the id of its
/// entry in the account (one word either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldRef(pub(super) Option<NonZeroU64>);

impl HoldRef {
    /// A hold renewed by the watchdog.
    pub(crate) const WATCHDOG: HoldRef = HoldRef(None);

    /// Whether the hold has a fixed lease.
    pub(crate) fn is_fixed(self) -> bool {
        self.0.is_some()
    }
}

/// Where a newly registered guard stands in its field: its generation, which of the account's
/// holds it is, and the loss epoch it was made at (counted live there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registered {
    pub(crate) gen: u64,
    pub(crate) hold: HoldRef,
    pub(crate) epoch: u64,
    /// The driver's published timers do not cover the hold: it must be told of the grant.
    pub(crate) tell_driver: bool,
    /// The field's validity deadline the grant left.
    pub(crate) valid_until: Instant,
}

impl FieldTurn {
    pub(super) fn held(&self) -> &Held {
        self.owner()
    }

    /// The hold count as of the last reply: what the next script compares against.
    pub(crate) fn count(&self) -> u64 {
        self.with(|a| a.count)
    }

    /// An attempt sent expecting `expected` holds was granted and Redis now has `count`
    /// (`adopted`: the grant was a hold a lost reply had already made, taken up). Fewer holds
    /// than we counted (beyond releases whose outcome we never learned) means they expired or
    /// were deleted without us: their generation ends first.
    pub(crate) fn attempt_granted(&self, expected: u64, count: u64, adopted: bool) {
        let held = self.held();
        self.with(|a| {
            let before = if adopted { expected } else { count - 1 };
            if before + a.uncertain < a.count {
                held.holds_vanished(a, LostReason::Gone);
            }
            a.count = count;
            a.dark = false;
            a.uncertain = 0;
            a.grants += 1;
            a.pending_nonce = 0;
            a.left_queued = false;
            // `unconfirmed` stays: the script gave the lock this attempt's lease, which need not
            // cover a direct grant's hold still waiting for its extension (a re-entry with a
            // shorter lease right after the grant); that hold's extension still runs, and its
            // answer (sent after this grant) confirms it.
        });
    }

    /// Registers the hold just granted for a new guard: sent at `sent`, the lock's TTL covering
    /// `covered` from then, with a fixed `lease` or (`None`) the watchdog's; `confirm`: the TTL
    /// is shorter than the hold needs and the watchdog must extend it. `None` when the hold
    /// could no longer be trusted on arrival (the caller gives it back); else the new guard's
    /// [`Registered`] place.
    ///
    /// The deadline check, the new validity and the guard's loss epoch are one step under the
    /// lane's mutex, as of one instant: a guard is never made in an epoch whose deadline had
    /// already lapsed (it would read as not lost with a deadline in the past, and a later loss
    /// would report it trusted until then).
    pub(crate) fn register_hold(
        &self,
        sent: Instant,
        covered: Duration,
        lease: Lease,
        confirm: bool,
    ) -> Option<Registered> {
        let held = self.held();
        self.with(|a| {
            let now = Instant::now();
            let own = validity_deadline(sent, covered);
            let trusted = a.validity().map_or(own, |(live, _)| live.max(own));
            if trusted <= now {
                return None;
            }
            let hold = match lease {
                Lease::Watchdog => {
                    a.watchdog_guards += 1;
                    if a.watchdog_valid().is_none_or(|v| v < own) {
                        a.set_watchdog_valid(Some(own));
                    }
                    HoldRef::WATCHDOG
                }
                Lease::Fixed(lease) => {
                    let id = next_id();
                    let mut hold = FixedHold::new(id, sent, lease);
                    hold.valid = own;
                    a.fixed.push(hold);
                    HoldRef(NonZeroU64::new(id))
                }
            };
            if confirm {
                a.unconfirmed = true;
            }
            held.revalidate_at(a, now);
            let valid_until = a.validity().map_or(trusted, |(until, _)| until);
            let covered = a.watch.covers(valid_until, lease.is_watchdog());
            if covered {
                a.watch.rely();
            }
            Some(Registered {
                gen: a.gen,
                hold,
                epoch: held.guard_made(),
                tell_driver: confirm || !covered,
                valid_until,
            })
        })
    }
}

impl Held {
    /// A call of the field starts an attempt (`joins`: one that may join the fair queue).
    /// Returns whether no other call of ours may own a queue entry of the field.
    pub(crate) fn call_starts(&self, joins: bool) -> bool {
        self.lane.with(|a| {
            let alone = a.waiting_calls == 0;
            a.waiting_calls += u32::from(joins);
            alone
        })
    }

    /// Whether another call of the field may share our queue entry.
    pub(crate) fn calls_share_entry(&self) -> bool {
        self.lane.with(|a| a.waiting_calls > 1)
    }

    /// A call counted by [`call_starts`](Self::call_starts) ended.
    pub(crate) fn call_ended(&self) {
        self.lane.with(|a| a.waiting_calls -= 1);
    }
}

// ===============================================================================================
// Losses and the validity deadline's cell.
// The losses of a field that live guards may still ask about, the cell of its validity
// deadline, and the clock deadlines are stored against (pure bookkeeping).

/// A fixed point of the monotonic clock that deadlines are stored relative to.
fn clock_base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

pub(super) fn to_nanos(at: Instant) -> u64 {
    // 0 means "unset": an instant at the base itself is stored one nanosecond later.
    (at.saturating_duration_since(clock_base()).as_nanos() as u64).max(1)
}

pub(super) fn from_nanos(nanos: u64) -> Instant {
    clock_base() + Duration::from_nanos(nanos)
}

/// A field's validity deadline, set under the lane's mutex and read by its guards without it.
///
/// The guards ask whether it passed at any moment; the account's holder moves it on (a grant, a
/// renewal, a release). What must never happen: a guard finds it passed and reports the lock
/// lost, and a move that read the clock before the deadline but stores after that finding then
/// makes the guard look valid again. So a reader that finds it passed marks that in the value
/// itself ([`Snapshot::mark_seen`], the top bit: deadlines are nanoseconds from the clock base,
/// never that large), and the mover replaces only the value it read
/// ([`DeadlineCell::replace`]): a mark put in between makes it fail, and the mover then treats
/// the deadline as passed.
#[derive(Debug, Default)]
pub(super) struct DeadlineCell(pub(super) AtomicU64);

/// The top bit of a [`DeadlineCell`]: a reader found the deadline passed.
pub(super) const SEEN_PASSED: u64 = 1 << 63;

/// One reading of a [`DeadlineCell`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Snapshot(pub(super) u64);

/// What a [`Snapshot`] says as of some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reading {
    /// No deadline is set.
    Unset,
    /// The deadline, still ahead.
    Ahead(Instant),
    /// The deadline, passed (or already found passed by a reader).
    Passed(Instant),
}

impl Snapshot {
    /// The deadline, passed or not.
    pub(super) fn deadline(self) -> Option<Instant> {
        (self.0 != 0).then(|| from_nanos(self.0 & !SEEN_PASSED))
    }

    /// What it says as of `now`.
    pub(super) fn at(self, now: Instant) -> Reading {
        match self.deadline() {
            None => Reading::Unset,
            Some(d) if self.0 & SEEN_PASSED != 0 || now >= d => Reading::Passed(d),
            Some(d) => Reading::Ahead(d),
        }
    }
}

impl DeadlineCell {
    /// Reads the cell (Acquire: a reader that sees a deadline stored after an epoch bump sees
    /// the bump too).
    pub(super) fn read(&self) -> Snapshot {
        Snapshot(self.0.load(Ordering::Acquire))
    }

    /// For the mover: stores `next` if the cell still holds `read`. `false` when a reader marked
    /// it passed in between.
    pub(super) fn replace(&self, read: Snapshot, next: Option<Instant>) -> bool {
        self.0
            .compare_exchange(read.0, Self::raw(next), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub(super) fn raw(next: Option<Instant>) -> u64 {
        next.map_or(0, to_nanos)
    }
}

/// One bump of a field's loss epoch: the epoch it ended, why, until when the holds could be
/// trusted, and how many live guards were made in that epoch (the only ones that may ask).
#[derive(Debug, Clone, Copy)]
pub(super) struct Loss {
    pub(super) epoch: u64,
    pub(super) reason: LostReason,
    pub(super) until: Instant,
    pub(super) live: u32,
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
pub(super) struct LossLog {
    /// By epoch, ascending.
    pub(super) kept: Vec<Loss>,
}

impl LossLog {}

/// The next minted holder id: negative, from one process-wide counter, so unique within every
/// client of the process (a `RedLock` uses one id on several clients) and never equal to a raw
/// id (`Holder::from_raw` takes the non-negative ones).
pub(crate) fn mint_holder_id() -> i64 {
    static NEXT_MINTED: AtomicI64 = AtomicI64::new(-1);
    NEXT_MINTED.fetch_sub(1, Ordering::Relaxed)
}
