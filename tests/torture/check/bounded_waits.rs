//! Bounded waits (`bounded-wait`): `try_lock(wait)` returns within `wait` + one command timeout
//! + a scheduling slack, outside faults.

use std::time::Duration;

use fairlock_testkit::history::Outcome;

use super::{CheckStats, History, Violation};

/// `try_lock(wait)` returns within `wait` + one command timeout (+ slack) outside faults.
pub fn check_bounded_waits(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    let p = &h.params;
    for c in &h.calls {
        if c.java {
            continue;
        }
        let (Some(wait), Some((t_end, outcome, _))) = (c.wait_ms, c.end) else {
            continue;
        };
        if outcome == Outcome::Cancelled || outcome == Outcome::Shutdown {
            continue;
        }
        stats.bounded_calls += 1;
        let bound = Duration::from_millis(wait) + p.command_timeout + p.slack;
        let took = Duration::from_nanos(t_end.saturating_sub(c.t_start));
        if took <= bound {
            continue;
        }
        if h.fault_near(&c.proc, c.t_start, t_end, p.fault_grace)
            .is_some()
        {
            stats.bounded_exempt += 1;
            continue;
        }
        out.push(Violation {
            rule: "bounded-wait",
            message: format!(
                "try_lock with wait {wait} ms took {:.1} ms (bound {:.1} ms) with no fault near",
                took.as_secs_f64() * 1e3,
                bound.as_secs_f64() * 1e3
            ),
            evidence: vec![c.describe(h)],
            ids: vec![c.id.clone()],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::check::fixtures::*;

    #[test]
    fn bounded_waits_are_checked_outside_faults() {
        let mut h = hist();
        h.add_events(call(
            "a",
            "p0",
            "plain",
            "u:1",
            0,
            Some(100),
            450,
            Outcome::TimedOut,
            None,
        ));
        assert!(rules(&h).is_empty());
        h.add_events(call(
            "b",
            "p0",
            "plain",
            "u:2",
            0,
            Some(100),
            600,
            Outcome::TimedOut,
            None,
        ));
        assert_eq!(rules(&h), vec!["bounded-wait"]);
        h.faults.push(Fault {
            kind: "pause".into(),
            scope: Scope::All,
            t0: 50 * MS,
            t1: 300 * MS,
        });
        assert!(rules(&h).is_empty());
        // A stalled runtime of its own process counts too.
        h.faults.clear();
        h.lags.push(("p0".into(), 200 * MS, 350 * MS));
        assert!(rules(&h).is_empty());
    }
}
