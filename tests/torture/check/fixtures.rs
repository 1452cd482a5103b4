//! Hand-made histories for the rules' own tests: each rule catches its violation and accepts a
//! legal one.

use std::time::Duration;

pub use fairlock_testkit::history::{Event, Outcome};

pub use super::{check, Fault, History, Params, Scope, Snapshot};

pub const MS: u64 = 1_000_000;

pub fn hist() -> History {
    let mut h = History::new(
        Params {
            command_timeout: Duration::from_millis(300),
            liveness: Duration::from_millis(1000),
            slack: Duration::from_millis(100),
            fault_grace: Duration::from_millis(500),
            lag_threshold: Duration::from_millis(100),
            epoch_offset_ms: 1_000_000.0,
        },
        0,
    );
    h.exited.insert("p0".into(), 100_000 * MS);
    h.exited.insert("p1".into(), 100_000 * MS);
    h
}

#[allow(clippy::too_many_arguments)]
pub fn call(
    id: &str,
    proc: &str,
    name: &str,
    field: &str,
    start_ms: u64,
    wait_ms: Option<u64>,
    end_ms: u64,
    outcome: Outcome,
    token: Option<u64>,
) -> Vec<Event> {
    vec![
        Event::Call {
            id: id.into(),
            proc: proc.into(),
            client: format!("{proc}.c0"),
            name: name.into(),
            fair: name.starts_with('f'),
            field: field.into(),
            op: if wait_ms.is_some() {
                "try_lock"
            } else {
                "lock"
            }
            .into(),
            wait_ms,
            lease_ms: None,
            t: start_ms * MS,
            shared: false,
            reentrant: false,
            java: proc == "java",
        },
        Event::End {
            id: id.into(),
            t: end_ms * MS,
            outcome,
            token,
            vu: token.map(|_| (end_ms + 1) * MS),
            detail: String::new(),
        },
    ]
}

/// A granted call held until `release_ms` (valid until `vu_ms`).
#[allow(clippy::too_many_arguments)]
pub fn hold(
    id: &str,
    proc: &str,
    name: &str,
    field: &str,
    (start_ms, end_ms): (u64, u64),
    token: u64,
    release_ms: u64,
    vu_ms: u64,
) -> Vec<Event> {
    let mut ev = call(
        id,
        proc,
        name,
        field,
        start_ms,
        None,
        end_ms,
        Outcome::Granted,
        Some(token),
    );
    ev.push(Event::Release {
        id: id.into(),
        t: release_ms * MS,
        vu: vu_ms * MS,
        how: "unlock".into(),
        lost: false,
    });
    ev
}

pub fn rules(h: &History) -> Vec<&'static str> {
    check(h, 100).0.iter().map(|v| v.rule).collect()
}

pub fn snap(name: &str, at_ms: u64, counter: u64, queue: &[&str]) -> Snapshot {
    Snapshot {
        name: name.into(),
        t0: at_ms * MS,
        t1: at_ms * MS + MS / 2,
        counter,
        queue: queue.iter().map(|s| s.to_string()).collect(),
        scores: queue
            .iter()
            .map(|s| (s.to_string(), 1_000_000.0 + at_ms as f64 + 1000.0))
            .collect(),
        holders: vec![],
        server_ms: 1_000_000 + at_ms as i64,
    }
}
