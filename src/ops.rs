//! Script invocations and reply decoding: the only place that knows the argument order of each Lua
//! script. Lock handles, guards and the background driver all go through these functions.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use redis::{Cmd, Pipeline, RedisError, Value};

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::scripts;

/// Which Redisson layout a lock uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// `RFairLock`: owner hash plus waiter queue and deadline zset.
    Fair,
    /// `RLock`: owner hash only; waiters listen on the shared release channel.
    NonFair,
}

/// What a handle needs to talk about one lock: its kind and every derived name.
#[derive(Debug)]
pub(crate) struct LockSpec {
    pub(crate) kind: Kind,
    pub(crate) keys: LockKeys,
}

impl LockSpec {
    pub(crate) fn new(kind: Kind, name: &str) -> Arc<Self> {
        Arc::new(LockSpec {
            kind,
            keys: LockKeys::new(name),
        })
    }

    pub(crate) fn name(&self) -> &str {
        self.keys.name()
    }

    /// The channel a waiter of this lock listens on: its own per-waiter channel for a fair lock,
    /// the shared release channel for a non-fair one.
    pub(crate) fn wake_channel(&self, field: &str) -> String {
        match self.kind {
            Kind::Fair => self.keys.waiter_channel(field),
            Kind::NonFair => self.keys.channel().to_owned(),
        }
    }
}

/// How an acquire attempt may use the fair queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Never join the queue (zero wait).
    Try,
    /// First attempt: join the tail when the lock cannot be taken.
    Queue,
    /// Later attempt of a waiter still waiting: rejoin at the head if it was purged while alive.
    Requeue,
}

impl Mode {
    fn as_arg(self) -> &'static str {
        match self {
            Mode::Try => "try",
            Mode::Queue => "queue",
            Mode::Requeue => "requeue",
        }
    }
}

/// Result of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Taken (or re-entered); the fencing token when fencing was asked for.
    Acquired { token: Option<u64> },
    /// Not taken. `hint_ms`: how long nothing will change unannounced (-1: until told).
    Waiting { hint_ms: i64 },
}

/// Result of releasing one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unlocked {
    /// Last hold released; the lock is free and the next waiter was told.
    Released,
    /// One hold fewer; the holder still has the lock.
    StillHeld,
    /// The lock had already expired (a fair lock treats this as released, as Redisson does).
    Expired,
    /// Somebody else holds it (or nobody, for a non-fair lock).
    NotOwner,
}

/// Parameters of one acquire attempt.
#[derive(Debug, Clone)]
pub(crate) struct AcquireArgs {
    pub(crate) spec: Arc<LockSpec>,
    pub(crate) field: Arc<str>,
    pub(crate) lease_ms: i64,
    pub(crate) liveness_ms: i64,
    pub(crate) mode: Mode,
    pub(crate) fenced: bool,
}

fn unexpected(what: &str, value: &Value) -> Error {
    Error::UnexpectedReply(format!("{what}: {value:?}"))
}

/// Runs one acquire attempt.
pub(crate) async fn acquire(conn: &mut Conn, args: &AcquireArgs) -> Result<Attempt> {
    let keys = &args.spec.keys;
    let publish = conn.publish_command();
    let reply: Vec<i64> = match args.spec.kind {
        Kind::Fair => {
            scripts::FAIR_ACQUIRE
                .key(keys.name())
                .key(keys.queue())
                .key(keys.deadlines())
                .key(keys.token())
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(args.liveness_ms)
                .arg(args.mode.as_arg())
                .arg(if args.fenced { "1" } else { "0" })
                .arg(publish)
                .arg(keys.channel())
                .invoke_async(conn)
                .await?
        }
        Kind::NonFair => {
            scripts::LOCK_ACQUIRE
                .key(keys.name())
                .key(keys.token())
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(if args.fenced { "1" } else { "0" })
                .invoke_async(conn)
                .await?
        }
    };
    match reply.as_slice() {
        [1, token] => Ok(Attempt::Acquired {
            token: args.fenced.then_some(*token as u64),
        }),
        [0, hint] => Ok(Attempt::Waiting { hint_ms: *hint }),
        _ => Err(Error::UnexpectedReply(format!("acquire: {reply:?}"))),
    }
}

/// What `field` holds on the lock right now: `(hold count, fencing counter)`. When that is more
/// than the `ours` holds the caller counts, the caller takes the extra grant up, and the lock's
/// TTL is set to `lease_ms` again.
pub(crate) async fn probe(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    ours: u64,
    lease_ms: i64,
) -> Result<(u64, u64)> {
    let keys = &spec.keys;
    let reply: Vec<i64> = scripts::HOLD_PROBE
        .key(keys.name())
        .key(keys.token())
        .arg(field)
        .arg(ours)
        .arg(lease_ms)
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [count, token] => Ok((*count.max(&0) as u64, *token.max(&0) as u64)),
        _ => Err(Error::UnexpectedReply(format!("probe: {reply:?}"))),
    }
}

