//! Reading one lock: the library's atomic `state()` (owners, TTL, queue with deadlines and
//! liveness marks, server time) plus the raw facts around it (which keys exist, their types
//! and TTLs, the fencing counter, unlock latches), then judging each waiter and finding orphans.
//! The structs here are also the `--json` schema (README.md); renaming a field breaks users.

use std::collections::HashSet;
use std::time::Duration;

use fairlock::keys::{self, DerivedKey, LockKeys};
use fairlock::DeadReason;
use serde::Serialize;

use crate::connect::{Node, Raw, Session};
use crate::error::Failure;
use crate::glob;
use crate::output::{self, Table};

/// A lock as the tool sees it at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub name: String,
    /// `fair`, `plain`, `rw` (a read-write lock), `absent` or `other` (see [`Snapshot::kind`]).
    pub kind: &'static str,
    /// A read-write lock's mode: `read`, `write`, or `None` (free, or not a read-write lock).
    pub mode: Option<&'static str>,
    /// A read-write lock's read holders (its writer is among `owners`, with them).
    pub readers: Vec<ReaderView>,
    pub locked: bool,
    pub server_time_ms: i64,
    pub server_time: String,
    pub owners: Vec<OwnerView>,
    /// PTTL of the owner hash: -1 no expiry; in JSON `null` when there is no such key (Redis's
    /// -2).
    #[serde(serialize_with = "crate::output::pttl_json")]
    pub pttl_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub expires_at: Option<String>,
    pub fencing_token: Option<i64>,
    pub queue_length: usize,
    pub dead_waiters: usize,
    pub queue: Vec<WaiterView>,
    pub keys: Vec<KeyView>,
    pub orphans: Vec<Orphan>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerView {
    pub field: String,
    pub client_id: String,
    pub holder_id: Option<i64>,
    pub holds: u64,
}

/// A read holder of a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReaderView {
    pub field: String,
    pub client_id: String,
    pub holder_id: Option<i64>,
    pub holds: u64,
    /// The remaining TTL of each hold's lease key (1 first); `None` for one that is gone.
    pub lease_ttls_ms: Vec<Option<i64>>,
    /// Whether any lease key is alive (a Redisson reader leaving counts the others by them).
    pub alive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaiterView {
    pub position: usize,
    pub field: String,
    pub client_id: String,
    pub holder_id: Option<i64>,
    /// It has a liveness mark, or its client id is that of a waiter with one.
    pub fairlock: bool,
    pub deadline_ms: Option<i64>,
    pub deadline: Option<String>,
    pub deadline_in_ms: Option<i64>,
    pub liveness_until_ms: Option<i64>,
    pub liveness_in_ms: Option<i64>,
    pub alive: bool,
    /// Why it looks dead: `liveness_lapsed`, `liveness_missing`, `no_deadline`,
    /// `deadline_passed`; `None` while it looks alive.
    pub dead_reason: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyView {
    pub key: String,
    pub role: &'static str,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(serialize_with = "crate::output::pttl_json")]
    pub pttl_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub key: String,
    /// A stable code: `lock_without_ttl`, `not_a_lock`, `wrong_type`, `queue_orphaned`,
    /// `deadlines_orphaned`, `liveness_without_ttl`, `latch_without_ttl`, `bad_fencing_counter`.
    pub problem: &'static str,
    pub detail: String,
}

/// Where the latches of a lock come from.
pub enum Latches {
    /// Do not look.
    Skip,
    /// Look for them (inspect).
    Search,
    /// Already found, with their PTTLs (scan).
    Known(Vec<(String, i64)>),
}

/// What kind of lock key a key is: the owner hash, or one of the keys the library derives from
/// the lock's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Lock,
    Derived(DerivedKey),
}

impl Role {
    /// The role's name in the output (`--json` `keys[].role`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Lock => "lock",
            Role::Derived(key) => key.label(),
        }
    }
}

/// The lock name and role of a derived key, by the library's [`keys::parse_derived`], or `None`
/// for any other key.
pub fn parse_derived(key: &str) -> Option<(String, Role)> {
    let (name, kind) = keys::parse_derived(key)?;
    Some((name.to_owned(), Role::Derived(kind)))
}

