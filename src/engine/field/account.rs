//! What one lock and owner field holds, as a client counts it: the account (pure data, no I/O),
//! what a release of it asks for, the fixed-lease holds among its guards, and the events that
//! change it (below), which nothing else does: the account's fields are private to `field/`,
//! and outside this file only `Held`'s generation events (`held.rs`) write them.

use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use super::{next_id, FieldTurn, Held};
use crate::engine::validity::{validity_deadline, LostReason};
use crate::lease::Lease;
use crate::wire::ReleaseArgs;

/// What one field holds, kept in its lane. Its fields are private to `field/`: the turn's
/// events (`Turn<Held>`, below) are the only way to change `count`, `uncertain`,
/// `gen`, `grants`, `dark`, `pending_nonce` and `unconfirmed`, so only the turn holder can; the
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
    /// Validity earned by the last successful grant or renewal of a watchdog hold.
    pub(super) watchdog_valid: Option<Instant>,
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

/// The release arguments for `what`, from the account as of `now`; `None` when there is nothing to send.
pub(super) fn release_plan(a: &Account, what: What, now: Instant) -> Option<ReleaseArgs> {
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

    #[test]
    fn a_release_with_another_waiting_in_line_leaves_the_ttl_alone() {
        // The torture test drew it (seed 1592590339): a guard whose short lease ran out is
        // still counted, two others were dropped and unlocked one after the other; the first
        // release set the TTL to what the lapsed one needed (1 ms), and the lock expired under
        // the second one's hold before its release ran.
        let now = Instant::now();
        let mut a = Account {
            count: 3,
            fixed: vec![FixedHold::new(
                1,
                now - Duration::from_secs(1),
                Duration::from_millis(4),
            )],
            pending_releases: 1,
            ..Account::default()
        };
        let first = release_plan(&a, What::Guard { gen: 0 }, now).unwrap();
        assert_eq!((first.by, first.remaining_ttl_ms), (1, -1));
        // The last release of the line sets it to what the guards left need.
        a.pending_releases = 0;
        let last = release_plan(&a, What::Guard { gen: 0 }, now).unwrap();
        assert_eq!((last.by, last.remaining_ttl_ms), (1, 1));
    }

    fn account(count: u64, watchdog: u32, fixed: usize) -> Account {
        let now = Instant::now();
        Account {
            count,
            watchdog_guards: watchdog,
            fixed: (0..fixed)
                .map(|i| FixedHold::new(i as u64, now, Duration::from_secs(10)))
                .collect(),
            ..Account::default()
        }
    }

    #[test]
    fn a_guard_of_an_older_generation_sends_nothing() {
        let mut a = account(1, 1, 0);
        a.gen = 3;
        assert_eq!(
            release_plan(&a, What::Guard { gen: 2 }, Instant::now()),
            None
        );
        assert!(release_plan(&a, What::Guard { gen: 3 }, Instant::now()).is_some());
    }

    #[test]
    fn a_release_with_another_one_waiting_in_line_gives_back_only_its_own_hold() {
        // Two guards left, neither counted any more: the first release to run is not the last.
        let mut a = account(2, 0, 0);
        a.pending_releases = 1;
        let first = release_plan(&a, What::Guard { gen: 0 }, Instant::now()).unwrap();
        assert_eq!((first.expected, first.by), (2, 1));
        a.pending_releases = 0;
        a.count = 1;
        let last = release_plan(&a, What::Guard { gen: 0 }, Instant::now()).unwrap();
        assert_eq!((last.expected, last.by), (1, 1));
    }

    #[test]
    fn the_last_guard_releases_every_hold_and_others_release_one() {
        let last = release_plan(&account(3, 0, 0), What::Guard { gen: 0 }, Instant::now()).unwrap();
        assert_eq!((last.expected, last.by), (3, 3));
        let one = release_plan(&account(3, 1, 1), What::Guard { gen: 0 }, Instant::now()).unwrap();
        assert_eq!((one.expected, one.by), (3, 1));
        // A watchdog hold remains: the TTL is left to the watchdog.
        assert_eq!(one.remaining_ttl_ms, -1);
        // Only a fixed lease remains: the TTL becomes what it needs.
        let fixed =
            release_plan(&account(2, 0, 1), What::Guard { gen: 0 }, Instant::now()).unwrap();
        assert!(fixed.remaining_ttl_ms > 9_000 && fixed.remaining_ttl_ms <= 10_000);
    }

    #[test]
    fn a_dark_attempt_is_settled_only_when_there_is_one() {
        assert_eq!(
            release_plan(&account(1, 1, 0), What::Dark, Instant::now()),
            None
        );
        let mut a = account(1, 1, 0);
        a.dark = true;
        let settle = release_plan(&a, What::Dark, Instant::now()).unwrap();
        // With a live guard, only the dark hold (if it is there) goes.
        assert_eq!((settle.expected, settle.by, settle.dark), (1, 0, true));
        let mut a = account(0, 0, 0);
        a.dark = true;
        let settle = release_plan(&a, What::Dark, Instant::now()).unwrap();
        assert_eq!((settle.expected, settle.by, settle.dark), (0, 0, true));
    }

    #[test]
    fn shutdown_releases_everything_it_knows_of() {
        assert_eq!(
            release_plan(&account(0, 0, 0), What::All, Instant::now()),
            None
        );
        let all = release_plan(&account(4, 1, 2), What::All, Instant::now()).unwrap();
        assert_eq!((all.expected, all.by), (4, 4));
    }
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
pub(crate) struct HoldRef(Option<NonZeroU64>);

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
}

impl FieldTurn {
    fn held(&self) -> &Held {
        self.owner()
    }

    /// The hold count as of the last reply: what the next script compares against.
    pub(crate) fn count(&self) -> u64 {
        self.with(|a| a.count)
    }

    /// Whether the holds of generation `gen` are still the live ones.
    pub(crate) fn gen_is(&self, gen: u64) -> bool {
        self.with(|a| a.gen == gen)
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
            // The script gave the lock at least this hold's whole lease.
            a.unconfirmed = false;
        });
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
                    if a.watchdog_valid.is_none_or(|v| v < own) {
                        a.watchdog_valid = Some(own);
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
            Some(Registered {
                gen: a.gen,
                hold,
                epoch: held.guard_made(),
            })
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
                        a.watchdog_valid = None;
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
