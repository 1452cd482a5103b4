//! Permits (`permit-limit`), on the permit-expirable semaphore ([`SEM_NAME`]): at no moment do
//! the trusted holds of its permits add up to more than [`SEM_LIMIT`]. A permit hold is trusted
//! as a lock hold is (`History::trusted_end`): from its acquire's return until its release
//! started, its validity ran out (nobody can reclaim a permit before its expiry, which is at
//! least that late), its `lost()` fired, its client shut down or its process froze. The permits
//! of one call are its op's number (`sem1`, `sem2`).

use super::{by_name, Call, CheckStats, History, Violation};
use crate::config::{SEM_LIMIT, SEM_NAME};

/// How many permits a semaphore call asked for.
fn permits(c: &Call) -> u64 {
    c.op.strip_prefix("sem")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

pub fn check_permits(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    let Some(calls) = by_name(h).remove(SEM_NAME) else {
        return out;
    };
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
        stats.permit_peak = stats.permit_peak.max(in_use);
        if in_use > SEM_LIMIT {
            out.push(Violation {
                rule: "permit-limit",
                message: format!(
                    "{in_use} permits of {SEM_NAME} trusted at once at {} (limit {SEM_LIMIT})",
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
