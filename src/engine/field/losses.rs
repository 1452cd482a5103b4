//! The losses of a field that live guards may still ask about, the cell of its validity
//! deadline, and the clock deadlines are stored against (pure bookkeeping).

use std::sync::atomic::{AtomicU64, Ordering};
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
pub(super) struct DeadlineCell(AtomicU64);

/// The top bit of a [`DeadlineCell`]: a reader found the deadline passed.
const SEEN_PASSED: u64 = 1 << 63;

/// One reading of a [`DeadlineCell`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Snapshot(u64);

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

    /// For a reader that found `seen` passed: marks it so in the cell. `false` when the cell no
    /// longer holds `seen` (read again).
    pub(super) fn mark_seen(&self, seen: Snapshot) -> bool {
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

    /// For the mover: stores `next` if the cell still holds `read`. `false` when a reader marked
    /// it passed in between.
    pub(super) fn replace(&self, read: Snapshot, next: Option<Instant>) -> bool {
        self.0
            .compare_exchange(read.0, Self::raw(next), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// For the mover, once the guards that could have seen the old deadline are marked lost
    /// (their epoch has ended): stores `next` whatever the cell holds.
    pub(super) fn set(&self, next: Option<Instant>) {
        self.0.store(Self::raw(next), Ordering::Release);
    }

    fn raw(next: Option<Instant>) -> u64 {
        next.map_or(0, to_nanos)
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
    fn a_deadline_found_passed_is_never_moved_on_unseen() {
        let t0 = Instant::now();
        let cell = DeadlineCell::default();
        assert_eq!(cell.read().at(t0), Reading::Unset);
        let d = t0 + Duration::from_millis(5);
        cell.set(Some(d));
        // The mover reads the cell and its clock before the deadline...
        let moved_from = cell.read();
        assert_eq!(moved_from.at(t0), Reading::Ahead(d));
        // ...a reader finds it passed afterwards and marks it...
        let later = d + Duration::from_millis(1);
        let seen = cell.read();
        assert_eq!(seen.at(later), Reading::Passed(d));
        assert!(cell.mark_seen(seen));
        // ...so the mover's store fails, and the deadline reads passed at any instant.
        assert!(!cell.replace(moved_from, Some(d + Duration::from_secs(30))));
        let marked = cell.read();
        assert_eq!(marked.at(t0), Reading::Passed(d));
        assert_eq!(marked.deadline(), Some(d));
        // Once the guards are marked lost, the mover sets the next deadline outright.
        cell.set(Some(d + Duration::from_secs(30)));
        assert_eq!(
            cell.read().at(later),
            Reading::Ahead(d + Duration::from_secs(30))
        );
        // A reader's mark on a value that changed meanwhile fails (it reads again).
        let stale = Snapshot(to_nanos(d));
        assert!(!cell.mark_seen(stale));
        // A replace of an unchanged value succeeds, and so does clearing it.
        let now = cell.read();
        assert!(cell.replace(now, None));
        assert_eq!(cell.read().at(later), Reading::Unset);
    }

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
