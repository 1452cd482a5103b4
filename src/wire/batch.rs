//! Batched script calls over many locks at once: watchdog renewals and waiter heartbeats. Calls
//! are grouped by cluster slot (a script's keys must share one), chunked to `batch` locks per
//! call and pipelined; every lock gets its own result.
//!
//! It must never let one lock's trouble decide another lock's result (only a dropped connection,
//! shared by a whole pipeline, fails every lock in it), or put keys of two slots in one call.

use redis::{Cmd, Pipeline};

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::keys::LockSpec;
use crate::scripts;
use crate::util::join_all;

/// An `EVALSHA` of `script` with `keys` keys; the caller adds the keys, then the arguments.
fn evalsha(script: &scripts::Lua, keys: usize) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.script.get_hash()).arg(keys);
    cmd
}

/// One renewal entry: lock name, our field, and the base of its lease keys for a read hold of a
/// read-write lock (`""` otherwise; see `renew.lua`).
pub(crate) type RenewItem<'a> = (&'a str, &'a str, &'a str);

/// What one lock's renewal found (`renew.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewOutcome {
    /// Renewed to the TTL asked for.
    Renewed,
    /// Our field was gone: the lock was lost.
    Gone,
    /// Renewed, but the lock's TTL was down to this when the renewal came: another client (a
    /// Redisson reader with a shorter watchdog timeout) keeps setting it shorter than we do, so
    /// the lock can only be trusted that long after a renewal (a read hold only).
    Shortened(std::time::Duration),
}

impl RenewOutcome {
    fn from_code(code: i64) -> Self {
        match code {
            0 => RenewOutcome::Gone,
            1 => RenewOutcome::Renewed,
            ms => RenewOutcome::Shortened(std::time::Duration::from_millis((ms - 2).max(0) as u64)),
        }
    }
}

