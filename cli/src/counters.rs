//! `fairlock semaphore NAME` and `fairlock latch NAME`: one read-only snapshot of a semaphore
//! (Redisson's `RSemaphore` or `RPermitExpirableSemaphore` layout) or of a count-down latch, as a
//! table or as JSON. Nothing is written: expired permits are shown as such, not reclaimed (the
//! library's `available()` would reclaim them). The structs are the `--json` schema.

use fairlock::keys;
use serde::Serialize;

use crate::connect::Session;
use crate::error::Failure;
use crate::output::{self, Out, Table};

/// The score Redisson gives a permit taken without a lease: it never expires.
const NEVER: f64 = 922_337_203_685_477.0;

#[derive(Debug, Clone, Serialize)]
pub struct SemaphoreView {
    pub name: String,
    /// `semaphore` (a count only), `expirable` (permits in use are listed), `absent`, or `other`
    /// (the key holds something that is not a count).
    pub kind: &'static str,
    pub available: Option<i64>,
    /// PTTL of the count: -1 no expiry; in JSON `null` when there is no such key.
    #[serde(serialize_with = "crate::output::pttl_json")]
    pub pttl_ms: i64,
    pub server_time_ms: i64,
    pub server_time: String,
    pub channel: String,
    /// Permits in use of an expirable semaphore, earliest expiry first.
    pub permits: Vec<PermitView>,
    /// Of those, the ones whose expiry passed: the next acquire (or count) reclaims them.
    pub expired: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct PermitView {
    /// The id as Redisson shows it (32 hex digits; other lengths are shown as they are).
    pub id: String,
    /// Unix epoch ms; `None` for a Redisson permit without a lease (it never expires).
    pub expires_at_ms: Option<i64>,
    pub expires_in_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatchView {
    pub name: String,
    /// `latch`, `open` (no key: a count of zero), or `other`.
    pub kind: &'static str,
    pub count: i64,
    /// PTTL of the count: -1 no expiry; in JSON `null` when there is no such key.
    #[serde(serialize_with = "crate::output::pttl_json")]
    pub pttl_ms: i64,
    pub channel: String,
}

fn hex(raw: &[u8]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// The server's clock. (On a cluster TIME goes to whichever node the connection picks: the
/// masters' clocks agree closely enough to judge expiries.)
async fn server_ms(session: &mut Session) -> Result<i64, Failure> {
    let (secs, micros): (i64, i64) = session
        .raw
        .query(&redis::cmd("TIME"))
        .await
        .map_err(|e| Failure::redis("cannot read the server time", e))?;
    Ok(secs * 1000 + micros / 1000)
}

pub async fn semaphore(session: &mut Session, name: &str, json: bool) -> Result<(), Failure> {
    let expiries = keys::permit_expiries(name);
    let now = server_ms(session).await?;
    let mut pipe = redis::pipe();
    pipe.cmd("TYPE").arg(name).cmd("PTTL").arg(name);
    let (kind_of, pttl): (String, i64) = session
        .raw
        .pipe(&pipe)
        .await
        .map_err(|e| Failure::redis(&format!("cannot read semaphore {name:?}"), e))?;
    let mut view = SemaphoreView {
        name: name.to_owned(),
        kind: "absent",
        available: None,
        pttl_ms: pttl,
        server_time_ms: now,
        server_time: output::timestamp(now),
        channel: keys::semaphore_channel(name),
        permits: Vec::new(),
        expired: 0,
    };
    if kind_of == "string" {
        let value: Option<String> = session
            .raw
            .query(redis::cmd("GET").arg(name))
            .await
            .map_err(|e| Failure::redis("cannot read the count", e))?;
        view.available = value.as_deref().and_then(|v| v.parse().ok());
        view.kind = if view.available.is_some() {
            "semaphore"
        } else {
            "other"
        };
    } else if kind_of != "none" {
        view.kind = "other";
    }
    let members: Vec<(Vec<u8>, f64)> = session
        .raw
        .query(
            redis::cmd("ZRANGE")
                .arg(&expiries)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        )
        .await
        .unwrap_or_default();
    if !members.is_empty() && view.kind != "other" {
        view.kind = "expirable";
    }
    for (id, score) in members {
        let never = score >= NEVER;
        let at = (!never).then_some(score as i64);
        if at.is_some_and(|at| at <= now) {
            view.expired += 1;
        }
        view.permits.push(PermitView {
            id: if id.len() == 16 {
                hex(&id)
            } else {
                String::from_utf8_lossy(&id).into_owned()
            },
            expires_at_ms: at,
            expires_in_ms: at.map(|at| at - now),
        });
    }
    if json {
        Out.json(&view)?;
    } else {
        Out.lines(&render_semaphore(&view))?;
    }
    match view.kind {
        "absent" => Err(Failure::NotFound(format!("no semaphore named {name:?}"))),
        "other" => Err(Failure::NotFound(format!(
            "{name:?} is not a semaphore: the key holds something other than a count"
        ))),
        _ => Ok(()),
    }
}

pub fn render_semaphore(v: &SemaphoreView) -> Vec<String> {
    let mut items: Vec<(&str, String)> = vec![
        ("semaphore", v.name.clone()),
        (
            "kind",
            match v.kind {
                "semaphore" => {
                    "semaphore (RSemaphore; or an expirable one with no permit in use)".into()
                }
                "expirable" => "expirable (RPermitExpirableSemaphore)".into(),
                k => k.to_owned(),
            },
        ),
        (
            "available",
            v.available.map_or("-".into(), |a| a.to_string()),
        ),
        (
            "expires",
            match v.pttl_ms {
                -2 => "-".into(),
                -1 => "never".into(),
                ms => format!("in {}", output::duration(ms)),
            },
        ),
        ("channel", v.channel.clone()),
        ("server time", v.server_time.clone()),
    ];
    if !v.permits.is_empty() {
        items.push((
            "in use",
            format!(
                "{} ({} expired, reclaimed by the next acquire)",
                v.permits.len(),
                v.expired
            ),
        ));
    }
    let mut lines = output::pairs(&items);
    if !v.permits.is_empty() {
        let mut table = Table::new(&["#", "PERMIT ID", "EXPIRES", "IN"]);
        for (i, p) in v.permits.iter().enumerate() {
            table.row(vec![
                (i + 1).to_string(),
                p.id.clone(),
                p.expires_at_ms
                    .map_or("never (no lease)".into(), output::timestamp),
                p.expires_in_ms.map_or("-".into(), |ms| {
                    if ms <= 0 {
                        format!("expired {} ago", output::duration(-ms))
                    } else {
                        output::duration(ms)
                    }
                }),
            ]);
        }
        lines.extend(table.render("  "));
    }
    lines
}

pub async fn latch(session: &mut Session, name: &str, json: bool) -> Result<(), Failure> {
    let mut pipe = redis::pipe();
    pipe.cmd("TYPE")
        .arg(name)
        .cmd("PTTL")
        .arg(name)
        .cmd("GET")
        .arg(name);
    let facts: (String, i64, redis::Value) = session
        .raw
        .pipe(&pipe)
        .await
        .map_err(|e| Failure::redis(&format!("cannot read latch {name:?}"), e))?;
    let (kind_of, pttl, value) = facts;
    let count = match &value {
        redis::Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|t| t.parse().ok()),
        _ => None,
    };
    let kind = match (kind_of.as_str(), count) {
        ("none", _) => "open",
        ("string", Some(_)) => "latch",
        _ => "other",
    };
    let view = LatchView {
        name: name.to_owned(),
        kind,
        count: count.unwrap_or(0).max(0),
        pttl_ms: pttl,
        channel: keys::count_down_channel(name),
    };
    if json {
        Out.json(&view)?;
    } else {
        Out.lines(&output::pairs(&[
            ("latch", view.name.clone()),
            (
                "state",
                match view.kind {
                    "open" => "open (no key: counts zero; await returns at once)".into(),
                    "latch" => format!("closed, count {}", view.count),
                    _ => "not a latch (the key holds something other than a count)".into(),
                },
            ),
            (
                "expires",
                match view.pttl_ms {
                    -2 => "-".into(),
                    -1 => "never".into(),
                    ms => format!("in {}", output::duration(ms)),
                },
            ),
            ("channel", view.channel.clone()),
        ]))?;
    }
    if view.kind == "other" {
        return Err(Failure::NotFound(format!(
            "{name:?} is not a latch: the key holds something other than a count"
        )));
    }
    Ok(())
}
