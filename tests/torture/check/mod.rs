//! The torture test's checker: one module per rule, each with its own tests beside it.
//!
//! Every process that takes locks records **events** (one text line each, see [`Event`](fairlock_testkit::history::Event)) with
//! timestamps on `CLOCK_MONOTONIC`, which every process on the machine shares. The parent adds
//! what it saw itself: atomic snapshots of each fair queue ([`Snapshot`]), the faults it injected
//! ([`Fault`]) and when a process died. [`check`] then verifies the promises of the library over
//! that history, without trusting any clock but the shared monotonic one and the fencing counter
//! (every grant increments `redisson_lock_token:{NAME}` in the same script, so tokens order the
//! grants of one name exactly as Redis executed them, across every client).
//!
//! The rules, and why each is sound (a legal history never fails it):
//!
//! * **Mutual exclusion** (`mutual-exclusion`): a hold is trusted from the moment its acquire call
//!   returned until the first of: its release call started, its guard's `valid_until()` (read just
//!   before the release), its `lost()` was observed, its client's `shutdown()` was called, or its
//!   process froze for good (killed, or stopped and then killed). The library promises nobody else
//!   can be granted the lock before `valid_until`, and the other holder's interval starts only
//!   when its call returned, after its grant ran in Redis. Two trusted intervals of different
//!   holders on one name must not overlap (one field is one reentrant holder; a read-write lock's
//!   read holds may overlap each other, and a writer's own read holds, a downgrade). An empty
//!   interval (the validity ran out before the call returned) is trusted for no time at all.
//! * **Returned valid** (`returned-lost`): a granted call's guard is still valid when the call
//!   returns (its `valid_until()`, read right after, is not before the return by more than the
//!   slack), unless its own process was stopped or stalled, or its client shut down, in between:
//!   the library registers a grant only while it can be trusted and returns it with no I/O in
//!   between, and a multi-lock checks every member once the last is in (`returned.rs`). This is
//!   what sees a guard handed back already lost, which mutual exclusion trusts for no time.
//! * **Fencing** (`fencing`): tokens of one name are unique, and a grant whose call returned
//!   before another call started has the smaller token.
//! * **FIFO** (`fifo-order`, `fifo-arrival`), fair names only, for waiters whose owner field is
//!   used by one task at a time (see [`Call::shared`]). A snapshot `S` (queue, deadlines, holders,
//!   token counter `c`, read in one `MULTI`) proves who waited and in which order at one point of
//!   the grant sequence: grants with token `<= c` ran before it, later ones after it. A queue entry
//!   is attributed to the call of that field that covers the whole snapshot, and only when it is
//!   certainly that call's: for a fairlock call, the call was seen to join the queue before the
//!   snapshot (its own `queued` event; an earlier call's give-up or abandoned attempt still runs
//!   in the background after that call ended, so an entry seen earlier may be a stale one), or it
//!   is the field's first call on that name; for a Redisson-protocol call, its previous call on
//!   that name cannot have left a stale entry behind (it was granted or timed out, or a snapshot
//!   after it ended shows the field gone).
//!   - `fifo-order`: `A` ahead of `B` in `S`, `B` granted afresh after `S` (token `> c`): then `A`
//!     was granted before `B`, or had left the queue by itself before `B`'s call returned (a timed
//!     out call leaves no earlier than its deadline, a dropped one no earlier than the drop).
//!   - `fifo-arrival`: `B` queued in `S`, and a call `A` that started only after `S` was granted
//!     afresh (token `> c`) before `B`, while `B` had not left by itself before `A` returned.
//!
//!   A waiter may lose its place without breaking the promise only when it looked dead: a fault
//!   touching its process (or all processes) overlapped the interval in question, widened by the
//!   liveness window, or, for a Redisson-protocol waiter, its deadline score can have passed (its
//!   score in some snapshot showing it, less every Java shift that may have run since, is not
//!   after the grant; or, when a snapshot before the grant shows its entry gone, not after that
//!   snapshot: it lost its place there, and may have joined again at the tail since, with a
//!   fresh score). Every snapshot is a starting point because a shift can run an entry out and
//!   its thread's next poll purge it and queue it afresh between two snapshots. A grant is not
//!   counted as overtaking when a fault touched its own process near it (it may have taken up a
//!   grant made to an earlier call whose reply was lost).
//! * **Bounded waits** (`bounded-wait`): `try_lock(wait)` returns within `wait` + one command
//!   timeout + a scheduling slack, unless a fault touching its process overlapped the call
//!   (widened by a grace period) or the process's runtime was seen stalled then.
//! * **Unlock** (`unlock`): `unlock()` answered `NotHeld` although the guard was not lost, its
//!   validity had not run out when the release finished, and no fault touched its process
//!   (fairlock's calls only: the Redisson-protocol peer keeps one validity per thread, the
//!   longest of its holds, while a re-entered Redisson read hold with a shorter lease can expire
//!   by itself inside it).
//! * **Writer preference** (`writer-preference`), on the read-write lock used only through
//!   writer-preferring handles: a reader whose call started after a writer was seen queued is not
//!   granted before that writer, unless a fault or a stall touched the writer's process meanwhile
//!   (its place may have lapsed); holders shared on purpose, re-entries and downgrades are left
//!   out (see `writer_preference.rs`).
//! * **Permits** (`permit-limit`), on the permit-expirable semaphore: the permits of its trusted
//!   holds (trusted as lock holds are) never add up to more than its limit at any moment. Its
//!   calls are left out of the rules above (permits have no holder and no order).
//! * **Anomalies** (`anomaly`): things a process noticed itself (a guard whose owner field is not
//!   the one computed for the caller, a fenced guard without a token).
//!
//! Not over the history: [`leftovers`] checks Redis itself once the load stopped (every lock can
//! be taken again, then nothing but the fencing counters is left).

