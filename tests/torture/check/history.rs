//! The history the rules read: every lock call with what happened to it, the parent's queue
//! snapshots, the faults it injected, and when processes froze or ended.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use fairlock_testkit::history::{Event, Outcome, UNBOUND};

/// An optional number for reports (`-` when absent).
fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// Who a fault touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every client (the server itself, or every connection).
    All,
    /// One process (by its `proc` name).
    Proc(String),
}

/// An injected fault, active from `t0` to `t1` (mono ns).
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: String,
    pub scope: Scope,
    pub t0: u64,
    pub t1: u64,
}

impl Fault {
    fn touches(&self, proc: &str) -> bool {
        match &self.scope {
            Scope::All => true,
            Scope::Proc(p) => p == proc,
        }
    }
}

/// One atomic view of a fair lock, read in a `MULTI` between `t0` and `t1`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub name: String,
    pub t0: u64,
    pub t1: u64,
    /// The fencing counter at that point (0 when unset).
    pub counter: u64,
    /// The waiter queue, head first.
    pub queue: Vec<String>,
    /// Deadline scores (epoch ms) of the zset members.
    pub scores: HashMap<String, f64>,
    /// Owner fields in the hash.
    pub holders: Vec<String>,
    /// Server `TIME` in epoch ms.
    pub server_ms: i64,
}

/// Timing parameters the rules need.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub command_timeout: Duration,
    pub liveness: Duration,
    /// Added to every timing bound for scheduling on a busy machine.
    pub slack: Duration,
    /// How long after a fault ended its effects may still be felt (reconnects, backlogs).
    pub fault_grace: Duration,
    /// A runtime stall longer than this counts as a fault of its process.
    pub lag_threshold: Duration,
    /// `epoch_ms - mono_ns / 1e6`, measured once by the parent.
    pub epoch_offset_ms: f64,
}

/// One lock call with everything that happened to it.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: String,
    pub proc: String,
    pub client: String,
    pub name: String,
    pub fair: bool,
    pub field: String,
    pub op: String,
    pub wait_ms: Option<u64>,
    pub lease_ms: Option<u64>,
    pub t_start: u64,
    pub shared: bool,
    pub reentrant: bool,
    pub java: bool,
    pub end: Option<(u64, Outcome, Option<u64>)>,
    pub end_detail: String,
    pub vu_at_grant: Option<u64>,
    pub lost: Option<(u64, String)>,
    /// When the call's own attempt first joined the fair queue ([`Event::Joined`]).
    pub joined: Option<u64>,
    /// The call took up a lock handed to it directly ([`Event::Handed`]).
    pub handed: bool,
    /// The call named no holder: the library picked its field ([`Event::Bound`]), which no
    /// other such call may hold at the same time.
    pub per_call: bool,
    pub release: Option<(u64, u64, String, bool)>,
    pub released: Option<(u64, String)>,
}

impl Call {
    pub fn granted(&self) -> Option<(u64, Option<u64>)> {
        match self.end {
            Some((t, Outcome::Granted, token)) => Some((t, token)),
            _ => None,
        }
    }

    pub fn token(&self) -> Option<u64> {
        self.granted().and_then(|(_, tok)| tok)
    }

    pub fn describe(&self, h: &History) -> String {
        let ms = |t: u64| h.rel_ms(t);
        let mut s = format!(
            "{} [{}{}] field={} op={} wait={} lease={} start={}",
            self.id,
            if self.java { "java " } else { "" },
            self.name,
            self.field,
            self.op,
            opt(self.wait_ms),
            opt(self.lease_ms),
            ms(self.t_start)
        );
        match self.end {
            Some((t, outcome, token)) => {
                let _ = write!(
                    s,
                    " end={} {} token={}",
                    ms(t),
                    outcome.as_str(),
                    opt(token)
                );
                if !self.end_detail.is_empty() && self.end_detail != "-" {
                    let _ = write!(s, " ({})", self.end_detail);
                }
            }
            None => s.push_str(" end=never"),
        }
        if self.reentrant {
            s.push_str(" reentrant");
        }
        if let Some((t, reason)) = &self.lost {
            let _ = write!(s, " lost@{}({reason})", ms(*t));
        }
        if let Some((t, vu, how, lost)) = &self.release {
            let _ = write!(
                s,
                " release@{} by {how} valid_until={} lost={lost}",
                ms(*t),
                ms(*vu)
            );
        }
        if let Some((t, result)) = &self.released {
            let _ = write!(s, " released@{} {result}", ms(*t));
        }
        s
    }
}

