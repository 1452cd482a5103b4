//! `fairlock scan [PATTERN]`: finds locks with `SCAN` (each master of a cluster in turn, a
//! bounded COUNT per call, a pause between calls, never `KEYS`), reads each one like `inspect`
//! does, and lists the orphans.
//!
//! Two passes per master: `SCAN … MATCH PATTERN TYPE hash` for owner hashes (a hash counts as a
//! lock when it has at most 8 fields, each `<uuid>:<integer>` with an integer value), and
//! `SCAN … MATCH *lock*:*` for the derived keys (queues, deadline sets, liveness sets, fencing
//! counters, unlock latches), whose lock names are then matched against PATTERN here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fairlock::keys;
use serde::Serialize;

use crate::args::invalid_name;
use crate::connect::{Node, Session};
use crate::error::Failure;
use crate::glob;
use crate::output::{self, Out, Table};
use crate::snapshot::{self, parse_derived, KeyView, Latches, Orphan, Role, Snapshot};
use fairlock::keys::DerivedKey;

/// A hash with more fields than this is not taken for a lock.
const MAX_LOCK_FIELDS: i64 = 8;
/// Locks read between two pauses.
const READS_PER_PAUSE: usize = 10;

pub struct Options {
    pub pattern: String,
    pub count: u32,
    pub pause: Duration,
    pub limit: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub locks: usize,
    pub held: usize,
    pub waiters: usize,
    pub dead_waiters: usize,
    pub orphans: usize,
}

#[derive(Debug, Serialize)]
pub struct ScanOrphan {
    pub name: String,
    #[serde(flatten)]
    pub orphan: Orphan,
}

#[derive(Debug, Serialize)]
pub struct ScanReport {
    pub pattern: String,
    pub nodes: Vec<String>,
    pub scan_calls: u64,
    pub keys_returned: u64,
    pub truncated: bool,
    pub summary: Summary,
    pub locks: Vec<Snapshot>,
    pub orphans: Vec<ScanOrphan>,
}

#[derive(Default)]
struct Found {
    roles: BTreeSet<Role>,
    keys: BTreeSet<(String, Role)>,
    latches: Vec<String>,
}

impl Found {
    /// Only a fencing counter: a free lock that was once fenced (counters live for ever by
    /// design), not worth a line.
    fn only_counter(&self) -> bool {
        self.roles
            .iter()
            .all(|r| *r == Role::Derived(DerivedKey::Token))
    }
}

struct Scanner<'a> {
    session: &'a mut Session,
    opts: &'a Options,
    calls: u64,
    returned: u64,
    found: BTreeMap<String, Found>,
}

