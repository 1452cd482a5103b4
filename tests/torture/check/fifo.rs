//! FIFO (`fifo-order`, `fifo-arrival`) among fair waiters, proven by queue snapshots (see the
//! rules in the parent module).

use std::collections::HashMap;

use fairlock_testkit::history::Outcome;
use fairlock_testkit::redisson_peer::GIVE_UP_FAILED;

use super::{by_name, Call, CheckStats, History, Snapshot, Violation};

/// Could `c`'s stale queue entry outlive it? (Its give-up runs after it ends, or may have failed.)
/// A granted call left the queue with its grant. A timed-out call gave up as its wait ended,
/// unless a fault touching its process was near that moment (a killed connection or a restart
/// can lose the give-up and leave the entry: seen with the Redisson-protocol peer, whose thread's
/// next call then took that place up, as Redisson lets a thread do), or the peer says its give-up
/// failed (a command timeout on a loaded machine needs no injected fault).
fn may_leave_stale_entry(h: &History, c: &Call) -> bool {
    match c.end {
        Some((_, Outcome::Granted, _)) => false,
        // A peer's tryLock whose give-up failed may have left its entry queued.
        Some(_) if c.java && c.end_detail == GIVE_UP_FAILED => true,
        Some((t, Outcome::TimedOut, _)) => {
            let command = h.params.command_timeout.as_nanos() as u64;
            h.fault_near(&c.proc, t, t + command, h.params.fault_grace)
                .is_some()
        }
        _ => true,
    }
}

struct FairIndex<'a> {
    h: &'a History,
    /// Calls of one name by field, by start time (fields used by one task only).
    by_field: HashMap<&'a str, Vec<&'a Call>>,
    /// Grants of the name by token.
    grants: Vec<&'a Call>,
    snaps: Vec<&'a Snapshot>,
}

impl<'a> FairIndex<'a> {
    fn new(h: &'a History, name: &str, calls: &[&'a Call]) -> Self {
        let mut by_field: HashMap<&str, Vec<&Call>> = HashMap::new();
        let mut shared: std::collections::HashSet<&str> = Default::default();
        for c in calls {
            if c.shared {
                shared.insert(c.field.as_str());
            }
            by_field.entry(c.field.as_str()).or_default().push(c);
        }
        for f in shared {
            by_field.remove(f);
        }
        for v in by_field.values_mut() {
            v.sort_by_key(|c| c.t_start);
        }
        let mut grants: Vec<&Call> = calls
            .iter()
            .copied()
            .filter(|c| c.token().is_some())
            .collect();
        grants.sort_by_key(|c| c.token());
        let mut snaps: Vec<&Snapshot> = h.snapshots.iter().filter(|s| s.name == name).collect();
        snaps.sort_by_key(|s| s.t0);
        FairIndex {
            h,
            by_field,
            grants,
            snaps,
        }
    }

    /// The call a queue entry `field` in `s` belongs to, when that is certain.
    fn owner(&self, s: &Snapshot, field: &str) -> Option<&'a Call> {
        let calls = self.by_field.get(field)?;
        let idx = calls.iter().rposition(|c| c.t_start <= s.t0)?;
        let c = calls[idx];
        let covers = match c.end {
            None => true,
            Some((t, _, _)) => t >= s.t1,
        };
        if !covers {
            return None;
        }
        if c.token().is_some_and(|tok| tok <= s.counter) {
            return None;
        }
        if c.java {
            if !self.no_stale_entry_before(calls, idx, s.t0) {
                return None;
            }
            return Some(c);
        }
        // A fairlock call: an earlier call's entry can outlive that call (its give-up, or an
        // attempt it abandoned in flight, runs later in the background, before this call's first
        // attempt). So the entry is this call's only once this call is seen to have joined, or
        // when no earlier call of the field exists.
        if idx == 0 || c.joined.is_some_and(|j| j <= s.t0) {
            Some(c)
        } else {
            None
        }
    }

    /// Whether the call before `calls[idx]` (same field, same name) is certain to have left no
    /// entry in the queue by `at`: it was granted or timed out, or a snapshot between its end and
    /// `at` shows the field gone.
    fn no_stale_entry_before(&self, calls: &[&Call], idx: usize, at: u64) -> bool {
        if idx == 0 {
            return true;
        }
        let prev = calls[idx - 1];
        if !may_leave_stale_entry(self.h, prev) {
            return true;
        }
        let field = prev.field.as_str();
        let prev_end = prev.end.map_or(u64::MAX, |(t, _, _)| t);
        self.snaps
            .iter()
            .any(|x| x.t0 > prev_end && x.t1 <= at && !x.queue.iter().any(|f| f == field))
    }

    /// For a Redisson-protocol call: its thread's abandoned earlier wait may still hold a place in
    /// the queue, which Redisson lets the same thread take up again (not an overtake).
    fn inherits_place(&self, c: &Call) -> bool {
        if !c.java {
            return false;
        }
        let Some(calls) = self.by_field.get(c.field.as_str()) else {
            return false;
        };
        let Some(idx) = calls.iter().position(|x| x.id == c.id) else {
            return false;
        };
        !self.no_stale_entry_before(calls, idx, c.t_start)
    }
}