/// Everything the checker looks at.
#[derive(Debug, Clone)]
pub struct History {
    pub params: Params,
    pub calls: Vec<Call>,
    pub snapshots: Vec<Snapshot>,
    pub faults: Vec<Fault>,
    /// Per process: when it froze for good (killed, or stopped and never resumed before the
    /// kill), and when it ended at the latest (exit or kill).
    pub frozen: HashMap<String, u64>,
    pub exited: HashMap<String, u64>,
    pub shutdowns: Vec<(String, u64)>,
    pub lags: Vec<(String, u64, u64)>,
    pub shifts: Vec<(String, u64, u64, u64)>,
    pub anomalies: Vec<(String, u64, String)>,
    /// Time origin for reports.
    pub origin: u64,
}

impl History {
    pub fn new(params: Params, origin: u64) -> Self {
        History {
            params,
            calls: Vec::new(),
            snapshots: Vec::new(),
            faults: Vec::new(),
            frozen: HashMap::new(),
            exited: HashMap::new(),
            shutdowns: Vec::new(),
            lags: Vec::new(),
            shifts: Vec::new(),
            anomalies: Vec::new(),
            origin,
        }
    }

    /// Milliseconds since the origin, for reports.
    pub fn rel_ms(&self, t: u64) -> String {
        format!("{:.1}ms", (t as f64 - self.origin as f64) / 1e6)
    }

    /// Adds events (in any order; a call's later events may come before its start only if they
    /// come from the same list).
    pub fn add_events(&mut self, events: impl IntoIterator<Item = Event>) {
        let mut index: HashMap<String, usize> = self
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id.clone(), i))
            .collect();
        let mut later = Vec::new();
        for ev in events {
            match ev {
                Event::Call {
                    id,
                    proc,
                    client,
                    name,
                    fair,
                    field,
                    op,
                    wait_ms,
                    lease_ms,
                    t,
                    shared,
                    reentrant,
                    java,
                } => {
                    index.insert(id.clone(), self.calls.len());
                    self.calls.push(Call {
                        id,
                        proc,
                        client,
                        name,
                        fair,
                        field,
                        op,
                        wait_ms,
                        lease_ms,
                        t_start: t,
                        shared,
                        reentrant,
                        java,
                        end: None,
                        end_detail: String::new(),
                        vu_at_grant: None,
                        lost: None,
                        joined: None,
                        handed: false,
                        per_call: false,
                        release: None,
                        released: None,
                    });
                }
                Event::Shutdown { client, t } => self.shutdowns.push((client, t)),
                Event::Lag { proc, t0, t1 } => self.lags.push((proc, t0, t1)),
                Event::Shift { name, t0, t1, ms } => self.shifts.push((name, t0, t1, ms)),
                Event::Anomaly { proc, t, what } => self.anomalies.push((proc, t, what)),
                other => later.push(other),
            }
        }
        for ev in later {
            let id = match &ev {
                Event::End { id, .. }
                | Event::Lost { id, .. }
                | Event::Joined { id, .. }
                | Event::Handed { id, .. }
                | Event::Bound { id, .. }
                | Event::Release { id, .. }
                | Event::Released { id, .. } => id.clone(),
                _ => continue,
            };
            let Some(&i) = index.get(&id) else {
                continue;
            };
            let call = &mut self.calls[i];
            match ev {
                Event::End {
                    t,
                    outcome,
                    token,
                    vu,
                    detail,
                    ..
                } => {
                    call.end = Some((t, outcome, token));
                    call.vu_at_grant = vu;
                    call.end_detail = detail;
                }
                Event::Lost { t, reason, .. } if call.lost.is_none() => {
                    call.lost = Some((t, reason));
                }
                Event::Joined { t, .. } => {
                    call.joined = Some(call.joined.map_or(t, |j| j.min(t)));
                }
                Event::Handed { .. } => call.handed = true,
                Event::Bound { field, .. } if call.field.starts_with(UNBOUND) => {
                    call.field = field;
                    call.per_call = true;
                }
                Event::Release {
                    t, vu, how, lost, ..
                } => call.release = Some((t, vu, how, lost)),
                Event::Released { t, result, .. } => call.released = Some((t, result)),
                _ => {}
            }
        }
    }

    /// Faults touching `proc` (global ones included) whose window, widened by `grace` after its
    /// end, overlaps `[t0, t1]`; runtime stalls of `proc` count as faults.
    pub fn fault_near(&self, proc: &str, t0: u64, t1: u64, grace: Duration) -> Option<String> {
        self.fault_near_where(proc, t0, t1, grace, |_| true)
    }

    /// [`fault_near`](Self::fault_near), counting only the faults `counts` accepts (runtime
    /// stalls always count).
    pub fn fault_near_where(
        &self,
        proc: &str,
        t0: u64,
        t1: u64,
        grace: Duration,
        counts: impl Fn(&Fault) -> bool,
    ) -> Option<String> {
        let g = grace.as_nanos() as u64;
        for f in &self.faults {
            if counts(f) && f.touches(proc) && f.t0 <= t1 && f.t1 + g >= t0 {
                return Some(format!(
                    "{} {:?} {}..{}",
                    f.kind,
                    f.scope,
                    self.rel_ms(f.t0),
                    self.rel_ms(f.t1)
                ));
            }
        }
        let lag = self.params.lag_threshold.as_nanos() as u64;
        for (p, l0, l1) in &self.lags {
            if p == proc && l1 - l0 >= lag && *l0 <= t1 && l1 + g >= t0 {
                return Some(format!(
                    "runtime stall of {p} {}..{}",
                    self.rel_ms(*l0),
                    self.rel_ms(*l1)
                ));
            }
        }
        None
    }

    /// When the hold of `call` stops being trusted (see the module docs).
    pub fn trusted_end(&self, call: &Call) -> u64 {
        let (start, _) = call.granted().expect("a hold");
        let mut end = u64::MAX;
        if let Some((t, vu, _, _)) = &call.release {
            end = end.min(*t).min(*vu);
        }
        if let Some((t, _)) = &call.lost {
            end = end.min(*t);
        }
        for (client, t) in &self.shutdowns {
            if *client == call.client && *t >= start {
                end = end.min(*t);
            }
        }
        if let Some(t) = self.frozen.get(&call.proc) {
            end = end.min(*t);
        }
        if end == u64::MAX {
            // Never released, never lost, and its process never froze: all that is certain is
            // the validity it had at the grant (a later reading would only move it on), and that
            // it ended with its process.
            end = call
                .vu_at_grant
                .unwrap_or(u64::MAX)
                .min(self.exited.get(&call.proc).copied().unwrap_or(u64::MAX));
        }
        end.max(start)
    }
}