/// The reason codes ([`DeadReason::code`]; the CLI's scripts return the same) in words.
pub fn reason_text(code: &str) -> &'static str {
    match code {
        "liveness_lapsed" => "liveness mark lapsed",
        "liveness_missing" => "fairlock client without a liveness mark",
        "no_deadline" => "no deadline",
        "deadline_passed" => "deadline passed",
        _ => "looks dead",
    }
}

/// The type each role's key must have.
fn expected_type(role: Role) -> &'static str {
    match role {
        Role::Lock => "hash",
        Role::Derived(key) => key.value_type(),
    }
}

/// Reads one lock. The name must be valid for the deployment (checked by the caller).
pub async fn read(
    session: &mut Session,
    name: &str,
    latches: Latches,
) -> Result<Snapshot, Failure> {
    let keys = LockKeys::new(name);
    let roles = [
        (Role::Lock, keys.name().to_owned()),
        (Role::Derived(DerivedKey::Queue), keys.queue().to_owned()),
        (
            Role::Derived(DerivedKey::Deadlines),
            keys.deadlines().to_owned(),
        ),
        (
            Role::Derived(DerivedKey::Liveness),
            keys.liveness().to_owned(),
        ),
        (Role::Derived(DerivedKey::Grants), keys.grants().to_owned()),
        (Role::Derived(DerivedKey::Token), keys.token().to_owned()),
    ];
    let [rw_queue, rw_writers, rw_liveness, rw_seq] = keys.rw_queue_keys();
    let roles: Vec<(Role, String)> = roles
        .into_iter()
        .chain([
            (Role::Derived(DerivedKey::RwQueue), rw_queue),
            (Role::Derived(DerivedKey::RwWriters), rw_writers),
            (Role::Derived(DerivedKey::RwLiveness), rw_liveness),
            (Role::Derived(DerivedKey::RwSeq), rw_seq),
        ])
        .collect();
    let mut pipe = redis::pipe();
    for (_, key) in &roles {
        pipe.cmd("TYPE").arg(key).cmd("PTTL").arg(key);
    }
    let facts: Vec<redis::Value> = session
        .raw
        .pipe(&pipe)
        .await
        .map_err(|e| Failure::redis(&format!("cannot read lock {name:?}"), e))?;
    let mut present: Vec<(Role, String, String, i64)> = Vec::new();
    for (i, (role, key)) in roles.iter().enumerate() {
        let kind = value_text(facts.get(2 * i));
        let pttl = value_int(facts.get(2 * i + 1)).unwrap_or(-2);
        if kind != "none" {
            present.push((*role, key.clone(), kind, pttl));
        }
    }
    let type_of = |role: Role| {
        present
            .iter()
            .find(|(r, ..)| *r == role)
            .map(|(_, _, t, _)| t.as_str())
    };
    let usable = |role: Role| type_of(role).is_none_or(|t| t == expected_type(role));

    let mut orphans = Vec::new();
    let mut fencing_token = None;
    if type_of(Role::Derived(DerivedKey::Token)) == Some("string") {
        let raw: Option<String> = session
            .raw
            .query(redis::cmd("GET").arg(keys.token()))
            .await
            .map_err(|e| Failure::redis("cannot read the fencing counter", e))?;
        match raw.as_deref().map(str::parse::<i64>) {
            Some(Ok(token)) => fencing_token = Some(token),
            Some(Err(_)) => orphans.push(Orphan {
                key: keys.token().to_owned(),
                problem: "bad_fencing_counter",
                detail: "fencing counter is not an integer".into(),
            }),
            None => {}
        }
    }
    // Client ids known to be fairlock's: every member of the liveness set.
    let mut fairlock_clients = HashSet::new();
    if type_of(Role::Derived(DerivedKey::Liveness)) == Some("zset") {
        let members: Vec<String> = session
            .raw
            .query(redis::cmd("ZRANGE").arg(keys.liveness()).arg(0).arg(9_999))
            .await
            .map_err(|e| Failure::redis("cannot read the liveness set", e))?;
        for m in members {
            fairlock_clients.insert(keys::split_field(&m).0.to_owned());
        }
    }

    // A read-write lock: its hash has a `mode` field, or its writer-preferring keys exist.
    let mode: Option<String> = if type_of(Role::Lock) == Some("hash") {
        session
            .raw
            .query(redis::cmd("HGET").arg(keys.name()).arg("mode"))
            .await
            .map_err(|e| Failure::redis("cannot read the lock's mode", e))?
    } else {
        None
    };
    let rw_roles = [
        Role::Derived(DerivedKey::RwQueue),
        Role::Derived(DerivedKey::RwWriters),
        Role::Derived(DerivedKey::RwLiveness),
        Role::Derived(DerivedKey::RwSeq),
    ];
    let rw = mode.is_some() || rw_roles.into_iter().any(|r| type_of(r).is_some());
    if rw {
        return read_rw(session, name, &keys, present, mode, orphans, fencing_token).await;
    }

    let all_usable = [
        Role::Lock,
        Role::Derived(DerivedKey::Queue),
        Role::Derived(DerivedKey::Deadlines),
        Role::Derived(DerivedKey::Liveness),
    ]
    .into_iter()
    .all(usable);
    let state = if all_usable {
        Some(session.lib.fair_lock(name).state().await?)
    } else {
        None
    };
    let now = match &state {
        Some(s) => epoch_ms(s.server_time),
        None => server_time(&mut session.raw).await?,
    };

    let owners: Vec<OwnerView> = state
        .iter()
        .flat_map(|s| &s.owners)
        .map(|o| {
            let (client, holder) = keys::split_field(&o.field);
            OwnerView {
                field: o.field.clone(),
                client_id: client.to_owned(),
                holder_id: holder,
                holds: u64::from(o.holds),
            }
        })
        .collect();
    let locked = !owners.is_empty();
    let pttl_ms = match state.as_ref().and_then(|s| s.ttl) {
        Some(ttl) => ttl.as_millis().min(i64::MAX as u128) as i64,
        None if locked => -1,
        None => -2,
    };
    for w in state.iter().flat_map(|s| &s.queue) {
        if w.is_fairlock() {
            fairlock_clients.insert(keys::split_field(&w.field).0.to_owned());
        }
    }
    let queue: Vec<WaiterView> = state
        .iter()
        .flat_map(|s| &s.queue)
        .enumerate()
        .map(|(i, w)| {
            let (client, holder) = keys::split_field(&w.field);
            // The library's rule, with what the tool knows beyond the snapshot: which clients
            // are fairlock's (the same rule as `dead_reason` in lua/admin_prologue.lua).
            let reason = w
                .dead_reason(at_epoch_ms(now), fairlock_clients.contains(client))
                .map(DeadReason::code);
            WaiterView {
                position: i + 1,
                field: w.field.clone(),
                client_id: client.to_owned(),
                holder_id: holder,
                fairlock: w.is_fairlock() || fairlock_clients.contains(client),
                deadline_ms: w.deadline.map(epoch_ms),
                deadline: w.deadline.map(epoch_ms).map(output::timestamp),
                deadline_in_ms: w.deadline.map(|d| epoch_ms(d) - now),
                liveness_until_ms: w.alive_until.map(epoch_ms),
                liveness_in_ms: w.alive_until.map(|m| epoch_ms(m) - now),
                alive: reason.is_none(),
                dead_reason: reason,
            }
        })
        .collect();
    let live_waiter = queue.iter().any(|w| w.alive);

    let mut key_views: Vec<KeyView> = present
        .iter()
        .map(|(role, key, kind, pttl)| KeyView {
            key: key.clone(),
            role: role.as_str(),
            kind: kind.clone(),
            pttl_ms: *pttl,
        })
        .collect();
    for (role, key, kind, pttl) in &present {
        let expected = expected_type(*role);
        if kind != expected {
            orphans.push(if *role == Role::Lock {
                Orphan {
                    key: key.clone(),
                    problem: "not_a_lock",
                    detail: format!("holds a {kind}, not a lock hash"),
                }
            } else {
                Orphan {
                    key: key.clone(),
                    problem: "wrong_type",
                    detail: format!(
                        "{} key holds a {kind}, expected a {expected}",
                        role.as_str()
                    ),
                }
            });
            continue;
        }
        match role {
            Role::Lock if *pttl == -1 => orphans.push(Orphan {
                key: key.clone(),
                problem: "lock_without_ttl",
                detail: "lock hash without TTL: it never expires".into(),
            }),
            Role::Derived(DerivedKey::Queue) if !locked && !live_waiter => orphans.push(Orphan {
                key: key.clone(),
                problem: "queue_orphaned",
                detail: "queue without a live owner or waiter".into(),
            }),
            Role::Derived(DerivedKey::Deadlines) if !locked && !live_waiter => {
                orphans.push(Orphan {
                    key: key.clone(),
                    problem: "deadlines_orphaned",
                    detail: "deadline set without a live owner or waiter".into(),
                })
            }
            Role::Derived(DerivedKey::Liveness) if *pttl == -1 => orphans.push(Orphan {
                key: key.clone(),
                problem: "liveness_without_ttl",
                detail: "liveness set without TTL".into(),
            }),
            Role::Derived(DerivedKey::Grants) if *pttl == -1 => orphans.push(Orphan {
                key: key.clone(),
                problem: "grants_without_ttl",
                detail: "grant requests without TTL".into(),
            }),
            _ => {}
        }
    }

    let latches = match latches {
        Latches::Skip => Vec::new(),
        Latches::Known(found) => found,
        Latches::Search => find_latches(session, name).await?,
    };
    for (key, pttl) in latches {
        if pttl == -1 {
            orphans.push(Orphan {
                key: key.clone(),
                problem: "latch_without_ttl",
                detail: "Redisson unlock latch without TTL".into(),
            });
        }
        key_views.push(KeyView {
            key,
            role: Role::Derived(DerivedKey::Latch).as_str(),
            kind: "string".into(),
            pttl_ms: pttl,
        });
    }

    let name_type = type_of(Role::Lock);
    let fair = [
        Role::Derived(DerivedKey::Queue),
        Role::Derived(DerivedKey::Deadlines),
        Role::Derived(DerivedKey::Liveness),
        Role::Derived(DerivedKey::Grants),
    ]
    .into_iter()
    .any(|r| type_of(r).is_some());
    let kind = match name_type {
        Some(t) if t != "hash" => "other",
        _ if fair => "fair",
        Some(_) => "plain",
        None => "absent",
    };
    let expires_at_ms = (locked && pttl_ms >= 0).then_some(now + pttl_ms);
    Ok(Snapshot {
        name: name.to_owned(),
        kind,
        mode: None,
        readers: Vec::new(),
        locked,
        server_time_ms: now,
        server_time: output::timestamp(now),
        owners,
        pttl_ms,
        expires_at_ms,
        expires_at: expires_at_ms.map(output::timestamp),
        fencing_token,
        queue_length: queue.len(),
        dead_waiters: queue.iter().filter(|w| !w.alive).count(),
        queue,
        keys: key_views,
        orphans,
    })
}