/// Releases one hold of `field`. `request` (32 lowercase hex) names this release: sending the same
/// request again (a retry after a timeout) returns the first outcome instead of releasing twice.
/// `retry` is set on every send of a request after the first: only then is the latch looked up
/// (always, on a connection that may resend by itself: [`Conn::may_resend`]).
pub(crate) async fn unlock(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    lease_ms: i64,
    request: &str,
    latch_ms: i64,
    retry: bool,
) -> Result<Unlocked> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let latch = format!("{}:{}", keys.latch_prefix(), request);
    let look_up_latch = if retry || conn.may_resend() { "1" } else { "0" };
    let code: i64 = match spec.kind {
        Kind::Fair => {
            scripts::FAIR_UNLOCK
                .key(keys.name())
                .key(keys.queue())
                .key(keys.deadlines())
                .key(&latch)
                .arg(lease_ms)
                .arg(field)
                .arg(publish)
                .arg(keys.channel())
                .arg(latch_ms)
                .arg(look_up_latch)
                .invoke_async(conn)
                .await?
        }
        Kind::NonFair => {
            scripts::LOCK_UNLOCK
                .key(keys.name())
                .key(&latch)
                .arg(lease_ms)
                .arg(field)
                .arg(publish)
                .arg(keys.channel())
                .arg(latch_ms)
                .arg(look_up_latch)
                .invoke_async(conn)
                .await?
        }
    };
    match code {
        1 => Ok(Unlocked::Released),
        0 => Ok(Unlocked::StillHeld),
        2 => Ok(Unlocked::Expired),
        -1 => Ok(Unlocked::NotOwner),
        other => Err(unexpected("unlock", &Value::Int(other))),
    }
}

/// Pause before retry `n` (1-based) after a transient failure: 25 ms doubling up to 1 s.
pub(crate) fn retry_backoff(n: u32) -> std::time::Duration {
    std::time::Duration::from_millis(25u64 << n.saturating_sub(1).min(6))
        .min(std::time::Duration::from_secs(1))
}

/// How many command timeouts a release keeps retrying transient failures for.
const RELEASE_ATTEMPTS: usize = 3;

