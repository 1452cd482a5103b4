//! Mutual exclusion (`mutual-exclusion`): two trusted holds of different holders on one name
//! never overlap, except two read holds of a read-write lock. (A read-write lock's writer field
//! is its holder's field plus `:write`: a writer and its own holder's read holds, a downgrade,
//! are one holder.) Two calls that named no holder are two holders even if the library gave
//! them one field: it may hand a field to a later call only once nothing of it is held.

use super::{by_name, Call, CheckStats, History, Violation};

/// The holder of a call: its owner field without a writer's `:write`.
fn holder(c: &Call) -> &str {
    c.field.strip_suffix(":write").unwrap_or(&c.field)
}

/// Whether the call is a read hold of a read-write lock (shared with other readers).
fn reads(c: &Call) -> bool {
    crate::config::is_rw_name(&c.name) && !c.field.ends_with(":write")
}

/// Whether two holds may not overlap.
fn conflict(a: &Call, b: &Call) -> bool {
    (holder(a) != holder(b) || (a.per_call && b.per_call)) && !(reads(a) && reads(b))
}

/// Mutual exclusion over trusted intervals.
pub fn check_mutual_exclusion(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    for (name, calls) in by_name(h) {
        if crate::config::is_sem_name(name) {
            // Permits are checked by count (`permits.rs`).
            continue;
        }
        let mut holds: Vec<(u64, u64, &Call)> = calls
            .iter()
            .filter_map(|c| c.granted().map(|(t, _)| (t, h.trusted_end(c), *c)))
            .collect();
        stats.holds += holds.len();
        // A guard whose validity ran out before its call returned (its process was paused after
        // the grant was registered) was never trusted: it cannot overlap anything.
        holds.retain(|(s, e, _)| e > s);
        holds.sort_by_key(|(s, _, _)| *s);
        // Sweep: every hold still open when the next starts.
        let mut open: Vec<(u64, u64, &Call)> = Vec::new();
        for (s, e, c) in holds {
            open.retain(|(_, oe, _)| *oe > s);
            for (os, oe, oc) in &open {
                stats.overlap_pairs += 1;
                if conflict(oc, c) {
                    out.push(Violation {
                        rule: "mutual-exclusion",
                        message: format!(
                            "two holders of {name} at once: {} trusted {}..{}, {} trusted {}..{} \
                             (overlap {:.1} ms)",
                            oc.field,
                            h.rel_ms(*os),
                            h.rel_ms(*oe),
                            c.field,
                            h.rel_ms(s),
                            h.rel_ms(e),
                            ((*oe).min(e) - s) as f64 / 1e6
                        ),
                        evidence: vec![oc.describe(h), c.describe(h)],
                        ids: vec![oc.id.clone(), c.id.clone()],
                    });
                }
            }
            open.push((s, e, c));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::check::fixtures::*;

    #[test]
    fn mutual_exclusion_accepts_hand_overs_and_reentry() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 20, 500));
        // Taken after A's release started; and A's own re-entry overlaps A.
        h.add_events(hold("b", "p1", "plain", "v:1", (15, 25), 2, 40, 500));
        h.add_events(hold("a2", "p0", "plain", "u:1", (12, 13), 3, 18, 500));
        // C overlaps D's hold but D's validity ran out first; E's lost() fired before F.
        h.add_events(hold("c", "p0", "plain2", "u:1", (0, 10), 1, 900, 100));
        h.add_events(hold("d", "p1", "plain2", "v:1", (50, 150), 2, 160, 900));
        h.add_events(hold("e", "p0", "plain3", "u:1", (0, 10), 1, 900, 900));
        h.add_events([Event::Lost {
            id: "e".into(),
            t: 100 * MS,
            reason: "Gone".into(),
        }]);
        h.add_events(hold("f", "p1", "plain3", "v:1", (50, 150), 2, 160, 900));
        // G's validity ran out before its call returned (its process paused): never trusted.
        h.add_events(hold("x", "p1", "plain4", "v:1", (0, 10), 1, 200, 500));
        h.add_events(hold("g", "p0", "plain4", "u:1", (0, 50), 2, 900, 45));
        assert!(
            !rules(&h).contains(&"mutual-exclusion"),
            "{:?}",
            check(&h, 9).0
        );
    }

    #[test]
    fn readers_of_a_read_write_lock_share_and_a_writer_excludes_them() {
        let rw = crate::config::RW_NAMES[0];
        let mut h = hist();
        // Two readers at once, and a writer's own read hold (a downgrade): fine.
        h.add_events(hold("r1", "p0", rw, "u:1", (0, 10), 1, 200, 500));
        h.add_events(hold("r2", "p1", rw, "v:1", (50, 60), 2, 150, 900));
        h.add_events(hold("w", "p0", rw, "u:2:write", (300, 310), 3, 400, 900));
        h.add_events(hold("d", "p0", rw, "u:2", (320, 330), 4, 380, 900));
        assert!(
            !rules(&h).contains(&"mutual-exclusion"),
            "{:?}",
            check(&h, 9).0
        );
        // A reader of another holder inside the writer's hold: caught.
        h.add_events(hold("r3", "p1", rw, "v:2", (340, 350), 5, 360, 900));
        assert!(rules(&h).contains(&"mutual-exclusion"));
    }

    #[test]
    fn two_calls_that_named_no_holder_never_share_a_hold() {
        let unbound = |id: &str, field: &str| {
            [Event::Bound {
                id: id.into(),
                field: field.into(),
            }]
        };
        let mut h = hist();
        // A per-call hold, its explicit re-entry (the guard's holder, named), and a later call
        // of the handle that took the same field over after the first was released: fine.
        h.add_events(hold("a", "p0", "plain", "unbound:a", (0, 10), 1, 100, 500));
        h.add_events(unbound("a", "u:1"));
        h.add_events(hold("a2", "p0", "plain", "u:1", (20, 30), 2, 40, 500));
        h.add_events(hold(
            "b",
            "p0",
            "plain",
            "unbound:b",
            (110, 120),
            3,
            200,
            500,
        ));
        h.add_events(unbound("b", "u:1"));
        assert!(
            !rules(&h).contains(&"mutual-exclusion"),
            "{:?}",
            check(&h, 9).0
        );
        // A second call given that field while the first still held it: caught.
        h.add_events(hold(
            "c",
            "p0",
            "plain",
            "unbound:c",
            (150, 160),
            4,
            180,
            500,
        ));
        h.add_events(unbound("c", "u:1"));
        assert!(rules(&h).contains(&"mutual-exclusion"));
    }

    #[test]
    fn mutual_exclusion_catches_two_holders() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 200, 500));
        h.add_events(hold("b", "p1", "plain", "v:1", (50, 100), 2, 150, 900));
        assert!(rules(&h).contains(&"mutual-exclusion"));
        // A hold never released counts up to its validity at the grant, or the kill.
        let mut h = hist();
        let mut a = call(
            "a",
            "p0",
            "plain",
            "u:1",
            0,
            None,
            10,
            Outcome::Granted,
            Some(1),
        );
        if let Event::End { vu, .. } = &mut a[1] {
            *vu = Some(1000 * MS);
        }
        h.add_events(a);
        h.add_events(hold("b", "p1", "plain", "v:1", (50, 100), 2, 150, 900));
        assert!(rules(&h).contains(&"mutual-exclusion"));
        // Its process froze (killed, or stopped for good) after B took it, or before.
        h.frozen.insert("p0".into(), 120 * MS);
        assert!(rules(&h).contains(&"mutual-exclusion"));
        h.frozen.insert("p0".into(), 90 * MS);
        assert!(!rules(&h).contains(&"mutual-exclusion"));
    }
}
