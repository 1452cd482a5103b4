//! Anomalies (`anomaly`): things a process noticed itself (a guard whose owner field is not the
//! one computed for the caller, a fenced guard without a token).

use super::{History, Violation};

/// Every anomaly a process reported.
pub fn check_anomalies(h: &History) -> Vec<Violation> {
    h.anomalies
        .iter()
        .map(|(proc, t, what)| Violation {
            rule: "anomaly",
            message: format!("{proc} at {}: {what}", h.rel_ms(*t)),
            evidence: vec![],
            ids: vec![],
        })
        .collect()
}