impl Scanner<'_> {
    fn full(&self) -> bool {
        self.found.values().filter(|f| !f.only_counter()).count() as u64 >= self.opts.limit
    }

    async fn scan_call(
        &mut self,
        node: &Node,
        cursor: u64,
        pattern: &str,
        hashes_only: bool,
    ) -> Result<(u64, Vec<String>), Failure> {
        if self.calls > 0 {
            tokio::time::sleep(self.opts.pause).await;
        }
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(self.opts.count);
        if hashes_only {
            cmd.arg("TYPE").arg("hash");
        }
        let reply: (u64, Vec<String>) = self
            .session
            .raw
            .on_node(node, &cmd)
            .await
            .map_err(|e| Failure::redis(&format!("SCAN on {} failed", node.addr), e))?;
        self.calls += 1;
        self.returned += reply.1.len() as u64;
        Ok(reply)
    }

    /// Pass 1: owner hashes.
    async fn hashes(&mut self, node: &Node) -> Result<(), Failure> {
        let mut cursor = 0;
        loop {
            let (next, batch) = self
                .scan_call(node, cursor, &self.opts.pattern.clone(), true)
                .await?;
            self.check_hashes(batch).await?;
            if next == 0 || self.full() {
                return Ok(());
            }
            cursor = next;
        }
    }

    async fn check_hashes(&mut self, batch: Vec<String>) -> Result<(), Failure> {
        if batch.is_empty() {
            return Ok(());
        }
        let fail = |e: redis::RedisError| Failure::redis("cannot read a scanned hash", e);
        let mut pipe = redis::pipe();
        for key in &batch {
            pipe.cmd("HLEN").arg(key);
        }
        let lens: Vec<i64> = self.session.raw.pipe(&pipe).await.map_err(fail)?;
        let small: Vec<&String> = batch
            .iter()
            .zip(lens)
            .filter(|(_, n)| (1..=MAX_LOCK_FIELDS).contains(n))
            .map(|(k, _)| k)
            .collect();
        if small.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for key in &small {
            pipe.cmd("HGETALL").arg(*key);
        }
        let all: Vec<Vec<(String, String)>> = self.session.raw.pipe(&pipe).await.map_err(fail)?;
        for (key, fields) in small.into_iter().zip(all) {
            // An owner hash: owner fields with counts, and a read-write lock's `mode`.
            let is_lock = !fields.is_empty()
                && fields.iter().all(|(f, v)| {
                    (keys::looks_like_owner_field(f) && v.parse::<i64>().is_ok())
                        || (f == "mode" && (v == "read" || v == "write"))
                });
            if is_lock {
                let found = self.found.entry(key.clone()).or_default();
                found.roles.insert(Role::Lock);
                found.keys.insert((key.clone(), Role::Lock));
            }
        }
        Ok(())
    }

    /// Pass 2: every derived key, matched to its lock name.
    async fn derived(&mut self, node: &Node) -> Result<(), Failure> {
        let mut cursor = 0;
        loop {
            let (next, batch) = self
                .scan_call(node, cursor, glob::DERIVED_MATCH, false)
                .await?;
            for key in batch {
                let Some((name, role)) = parse_derived(&key) else {
                    continue;
                };
                if !glob::glob_match(&self.opts.pattern, &name) {
                    continue;
                }
                let found = self.found.entry(name).or_default();
                found.roles.insert(role);
                if role == Role::Derived(DerivedKey::Latch) {
                    found.latches.push(key);
                } else {
                    found.keys.insert((key, role));
                }
            }
            if next == 0 || self.full() {
                return Ok(());
            }
            cursor = next;
        }
    }
}

pub async fn run(session: &mut Session, opts: Options, json: bool) -> Result<(), Failure> {
    let mut nodes = session
        .raw
        .masters()
        .await
        .map_err(|e| Failure::redis("cannot list the masters", e))?;
    if !session.is_cluster() {
        for n in &mut nodes {
            n.addr = session.target.describe();
        }
    }
    let mut scanner = Scanner {
        session,
        opts: &opts,
        calls: 0,
        returned: 0,
        found: BTreeMap::new(),
    };
    for node in &nodes {
        if scanner.full() {
            break;
        }
        scanner.hashes(node).await?;
        if scanner.full() {
            break;
        }
        scanner.derived(node).await?;
    }
    let truncated = scanner.full();
    let (calls, returned) = (scanner.calls, scanner.returned);
    let found = std::mem::take(&mut scanner.found);
    let session = scanner.session;

    let mut locks = Vec::new();
    let mut reads = 0;
    for (name, f) in found {
        if f.only_counter() {
            continue;
        }
        if locks.len() as u64 >= opts.limit {
            break;
        }
        if invalid_name(&name, session.is_cluster()).is_some() {
            locks.push(unusable(session, &name, &f).await?);
            continue;
        }
        if reads > 0 && reads % READS_PER_PAUSE == 0 {
            tokio::time::sleep(opts.pause).await;
        }
        reads += 1;
        let latches = snapshot::latch_ttls(&mut session.raw, f.latches.clone()).await?;
        let snap = snapshot::read(session, &name, Latches::Known(latches)).await?;
        // Gone between the scan and the read, with nothing left behind: not worth a line.
        if snap.kind == "absent" && snap.orphans.is_empty() {
            continue;
        }
        locks.push(snap);
    }

    let mut summary = Summary::default();
    let mut orphans = Vec::new();
    for s in &locks {
        summary.locks += 1;
        summary.held += usize::from(s.locked);
        summary.waiters += s.queue_length;
        summary.dead_waiters += s.dead_waiters;
        for o in &s.orphans {
            orphans.push(ScanOrphan {
                name: s.name.clone(),
                orphan: o.clone(),
            });
        }
    }
    summary.orphans = orphans.len();
    let report = ScanReport {
        pattern: opts.pattern.clone(),
        nodes: nodes.iter().map(|n| n.addr.clone()).collect(),
        scan_calls: calls,
        keys_returned: returned,
        truncated,
        summary,
        locks,
        orphans,
    };
    let out = Out;
    if json {
        return out.json(&report);
    }
    out.lines(&render(&report))
}

