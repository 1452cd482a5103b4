//! Returned valid (`returned-lost`): the guard a call hands back can be trusted when the call
//! returns.
//!
//! Why it is sound: the library registers a grant only while its hold can still be trusted and
//! hands the guard over without any further I/O (`lock/acquire.rs` `granted`); a multi-lock
//! checks every member still held once the last is in and puts the fixed lease on last, with no
//! I/O between that check and its return (`lock/multi.rs`). So a granted call whose guard's
//! `valid_until()` (read right after the call returned) lies before its return by more than the
//! scheduling slack was handed back already lost, unless its own process was paused between the
//! grant and the return: stopped (`sigstop`), its runtime seen stalled, or its client shut down
//! meanwhile (a shutdown marks every guard lost). Faults of the server or of the connections
//! (`Scope::All`, a proxy) delay round trips, never the moment between a check and a return, so
//! they excuse nothing here.
//!
//! This is the rule that sees issue 34's first defect: a multi-lock whose first member's fixed
//! lease ran out while a later member was awaited (a rival then took it) still returned a guard.
//! The mutual-exclusion rule cannot see it, because a guard lost before its call returned is
//! trusted for no time at all.

use super::{History, Scope, Violation};

/// Granted calls whose guard was already lost when the call returned.
pub fn check_returned(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let slack = h.params.slack.as_nanos() as u64;
    for c in &h.calls {
        if c.java {
            continue;
        }
        let (Some((t_end, _)), Some(vu)) = (c.granted(), c.vu_at_grant) else {
            continue;
        };
        if vu.saturating_add(slack) >= t_end {
            continue;
        }
        if let Some(why) = paused(h, &c.proc, &c.client, vu, t_end) {
            let _ = why;
            continue;
        }
        out.push(Violation {
            rule: "returned-lost",
            message: format!(
                "{} returned a guard of {} valid only until {}, {:.1} ms before the call returned \
                 at {}, with its process running",
                c.op,
                c.name,
                h.rel_ms(vu),
                (t_end - vu) as f64 / 1e6,
                h.rel_ms(t_end)
            ),
            evidence: vec![c.describe(h)],
            ids: vec![c.id.clone()],
        });
    }
    out
}

/// Why `proc` may have been paused between `t0` and `t1`: a fault of that process alone (a
/// stop), a runtime stall of it, or a shutdown of `client`, each widened by the fault grace.
fn paused(h: &History, proc: &str, client: &str, t0: u64, t1: u64) -> Option<String> {
    let g = h.params.fault_grace.as_nanos() as u64;
    for f in &h.faults {
        if f.scope == Scope::Proc(proc.to_owned())
            && f.kind == "sigstop"
            && f.t0 <= t1
            && f.t1 + g >= t0
        {
            return Some(format!("sigstop {}..{}", h.rel_ms(f.t0), h.rel_ms(f.t1)));
        }
    }
    let lag = h.params.lag_threshold.as_nanos() as u64;
    for (p, l0, l1) in &h.lags {
        if p == proc && l1 - l0 >= lag && *l0 <= t1 && l1 + g >= t0 {
            return Some(format!("stall {}..{}", h.rel_ms(*l0), h.rel_ms(*l1)));
        }
    }
    h.shutdowns
        .iter()
        .find(|(c, t)| c == client && *t + g >= t0 && *t <= t1)
        .map(|(_, t)| format!("shutdown at {}", h.rel_ms(*t)))
}

#[cfg(test)]
mod tests {
    use crate::check::fixtures::*;

    /// A granted call whose guard's validity ended 400 ms before it returned.
    fn returned_lost(h: &mut History, proc: &str) {
        let mut ev = call(
            "m",
            proc,
            "plain",
            "u:1",
            0,
            None,
            900,
            Outcome::Granted,
            Some(1),
        );
        if let Event::End { vu, .. } = &mut ev[1] {
            *vu = Some(500 * MS);
        }
        h.add_events(ev);
    }

    #[test]
    fn a_guard_returned_already_lost_is_caught() {
        let mut h = hist();
        returned_lost(&mut h, "p0");
        assert_eq!(rules(&h), vec!["returned-lost"]);
        // A server fault excuses nothing; a stop of the process itself does.
        h.faults.push(Fault {
            kind: "pause".into(),
            scope: Scope::All,
            t0: 400 * MS,
            t1: 800 * MS,
        });
        assert_eq!(rules(&h), vec!["returned-lost"]);
        h.faults.push(Fault {
            kind: "sigstop".into(),
            scope: Scope::Proc("p0".into()),
            t0: 520 * MS,
            t1: 880 * MS,
        });
        assert!(rules(&h).is_empty(), "{:?}", check(&h, 9).0);
    }

    #[test]
    fn a_stall_or_a_shutdown_of_its_own_process_excuses_it_and_slack_is_allowed() {
        let mut h = hist();
        returned_lost(&mut h, "p0");
        h.lags.push(("p1".into(), 500 * MS, 890 * MS));
        assert_eq!(rules(&h), vec!["returned-lost"], "another process's stall");
        h.lags.push(("p0".into(), 500 * MS, 890 * MS));
        assert!(rules(&h).is_empty());
        let mut h = hist();
        returned_lost(&mut h, "p0");
        h.shutdowns.push(("p0.c0".into(), 700 * MS));
        assert!(rules(&h).is_empty());
        // Within the scheduling slack (100 ms here): fine.
        let mut h = hist();
        let mut ev = call(
            "s",
            "p0",
            "plain",
            "u:1",
            0,
            None,
            900,
            Outcome::Granted,
            Some(1),
        );
        if let Event::End { vu, .. } = &mut ev[1] {
            *vu = Some(850 * MS);
        }
        h.add_events(ev);
        assert!(rules(&h).is_empty());
    }
}