/// Reads a read-write lock (the library's `ReadWriteLock::state()`, Java holders included): the
/// writer and readers as owners, each reader's lease keys, the writer-preferring queue.
async fn read_rw(
    session: &mut Session,
    name: &str,
    keys: &LockKeys,
    present: Vec<(Role, String, String, i64)>,
    mode: Option<String>,
    mut orphans: Vec<Orphan>,
    fencing_token: Option<i64>,
) -> Result<Snapshot, Failure> {
    for (role, key, kind, _) in &present {
        let expected = expected_type(*role);
        if kind != expected {
            orphans.push(Orphan {
                key: key.clone(),
                problem: if *role == Role::Lock {
                    "not_a_lock"
                } else {
                    "wrong_type"
                },
                detail: format!(
                    "{} key holds a {kind}, expected a {expected}",
                    role.as_str()
                ),
            });
        }
    }
    if !orphans
        .iter()
        .any(|o| o.problem == "not_a_lock" || o.problem == "wrong_type")
    {
        let state = session.lib.read_write_lock(name).state().await?;
        let now = epoch_ms(state.server_time);
        let owner = |field: &str, holds: u32| {
            let (client, holder) = keys::split_field(field);
            OwnerView {
                field: field.to_owned(),
                client_id: client.to_owned(),
                holder_id: holder,
                holds: u64::from(holds),
            }
        };
        let mut owners: Vec<OwnerView> = state
            .writer
            .iter()
            .map(|w| owner(&w.field, w.holds))
            .collect();
        owners.extend(
            state
                .readers
                .iter()
                .map(|r| owner(&r.owner.field, r.owner.holds)),
        );
        let ms = |d: std::time::Duration| d.as_millis().min(i64::MAX as u128) as i64;
        let readers: Vec<ReaderView> = state
            .readers
            .iter()
            .map(|r| {
                let (client, holder) = keys::split_field(&r.owner.field);
                ReaderView {
                    field: r.owner.field.clone(),
                    client_id: client.to_owned(),
                    holder_id: holder,
                    holds: u64::from(r.owner.holds),
                    lease_ttls_ms: r.leases.iter().map(|l| l.map(ms)).collect(),
                    alive: r.alive(),
                }
            })
            .collect();
        let queue: Vec<WaiterView> = state
            .queue
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let (client, holder) = keys::split_field(&w.field);
                let mark = w.alive_until.map(epoch_ms);
                let reason = match mark {
                    None => Some("liveness_missing"),
                    Some(m) if m < now => Some("liveness_lapsed"),
                    Some(_) => None,
                };
                WaiterView {
                    position: i + 1,
                    field: w.field.clone(),
                    client_id: client.to_owned(),
                    holder_id: holder,
                    fairlock: true,
                    deadline_ms: None,
                    deadline: None,
                    deadline_in_ms: None,
                    liveness_until_ms: mark,
                    liveness_in_ms: mark.map(|m| m - now),
                    alive: reason.is_none(),
                    dead_reason: reason,
                }
            })
            .collect();
        let locked = state.is_locked();
        let pttl_ms = match state.ttl {
            Some(ttl) => ms(ttl),
            None if locked => -1,
            None => -2,
        };
        let mut key_views: Vec<KeyView> = present
            .iter()
            .map(|(role, key, kind, pttl)| KeyView {
                key: key.clone(),
                role: role.as_str(),
                kind: kind.clone(),
                pttl_ms: *pttl,
            })
            .collect();
        for r in &readers {
            for (k, ttl) in r.lease_ttls_ms.iter().enumerate() {
                if let Some(ttl) = ttl {
                    key_views.push(KeyView {
                        key: keys.lease_key(&r.field, k as u32 + 1),
                        role: Role::Derived(DerivedKey::ReadLease).as_str(),
                        kind: "string".into(),
                        pttl_ms: *ttl,
                    });
                }
            }
        }
        for (role, key, _, pttl) in &present {
            match role {
                Role::Lock if *pttl == -1 => orphans.push(Orphan {
                    key: key.clone(),
                    problem: "lock_without_ttl",
                    detail: "lock hash without TTL: it never expires".into(),
                }),
                Role::Derived(DerivedKey::RwQueue)
                | Role::Derived(DerivedKey::RwWriters)
                | Role::Derived(DerivedKey::RwLiveness)
                | Role::Derived(DerivedKey::RwSeq)
                    if *pttl == -1 =>
                {
                    orphans.push(Orphan {
                        key: key.clone(),
                        problem: "rw_queue_without_ttl",
                        detail: format!("{} key without TTL", role.as_str()),
                    })
                }
                _ => {}
            }
        }
        let expires_at_ms = (locked && pttl_ms >= 0).then_some(now + pttl_ms);
        return Ok(Snapshot {
            name: name.to_owned(),
            kind: "rw",
            mode: match mode.as_deref() {
                Some("read") => Some("read"),
                Some("write") => Some("write"),
                _ => None,
            },
            readers,
            locked,
            server_time_ms: now,
            server_time: output::timestamp(now),
            owners,
            pttl_ms,
            expires_at_ms,
            expires_at: expires_at_ms.map(output::timestamp),
            fencing_token,
            queue_length: queue.len(),
            dead_waiters: queue.iter().filter(|w| !w.alive).count(),
            queue,
            keys: key_views,
            orphans,
        });
    }
    let now = server_time(&mut session.raw).await?;
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
        fencing_token,
        queue_length: 0,
        dead_waiters: 0,
        queue: Vec::new(),
        keys: present
            .iter()
            .map(|(role, key, kind, pttl)| KeyView {
                key: key.clone(),
                role: role.as_str(),
                kind: kind.clone(),
                pttl_ms: *pttl,
            })
            .collect(),
        orphans,
    })
}