#[cfg(test)]
mod tests {
    use crate::check::fixtures::*;
    use fairlock_testkit::history::UNBOUND;

    #[test]
    fn events_round_trip_through_their_text_form() {
        let evs: Vec<Event> = hold("p0.1", "p0", "plain", "u:1", (10, 12), 7, 30, 40)
            .into_iter()
            .chain([
                Event::Lost {
                    id: "p0.1".into(),
                    t: 5,
                    reason: "Gone".into(),
                },
                Event::Shift {
                    name: "fair".into(),
                    t0: 1,
                    t1: 2,
                    ms: 300000,
                },
                Event::Bound {
                    id: "p0.2".into(),
                    field: "u:7:write".into(),
                },
            ])
            .collect();
        for ev in evs {
            assert_eq!(
                Event::parse(&ev.to_line()),
                Some(ev.clone()),
                "{}",
                ev.to_line()
            );
        }
        assert_eq!(Event::parse("call id=torn"), None);
    }

    #[test]
    fn a_bound_event_names_the_field_of_a_call_that_named_no_holder_only() {
        let mut h = hist();
        h.add_events(call(
            "a",
            "p0",
            "plain",
            &format!("{UNBOUND}a"),
            0,
            None,
            10,
            Outcome::Granted,
            Some(1),
        ));
        h.add_events(call(
            "b",
            "p0",
            "plain",
            "u:2",
            20,
            None,
            30,
            Outcome::Granted,
            Some(2),
        ));
        h.add_events(["a", "b"].map(|id| Event::Bound {
            id: id.into(),
            field: "u:9".into(),
        }));
        let field = |id: &str| {
            let c = h.calls.iter().find(|c| c.id == id).unwrap();
            (c.field.clone(), c.per_call)
        };
        assert_eq!(field("a"), ("u:9".to_owned(), true));
        assert_eq!(field("b"), ("u:2".to_owned(), false));
    }
}
