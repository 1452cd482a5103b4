//! The torture test's history and its checker.
//!
//! Every process that takes locks records **events** (one text line each, see [`Event`]) with
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
//!   owner fields on one name must not overlap (one field is one reentrant holder). An empty
//!   interval (the validity ran out before the call returned) is trusted for no time at all.
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
//!   score in `S`, less every Java shift that may have run since, is not after the grant). A grant
//!   is not counted as overtaking when a fault touched its own process near it (it may have taken
//!   up a grant made to an earlier call whose reply was lost).
//! * **Bounded waits** (`bounded-wait`): `try_lock(wait)` returns within `wait` + one command
//!   timeout + a scheduling slack, unless a fault touching its process overlapped the call
//!   (widened by a grace period) or the process's runtime was seen stalled then.
//! * **Unlock** (`unlock`): `unlock()` answered `NotHeld` although the guard was not lost, its
//!   validity had not run out when the release finished, and no fault touched its process.
//! * **Anomalies** (`anomaly`): things a process noticed itself (a guard whose owner field is not
//!   the one computed for the caller, a fenced guard without a token).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process on this machine.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall clock in Unix epoch milliseconds (what Redis `TIME` and a Java client's clock give).
pub fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Converts a `std::time::Instant` of this process (the library's `valid_until()`) to
/// [`mono_ns`], from one pairing of the two clocks taken at creation.
#[derive(Debug, Clone, Copy)]
pub struct InstantClock {
    base: Instant,
    base_ns: u64,
}

impl Default for InstantClock {
    fn default() -> Self {
        Self::new()
    }
}

impl InstantClock {
    pub fn new() -> Self {
        // Both read back to back; on Linux `Instant` is CLOCK_MONOTONIC itself, so the pairing
        // error is the gap between the two reads (well under a microsecond).
        let base = Instant::now();
        let base_ns = mono_ns();
        InstantClock { base, base_ns }
    }

    pub fn ns(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.base) {
            Some(after) => self.base_ns + after.as_nanos() as u64,
            None => self
                .base_ns
                .saturating_sub(self.base.duration_since(at).as_nanos() as u64),
        }
    }
}

/// How a lock call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The lock was granted (a hold follows).
    Granted,
    /// `try_lock`'s wait ran out (`Ok(None)`).
    TimedOut,
    /// The caller dropped the future (a `timeout`/`select!` around it fired), or a Java waiter
    /// was abandoned (interrupted) without its give-up.
    Cancelled,
    /// The call returned a Redis (or other) error.
    Error,
    /// The call returned `Error::Shutdown`.
    Shutdown,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::TimedOut => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
            Outcome::Shutdown => "shutdown",
        }
    }

    fn parse(s: &str) -> Option<Outcome> {
        Some(match s {
            "granted" => Outcome::Granted,
            "timeout" => Outcome::TimedOut,
            "cancelled" => Outcome::Cancelled,
            "error" => Outcome::Error,
            "shutdown" => Outcome::Shutdown,
            _ => return None,
        })
    }
}

/// One recorded event. Text form: the kind, then `key=value` pairs, separated by single spaces
/// (values never contain spaces).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A lock call starts (`t` read before the call).
    Call {
        id: String,
        proc: String,
        client: String,
        name: String,
        fair: bool,
        field: String,
        op: String,
        /// `None`: unbounded (`lock()`); Java `lock()` calls record `None` too.
        wait_ms: Option<u64>,
        lease_ms: Option<u64>,
        t: u64,
        /// The owner field is shared by several tasks (`.holder(id)`).
        shared: bool,
        /// The caller already held a guard of this field on this name (a re-entry).
        reentrant: bool,
        /// The Redisson-protocol peer made the call.
        java: bool,
    },
    /// A lock call ended (`t` read right after it returned or was dropped).
    End {
        id: String,
        t: u64,
        outcome: Outcome,
        token: Option<u64>,
        /// The guard's `valid_until()` at the grant (mono ns), when granted.
        vu: Option<u64>,
        detail: String,
    },
    /// A hold's `lost()` was observed.
    Lost { id: String, t: u64, reason: String },
    /// The call's own attempt joined a fair queue (the library's `queued` event, emitted inside
    /// the call; `t` read after Redis ran the join). An attempt abandoned by a dropped call never
    /// emits it.
    Joined { id: String, t: u64 },
    /// The release of a hold starts (`t` and `vu` read just before `unlock()` / `drop`).
    Release {
        id: String,
        t: u64,
        vu: u64,
        how: String,
        lost: bool,
    },
    /// `unlock()` returned.
    Released { id: String, t: u64, result: String },
    /// `client.shutdown()` was called on client `client`.
    Shutdown { client: String, t: u64 },
    /// The process's runtime did not run a 5 ms timer between `t0` and `t1`.
    Lag { proc: String, t0: u64, t1: u64 },
    /// A Redisson-protocol acquisition or give-up that subtracted `ms` from deadline scores; sent
    /// at `t0`, answered at `t1`.
    Shift {
        name: String,
        t0: u64,
        t1: u64,
        ms: u64,
    },
    /// Something a process found wrong by itself.
    Anomaly { proc: String, t: u64, what: String },
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

