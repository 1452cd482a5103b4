//! Unit tests of the field (`held.rs`, `ends.rs`): the account, the registry and the losses.

mod held {
    use super::super::held::*;

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

mod account {
    use super::super::ends::release_plan;
    use super::super::held::*;
    use std::time::{Duration, Instant};

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
        a.set_watchdog_valid(Some(t0 + Duration::from_secs(30)));
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

mod losses {
    use super::super::held::*;
    use crate::error::LostReason;
    use std::time::{Duration, Instant};

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

mod lease {
    use crate::engine::validity::Lease;
    use std::time::Duration;

    #[test]
    fn a_fixed_lease_is_checked_where_it_enters() {
        assert_eq!(Lease::new(None).unwrap(), Lease::Watchdog);
        assert!(Lease::new(Some(Duration::from_millis(2))).is_err());
        assert!(Lease::new(Some(crate::config::MAX_DURATION * 2)).is_err());
        let lease = Lease::new(Some(Duration::from_millis(1500))).unwrap();
        assert_eq!(lease.ttl_ms(Duration::from_secs(30)), 1500);
        assert_eq!(Lease::Watchdog.ttl_ms(Duration::from_secs(30)), 30_000);
    }
}

mod watch {
    use super::super::held::WatchWord;
    use crate::engine::driver::Watch;
    use std::time::{Duration, Instant};

    #[test]
    fn a_grant_that_counted_on_the_published_watch_makes_the_driver_look_again() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let mut w = WatchWord::default();
        assert!(!w.covers(now + s(30), false), "nothing published yet");
        w.look();
        let both = Watch {
            validity_at: Some(now + s(10)),
            renewing: true,
        };
        assert!(w.publish(both));
        // The validity timer fires no later than the new deadline, renewals are armed.
        assert!(w.covers(now + s(10), true));
        assert!(w.covers(now + s(20), true));
        assert!(!w.covers(now + s(5), false), "the timer would fire late");
        // A grant counts on it; the driver, which looked before, must look again.
        w.rely();
        assert!(!w.publish(Watch::default()));
        assert!(
            w.covers(now + s(20), true),
            "nothing changed by the refusal"
        );
        w.look();
        let validity_only = Watch {
            validity_at: Some(now + s(10)),
            renewing: false,
        };
        assert!(w.publish(validity_only));
        assert!(
            w.covers(now + s(10), false),
            "a fixed lease needs no renewals"
        );
        assert!(!w.covers(now + s(10), true), "a watchdog hold does");
        // An instant too far to store reads as no timer.
        let far = now + s(200 * 365 * 24 * 3600);
        assert!(w.publish(Watch {
            validity_at: Some(far),
            renewing: true,
        }));
        assert!(!w.covers(far, false));
    }
}
