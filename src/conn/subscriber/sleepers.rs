//! The waiters of one semaphore channel in this client (PROTOCOL 11): they sleep in arrival
//! order, each with the number of permits it needs, and a message carrying the available count
//! wakes only the waiters whose needs fit into that count, in that order, rather than every
//! waiter of the client (which then all ran an acquire script for a single free permit). A
//! Redisson JVM likewise wakes "up to that many" of its waiters.
//!
//! Invariant: a count is never left unclaimed by this client's waiters because of how they were
//! woken. Enforced by:
//! * waiters already woken (and not yet through the attempt it is for) count against a count
//!   before anybody else is woken, so one message never wakes more than it can serve; only
//!   those whose need fits into what is left count, so a woken waiter that needs more than the
//!   count never swallows a count the others could have used;
//! * a waiter that a count was charged to while its attempt ran (it was woken and counted
//!   against the count, or was woken by it) tries again at once (`SleeperSlot::spent` says
//!   so, `coord::wait_on` acts on it): its attempt may have run on the server before the
//!   release that message announced. A message nobody is charged with during an attempt does
//!   not send that attempt's waiter round again: the waiters it woke look instead, so under a
//!   stream of releases each message costs the attempts it can serve, not one per waiter that
//!   happened to be mid-attempt;
//! * a waiter that leaves (permits taken, cancelled mid-attempt, out of time, failed) while it
//!   was woken, or after a count was charged to it during its last attempt, hands the wake-up
//!   on: the waiters behind it are chosen again against the last count seen;
//! * a wake-up that is not a count (a reconnect, a heartbeat's finding, a payload this client
//!   cannot read) wakes every waiter;
//! * a count may be less than what is available (Redisson publishes how many permits some calls
//!   returned, not the new count): the first waiter passed over because it needs more is woken
//!   too, to look.
//!
//! A wrong guess costs one script call (a waiter that finds the permits gone sleeps again) and
//! a missed one at most `coord::RECHECK`, never a permit: the scripts decide, not the wake-ups.

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// One waiting call.
#[derive(Debug)]
struct Sleeper {
    need: u64,
    notify: Notify,
    /// [`ARMED`] and [`CHARGED`], in one word so that a waiter finishing an attempt
    /// (`SleeperSlot::spent`) and a message counted against it cannot pass each other: a count
    /// is charged to a woken waiter only while it is still armed, and `spent` disarms it and
    /// takes the charge in one step.
    state: AtomicU8,
}

/// Woken by a count, and not yet through the attempt that wake-up is for.
const ARMED: u8 = 1;
/// A count was charged to the waiter since its current attempt began (`SleeperSlot::begin`).
const CHARGED: u8 = 2;

impl Sleeper {
    /// This waiter answers for (part of) a count: it is woken, and an attempt of it in flight
    /// is followed by another.
    fn charge(&self) {
        self.state.fetch_or(ARMED | CHARGED, Ordering::SeqCst);
        self.notify.notify_one();
    }

    fn armed(&self) -> bool {
        self.state.load(Ordering::SeqCst) & ARMED != 0
    }

    /// Charges a count to this waiter if it is still armed; whether it was.
    fn charge_if_armed(&self) -> bool {
        self.state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |st| {
                (st & ARMED != 0).then_some(st | CHARGED)
            })
            .is_ok()
    }
}

/// The waiters of one channel, in arrival order.
#[derive(Debug)]
pub(crate) struct Sleepers {
    queue: Mutex<Vec<Arc<Sleeper>>>,
    /// The last count a message carried (`i64::MIN`: none yet, or one this client cannot read).
    last: AtomicI64,
}

impl Default for Sleepers {
    fn default() -> Self {
        Sleepers {
            queue: Mutex::default(),
            last: AtomicI64::new(i64::MIN),
        }
    }
}

