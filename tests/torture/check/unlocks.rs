//! Unlock (`unlock`): `unlock()` never answers `NotHeld` for a hold still trusted and untouched
//! by faults (nor by a shutdown of its client).

use super::{History, Violation};

/// `unlock()` answering `NotHeld` for a hold that was still trusted and untouched by faults.
pub fn check_unlocks(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for c in h.calls.iter().filter(|c| !c.java) {
        let (Some((start, _)), Some((rt, vu, _, lost)), Some((done, result))) =
            (c.granted(), &c.release, &c.released)
        else {
            continue;
        };
        if result != "notheld" || *lost || c.lost.is_some() || *done >= *vu || *rt >= *vu {
            continue;
        }
        // Its client was shut down meanwhile (which releases every hold; the guard may not have
        // been told yet when its release was sent): the hold was no longer trusted, as
        // `History::trusted_end` says.
        if h.shutdowns
            .iter()
            .any(|(client, t)| *client == c.client && *t >= start && *t <= *done)
        {
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
        // Its client was shut down before the release finished: expected too.
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 20, 500));
        h.add_events([Event::Released {
            id: "a".into(),
            t: 22 * MS,
            result: "notheld".into(),
        }]);
        let client = h.calls[0].client.clone();
        h.add_events([Event::Shutdown { client, t: 15 * MS }]);
        assert!(rules(&h).is_empty());
    }
}
