//! Fencing (`fencing`): tokens of one name are unique, and a grant whose call returned before
//! another call started has the smaller token (a read-write lock: its writers' tokens).

use std::collections::HashMap;

use super::{by_name, Call, CheckStats, History, Violation};

/// Unique tokens, increasing with real-time order of grants.
pub fn check_fencing(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    for (name, calls) in by_name(h) {
        if crate::config::is_sem_name(name) {
            // Permits carry no token.
            continue;
        }
        let mut grants: Vec<&Call> = calls
            .iter()
            .copied()
            .filter(|c| c.granted().is_some())
            .collect();
        // Read holds of a read-write lock have no token, nor have Redisson's writers of one.
        grants.retain(|c| {
            !crate::config::is_rw_name(&c.name) || (c.field.ends_with(":write") && !c.java)
        });
        for c in &grants {
            if c.token().is_none() {
                out.push(Violation {
                    rule: "fencing",
                    message: format!("a fenced grant of {name} without a token"),
                    evidence: vec![c.describe(h)],
                    ids: vec![c.id.clone()],
                });
            }
        }
        grants.retain(|c| c.token().is_some());
        stats.tokens += grants.len();
        let mut seen: HashMap<u64, &Call> = HashMap::new();
        for c in &grants {
            if let Some(prev) = seen.insert(c.token().unwrap(), c) {
                out.push(Violation {
                    rule: "fencing",
                    message: format!("token {} of {name} handed out twice", c.token().unwrap()),
                    evidence: vec![prev.describe(h), c.describe(h)],
                    ids: vec![prev.id.clone(), c.id.clone()],
                });
            }
        }
        // By return time; then each call, by start time, must exceed every token returned
        // before it started.
        let mut by_return: Vec<&Call> = grants.clone();
        by_return.sort_by_key(|c| c.granted().unwrap().0);
        let mut by_start: Vec<&Call> = grants.clone();
        by_start.sort_by_key(|c| c.t_start);
        let mut i = 0;
        let mut best: Option<&Call> = None;
        for c in by_start {
            while i < by_return.len() && by_return[i].granted().unwrap().0 < c.t_start {
                let r = by_return[i];
                if best.is_none_or(|b| r.token() > b.token()) {
                    best = Some(r);
                }
                i += 1;
            }
            if let Some(b) = best {
                if b.token() >= c.token() {
                    out.push(Violation {
                        rule: "fencing",
                        message: format!(
                            "token order of {name}: a grant returned with token {} before a call \
                             started that then got token {}",
                            b.token().unwrap(),
                            c.token().unwrap()
                        ),
                        evidence: vec![b.describe(h), c.describe(h)],
                        ids: vec![b.id.clone(), c.id.clone()],
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::check::fixtures::*;

    #[test]
    fn fencing_catches_reused_and_reordered_tokens() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 5, 20, 500));
        h.add_events(hold("b", "p1", "plain", "v:1", (30, 40), 6, 50, 500));
        assert!(rules(&h).is_empty(), "{:?}", check(&h, 9).0);
        // Returned before the other call started, yet a higher token.
        h.add_events(hold("c", "p1", "plain", "v:1", (60, 70), 4, 80, 500));
        assert!(rules(&h).contains(&"fencing"));
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 5, 20, 500));
        h.add_events(hold("b", "p1", "plain", "u:1", (5, 12), 5, 30, 500));
        assert!(rules(&h).contains(&"fencing"));
    }
}