/// A value for the text form: spaces become `_`, an empty value `-`.
fn word(s: &str) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s.replace(char::is_whitespace, "_")
    }
}

impl Event {
    /// The one-line text form.
    pub fn to_line(&self) -> String {
        match self {
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
            } => format!(
                "call id={id} proc={proc} client={client} name={} fair={} field={field} op={op} \
                 wait={} lease={} t={t} shared={} reentrant={} java={}",
                word(name),
                flag(*fair),
                opt(*wait_ms),
                opt(*lease_ms),
                flag(*shared),
                flag(*reentrant),
                flag(*java)
            ),
            Event::End {
                id,
                t,
                outcome,
                token,
                vu,
                detail,
            } => format!(
                "end id={id} t={t} outcome={} token={} vu={} detail={}",
                outcome.as_str(),
                opt(*token),
                opt(*vu),
                word(detail)
            ),
            Event::Lost { id, t, reason } => format!("lost id={id} t={t} reason={}", word(reason)),
            Event::Joined { id, t } => format!("joined id={id} t={t}"),
            Event::Release {
                id,
                t,
                vu,
                how,
                lost,
            } => format!(
                "release id={id} t={t} vu={vu} how={how} lost={}",
                flag(*lost)
            ),
            Event::Released { id, t, result } => {
                format!("released id={id} t={t} result={}", word(result))
            }
            Event::Shutdown { client, t } => format!("shutdown client={client} t={t}"),
            Event::Lag { proc, t0, t1 } => format!("lag proc={proc} t0={t0} t1={t1}"),
            Event::Shift { name, t0, t1, ms } => {
                format!("shift name={} t0={t0} t1={t1} ms={ms}", word(name))
            }
            Event::Anomaly { proc, t, what } => {
                format!("anomaly proc={proc} t={t} what={}", word(what))
            }
        }
    }

    /// Parses [`to_line`](Self::to_line)'s form; `None` for anything else (a torn last line of a
    /// killed process, or unrelated output).
    pub fn parse(line: &str) -> Option<Event> {
        let mut parts = line.split_whitespace();
        let kind = parts.next()?;
        let kv: HashMap<&str, &str> = parts.filter_map(|p| p.split_once('=')).collect();
        let s = |k: &str| kv.get(k).map(|v| v.to_string());
        let n = |k: &str| kv.get(k).and_then(|v| v.parse::<u64>().ok());
        let o = |k: &str| -> Option<Option<u64>> {
            let v = kv.get(k)?;
            if *v == "-" {
                Some(None)
            } else {
                Some(Some(v.parse().ok()?))
            }
        };
        let b = |k: &str| kv.get(k).map(|v| *v == "1");
        Some(match kind {
            "call" => Event::Call {
                id: s("id")?,
                proc: s("proc")?,
                client: s("client")?,
                name: s("name")?,
                fair: b("fair")?,
                field: s("field")?,
                op: s("op")?,
                wait_ms: o("wait")?,
                lease_ms: o("lease")?,
                t: n("t")?,
                shared: b("shared")?,
                reentrant: b("reentrant")?,
                java: b("java")?,
            },
            "end" => Event::End {
                id: s("id")?,
                t: n("t")?,
                outcome: Outcome::parse(kv.get("outcome")?)?,
                token: o("token")?,
                vu: o("vu")?,
                detail: s("detail").filter(|d| d != "-").unwrap_or_default(),
            },
            "lost" => Event::Lost {
                id: s("id")?,
                t: n("t")?,
                reason: s("reason")?,
            },
            "joined" => Event::Joined {
                id: s("id")?,
                t: n("t")?,
            },
            "release" => Event::Release {
                id: s("id")?,
                t: n("t")?,
                vu: n("vu")?,
                how: s("how")?,
                lost: b("lost")?,
            },
            "released" => Event::Released {
                id: s("id")?,
                t: n("t")?,
                result: s("result")?,
            },
            "shutdown" => Event::Shutdown {
                client: s("client")?,
                t: n("t")?,
            },
            "lag" => Event::Lag {
                proc: s("proc")?,
                t0: n("t0")?,
                t1: n("t1")?,
            },
            "shift" => Event::Shift {
                name: s("name")?,
                t0: n("t0")?,
                t1: n("t1")?,
                ms: n("ms")?,
            },
            "anomaly" => Event::Anomaly {
                proc: s("proc")?,
                t: n("t")?,
                what: s("what")?,
            },
            _ => return None,
        })
    }
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
    pub release: Option<(u64, u64, String, bool)>,
    pub released: Option<(u64, String)>,
}