mod anomalies;
mod bounded_waits;
mod fencing;
mod fifo;
#[cfg(test)]
pub(crate) mod fixtures;
mod history;
pub mod leftovers;
mod mutual_exclusion;
mod permits;
mod returned;
mod unlocks;
mod writer_preference;

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use history::{Call, Fault, History, Params, Scope, Snapshot};

use anomalies::check_anomalies;
use bounded_waits::check_bounded_waits;
use fencing::check_fencing;
use fifo::check_fifo;
use mutual_exclusion::check_mutual_exclusion;
use permits::check_permits;
pub use permits::plain_permits_lost;
use returned::check_returned;
use unlocks::check_unlocks;
use writer_preference::check_writer_preference;

/// A broken rule, with the events that show it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: &'static str,
    pub message: String,
    pub evidence: Vec<String>,
    /// Ids of the calls in the evidence (for [`context`]).
    pub ids: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "[{}] {}", self.rule, self.message)?;
        for e in &self.evidence {
            writeln!(f, "    {e}")?;
        }
        Ok(())
    }
}

/// What [`check`] looked at, for the summary.
#[derive(Debug, Default, Clone)]
pub struct CheckStats {
    pub holds: usize,
    pub overlap_pairs: usize,
    pub tokens: usize,
    pub snapshots: usize,
    pub fifo_pairs: usize,
    pub fifo_exempt: usize,
    pub bounded_calls: usize,
    pub bounded_exempt: usize,
    pub preference_pairs: usize,
    pub preference_exempt: usize,
    /// Permit holds of the semaphore looked at, and the most permits trusted at once.
    pub permit_holds: usize,
    pub permit_peak: u64,
}

/// Calls on the big semaphore that take more than this many permits run scripts long enough to
/// stall the server for everybody (one `ZADD` per permit, and as many removals when they are
/// reclaimed or released).
const BIG_SCRIPT_PERMITS: u64 = 20_000;

/// Adds the stalls the workload itself causes as faults of every process: a call on the big
/// semaphore with more than [`BIG_SCRIPT_PERMITS`] permits blocks the server while its acquire,
/// renewals, release or reclaim run, from its start until its release is done (or its end, when
/// it got nothing). The timing rules (bounded waits, unlock) then treat it as they treat a
/// `DEBUG SLEEP`; the rules about what the library promises whatever Redis does (mutual
/// exclusion, fencing, returned-lost) are not touched by it.
pub fn add_workload_stalls(h: &mut History) {
    let stalls: Vec<Fault> = h
        .calls
        .iter()
        .filter(|c| c.name == crate::config::BIG_SEM_NAME)
        .filter(|c| {
            c.op.strip_prefix("sem")
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > BIG_SCRIPT_PERMITS)
        })
        .map(|c| {
            let end = c.end.map_or(c.t_start, |(t, _, _)| t);
            let done = c.released.as_ref().map_or(end, |(t, _)| *t);
            let done = c.release.as_ref().map_or(done, |(t, ..)| done.max(*t));
            Fault {
                kind: "big-script".into(),
                scope: Scope::All,
                t0: c.t_start,
                t1: done,
            }
        })
        .collect();
    h.faults.extend(stalls);
}