/// The server clock in epoch milliseconds.
pub async fn server_time(raw: &mut Raw) -> Result<i64, Failure> {
    let (secs, micros): (i64, i64) = raw
        .query(&redis::cmd("TIME"))
        .await
        .map_err(|e| Failure::redis("cannot read the server time", e))?;
    Ok(secs * 1_000 + micros / 1_000)
}

/// Redisson unlock latches of one lock, with their PTTLs. On a cluster they share the lock's
/// slot, so `CLUSTER GETKEYSINSLOT` (bounded) finds them; elsewhere a paced `SCAN MATCH`.
async fn find_latches(session: &mut Session, name: &str) -> Result<Vec<(String, i64)>, Failure> {
    let pattern = glob::latch_pattern(name);
    let fail = |e: redis::RedisError| Failure::redis("cannot look for unlock latches", e);
    let mut found: Vec<String> = Vec::new();
    if session.is_cluster() {
        let slot = keys::slot(name);
        let node = Node {
            addr: String::new(),
            slot,
        };
        let in_slot: Vec<String> = session
            .raw
            .on_node(
                &node,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(10_000),
            )
            .await
            .map_err(fail)?;
        found.extend(
            in_slot
                .into_iter()
                .filter(|k| glob::glob_match(&pattern, k)),
        );
    } else {
        let node = Node {
            addr: String::new(),
            slot: 0,
        };
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = session
                .raw
                .on_node(
                    &node,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1_000),
                )
                .await
                .map_err(fail)?;
            found.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    found.sort();
    found.dedup();
    latch_ttls(&mut session.raw, found).await
}

