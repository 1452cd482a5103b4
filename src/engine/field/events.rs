//! The events that change a field's account, and nothing else does (the account's fields are
//! private to `field/`).
//!
//! Events that change what we know Redis holds for the field (the count, a lost reply, the
//! generation, grants, the pending direct-grant nonce) are methods of the field's turn
//! (`Turn<Held>`): only the operation whose turn it is can call them, so the count read at the
//! start of an operation is still the truth when its reply is recorded. Events of the local
//! bookkeeping (a guard leaving, a call joining or leaving the queue) are methods of [`Held`]
//! and run under the lane's mutex, from any thread, synchronously in `Drop` if need be.

use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use super::account::{release_plan, FixedHold, What};
use super::{next_id, FieldTurn, Held};
use crate::engine::validity::{validity_deadline, LostReason};
use crate::lease::Lease;
use crate::wire::ReleaseArgs;

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
