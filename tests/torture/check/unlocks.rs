//! Unlock (`unlock`): `unlock()` never answers `NotHeld` for a hold still trusted and untouched
//! by faults.

use super::{History, Violation};

/// `unlock()` answering `NotHeld` for a hold that was still trusted and untouched by faults.
pub fn check_unlocks(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for c in &h.calls {
        let (Some((start, _)), Some((rt, vu, _, lost)), Some((done, result))) =
            (c.granted(), &c.release, &c.released)
        else {
            continue;
        };
        if result != "notheld" || *lost || c.lost.is_some() || *done >= *vu || *rt >= *vu {
            continue;
        }
        if h.fault_near(&c.proc, start, *done, h.params.fault_grace)
            .is_some()
        {
            continue;
        }
        out.push(Violation {
            rule: "unlock",
            message: format!(
                "unlock of a trusted hold of {} answered NotHeld (release done at {}, valid until \
                 {})",
                c.name,
                h.rel_ms(*done),
                h.rel_ms(*vu)
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
    fn unlock_not_held_while_trusted_is_caught() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 20, 500));
        h.add_events([Event::Released {
            id: "a".into(),
            t: 22 * MS,
            result: "notheld".into(),
        }]);
        assert_eq!(rules(&h), vec!["unlock"]);
        // After its validity ran out, NotHeld is expected.
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 600, 500));
        h.add_events([Event::Released {
            id: "a".into(),
            t: 602 * MS,
            result: "notheld".into(),
        }]);
        assert!(rules(&h).is_empty());
    }
}
