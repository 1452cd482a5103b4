//! The losses of a field that live guards may still ask about, and the clock deadlines are
//! stored against (pure bookkeeping).

use std::time::{Duration, Instant};

use crate::engine::validity::LostReason;

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
pub(super) struct LossLog {
    /// By epoch, ascending.
    kept: Vec<Loss>,
}

impl LossLog {
    /// A guard made at an epoch that has ended is gone.
    pub(super) fn guard_gone(&mut self, epoch: u64) {
        if let Ok(at) = self.kept.binary_search_by_key(&epoch, |l| l.epoch) {
            self.kept[at].live -= 1;
            if self.kept[at].live == 0 {
                self.kept.remove(at);
            }
        }
    }

    /// The current epoch `now`, in which `live` guards still live were made, ends: for
    /// `reason`, trusted until `until`. Returns the next epoch.
    pub(super) fn bump(&mut self, now: u64, live: u32, reason: LostReason, until: Instant) -> u64 {
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
    pub(super) fn loss(&self, epoch: u64) -> (LostReason, Instant) {
        match self.kept.binary_search_by_key(&epoch, |l| l.epoch) {
            Ok(at) => (self.kept[at].reason, self.kept[at].until),
            Err(_) => (LostReason::Gone, Instant::now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
