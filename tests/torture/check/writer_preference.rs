//! Writer preference (`writer-preference`), on the read-write lock used only through
//! writer-preferring handles: a reader whose call started after a writer was seen queued is not
//! granted before that writer.
//!
//! Why it is sound: the writer's `queued` event is logged after the attempt that queued it
//! returned, so the reader's first attempt ran in Redis after the writer joined. If the reader's
//! call returned before the writer's, its grant ran before the writer's grant (a grant after it
//! would overlap the writer's hold, which `mutual-exclusion` checks). The writer keeps its place
//! unless its liveness mark lapsed, which needs a fault or a stall of its process (then it is
//! exempt), or a call sharing its holder gave the place up (holders shared on purpose are left
//! out, as are re-entries and downgrades, which bypass the queue), or its lease is close to the
//! round trip (a grant that reached it run out was given back and it queued again).

use super::{by_name, Call, CheckStats, History, Violation};

fn writes(c: &Call) -> bool {
    c.field.ends_with(":write")
}

/// Writer preference on the writer-preferring read-write lock.
pub fn check_writer_preference(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    for (name, calls) in by_name(h) {
        if !crate::config::is_preferring_name(name) {
            continue;
        }
        let plain = |c: &&&Call| !c.shared && !c.reentrant && !c.java;
        let writers: Vec<(&Call, u64, u64)> = calls
            .iter()
            .filter(plain)
            .filter(|c| writes(c))
            .filter_map(|c| Some((*c, c.joined?, c.granted()?.0)))
            .collect();
        let readers: Vec<(&Call, u64)> = calls
            .iter()
            .filter(plain)
            .filter(|c| !writes(c))
            .filter_map(|c| Some((*c, c.granted()?.0)))
            .collect();
        for (w, joined, w_granted) in &writers {
            for (r, r_granted) in &readers {
                if r.t_start <= *joined || r_granted >= w_granted {
                    continue;
                }
                stats.preference_pairs += 1;
                // A writer whose lease is close to the round trip may get a grant that arrives
                // already run out: it gives it back and joins again at the tail (PROTOCOL 7),
                // so later readers may enter first (`fifo::near_margin`).
                if super::fifo::near_margin(w)
                    || h.fault_near(&w.proc, *joined, *w_granted, h.params.fault_grace)
                        .is_some()
                {
                    stats.preference_exempt += 1;
                    continue;
                }
                out.push(Violation {
                    rule: "writer-preference",
                    message: format!(
                        "a reader of {name} that arrived {:.1} ms after a writer queued entered \
                         before it",
                        (r.t_start - joined) as f64 / 1e6
                    ),
                    evidence: vec![w.describe(h), r.describe(h)],
                    ids: vec![w.id.clone(), r.id.clone()],
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::check::fixtures::*;
    use fairlock_testkit::history::Event;

    #[test]
    fn a_reader_may_not_pass_a_queued_writer() {
        let pref = crate::config::RW_NAMES[1];
        let mut h = hist();
        // The writer queued at 20 and got the lock at 100; a reader that started at 10 (before
        // it queued) entered at 30: fine. One that started at 40 and entered at 60: caught.
        h.add_events(hold("w", "p0", pref, "u:1:write", (0, 100), 1, 150, 900));
        h.add_events([Event::Joined {
            id: "w".into(),
            t: 20 * MS,
        }]);
        h.add_events(hold("r1", "p1", pref, "v:1", (10, 30), 2, 35, 900));
        assert!(!rules(&h).contains(&"writer-preference"));
        h.add_events(hold("r2", "p1", pref, "v:2", (40, 60), 3, 70, 900));
        assert!(rules(&h).contains(&"writer-preference"));
    }
}