impl Call {
    fn granted(&self) -> Option<(u64, Option<u64>)> {
        match self.end {
            Some((t, Outcome::Granted, token)) => Some((t, token)),
            _ => None,
        }
    }

    fn token(&self) -> Option<u64> {
        self.granted().and_then(|(_, tok)| tok)
    }

    fn describe(&self, h: &History) -> String {
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
    fn fault_near(&self, proc: &str, t0: u64, t1: u64, grace: Duration) -> Option<String> {
        let g = grace.as_nanos() as u64;
        for f in &self.faults {
            if f.touches(proc) && f.t0 <= t1 && f.t1 + g >= t0 {
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
    fn trusted_end(&self, call: &Call) -> u64 {
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
}

/// Runs every rule. Violations are sorted by rule and capped per rule (`max_per_rule`).
pub fn check(h: &History, max_per_rule: usize) -> (Vec<Violation>, CheckStats) {
    let mut stats = CheckStats::default();
    let mut out = Vec::new();
    let mut push = |vs: Vec<Violation>| out.extend(vs.into_iter().take(max_per_rule));
    push(check_mutual_exclusion(h, &mut stats));
    push(check_fencing(h, &mut stats));
    push(check_fifo(h, &mut stats));
    push(check_bounded_waits(h, &mut stats));
    push(check_unlocks(h));
    push(
        h.anomalies
            .iter()
            .map(|(proc, t, what)| Violation {
                rule: "anomaly",
                message: format!("{proc} at {}: {what}", h.rel_ms(*t)),
                evidence: vec![],
                ids: vec![],
            })
            .collect(),
    );
    (out, stats)
}

fn by_name(h: &History) -> BTreeMap<&str, Vec<&Call>> {
    let mut m: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
    for c in &h.calls {
        m.entry(c.name.as_str()).or_default().push(c);
    }
    m
}

/// Mutual exclusion over trusted intervals.
pub fn check_mutual_exclusion(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    for (name, calls) in by_name(h) {
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
                if oc.field != c.field {
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

/// Unique tokens, increasing with real-time order of grants.
pub fn check_fencing(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    for (name, calls) in by_name(h) {
        let mut grants: Vec<&Call> = calls
            .iter()
            .copied()
            .filter(|c| c.granted().is_some())
            .collect();
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

/// Could `c`'s stale queue entry outlive it? (Its give-up runs after it ends, or may have failed.)
fn may_leave_stale_entry(c: &Call) -> bool {
    !matches!(
        c.end,
        Some((_, Outcome::Granted, _)) | Some((_, Outcome::TimedOut, _))
    )
}

struct FairIndex<'a> {
    /// Calls of one name by field, by start time (fields used by one task only).
    by_field: HashMap<&'a str, Vec<&'a Call>>,
    /// Grants of the name by token.
    grants: Vec<&'a Call>,
    snaps: Vec<&'a Snapshot>,
}

impl<'a> FairIndex<'a> {
    fn new(h: &'a History, name: &str, calls: &[&'a Call]) -> Self {
        let mut by_field: HashMap<&str, Vec<&Call>> = HashMap::new();
        let mut shared: std::collections::HashSet<&str> = Default::default();
        for c in calls {
            if c.shared {
                shared.insert(c.field.as_str());
            }
            by_field.entry(c.field.as_str()).or_default().push(c);
        }
        for f in shared {
            by_field.remove(f);
        }
        for v in by_field.values_mut() {
            v.sort_by_key(|c| c.t_start);
        }
        let mut grants: Vec<&Call> = calls
            .iter()
            .copied()
            .filter(|c| c.token().is_some())
            .collect();
        grants.sort_by_key(|c| c.token());
        let mut snaps: Vec<&Snapshot> = h.snapshots.iter().filter(|s| s.name == name).collect();
        snaps.sort_by_key(|s| s.t0);
        FairIndex {
            by_field,
            grants,
            snaps,
        }
    }

    /// The call a queue entry `field` in `s` belongs to, when that is certain.
    fn owner(&self, s: &Snapshot, field: &str) -> Option<&'a Call> {
        let calls = self.by_field.get(field)?;
        let idx = calls.iter().rposition(|c| c.t_start <= s.t0)?;
        let c = calls[idx];
        let covers = match c.end {
            None => true,
            Some((t, _, _)) => t >= s.t1,
        };
        if !covers {
            return None;
        }
        if c.token().is_some_and(|tok| tok <= s.counter) {
            return None;
        }
        if c.java {
            if !self.no_stale_entry_before(calls, idx, s.t0) {
                return None;
            }
            return Some(c);
        }
        // A fairlock call: an earlier call's entry can outlive that call (its give-up, or an
        // attempt it abandoned in flight, runs later in the background, before this call's first
        // attempt). So the entry is this call's only once this call is seen to have joined, or
        // when no earlier call of the field exists.
        if idx == 0 || c.joined.is_some_and(|j| j <= s.t0) {
            Some(c)
        } else {
            None
        }
    }

    /// Whether the call before `calls[idx]` (same field, same name) is certain to have left no
    /// entry in the queue by `at`: it was granted or timed out, or a snapshot between its end and
    /// `at` shows the field gone.
    fn no_stale_entry_before(&self, calls: &[&Call], idx: usize, at: u64) -> bool {
        if idx == 0 {
            return true;
        }
        let prev = calls[idx - 1];
        if !may_leave_stale_entry(prev) {
            return true;
        }
        let field = prev.field.as_str();
        let prev_end = prev.end.map_or(u64::MAX, |(t, _, _)| t);
        self.snaps
            .iter()
            .any(|x| x.t0 > prev_end && x.t1 <= at && !x.queue.iter().any(|f| f == field))
    }

    /// For a Redisson-protocol call: its thread's abandoned earlier wait may still hold a place in
    /// the queue, which Redisson lets the same thread take up again (not an overtake).
    fn inherits_place(&self, c: &Call) -> bool {
        if !c.java {
            return false;
        }
        let Some(calls) = self.by_field.get(c.field.as_str()) else {
            return false;
        };
        let Some(idx) = calls.iter().position(|x| x.id == c.id) else {
            return false;
        };
        !self.no_stale_entry_before(calls, idx, c.t_start)
    }
}

/// The earliest time `c`'s queue entry can be gone by its own doing, when it was not granted.
fn leaves_no_earlier_than(h: &History, c: &Call) -> u64 {
    let died = h.frozen.get(&c.proc).copied().unwrap_or(u64::MAX);
    if c.java {
        // The peer: a timed-out tryLock gives up once its wait is over; an abandoned (interrupted)
        // waiter never gives up by itself, but its place belongs to its thread (its owner field):
        // the thread's next call on the lock takes that place up or gives it up, so the abandoned
        // call's claim ends when that call starts. Any other end (a give-up at teardown, an
        // error) may have left at any time during the call.
        return match c.end {
            None => died,
            Some((_, Outcome::TimedOut, _)) => c.t_start + c.wait_ms.unwrap_or(0) * 1_000_000,
            Some((_, Outcome::Cancelled, _)) if c.end_detail == "abandoned" => h
                .calls
                .iter()
                .filter(|n| n.field == c.field && n.name == c.name && n.t_start > c.t_start)
                .map(|n| n.t_start)
                .min()
                .unwrap_or(died)
                .min(died),
            Some(_) => c.t_start,
        };
    }
    let t = match c.end {
        None => u64::MAX,
        Some((_, Outcome::TimedOut, _)) => {
            // The give-up runs only once the wait is over.
            c.t_start + c.wait_ms.unwrap_or(0) * 1_000_000
        }
        Some((t, Outcome::Shutdown, _)) => {
            let sd = h
                .shutdowns
                .iter()
                .filter(|(cl, st)| *cl == c.client && *st >= c.t_start)
                .map(|(_, st)| *st)
                .min()
                .unwrap_or(t);
            sd.min(t)
        }
        Some((t, _, _)) => t,
    };
    t.min(died)
}

/// Why the waiter `a` (queued in `s`) may have been purged legitimately before `until`.
fn victim_exempt(h: &History, s: &Snapshot, a: &Call, until: u64) -> Option<String> {
    if a.java {
        // A Redisson waiter is purged once its deadline score is past, and only Java shifts lower
        // a score. Start from the latest snapshot before `until` that shows it (fairlock's own
        // scripts may change scores too; a snapshot sees whatever they did up to it).
        let latest = h
            .snapshots
            .iter()
            .filter(|x| x.name == a.name && x.t0 >= s.t0 && x.t1 <= until)
            .filter(|x| x.scores.contains_key(&a.field))
            .max_by_key(|x| x.t0)
            .unwrap_or(s);
        let score = *latest.scores.get(&a.field)?;
        let shifted: u64 = h
            .shifts
            .iter()
            .filter(|(name, t0, t1, _)| *name == a.name && *t0 <= until && *t1 >= latest.t0)
            .map(|(_, _, _, ms)| *ms)
            .sum();
        let lowest = score - shifted as f64;
        let at_ms = until as f64 / 1e6 + h.params.epoch_offset_ms;
        let slack_ms = h.params.slack.as_millis() as f64;
        if lowest <= at_ms + slack_ms {
            return Some(format!(
                "java deadline {lowest:.0} (score {score:.0} less shifts {shifted}) not after \
                 {at_ms:.0}"
            ));
        }
        return h.fault_near(&a.proc, s.t0, until, h.params.fault_grace);
    }
    h.fault_near(
        &a.proc,
        s.t0,
        until,
        h.params.liveness + h.params.fault_grace,
    )
}

/// Whether `b`'s grant may be the take-up of an earlier call's grant (lost reply): a fault
/// touched its process between `from` and its return.
fn grant_suspect(h: &History, b: &Call, from: u64) -> bool {
    let (t, _) = b.granted().unwrap();
    h.fault_near(&b.proc, from, t, h.params.fault_grace)
        .is_some()
}

/// FIFO among fair waiters.
pub fn check_fifo(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut reported: std::collections::HashSet<(String, String)> = Default::default();
    for (name, calls) in by_name(h) {
        if !calls.iter().any(|c| c.fair) {
            continue;
        }
        let idx = FairIndex::new(h, name, &calls);
        for s in &idx.snaps {
            stats.snapshots += 1;
            let owners: Vec<Option<&Call>> = s.queue.iter().map(|f| idx.owner(s, f)).collect();
            // fifo-order
            for (i, a) in owners.iter().enumerate() {
                let Some(a) = a else { continue };
                for b in owners.iter().skip(i + 1).flatten() {
                    let Some((b_ret, Some(tb))) = b.granted() else {
                        continue;
                    };
                    if tb <= s.counter
                        || b.reentrant
                        || grant_suspect(h, b, s.t0)
                        || idx.inherits_place(b)
                    {
                        continue;
                    }
                    stats.fifo_pairs += 1;
                    let a_first = match a.token() {
                        Some(ta) => ta < tb,
                        None => leaves_no_earlier_than(h, a) <= b_ret,
                    };
                    if a_first {
                        continue;
                    }
                    if let Some(why) = victim_exempt(h, s, a, b_ret) {
                        let _ = why;
                        stats.fifo_exempt += 1;
                        continue;
                    }
                    if reported.insert((a.id.clone(), b.id.clone())) {
                        out.push(Violation {
                            rule: "fifo-order",
                            message: format!(
                                "{} overtook {} on {name}: both queued at {} (counter {}, queue \
                                 {:?}), the later one was granted token {tb} while the earlier \
                                 was still waiting",
                                b.field,
                                a.field,
                                h.rel_ms(s.t0),
                                s.counter,
                                s.queue
                            ),
                            evidence: vec![a.describe(h), b.describe(h)],
                            ids: vec![a.id.clone(), b.id.clone()],
                        });
                    }
                }
            }
            // fifo-arrival
            for b in owners.iter().flatten() {
                let b_leaves = match b.token() {
                    Some(_) => u64::MAX,
                    None => leaves_no_earlier_than(h, b),
                };
                let start = idx
                    .grants
                    .partition_point(|g| g.token().unwrap() <= s.counter);
                for a in &idx.grants[start..] {
                    let ta = a.token().unwrap();
                    if b.token().is_some_and(|tb| tb <= ta) {
                        break;
                    }
                    if b.token().is_none() && a.t_start >= b_leaves {
                        break;
                    }
                    if a.t_start <= s.t1 || a.field == b.field || a.reentrant || a.shared {
                        continue;
                    }
                    let (a_ret, _) = a.granted().unwrap();
                    if b.token().is_none() && a_ret >= b_leaves {
                        continue;
                    }
                    if grant_suspect(h, a, s.t0) || idx.inherits_place(a) {
                        continue;
                    }
                    stats.fifo_pairs += 1;
                    if victim_exempt(h, s, b, a_ret).is_some() {
                        stats.fifo_exempt += 1;
                        continue;
                    }
                    if reported.insert((b.id.clone(), a.id.clone())) {
                        out.push(Violation {
                            rule: "fifo-arrival",
                            message: format!(
                                "{} jumped the queue of {name}: its call started at {}, after {} \
                                 was seen queued at {} (counter {}, queue {:?}), and was granted \
                                 token {ta} first",
                                a.field,
                                h.rel_ms(a.t_start),
                                b.field,
                                h.rel_ms(s.t0),
                                s.counter,
                                s.queue
                            ),
                            evidence: vec![b.describe(h), a.describe(h)],
                            ids: vec![b.id.clone(), a.id.clone()],
                        });
                    }
                }
            }
        }
    }
    out
}

/// `try_lock(wait)` returns within `wait` + one command timeout (+ slack) outside faults.
pub fn check_bounded_waits(h: &History, stats: &mut CheckStats) -> Vec<Violation> {
    let mut out = Vec::new();
    let p = &h.params;
    for c in &h.calls {
        if c.java {
            continue;
        }
        let (Some(wait), Some((t_end, outcome, _))) = (c.wait_ms, c.end) else {
            continue;
        };
        if outcome == Outcome::Cancelled || outcome == Outcome::Shutdown {
            continue;
        }
        stats.bounded_calls += 1;
        let bound = Duration::from_millis(wait) + p.command_timeout + p.slack;
        let took = Duration::from_nanos(t_end.saturating_sub(c.t_start));
        if took <= bound {
            continue;
        }
        if h.fault_near(&c.proc, c.t_start, t_end, p.fault_grace)
            .is_some()
        {
            stats.bounded_exempt += 1;
            continue;
        }
        out.push(Violation {
            rule: "bounded-wait",
            message: format!(
                "try_lock with wait {wait} ms took {:.1} ms (bound {:.1} ms) with no fault near",
                took.as_secs_f64() * 1e3,
                bound.as_secs_f64() * 1e3
            ),
            evidence: vec![c.describe(h)],
            ids: vec![c.id.clone()],
        });
    }
    out
}

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
