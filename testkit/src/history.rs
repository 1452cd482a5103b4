//! The torture test's history records: the clocks every process shares, and the events each
//! process records (one text line each, see [`Event`]) for the checker in `tests/torture/check/`.
//! The Redisson-protocol peer ([`crate::redisson_peer`]) records its calls in the same form.

use std::collections::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
    /// The text form of the outcome.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::TimedOut => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
            Outcome::Shutdown => "shutdown",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s form.
    pub fn parse(s: &str) -> Option<Outcome> {
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

/// The start of the field a call without a named holder records (`unbound:<call id>`, a field
/// no other call has) until its [`Event::Bound`] names the field the library picked. A call
/// that ended before it started its work (a refused lease, a cancellation before the first
/// poll) keeps it: it never reached Redis.
pub const UNBOUND: &str = "unbound:";

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
        /// The owner field is shared by several tasks (one `Holder` passed to `with_holder`).
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
    /// The owner field a call without a named holder acts for, read from the library's
    /// `acquire` span when the call starts its work (the call's [`Event::Call`] then names no
    /// field: the library picks the holder inside the call).
    Bound { id: String, field: String },
    /// The call took up a lock handed to it directly (the library's `took up a direct grant`
    /// event, PROTOCOL 8: granted by another client's script, no round trip of its own).
    Handed { id: String, t: u64 },
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
            Event::Handed { id, t } => format!("handed id={id} t={t}"),
            Event::Bound { id, field } => format!("bound id={id} field={}", word(field)),
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
            "bound" => Event::Bound {
                id: s("id")?,
                field: s("field")?,
            },
            "handed" => Event::Handed {
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