/// The earliest time `c`'s queue entry can be gone by its own doing, when it was not granted.
fn leaves_no_earlier_than(h: &History, c: &Call) -> u64 {
    let died = h.frozen.get(&c.proc).copied().unwrap_or(u64::MAX);
    if c.java {
        // The peer: a timed-out tryLock gives up once its wait is over; an abandoned (interrupted)
        // waiter never gives up by itself, but its place belongs to its thread (its owner field):
        // the thread's next call on the lock takes that place up or gives it up, so the abandoned
        // call's claim ends when that call starts. Any other end (a give-up at teardown, an
        // error) may have left at any time during the call.
        return match c.end {
            None => died,
            Some((_, Outcome::TimedOut, _)) => c.t_start + c.wait_ms.unwrap_or(0) * 1_000_000,
            Some((_, Outcome::Cancelled, _)) if c.end_detail == "abandoned" => h
                .calls
                .iter()
                .filter(|n| n.field == c.field && n.name == c.name && n.t_start > c.t_start)
                .map(|n| n.t_start)
                .min()
                .unwrap_or(died)
                .min(died),
            Some(_) => c.t_start,
        };
    }
    let t = match c.end {
        None => u64::MAX,
        Some((_, Outcome::TimedOut, _)) => {
            // The give-up runs only once the wait is over.
            c.t_start + c.wait_ms.unwrap_or(0) * 1_000_000
        }
        Some((t, Outcome::Shutdown, _)) => {
            let sd = h
                .shutdowns
                .iter()
                .filter(|(cl, st)| *cl == c.client && *st >= c.t_start)
                .map(|(_, st)| *st)
                .min()
                .unwrap_or(t);
            sd.min(t)
        }
        Some((t, _, _)) => t,
    };
    t.min(died)
}