/// Runs every rule. Violations are sorted by rule and capped per rule (`max_per_rule`).
pub fn check(h: &History, max_per_rule: usize) -> (Vec<Violation>, CheckStats) {
    let mut stats = CheckStats::default();
    let mut out = Vec::new();
    let mut push = |vs: Vec<Violation>| out.extend(vs.into_iter().take(max_per_rule));
    push(check_mutual_exclusion(h, &mut stats));
    push(check_returned(h));
    push(check_permits(h, &mut stats));
    push(check_fencing(h, &mut stats));
    push(check_fifo(h, &mut stats));
    push(check_bounded_waits(h, &mut stats));
    push(check_unlocks(h));
    push(check_writer_preference(h, &mut stats));
    push(check_anomalies(h));
    (out, stats)
}

/// The calls of each lock name.
pub(crate) fn by_name(h: &History) -> BTreeMap<&str, Vec<&Call>> {
    let mut m: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in &h.calls {
        m.entry(c.name.as_str()).or_default().push(c);
    }
    m
}

/// The history around a violation: every call on the same lock that overlaps the calls it names
/// (widened by 200 ms), the snapshots of that lock and the faults in that span.
pub fn context(h: &History, v: &Violation) -> String {
    let calls: Vec<&Call> = h.calls.iter().filter(|c| v.ids.contains(&c.id)).collect();
    let Some(first) = calls.first() else {
        return String::new();
    };
    let name = first.name.clone();
    let pad = 200_000_000;
    let lo = calls
        .iter()
        .map(|c| c.t_start)
        .min()
        .unwrap()
        .saturating_sub(pad);
    let hi = calls
        .iter()
        .map(|c| {
            c.release
                .as_ref()
                .map_or(c.end.map_or(c.t_start, |e| e.0), |r| r.0)
        })
        .max()
        .unwrap()
        + pad;
    let mut out = format!(
        "  history of {name} from {} to {}:\n",
        h.rel_ms(lo),
        h.rel_ms(hi)
    );
    let mut around: Vec<&Call> = h
        .calls
        .iter()
        .filter(|c| c.name == name)
        .filter(|c| {
            let end = c
                .release
                .as_ref()
                .map_or(c.end.map_or(u64::MAX, |e| e.0), |r| r.0);
            c.t_start <= hi && end >= lo
        })
        .collect();
    around.sort_by_key(|c| c.t_start);
    let n = around.len();
    for c in around.into_iter().take(40) {
        let _ = writeln!(out, "    call {}", c.describe(h));
    }
    if n > 40 {
        let _ = writeln!(out, "    ... {} more calls", n - 40);
    }
    let snaps: Vec<&Snapshot> = h
        .snapshots
        .iter()
        .filter(|s| s.name == name && s.t0 >= lo && s.t0 <= hi)
        .collect();
    let step = (snaps.len() / 25).max(1);
    for s in snaps.iter().step_by(step) {
        let _ = writeln!(
            out,
            "    snapshot {} counter={} holders={:?} queue={:?}",
            h.rel_ms(s.t0),
            s.counter,
            s.holders,
            s.queue
                .iter()
                .map(|f| format!(
                    "{f}@{}",
                    s.scores.get(f).map_or(-1, |x| *x as i64) - s.server_ms
                ))
                .collect::<Vec<_>>()
        );
    }
    for f in &h.faults {
        if f.t0 <= hi + 2 * pad * 5 && f.t1 + 2 * pad * 5 >= lo {
            let _ = writeln!(
                out,
                "    fault {} {:?} {}..{}",
                f.kind,
                f.scope,
                h.rel_ms(f.t0),
                h.rel_ms(f.t1)
            );
        }
    }
    out
}