/// PTTLs of latch keys (one pipeline; on a cluster they share one slot).
pub async fn latch_ttls(raw: &mut Raw, found: Vec<String>) -> Result<Vec<(String, i64)>, Failure> {
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for key in &found {
        pipe.cmd("PTTL").arg(key);
    }
    let ttls: Vec<i64> = raw
        .pipe(&pipe)
        .await
        .map_err(|e| Failure::redis("cannot read unlock latches", e))?;
    Ok(found
        .into_iter()
        .zip(ttls)
        .filter(|(_, t)| *t != -2)
        .collect())
}

fn value_text(v: Option<&redis::Value>) -> String {
    match v {
        Some(redis::Value::SimpleString(s)) => s.clone(),
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(redis::Value::Okay) => "OK".into(),
        _ => "none".into(),
    }
}

fn value_int(v: Option<&redis::Value>) -> Option<i64> {
    match v {
        Some(redis::Value::Int(n)) => Some(*n),
        _ => None,
    }
}

/// A short form of an owner field for narrow columns: the first 8 characters of the client id.
pub fn short_field(field: &str) -> String {
    let (client, holder) = keys::split_field(field);
    let short: String = client.chars().take(8).collect();
    match holder {
        Some(h) if client.chars().count() > 8 => format!("{short}…:{h}"),
        _ => field.to_owned(),
    }
}