/// Why the waiter `a` (queued in `s`) may have been purged legitimately before `until`.
/// `snaps`: the snapshots of `a`'s lock, by start time ([`FairIndex::snaps`]); `s` is one of them.
fn victim_exempt(
    h: &History,
    snaps: &[&Snapshot],
    s: &Snapshot,
    a: &Call,
    until: u64,
) -> Option<String> {
    if a.java {
        // A Redisson waiter is purged once its deadline score is past, and only Java shifts lower
        // a score. If a snapshot before `until` shows its entry gone, it lost its place then (it
        // may have joined again at the tail since, with a fresh score): judge its deadline up to
        // that snapshot. It may also have been purged and joined again between two snapshots
        // (a Java grant's shift runs it out; its own next poll purges it and queues it afresh),
        // so every snapshot that shows its score is a starting point: from each, the score less
        // every Java shift that may have run since is the lowest its deadline can have been (as
        // long as it kept that entry). If any of them is not after `until`, it may have lapsed.
        // (Fairlock's own scripts may change scores too; a snapshot sees whatever they did up
        // to it.) Only snapshots from `s` on can matter, and none that began after `until`.
        let from = snaps.partition_point(|x| x.t0 < s.t0);
        let window = || {
            snaps[from..]
                .iter()
                .take_while(move |x| x.t0 <= until)
                .filter(move |x| x.t1 <= until)
        };
        let until = window()
            .filter(|x| x.t0 > s.t0 && !x.queue.contains(&a.field))
            .map(|x| x.t1)
            .min()
            .unwrap_or(until);
        let at_ms = until as f64 / 1e6 + h.params.epoch_offset_ms;
        let slack_ms = h.params.slack.as_millis() as f64;
        let mut starts: Vec<&Snapshot> = window()
            .filter(|x| x.t1 <= until && x.scores.contains_key(&a.field))
            .copied()
            .collect();
        if starts.is_empty() {
            starts.push(s);
        }
        for x in starts {
            let Some(&score) = x.scores.get(&a.field) else {
                continue;
            };
            let shifted: u64 = h
                .shifts
                .iter()
                .filter(|(name, t0, t1, _)| *name == a.name && *t0 <= until && *t1 >= x.t0)
                .map(|(_, _, _, ms)| *ms)
                .sum();
            let lowest = score - shifted as f64;
            if lowest <= at_ms + slack_ms {
                return Some(format!(
                    "java deadline {lowest:.0} (score {score:.0} less shifts {shifted}) not \
                     after {at_ms:.0}"
                ));
            }
        }
        return h.fault_near(&a.proc, s.t0, until, h.params.fault_grace);
    }
    if near_margin(a) {
        // A lease close to the round trip: the grant its turn brought may reach it already run
        // out, and the library gives such a grant back (the next waiter gets the lock) and the
        // waiter joins again at the tail, after a backoff (`lock/acquire.rs`,
        // `back_off_untrusted`; PROTOCOL 7). It had its turn; it could not use it.
        return Some(format!(
            "lease of {} ms, near the validity margin",
            a.lease_ms?
        ));
    }
    let grace = h.params.liveness + h.params.fault_grace;
    if let Some(why) = h.fault_near_where(&a.proc, s.t0, until, grace, |f| f.kind != LOST_REPLIES) {
        return Some(why);
    }
    // Replies lost on their way back, and nothing else: every request of the waiter reached
    // Redis (its attempts and heartbeats ran), so it stayed queued and alive, and a resend of an
    // attempt whose reply was lost keeps the place the first send took (`fair_acquire.lua`, the
    // call's mark). It can only have lost its turn by having it: a grant whose reply or message
    // never came back, so the lock passed on once that hold ran out. A snapshot showing it among
    // the holders is that turn (such a hold lasts the grant's TTL, a liveness window, or more).
    let lost = h.fault_near(&a.proc, s.t0, until, grace)?;
    snaps
        .iter()
        .filter(|x| x.t0 >= s.t0 && x.t1 <= until)
        .any(|x| x.holders.contains(&a.field))
        .then(|| format!("{lost}, and it held the lock meanwhile"))
}

/// The proxy fault that drops every reply to one process while its requests still arrive.
const LOST_REPLIES: &str = "proxy-lost-replies";

/// Fixed leases under this many ms are "near the validity margin" (the workload draws 3 to 8 ms
/// there; its other leases start at 60 ms).
const NEAR_MARGIN_MS: u64 = 50;

/// Whether `c`'s lease is near the validity margin: a grant may reach it already run out, and
/// is then given back; the waiter joins the queue again at the tail.
pub(super) fn near_margin(c: &Call) -> bool {
    c.lease_ms.is_some_and(|l| l < NEAR_MARGIN_MS)
}

/// Whether `b`'s grant may be the take-up of an earlier call's grant (lost reply): a fault
/// touched its process between `from` and its return.
fn grant_suspect(h: &History, b: &Call, from: u64) -> bool {
    let (t, _) = b.granted().unwrap();
    h.fault_near(&b.proc, from, t, h.params.fault_grace)
        .is_some()
}