/// Renews a group of held locks in chunks of `batch`, pipelined. One result per entry, in order
/// (`Err`: the renewal of its pipeline failed; on a cluster, one failing shard fails only its own
/// locks' renewals).
pub(crate) async fn renew(
    conn: &mut Conn,
    items: &[RenewItem<'_>],
    ttl_ms: i64,
    batch: usize,
) -> Vec<Result<RenewOutcome>> {
    let batch = batch.max(1);
    let mut out: Vec<Result<RenewOutcome>> = vec![Ok(RenewOutcome::Gone); items.len()];
    let groups = slot_groups(conn, items.iter().map(|(name, _, _)| *name));
    let calls: usize = groups.iter().map(|g| g.len().div_ceil(batch)).sum();
    crate::metrics::renewal_calls(calls as u64);
    let mut settle = |group: &[usize], reply: Result<Vec<RenewOutcome>>| match reply {
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
        // server: after a connection failure the rest would only wait out timeouts too, so they
        // fail with it; any other failure is its own pipeline's (a key of the wrong type fails
        // nothing: the script reports that lock alone as gone).
        let mut failed: Option<Error> = None;
        for group in groups
            .iter()
            .flat_map(|g| g.chunks(batch * CALLS_PER_PIPELINE))
        {
            let reply = match &failed {
                Some(e) => Err(e.clone()),
                None => renew_group(conn, items, group, ttl_ms, batch).await,
            };
            if let Err(e) = &reply {
                if e.is_transient() {
                    failed.get_or_insert_with(|| e.clone());
                }
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
) -> Result<Vec<RenewOutcome>> {
    let mut pipe = Pipeline::with_capacity(group.len().div_ceil(batch));
    for chunk in group.chunks(batch) {
        let mut cmd = evalsha(&scripts::RENEW, chunk.len());
        for &i in chunk {
            cmd.arg(items[i].0);
        }
        cmd.arg(ttl_ms);
        for &i in chunk {
            cmd.arg(items[i].1).arg(items[i].2);
        }
        pipe.add_command(cmd);
    }
    // A NOSCRIPT (flush, restart, failover) is answered by the connection: see `Conn`.
    let replies: Vec<Vec<i64>> = pipe.query_async(conn).await?;
    Ok(replies
        .into_iter()
        .flatten()
        .map(RenewOutcome::from_code)
        .collect())
}

/// One permit-expirable semaphore guard to renew: its expiries key (`{NAME}:timeout`) and its
/// permit ids (see `permit_renew.lua`).
pub(crate) type PermitItem<'a> = (&'a str, &'a [[u8; 16]]);

/// Renews permit guards, one script call each, pipelined per slot (all slots at once on a
/// cluster, [`CALLS_PER_PIPELINE`] × `batch` calls per pipeline on one server). One result per
/// guard, in order: `Ok(true)` renewed, `Ok(false)` a permit is gone, `Err` its pipeline failed.
pub(crate) async fn renew_permits(
    conn: &mut Conn,
    items: &[PermitItem<'_>],
    lease_ms: i64,
    batch: usize,
) -> Vec<Result<bool>> {
    let mut out: Vec<Result<bool>> = vec![Ok(false); items.len()];
    let groups = slot_groups(conn, items.iter().map(|(key, _)| *key));
    let per_pipeline = batch.max(1) * CALLS_PER_PIPELINE;
    let chunks: Vec<&[usize]> = groups.iter().flat_map(|g| g.chunks(per_pipeline)).collect();
    let replies = join_all(chunks.iter().map(|chunk| {
        let mut conn = conn.clone();
        async move {
            let mut pipe = Pipeline::with_capacity(chunk.len());
            for &i in chunk.iter() {
                let (key, ids) = items[i];
                let mut cmd = evalsha(&scripts::PERMIT_RENEW, 1);
                cmd.arg(key).arg(lease_ms);
                for id in ids {
                    cmd.arg(&id[..]);
                }
                pipe.add_command(cmd);
            }
            let replies: Result<Vec<i64>> = pipe.query_async(&mut conn).await.map_err(Error::from);
            replies
        }
    }))
    .await;
    for (chunk, reply) in chunks.iter().zip(replies) {
        match reply {
            Ok(renewed) => {
                for (&i, r) in chunk.iter().zip(renewed) {
                    out[i] = Ok(r == 1);
                }
            }
            Err(e) => {
                for &i in chunk.iter() {
                    out[i] = Err(e.clone());
                }
            }
        }
    }
    out
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
    /// Head of a free lock (a read-write lock's waiter: may enter now): wake it.
    HeadOfFreeLock,
    /// Not queued any more: wake it so its next attempt requeues.
    Dropped,
    /// Second in line: wake it so it learns the head's deadline.
    Second,
}

/// Adds the fair heartbeat calls of `group` (fair waiters of one slot) to `pipe`.
fn fair_heartbeats(
    pipe: &mut Pipeline,
    items: &[(&LockSpec, &str)],
    group: &[usize],
    batch: usize,
    liveness_ms: i64,
    publish: &str,
    redisson_wait_ms: i64,
) {
    for chunk in group.chunks(batch) {
        let mut cmd = evalsha(&scripts::FAIR_HEARTBEAT, 6 * chunk.len());
        for &i in chunk {
            let k = &items[i].0.keys;
            cmd.arg(k.name())
                .arg(k.queue())
                .arg(k.deadlines())
                .arg(k.liveness())
                .arg(k.grants())
                .arg(k.token());
        }
        cmd.arg(liveness_ms).arg(publish).arg(redisson_wait_ms);
        for &i in chunk {
            cmd.arg(items[i].1).arg(items[i].0.keys.channel());
        }
        pipe.add_command(cmd);
    }
}

/// Refreshes the places of a group of queued waiters (fair waiters' deadlines and marks,
/// writer-preferring read-write waiters' marks), in chunks of `batch`, pipelined.
pub(crate) async fn heartbeat(
    conn: &mut Conn,
    items: &[(&LockSpec, &str)],
    liveness_ms: i64,
    redisson_wait_ms: i64,
    batch: usize,
) -> Result<Vec<Beat>> {
    let publish = conn.publish_command();
    let batch = batch.max(1);
    let groups = slot_groups(conn, items.iter().map(|(spec, _)| spec.name()));
    // Within each slot group, fair waiters and read-write waiters go to their own scripts.
    let groups: Vec<Vec<usize>> = groups
        .into_iter()
        .flat_map(|group| {
            let (rw, fair): (Vec<usize>, Vec<usize>) =
                group.into_iter().partition(|&i| items[i].0.kind.is_rw());
            [fair, rw].into_iter().filter(|g| !g.is_empty())
        })
        .collect();
    let replies = join_all(groups.iter().map(|group| {
        let mut conn = conn.clone();
        let mut pipe = Pipeline::with_capacity(group.len().div_ceil(batch));
        if items[group[0]].0.kind.is_rw() {
            for chunk in group.chunks(batch) {
                let mut cmd = evalsha(&scripts::RW_HEARTBEAT, 5 * chunk.len());
                for &i in chunk {
                    let k = &items[i].0.keys;
                    let [queue, writers, live, seq] = k.rw_queue_keys();
                    cmd.arg(k.name()).arg(queue).arg(writers).arg(live).arg(seq);
                }
                cmd.arg(liveness_ms).arg(publish);
                for &i in chunk {
                    cmd.arg(items[i].1).arg(items[i].0.keys.rw_turns_channel());
                }
                pipe.add_command(cmd);
            }
        } else {
            fair_heartbeats(
                &mut pipe,
                items,
                group,
                batch,
                liveness_ms,
                publish,
                redisson_wait_ms,
            );
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