/// The human rendering of a snapshot (inspect, and the top of `watch` on a terminal).
pub fn render(s: &Snapshot, limit: usize) -> Vec<String> {
    let state = if s.locked {
        "held".to_owned()
    } else {
        "free".to_owned()
    };
    let mut items: Vec<(&str, String)> = vec![
        ("lock", s.name.clone()),
        (
            "kind",
            match s.kind {
                "plain" => {
                    "plain (an owner hash without a queue: RLock, or a fair lock nobody waits for)"
                        .into()
                }
                "other" => "not a lock (the key holds another type)".into(),
                "rw" => "rw (a read-write lock: RReadWriteLock)".into(),
                k => k.to_owned(),
            },
        ),
        ("state", state),
        ("server time", s.server_time.clone()),
    ];
    if s.kind == "rw" {
        items.push(("mode", s.mode.unwrap_or("-").to_owned()));
    }
    for o in &s.owners {
        if s.kind == "rw" {
            let reader = s.readers.iter().find(|r| r.field == o.field);
            items.push(match reader {
                Some(r) => (
                    "reader",
                    format!(
                        "client {}  holder {}  holds {}  leases {}{}",
                        o.client_id,
                        o.holder_id.map_or("?".into(), |h| h.to_string()),
                        o.holds,
                        r.lease_ttls_ms
                            .iter()
                            .map(|t| t.map_or("gone".into(), output::duration))
                            .collect::<Vec<_>>()
                            .join(", "),
                        if r.alive {
                            ""
                        } else {
                            "  (DEAD: every lease key expired)"
                        }
                    ),
                ),
                None => (
                    "writer",
                    format!(
                        "client {}  holder {}  holds {}",
                        o.client_id,
                        o.holder_id.map_or("?".into(), |h| h.to_string()),
                        o.holds
                    ),
                ),
            });
            continue;
        }
        items.push((
            "owner",
            format!(
                "client {}  holder {}  holds {}",
                o.client_id,
                o.holder_id.map_or("?".into(), |h| h.to_string()),
                o.holds
            ),
        ));
    }
    if s.locked {
        items.push((
            "ttl",
            match (s.pttl_ms, &s.expires_at) {
                (-1, _) => "none: the lock never expires".into(),
                (ms, Some(at)) => format!("{}  (expires {at})", output::duration(ms)),
                (ms, None) => output::duration(ms),
            },
        ));
    }
    items.push((
        "fencing",
        s.fencing_token
            .map_or("-".into(), |t| format!("{t} (last token handed out)")),
    ));
    if s.kind == "fair" || s.queue_length > 0 {
        // (A read-write lock's queue holds its writer-preferring waiters.)
        items.push((
            "queue",
            match (s.queue_length, s.dead_waiters) {
                (0, _) => "empty".into(),
                (n, 0) => format!("{n} waiting"),
                (n, d) => format!("{n} waiting, {d} look dead"),
            },
        ));
    }
    let mut lines = output::pairs(&items);
    if !s.queue.is_empty() {
        let mut t = Table::new(&[
            "#", "CLIENT", "HOLDER", "KIND", "DEADLINE", "IN", "MARK IN", "STATUS",
        ]);
        for w in s.queue.iter().take(limit) {
            t.row(vec![
                w.position.to_string(),
                w.client_id.clone(),
                w.holder_id.map_or("?".into(), |h| h.to_string()),
                if w.fairlock { "fairlock" } else { "other" }.into(),
                w.deadline.clone().unwrap_or_else(|| "-".into()),
                w.deadline_in_ms.map_or("-".into(), output::duration),
                w.liveness_in_ms.map_or("-".into(), output::duration),
                match w.dead_reason {
                    None => "alive".into(),
                    Some(code) => format!("DEAD: {}", reason_text(code)),
                },
            ]);
        }
        lines.push(String::new());
        lines.extend(t.render(""));
        if s.queue.len() > limit {
            lines.push(format!(
                "… {} more waiters (--limit, or --json for all)",
                s.queue.len() - limit
            ));
        }
    }
    lines.push(String::new());
    if s.orphans.is_empty() {
        lines.push("orphans  none".into());
    } else {
        let mut t = Table::new(&["ORPHAN KEY", "PROBLEM"]);
        for o in &s.orphans {
            t.row(vec![o.key.clone(), o.detail.clone()]);
        }
        lines.extend(t.render(""));
    }
    lines
}

/// A server time from the library as Unix epoch milliseconds (the unit of the tool's output).
fn epoch_ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Unix epoch milliseconds as the library's `SystemTime`.
fn at_epoch_ms(ms: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_fields() {
        assert_eq!(
            short_field("6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:57"),
            "6c1b4f5e…:57"
        );
        assert_eq!(short_field("abc:1"), "abc:1");
    }
}