/// FIFO among fair waiters.
pub fn check_fifo(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut reported: std::collections::HashSet<(String, String)> = Default::default();
    for (name, calls) in by_name(h) {
        if !calls.iter().any(|c| c.fair) {
            continue;
        }
        let idx = FairIndex::new(h, name, &calls);
        for s in &idx.snaps {
            stats.snapshots += 1;
            let owners: Vec<Option<&Call>> = s.queue.iter().map(|f| idx.owner(s, f)).collect();
            // fifo-order
            for (i, a) in owners.iter().enumerate() {
                let Some(a) = a else { continue };
                for b in owners.iter().skip(i + 1).flatten() {
                    let Some((b_ret, Some(tb))) = b.granted() else {
                        continue;
                    };
                    if tb <= s.counter
                        || b.reentrant
                        || grant_suspect(h, b, s.t0)
                        || idx.inherits_place(b)
                    {
                        continue;
                    }
                    stats.fifo_pairs += 1;
                    let a_first = match a.token() {
                        Some(ta) => ta < tb,
                        None => leaves_no_earlier_than(h, a) <= b_ret,
                    };
                    if a_first {
                        continue;
                    }
                    if let Some(why) = victim_exempt(h, &idx.snaps, s, a, b_ret) {
                        let _ = why;
                        stats.fifo_exempt += 1;
                        continue;
                    }
                    if reported.insert((a.id.clone(), b.id.clone())) {
                        out.push(Violation {
                            rule: "fifo-order",
                            message: format!(
                                "{} overtook {} on {name}: both queued at {} (counter {}, queue \
                                 {:?}), the later one was granted token {tb} while the earlier \
                                 was still waiting",
                                b.field,
                                a.field,
                                h.rel_ms(s.t0),
                                s.counter,
                                s.queue
                            ),
                            evidence: vec![a.describe(h), b.describe(h)],
                            ids: vec![a.id.clone(), b.id.clone()],
                        });
                    }
                }
            }
            // fifo-arrival
            for b in owners.iter().flatten() {
                let b_leaves = match b.token() {
                    Some(_) => u64::MAX,
                    None => leaves_no_earlier_than(h, b),
                };
                let start = idx
                    .grants
                    .partition_point(|g| g.token().unwrap() <= s.counter);
                for a in &idx.grants[start..] {
                    let ta = a.token().unwrap();
                    if b.token().is_some_and(|tb| tb <= ta) {
                        break;
                    }
                    if b.token().is_none() && a.t_start >= b_leaves {
                        break;
                    }
                    if a.t_start <= s.t1 || a.field == b.field || a.reentrant || a.shared {
                        continue;
                    }
                    let (a_ret, _) = a.granted().unwrap();
                    if b.token().is_none() && a_ret >= b_leaves {
                        continue;
                    }
                    if grant_suspect(h, a, s.t0) || idx.inherits_place(a) {
                        continue;
                    }
                    stats.fifo_pairs += 1;
                    if victim_exempt(h, &idx.snaps, s, b, a_ret).is_some() {
                        stats.fifo_exempt += 1;
                        continue;
                    }
                    if reported.insert((b.id.clone(), a.id.clone())) {
                        out.push(Violation {
                            rule: "fifo-arrival",
                            message: format!(
                                "{} jumped the queue of {name}: its call started at {}, after {} \
                                 was seen queued at {} (counter {}, queue {:?}), and was granted \
                                 token {ta} first",
                                a.field,
                                h.rel_ms(a.t_start),
                                b.field,
                                h.rel_ms(s.t0),
                                s.counter,
                                s.queue
                            ),
                            evidence: vec![b.describe(h), a.describe(h)],
                            ids: vec![b.id.clone(), a.id.clone()],
                        });
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::GIVE_UP_FAILED;
    use crate::check::fixtures::*;

    #[test]
    fn fifo_order_catches_an_overtake_and_accepts_legal_orders() {
        // A ahead of B at 100 ms (counter 1); B is granted token 2 at 150 ms while A waits on.
        let base = |h: &mut History| {
            h.snapshots.push(snap("fair", 100, 1, &["u:1", "v:1"]));
            h.add_events(call(
                "b",
                "p1",
                "fair",
                "v:1",
                60,
                None,
                150,
                Outcome::Granted,
                Some(2),
            ));
        };
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            None,
            300,
            Outcome::Granted,
            Some(3),
        ));
        assert_eq!(rules(&h), vec!["fifo-order"]);
        // A first: fine.
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            None,
            120,
            Outcome::Granted,
            Some(1),
        ));
        assert!(!rules(&h).contains(&"fifo-order"));
        // A's try_lock wait (60 ms from 50) was over by B's grant: it may have left.
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            Some(60),
            115,
            Outcome::TimedOut,
            None,
        ));
        assert!(!rules(&h).contains(&"fifo-order"));
        // ... but not if the wait was longer.
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            Some(400),
            455,
            Outcome::TimedOut,
            None,
        ));
        assert_eq!(rules(&h), vec!["fifo-order"]);
        // A fault on A's process lets its place go.
        h.faults.push(Fault {
            kind: "sigstop".into(),
            scope: Scope::Proc("p0".into()),
            t0: 20 * MS,
            t1: 30 * MS,
        });
        assert!(rules(&h).is_empty());
        // A fault elsewhere does not.
        h.faults[0].scope = Scope::Proc("p1x".into());
        assert_eq!(rules(&h), vec!["fifo-order"]);
    }

    #[test]
    fn replies_lost_to_a_waiter_do_not_excuse_its_overtake_unless_it_had_its_turn() {
        // A ahead of B at 100 ms; B granted token 2 at 150 ms, A token 3 at 300 ms. Replies to
        // A's process were lost around then (its requests still reached Redis): its attempts
        // and heartbeats ran, so its place was never legitimately lost. That is how a resend of
        // a first attempt that dropped its own entry showed (fixed in `fair_acquire.lua`).
        let mut h = hist();
        h.snapshots.push(snap("fair", 100, 1, &["u:1", "v:1"]));
        h.add_events(call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            None,
            150,
            Outcome::Granted,
            Some(2),
        ));
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            None,
            300,
            Outcome::Granted,
            Some(3),
        ));
        h.faults.push(Fault {
            kind: "proxy-lost-replies".into(),
            scope: Scope::Proc("p0".into()),
            t0: 20 * MS,
            t1: 130 * MS,
        });
        assert_eq!(rules(&h), vec!["fifo-order"]);
        // Seen holding the lock before B's grant: A had its turn (a grant whose reply was lost).
        let mut turn = snap("fair", 120, 1, &["v:1"]);
        turn.holders = vec!["u:1".into()];
        h.snapshots.push(turn);
        assert!(rules(&h).is_empty());
        // Any other fault still lets its place go.
        let mut h2 = hist();
        h2.snapshots.push(snap("fair", 100, 1, &["u:1", "v:1"]));
        h2.add_events(call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            None,
            150,
            Outcome::Granted,
            Some(2),
        ));
        h2.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            None,
            300,
            Outcome::Granted,
            Some(3),
        ));
        h2.faults.push(Fault {
            kind: "proxy-lost-requests".into(),
            scope: Scope::Proc("p0".into()),
            t0: 20 * MS,
            t1: 130 * MS,
        });
        assert!(rules(&h2).is_empty());
    }

    /// A's previous call on the name ("a0", dropped at 95 ms) and its next one ("a", from 96 ms,
    /// granted token 3), both by `proc`; B, queued from 60 ms, granted token 2; a snapshot at
    /// 100 ms shows A's field ahead of B's.
    fn a_field_queued_across_two_calls(proc: &str) -> History {
        let mut h = hist();
        h.snapshots.push(snap("fair", 100, 1, &["u:1", "v:1"]));
        let a0 = call(
            "a0",
            proc,
            "fair",
            "u:1",
            10,
            None,
            95,
            Outcome::Cancelled,
            None,
        );
        h.add_events(a0);
        let a = call(
            "a",
            proc,
            "fair",
            "u:1",
            96,
            None,
            300,
            Outcome::Granted,
            Some(3),
        );
        h.add_events(a);
        let b = call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            None,
            150,
            Outcome::Granted,
            Some(2),
        );
        h.add_events(b);
        h
    }

    #[test]
    fn fifo_entries_are_attributed_only_to_the_call_that_certainly_owns_them() {
        // The entry at 100 ms may be the dropped call's leftover, so the overtake cannot be
        // blamed on A's new call...
        let mut h = a_field_queued_across_two_calls("p0");
        assert!(!rules(&h).contains(&"fifo-order"));
        // ... not even when a snapshot in between shows the field gone: an attempt the dropped
        // call abandoned in flight may still join (and then leave) after that snapshot...
        h.snapshots.push(snap("fair", 97, 1, &["v:1"]));
        assert!(!rules(&h).contains(&"fifo-order"));
        // ... but A's own join before the snapshot makes the entry A's.
        h.add_events([Event::Joined {
            id: "a".into(),
            t: 99 * MS,
        }]);
        assert!(rules(&h).contains(&"fifo-order"));
        // For a Redisson-protocol thread a snapshot showing the field gone is enough: its
        // give-ups run inside its calls.
        let mut h = a_field_queued_across_two_calls("java");
        assert!(!rules(&h).contains(&"fifo-order"));
        h.snapshots.push(snap("fair", 97, 1, &["v:1"]));
        assert!(rules(&h).contains(&"fifo-order"));
    }

    /// B, a Redisson-protocol call on `j:101` from 60 ms, granted token 3 at 400 ms; A, a fairlock
    /// call from 120 ms, granted token 2 at 130 ms.
    fn java_b_overtaken_by_a(h: &mut History) {
        h.add_events(call(
            "b",
            "java",
            "fair",
            "j:101",
            60,
            None,
            400,
            Outcome::Granted,
            Some(3),
        ));
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            120,
            None,
            130,
            Outcome::Granted,
            Some(2),
        ));
    }

    #[test]
    fn a_peer_thread_whose_give_up_failed_may_take_its_place_up() {
        // Thread j:102 times out (its place in the queue ahead of B); its next call starts after
        // the snapshot and is granted before B. Only a failed give-up can have left that place.
        let jump = |detail: &str| {
            let mut h = hist();
            h.snapshots.push(snap("fair", 100, 1, &["j:102", "v:1"]));
            let mut first = call(
                "a0",
                "java",
                "fair",
                "j:102",
                50,
                Some(100),
                150,
                Outcome::TimedOut,
                None,
            );
            if let Some(Event::End { detail: d, .. }) = first.last_mut() {
                *d = detail.to_owned();
            }
            h.add_events(first);
            h.add_events(call(
                "b",
                "p1",
                "fair",
                "v:1",
                60,
                None,
                400,
                Outcome::Granted,
                Some(3),
            ));
            h.add_events(call(
                "a",
                "java",
                "fair",
                "j:102",
                150,
                Some(300),
                160,
                Outcome::Granted,
                Some(2),
            ));
            rules(&h)
        };
        assert_eq!(jump(""), vec!["fifo-arrival"]);
        assert!(jump(GIVE_UP_FAILED).is_empty());
    }

    #[test]
    fn fifo_arrival_catches_a_queue_jump() {
        // B queued at 100 ms; A's call starts at 120 ms and is granted (token 2) before B (3).
        let mut h = hist();
        h.snapshots.push(snap("fair", 100, 1, &["v:1"]));
        h.add_events(call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            None,
            400,
            Outcome::Granted,
            Some(3),
        ));
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            120,
            None,
            130,
            Outcome::Granted,
            Some(2),
        ));
        assert_eq!(rules(&h), vec!["fifo-arrival"]);
        // If B's wait was over before A was granted, B had left.
        let mut h = hist();
        h.snapshots.push(snap("fair", 100, 1, &["v:1"]));
        h.add_events(call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            Some(50),
            112,
            Outcome::TimedOut,
            None,
        ));
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            120,
            None,
            130,
            Outcome::Granted,
            Some(2),
        ));
        assert!(rules(&h).is_empty());
        // A Redisson waiter whose deadline has passed may be purged.
        let mut h = hist();
        let mut s = snap("fair", 100, 1, &["j:101"]);
        s.scores.insert("j:101".into(), 1_000_000.0 + 110.0);
        h.snapshots.push(s);
        java_b_overtaken_by_a(&mut h);
        assert!(rules(&h).is_empty(), "{:?}", check(&h, 9).0);
        // ... but not while its deadline is ahead (no Java shift since).
        h.snapshots[0]
            .scores
            .insert("j:101".into(), 1_000_000.0 + 5000.0);
        assert_eq!(rules(&h), vec!["fifo-arrival"]);
        // A Java acquisition shifting deadlines by 300 s in between makes it purgeable again.
        h.shifts.push(("fair".into(), 105 * MS, 106 * MS, 300_000));
        assert!(rules(&h).is_empty());
    }

    #[test]
    fn a_redisson_waiter_that_lapsed_and_joined_again_has_no_claim_to_its_old_place() {
        // B (Java) queued at 100 ms with a deadline at 110 ms; at 115 ms its entry is gone
        // (purged); at 125 ms it is back at the tail with a fresh score far ahead, behind A,
        // whose call started at 120 ms and is granted (token 2) before B (3). Seen from the
        // latest snapshot, B's deadline is far ahead; but B lost its place at 115 ms, when its
        // deadline had passed.
        let history = |deadline_ms: f64| {
            let mut h = hist();
            let mut s = snap("fair", 100, 1, &["j:101"]);
            s.scores.insert("j:101".into(), 1_000_000.0 + deadline_ms);
            h.snapshots.push(s);
            h.snapshots.push(snap("fair", 115, 1, &[]));
            let mut back = snap("fair", 125, 1, &["u:1", "j:101"]);
            back.scores.insert("j:101".into(), 1_000_000.0 + 300_125.0);
            h.snapshots.push(back);
            java_b_overtaken_by_a(&mut h);
            h
        };
        let h = history(110.0);
        assert!(rules(&h).is_empty(), "{:?}", check(&h, 9).0);
        // Had its deadline been ahead when it vanished, it was dropped while alive: still a jump.
        let h = history(5_000.0);
        assert_eq!(rules(&h), vec!["fifo-arrival"]);
    }

    #[test]
    fn a_redisson_waiter_run_out_by_a_shift_may_rejoin_between_two_snapshots() {
        // Seed 4217202790295420099: B (Java) queued at 100 ms with its deadline 5 s ahead; a Java
        // grant at 105 ms shifts every deadline 300 s earlier, B's next poll purges its entry and
        // queues it afresh at the tail behind A. No snapshot shows B gone: the one at 125 ms
        // already shows it back, with a fresh score far ahead. A's call (started 120 ms) is
        // granted (token 2) before B (3): B had lost its place.
        let history = |shift: u64| {
            let mut h = hist();
            let mut s = snap("fair", 100, 1, &["j:101"]);
            s.scores.insert("j:101".into(), 1_000_000.0 + 5_000.0);
            h.snapshots.push(s);
            let mut back = snap("fair", 125, 1, &["u:1", "j:101"]);
            back.scores.insert("j:101".into(), 1_000_000.0 + 300_125.0);
            h.snapshots.push(back);
            if shift > 0 {
                h.shifts.push(("fair".into(), 105 * MS, 106 * MS, shift));
            }
            java_b_overtaken_by_a(&mut h);
            h
        };
        let h = history(300_000);
        assert!(rules(&h).is_empty(), "{:?}", check(&h, 9).0);
        // Without the shift its deadline was ahead all along: still a jump.
        let h = history(0);
        assert_eq!(rules(&h), vec!["fifo-arrival"]);
    }
}