/// A name whose keys cannot share a slot on this cluster: nobody can use it as a lock, so every
/// key found for it is reported.
async fn unusable(session: &mut Session, name: &str, f: &Found) -> Result<Snapshot, Failure> {
    let now = snapshot::server_time(&mut session.raw).await?;
    let mut keys_found: Vec<(String, Role)> = f.keys.iter().cloned().collect();
    keys_found.extend(
        f.latches
            .iter()
            .map(|k| (k.clone(), Role::Derived(DerivedKey::Latch))),
    );
    let orphans = keys_found
        .iter()
        .map(|(key, _)| Orphan {
            key: key.clone(),
            problem: "unusable_name",
            detail: "the lock's keys would span cluster slots: no client can use this name".into(),
        })
        .collect();
    Ok(Snapshot {
        name: name.to_owned(),
        kind: "other",
        mode: None,
        readers: Vec::new(),
        locked: false,
        server_time_ms: now,
        server_time: output::timestamp(now),
        owners: Vec::new(),
        pttl_ms: -2,
        expires_at_ms: None,
        expires_at: None,
        fencing_token: None,
        queue_length: 0,
        dead_waiters: 0,
        queue: Vec::new(),
        keys: keys_found
            .into_iter()
            .map(|(key, role)| KeyView {
                key,
                role: role.as_str(),
                kind: String::new(),
                pttl_ms: -2,
            })
            .collect(),
        orphans,
    })
}

fn render(r: &ScanReport) -> Vec<String> {
    let mut lines = Vec::new();
    if r.locks.is_empty() {
        lines.push(format!("no locks match {:?}", r.pattern));
    } else {
        let mut t = Table::new(&[
            "LOCK", "KIND", "STATE", "OWNER", "HOLDS", "TTL", "QUEUE", "DEAD", "FENCING",
        ]);
        for s in &r.locks {
            let owner = match s.owners.as_slice() {
                [] => "-".to_owned(),
                [one] => snapshot::short_field(&one.field),
                many => format!("{} owners", many.len()),
            };
            t.row(vec![
                s.name.clone(),
                s.kind.to_owned(),
                if s.locked { "held" } else { "free" }.into(),
                owner,
                if s.locked {
                    s.owners.iter().map(|o| o.holds).sum::<u64>().to_string()
                } else {
                    "-".into()
                },
                if !s.locked {
                    "-".into()
                } else if s.pttl_ms == -1 {
                    "no TTL".into()
                } else {
                    output::duration(s.pttl_ms)
                },
                s.queue_length.to_string(),
                s.dead_waiters.to_string(),
                s.fencing_token.map_or("-".into(), |t| t.to_string()),
            ]);
        }
        lines.extend(t.render(""));
    }
    if !r.orphans.is_empty() {
        lines.push(String::new());
        let mut t = Table::new(&["ORPHAN KEY", "LOCK", "PROBLEM"]);
        for o in &r.orphans {
            t.row(vec![
                o.orphan.key.clone(),
                o.name.clone(),
                o.orphan.detail.clone(),
            ]);
        }
        lines.extend(t.render(""));
    }
    lines.push(String::new());
    let s = &r.summary;
    lines.push(format!(
        "{} ({} held, {} waiting, {} look dead), {}; {} over {}, {} returned{}",
        output::count(s.locks, "lock"),
        s.held,
        s.waiters,
        s.dead_waiters,
        output::count(s.orphans, "orphan"),
        output::count(r.scan_calls as usize, "SCAN call"),
        output::count(r.nodes.len(), "master"),
        output::count(r.keys_returned as usize, "key"),
        if r.truncated {
            " (stopped at --limit)"
        } else {
            ""
        }
    ));
    lines
}
