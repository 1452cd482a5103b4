//! Permits (`permit-limit`), on each semaphore ([`SEM_NAME`] and [`BIG_SEM_NAME`], expirable, and
//! [`SEM_PLAIN_NAME`]): at no moment do the trusted holds of its permits add up to more than its
//! limit ([`sem_limit`]). A permit
//! hold is trusted as a lock hold is (`History::trusted_end`): from its acquire's return until its
//! release started, its validity ran out (nobody can reclaim an expirable permit before its
//! expiry, which is at least that late; a plain one never expires), its `lost()` fired, its client
//! shut down or its process froze. The permits of one call are its op's number (`sem1`, `sem2`).
//!
//! [`plain_permits_lost`] bounds how many permits of the plain semaphore killed processes may
//! have taken with them, for the parent's final count.

use super::{by_name, Call, CheckStats, History, Violation};
use crate::config::{sem_limit, BIG_SEM_NAME, SEM_NAME, SEM_PLAIN_NAME};
use fairlock_testkit::history::Outcome;

/// How many permits a semaphore call asked for.
fn permits(c: &Call) -> u64 {
    c.op.strip_prefix("sem")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

pub fn check_permits(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut by = by_name(h);
    let mut out = Vec::new();
    for name in [SEM_NAME, SEM_PLAIN_NAME, BIG_SEM_NAME] {
        if let Some(calls) = by.remove(name) {
            out.extend(check_one(h, name, &calls, stats));
        }
    }
    out
}

/// How long after it was handed over a background settle (a dropped acquire's give-back, a
/// dropped guard's release) may still be running: its resend window (half a call mark's ten
/// seconds) and one command timeout, with a margin.
const SETTLING_NS: u64 = 6_000_000_000;

/// The permits of the plain semaphore that processes which never exited by themselves (killed)
/// may have taken with them: `(certain, possible)`. Certain: granted, and no release started.
/// Possible besides: work that may not have finished when the process died: an acquire that had
/// not ended; a release started but not seen to finish (a drop hands it to the background), or
/// an acquire that ended without permits but may have left some to settle (cut off, failed),
/// within the settling time before the kill.
pub fn plain_permits_lost(h: &History) -> (u64, u64) {
    let (mut certain, mut possible) = (0, 0);
    for c in h.calls.iter().filter(|c| c.name == SEM_PLAIN_NAME) {
        let Some(&killed) = h.frozen.get(&c.proc) else {
            continue;
        };
        let recent = |t: u64| t + SETTLING_NS >= killed;
        let n = permits(c);
        match (c.end, &c.release, &c.released) {
            (None, _, _) => possible += n,
            (Some((_, Outcome::Granted, _)), None, _) => certain += n,
            (Some((_, Outcome::Granted, _)), Some(_), Some((_, r))) if r == "ok" => {}
            (Some((_, Outcome::Granted, _)), Some((t, ..)), _) if recent(*t) => possible += n,
            (Some((_, Outcome::Granted, _)), Some(_), _) => {}
            (Some((_, Outcome::TimedOut, _)), _, _) => {}
            (Some((t, _, _)), _, _) if recent(t) => possible += n,
            (Some(_), _, _) => {}
        }
    }
    (certain, possible)
}

fn check_one(h: &History, name: &str, calls: &[&Call], stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    let limit = sem_limit(name);
    let mut holds: Vec<(u64, u64, &Call)> = calls
        .iter()
        .filter_map(|c| c.granted().map(|(t, _)| (t, h.trusted_end(c), *c)))
        .filter(|(s, e, _)| e > s)
        .collect();
    stats.permit_holds += holds.len();
    holds.sort_by_key(|(s, _, _)| *s);
    let mut open: Vec<(u64, u64, &Call)> = Vec::new();
    for (s, e, c) in holds {
        open.retain(|(_, oe, _)| *oe > s);
        open.push((s, e, c));
        let in_use: u64 = open.iter().map(|(_, _, c)| permits(c)).sum();
        if name != BIG_SEM_NAME {
            stats.permit_peak = stats.permit_peak.max(in_use);
        }
        if in_use > limit {
            out.push(Violation {
                rule: "permit-limit",
                message: format!(
                    "{in_use} permits of {name} trusted at once at {} (limit {limit})",
                    h.rel_ms(s)
                ),
                evidence: open.iter().map(|(_, _, c)| c.describe(h)).collect(),
                ids: open.iter().map(|(_, _, c)| c.id.clone()).collect(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::check::fixtures::*;
    use crate::config::SEM_NAME;

    fn sem_hold(id: &str, proc: &str, n: u64, span: (u64, u64), release: u64) -> Vec<Event> {
        let mut evs = hold(
            id,
            proc,
            SEM_NAME,
            &format!("u:{id}"),
            span,
            0,
            release,
            900,
        );
        if let Event::Call { op, .. } = &mut evs[0] {
            *op = format!("sem{n}");
        }
        for e in &mut evs {
            if let Event::End { token, .. } = e {
                *token = None;
            }
        }
        evs
    }

    #[test]
    fn killed_holders_of_the_plain_semaphore_bound_the_final_count() {
        use crate::config::SEM_PLAIN_NAME;
        let plain = |id: &str, proc: &str, n: u64, span: (u64, u64), release: Option<u64>| {
            let mut evs = sem_hold(id, proc, n, span, release.unwrap_or(0));
            for e in &mut evs {
                if let Event::Call { name, .. } = e {
                    *name = SEM_PLAIN_NAME.into();
                }
            }
            if release.is_none() {
                evs.pop();
            }
            evs
        };
        let mut h = hist();
        // p0 dies at 20 s holding 2 (certain); its release long before settled; a release 1 s
        // before the kill may not have (possible); p1 lives: nothing of it counts.
        h.add_events(plain("a", "p0", 2, (19_000, 19_010), None));
        h.add_events(plain("b", "p0", 1, (1_000, 1_010), Some(1_020)));
        h.add_events(plain("c", "p0", 1, (18_900, 18_950), Some(19_000)));
        h.add_events(plain("d", "p1", 2, (19_000, 19_010), None));
        h.frozen.insert("p0".into(), 20_000 * MS);
        assert_eq!(super::plain_permits_lost(&h), (2, 1));
    }

    #[test]
    fn permits_add_up_to_the_limit_and_no_further() {
        let mut h = hist();
        // 2 + 1 at once: the limit (3); then one more while both hold: caught.
        h.add_events(sem_hold("a", "p0", 2, (0, 10), 200));
        h.add_events(sem_hold("b", "p1", 1, (20, 30), 150));
        h.add_events(sem_hold("c", "p2", 1, (160, 170), 300));
        assert!(!rules(&h).contains(&"permit-limit"), "{:?}", check(&h, 9).0);
        assert!(!rules(&h).contains(&"mutual-exclusion"));
        h.add_events(sem_hold("d", "p2", 1, (40, 50), 100));
        assert!(rules(&h).contains(&"permit-limit"));
    }
}