fn lock(queue: &Mutex<Vec<Arc<Sleeper>>>) -> MutexGuard<'_, Vec<Arc<Sleeper>>> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sleepers {
    /// Registers a waiter that needs `need` permits, behind every waiter registered before it.
    pub(crate) fn join(self: &Arc<Self>, need: u64) -> SleeperSlot {
        let sleeper = Arc::new(Sleeper {
            need: need.max(1),
            notify: Notify::new(),
            state: AtomicU8::new(0),
        });
        lock(&self.queue).push(sleeper.clone());
        SleeperSlot {
            sleepers: self.clone(),
            sleeper,
            done: false,
        }
    }

    /// A message carried the available count `count`: wakes the waiters it can serve.
    pub(crate) fn counted(&self, count: i64) {
        self.last.store(count, Ordering::SeqCst);
        self.wake_for(u64::try_from(count).unwrap_or(0));
    }

    /// A wake-up that is not a count: every waiter looks.
    pub(crate) fn wake_all(&self) {
        self.last.store(i64::MIN, Ordering::SeqCst);
        for s in lock(&self.queue).iter() {
            s.charge();
        }
    }

    /// Wakes, in arrival order, the waiters whose needs fit into `available`; those already
    /// woken count against it first. The first waiter passed over because it needs more than
    /// was left is woken too, to look: a Redisson client publishes how many permits it returned
    /// (`tryRelease` of several ids, `addPermits`), which can be less than what is available.
    fn wake_for(&self, available: u64) {
        let queue = lock(&self.queue);
        let mut left = available;
        for s in queue.iter() {
            // Counted against a woken waiter whose need fits: it answers for that part. One
            // that needs more than is left (a caller of several permits woken to look) takes
            // nothing of it, so the count still wakes the waiters it can serve.
            if s.need <= left && s.charge_if_armed() {
                left -= s.need;
            }
        }
        let mut probe = None;
        for s in queue.iter() {
            if left == 0 {
                break;
            }
            if s.armed() {
                continue;
            }
            if s.need > left {
                probe = probe.or(Some(s));
                continue;
            }
            left -= s.need;
            s.charge();
        }
        if let Some(s) = probe {
            s.charge();
        }
    }

    /// Chooses again against the last count seen (every waiter when there was none).
    fn hand_on(&self) {
        match self.last.load(Ordering::SeqCst) {
            i64::MIN => self.wake_all(),
            count => self.wake_for(u64::try_from(count).unwrap_or(0)),
        }
    }

    /// How many waiters are registered (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.queue).len()
    }
}

/// A waiting call's place among the [`Sleepers`]; leaving it (drop) hands a pending wake-up on.
#[derive(Debug)]
pub(crate) struct SleeperSlot {
    sleepers: Arc<Sleepers>,
    sleeper: Arc<Sleeper>,
    /// Left with nothing to hand on.
    done: bool,
}

impl SleeperSlot {
    /// Returns once the waiter was woken since it last came here (at once if it was meanwhile).
    pub(crate) async fn woken(&self) {
        self.sleeper.notify.notified().await;
    }

    /// An attempt is about to be sent: what was charged to this waiter before is served by it.
    pub(crate) fn begin(&self) {
        self.sleeper.state.fetch_and(!CHARGED, Ordering::SeqCst);
    }

    /// An attempt has run: the wake-up it was for, if any, is spent. Returns whether a count
    /// was charged to this waiter while the attempt ran (since [`begin`](Self::begin)): then it
    /// must look again (or hand the wake-up on when it leaves), because its attempt may have
    /// run on the server before that release.
    pub(crate) fn spent(&self) -> bool {
        self.sleeper.state.swap(0, Ordering::SeqCst) & CHARGED != 0
    }

    /// The call leaves; `charged`: what [`spent`](Self::spent) returned for its last attempt
    /// (a count it answered for came while that attempt ran), so the others are chosen again.
    pub(crate) fn leave(mut self, charged: bool) {
        self.done = !charged && !self.sleeper.armed();
    }
}