/// Releases one hold, retrying transient failures ([`Error::is_transient`]: a timeout, a dropped
/// connection, a failover in progress) with a short backoff under the same request id, so the
/// latch turns a retry of a release that did reach Redis into a no-op. Retries stop once
/// `RELEASE_ATTEMPTS` command timeouts have passed (enough for a Sentinel or Cluster failover to
/// complete); the latch outlives every retry.
pub(crate) async fn release(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    lease_ms: i64,
    command_timeout: std::time::Duration,
) -> Result<Unlocked> {
    let request = uuid::Uuid::new_v4().simple().to_string();
    let window = command_timeout * RELEASE_ATTEMPTS as u32;
    // Outlives the last send: the last attempt starts before `window` ends, and a cluster
    // connection may send it again `CLUSTER_RETRIES` times, each bounded by the command timeout.
    let resends = if conn.may_resend() {
        crate::conn::CLUSTER_RETRIES
    } else {
        0
    };
    let latch_ms = ((window + command_timeout * (2 + resends)).as_millis() as i64).max(1000);
    let started = std::time::Instant::now();
    let mut attempt: u32 = 1;
    loop {
        match unlock(conn, spec, field, lease_ms, &request, latch_ms, attempt > 1).await {
            Err(e) if e.is_transient() && started.elapsed() < window => {
                tracing::debug!(lock = spec.name(), field, error = ?e, attempt, "retrying release");
                let pause = retry_backoff(attempt).min(window.saturating_sub(started.elapsed()));
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Removes a fair waiter from the queue and wakes the next head of a free lock. Returns whether
/// the waiter was still queued.
pub(crate) async fn give_up(conn: &mut Conn, spec: &LockSpec, field: &str) -> Result<bool> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let removed: i64 = scripts::FAIR_GIVE_UP
        .key(keys.name())
        .key(keys.queue())
        .key(keys.deadlines())
        .arg(field)
        .arg(publish)
        .arg(keys.channel())
        .invoke_async(conn)
        .await?;
    Ok(removed == 1)
}

/// Deletes the lock whoever holds it; wakes the next waiter. Returns whether a lock was deleted.
pub(crate) async fn force_unlock(conn: &mut Conn, spec: &LockSpec) -> Result<bool> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let deleted: i64 = match spec.kind {
        Kind::Fair => {
            scripts::FAIR_FORCE_UNLOCK
                .key(keys.name())
                .key(keys.queue())
                .key(keys.deadlines())
                .arg(publish)
                .arg(keys.channel())
                .invoke_async(conn)
                .await?
        }
        Kind::NonFair => {
            scripts::LOCK_FORCE_UNLOCK
                .key(keys.name())
                .arg(publish)
                .arg(keys.channel())
                .invoke_async(conn)
                .await?
        }
    };
    Ok(deleted == 1)
}

/// Raw inspection snapshot (see `state.lua`).
pub(crate) struct RawState {
    pub(crate) now_ms: i64,
    pub(crate) pttl_ms: i64,
    pub(crate) owners: Vec<(String, i64)>,
    pub(crate) waiters: Vec<(String, i64)>,
}

pub(crate) async fn state(conn: &mut Conn, spec: &LockSpec) -> Result<RawState> {
    let keys = &spec.keys;
    type Pairs = Vec<(String, i64)>;
    let (now_ms, pttl_ms, owners, waiters): (i64, i64, Pairs, Pairs) = scripts::STATE
        .key(keys.name())
        .key(keys.queue())
        .key(keys.deadlines())
        .invoke_async(conn)
        .await?;
    Ok(RawState {
        now_ms,
        pttl_ms,
        owners,
        waiters,
    })
}

/// An `EVALSHA` of `script` with `keys` keys; the caller adds the keys, then the arguments.
fn evalsha(script: &redis::Script, keys: usize) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

/// One renewal entry: lock name and our field.
pub(crate) type RenewItem<'a> = (&'a str, &'a str);

/// Renews a group of held locks in chunks of `batch`, pipelined. One result per entry, in order:
/// `Ok(true)` renewed, `Ok(false)` our field is gone, `Err` the renewal of its pipeline failed
/// (on a cluster, one failing shard fails only its own locks' renewals).
pub(crate) async fn renew(
    conn: &mut Conn,
    items: &[RenewItem<'_>],
    ttl_ms: i64,
    batch: usize,
) -> Vec<Result<bool, RedisError>> {
    let batch = batch.max(1);
    let mut out: Vec<Result<bool, RedisError>> = vec![Ok(false); items.len()];
    let groups = slot_groups(conn, items.iter().map(|(name, _)| *name));
    let mut settle = |group: &[usize], reply: Result<Vec<bool>, RedisError>| match reply {
        Ok(renewed) => {
            for (&i, ok) in group.iter().zip(renewed) {
                out[i] = Ok(ok);
            }
        }
        Err(e) => {
            for &i in group {
                out[i] = Err(e.clone());
            }
        }
    };
    if conn.is_cluster() {
        // One pipeline per slot (a script call's keys must share a slot), all in flight at once.
        let replies = join_all(groups.iter().map(|group| {
            let mut conn = conn.clone();
            async move { renew_group(&mut conn, items, group, ttl_ms, batch).await }
        }))
        .await;
        for (group, reply) in groups.iter().zip(replies) {
            settle(group, reply);
        }
    } else {
        // One pipeline of up to `CALLS_PER_PIPELINE` calls at a time: the client's memory for a
        // renewal stays bounded however many locks are held (10,000 locks: 10 round trips). One
        // server: after a failure the rest would only wait out timeouts too, so they fail with it.
        let mut failed: Option<RedisError> = None;
        for group in groups
            .iter()
            .flat_map(|g| g.chunks(batch * CALLS_PER_PIPELINE))
        {
            let reply = match &failed {
                Some(e) => Err(e.clone()),
                None => renew_group(conn, items, group, ttl_ms, batch).await,
            };
            if let Err(e) = &reply {
                failed.get_or_insert_with(|| e.clone());
            }
            settle(group, reply);
        }
    }
    out
}

/// Renews `items[i]` for every `i` in `group` (one slot, when clustered) in one pipeline.
async fn renew_group(
    conn: &mut Conn,
    items: &[RenewItem<'_>],
    group: &[usize],
    ttl_ms: i64,
    batch: usize,
) -> Result<Vec<bool>, RedisError> {
    let mut pipe = Pipeline::with_capacity(group.len().div_ceil(batch));
    for chunk in group.chunks(batch) {
        let mut cmd = evalsha(&scripts::RENEW, chunk.len());
        for &i in chunk {
            cmd.arg(items[i].0);
        }
        cmd.arg(ttl_ms);
        for &i in chunk {
            cmd.arg(items[i].1);
        }
        pipe.add_command(cmd);
    }
    // A NOSCRIPT (flush, restart, failover) is answered by the connection: see `Conn`.
    let replies: Vec<Vec<i64>> = pipe.query_async(conn).await?;
    Ok(replies.into_iter().flatten().map(|r| r == 1).collect())
}

/// Indices of `names` grouped by cluster slot (one group holding everything outside a cluster),
/// each group in input order.
fn slot_groups<'a>(conn: &Conn, names: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
    if !conn.is_cluster() {
        return vec![names.enumerate().map(|(i, _)| i).collect()];
    }
    let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
    for (i, name) in names.enumerate() {
        by_slot.entry(crate::keys::slot(name)).or_default().push(i);
    }
    by_slot.into_values().collect()
}

/// Script calls per pipeline in a renewal batch (see [`renew`]).
const CALLS_PER_PIPELINE: usize = 10;

/// What a heartbeat learned about one waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Beat {
    /// Still queued, nothing to do.
    Queued,
    /// Head of a free lock: wake it.
    HeadOfFreeLock,
    /// Not queued any more: wake it so its next attempt requeues.
    Dropped,
    /// Second in line: wake it so it learns the head's deadline.
    Second,
}

/// Refreshes the deadlines of a group of fair waiters, in chunks of `batch`, pipelined.
pub(crate) async fn heartbeat(
    conn: &mut Conn,
    items: &[(&LockSpec, &str)],
    liveness_ms: i64,
    batch: usize,
) -> Result<Vec<Beat>, RedisError> {
    let publish = conn.publish_command();
    let batch = batch.max(1);
    let groups = slot_groups(conn, items.iter().map(|(spec, _)| spec.name()));
    let replies = join_all(groups.iter().map(|group| {
        let mut conn = conn.clone();
        let mut pipe = Pipeline::with_capacity(group.len().div_ceil(batch));
        for chunk in group.chunks(batch) {
            let mut cmd = evalsha(&scripts::FAIR_HEARTBEAT, 3 * chunk.len());
            for &i in chunk {
                let k = &items[i].0.keys;
                cmd.arg(k.name()).arg(k.queue()).arg(k.deadlines());
            }
            cmd.arg(liveness_ms).arg(publish);
            for &i in chunk {
                cmd.arg(items[i].1).arg(items[i].0.keys.channel());
            }
            pipe.add_command(cmd);
        }
        async move { pipe.query_async::<Vec<Vec<i64>>>(&mut conn).await }
    }))
    .await;
    let mut codes = vec![0i64; items.len()];
    for (group, reply) in groups.iter().zip(replies) {
        for (&i, code) in group.iter().zip(reply?.into_iter().flatten()) {
            codes[i] = code;
        }
    }
    let replies = vec![codes];
    Ok(replies
        .into_iter()
        .flatten()
        .map(|code| match code {
            1 => Beat::HeadOfFreeLock,
            2 => Beat::Dropped,
            3 => Beat::Second,
            _ => Beat::Queued,
        })
        .collect())
}

/// Connected replicas of the master of `slot` (`INFO replication`).
pub(crate) async fn connected_replicas(conn: &mut Conn, slot: u16) -> Result<u64> {
    let info = conn
        .on_master_of(slot, redis::cmd("INFO").arg("replication"))
        .await?
        .extract_error()?;
    let info: String = redis::FromRedisValue::from_redis_value(info)
        .map_err(|e| Error::UnexpectedReply(format!("INFO replication: {e}")))?;
    Ok(info
        .lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

/// `WAIT replicas timeout` on the master of `slot`: how many replicas acknowledged every write
/// made so far on our connection to it.
pub(crate) async fn wait_replicas(
    conn: &mut Conn,
    slot: u16,
    replicas: u64,
    timeout_ms: i64,
) -> Result<u64> {
    let acked = conn
        .on_master_of(slot, redis::cmd("WAIT").arg(replicas).arg(timeout_ms))
        .await?;
    // A server error (e.g. NOPERM) stays a Redis error, with its kind.
    let acked = acked.extract_error()?;
    redis::FromRedisValue::from_redis_value(acked)
        .map_err(|e| Error::UnexpectedReply(format!("WAIT: {e}")))
}

/// Polls every future until all are done, in the calling task: no spawn (so the caller's task
/// stays the default holder, and dropping the join drops every future at once) and no extra crate.
pub(crate) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut all = true;
        for (future, out) in running.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *out = Some(value),
                    Poll::Pending => all = false,
                }
            }
        }
        if all {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter()
        .map(|out| out.expect("every future completed"))
        .collect()
}