impl Drop for SleeperSlot {
    fn drop(&mut self) {
        lock(&self.sleepers.queue).retain(|s| !Arc::ptr_eq(s, &self.sleeper));
        if !self.done || self.sleeper.armed() {
            self.sleepers.hand_on();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;

    /// Whether `slot` was woken (a stored wake-up is taken).
    fn woken(slot: &SleeperSlot) -> bool {
        let fut = slot.woken();
        tokio::pin!(fut);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        fut.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn a_count_wakes_only_the_waiters_it_can_serve_in_arrival_order() {
        let s = Arc::new(Sleepers::default());
        let a = s.join(2);
        let b = s.join(1);
        let c = s.join(1);
        let d = s.join(1);
        s.counted(1);
        // a needs 2: passed over, but woken to look (the count may be a Redisson delta); b
        // fits; nobody else.
        assert!(woken(&a));
        assert!(woken(&b));
        assert!(!woken(&c));
        assert!(!woken(&d));
        // a found 1, not 2: spent. b has not been through its attempt yet: it counts against
        // the next count first, so a count of 2 leaves room for one waiter of 1 (c), and a is
        // woken to look again as the first one passed over.
        a.spent();
        s.counted(2);
        assert!(woken(&c));
        assert!(!woken(&d));
        assert!(woken(&a));
        // Nothing left over: nobody passed over, nobody woken.
        a.spent();
        s.counted(1);
        assert!(!woken(&a) && !woken(&d));
        for slot in [a, b, c, d] {
            slot.leave(false);
        }
    }

    #[test]
    fn woken_waiters_count_against_the_next_count_and_spent_ones_do_not() {
        let s = Arc::new(Sleepers::default());
        let a = s.join(1);
        let b = s.join(1);
        let c = s.join(1);
        s.counted(1);
        assert!(woken(&a));
        // a is still armed: a count of 1 is a's, nobody else wakes.
        s.counted(1);
        assert!(!woken(&b) && !woken(&c));
        // a's attempt found nothing: the next count of 1 goes to a again (first in line).
        a.spent();
        s.counted(1);
        assert!(woken(&a));
        assert!(!woken(&b));
        // A count of 3 serves a (armed), b and c.
        s.counted(3);
        assert!(woken(&b) && woken(&c));
        for slot in [a, b, c] {
            slot.leave(false);
        }
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_woken_waiter_that_leaves_hands_its_wake_up_on() {
        let s = Arc::new(Sleepers::default());
        let a = s.join(1);
        let b = s.join(1);
        s.counted(1);
        assert!(woken(&a) && !woken(&b));
        // Cancelled before its attempt ran: b gets the wake-up.
        drop(a);
        assert!(woken(&b));
        // A waiter that got its permits with no message meanwhile hands nothing on.
        let c = s.join(1);
        b.spent();
        s.counted(0);
        assert!(!woken(&c));
        b.leave(false);
        assert!(!woken(&c), "b left with nothing to hand on");
        // One that saw a message during its attempt has the others chosen again.
        let d = s.join(1);
        s.counted(2);
        assert!(woken(&c) && woken(&d));
        c.spent();
        d.leave(true);
        assert!(woken(&c), "the last count (2) still has room for c");
        c.leave(false);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn only_a_waiter_a_count_was_charged_to_during_its_attempt_looks_again() {
        let s = Arc::new(Sleepers::default());
        let a = s.join(1);
        let b = s.join(1);
        let c = s.join(1);
        // a and b are woken and begin their attempts.
        s.counted(2);
        assert!(woken(&a) && woken(&b) && !woken(&c));
        a.begin();
        b.begin();
        // A count of 1 comes while both attempts run: it is a's (first in line), not b's, and
        // wakes nobody else.
        s.counted(1);
        assert!(!woken(&c));
        assert!(
            a.spent(),
            "a answers for the count that came during its attempt"
        );
        assert!(!b.spent(), "b was not charged: it need not look again");
        // A waiter on its first attempt (not woken) is charged when a count wakes it meanwhile.
        c.begin();
        s.counted(1);
        assert!(woken(&a), "a, first in line and back asleep, is woken");
        assert!(!c.spent());
        a.begin();
        assert!(
            !a.spent(),
            "what came before the attempt began is served by it"
        );
        // A count that finds every waiter asleep and none woken: the first in line answers.
        s.counted(1);
        c.begin();
        assert!(!c.spent());
        s.counted(0);
        b.begin();
        assert!(!b.spent(), "a count of 0 is charged to nobody");
        // A wake-up without a count is charged to everyone mid-attempt.
        c.begin();
        s.wake_all();
        assert!(c.spent());
        for slot in [a, b, c] {
            slot.leave(false);
        }
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_woken_waiter_that_needs_more_does_not_swallow_a_count() {
        let s = Arc::new(Sleepers::default());
        let greedy = s.join(2);
        let a = s.join(1);
        // The caller of 2 is woken to look (passed over by a count of 1), as is a.
        s.counted(1);
        assert!(woken(&greedy) && woken(&a));
        greedy.begin();
        // a's attempt ran (and found nothing) before the next count.
        a.begin();
        assert!(!a.spent());
        // While greedy's attempt runs, a count of 1 comes: greedy cannot use it, a can.
        s.counted(1);
        assert!(woken(&a), "the count wakes the waiter it can serve");
        assert!(
            !greedy.spent(),
            "greedy was not charged with a count it cannot use"
        );
        for slot in [greedy, a] {
            slot.leave(false);
        }
    }

    #[test]
    fn a_wake_up_without_a_count_wakes_everyone() {
        let s = Arc::new(Sleepers::default());
        let a = s.join(5);
        let b = s.join(1);
        s.wake_all();
        assert!(woken(&a) && woken(&b));
        // With no count known, a waiter that leaves woken wakes everyone again.
        drop(a);
        assert!(woken(&b));
        b.leave(false);
    }
}
