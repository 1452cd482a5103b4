//! Replica sync (`Builder::replica_sync`): after a grant, `WAIT` until a replica has the lock
//! write, and give the grant back when none acknowledged.

use std::time::Duration;

use crate::config::{ReplicaSync, SyncFailure};
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::ops::{AcquireArgs, Attempt};

/// Connected replicas of the master of `slot` (`INFO replication`).
pub(crate) async fn connected_replicas(conn: &mut Conn, slot: u16) -> Result<u64> {
    let info = conn
        .on_master_of(slot, redis::cmd("INFO").arg("replication"))
        .await?
        .extract_error()?;
    let info: String =
        redis::FromRedisValue::from_redis_value(info).map_err(redis::RedisError::from)?;
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
    redis::FromRedisValue::from_redis_value(acked).map_err(|e| Error::Redis(e.into()))
}

/// Replica sync after a grant (see `Builder::replica_sync`): waits for a replica to acknowledge
/// the hold just taken. When none does, the hold is released again and the configured reaction
/// decides: an error, or a `Waiting` outcome so the caller tries again. Runs inside the attempt's
/// future, so a caller that stops waiting meanwhile leaves the outcome to the driver like any other.
pub(crate) async fn synced(
    conn: &mut Conn,
    args: &AcquireArgs,
    granted: Attempt,
    sync: ReplicaSync,
    command_timeout: Duration,
) -> Result<Attempt> {
    let slot = crate::keys::slot(args.spec.name());
    let counted = async {
        let replicas = connected_replicas(conn, slot).await?;
        if replicas == 0 {
            return Ok((0, 0));
        }
        let acked = wait_replicas(conn, slot, replicas, sync.timeout.as_millis() as i64).await?;
        Ok::<_, Error>((replicas, acked))
    }
    .await;
    let outcome = match counted {
        Ok((0, _)) => return Ok(granted),
        Ok((_, acked)) if acked > 0 => return Ok(granted),
        Ok((replicas, _)) => {
            tracing::warn!(replicas, timeout = ?sync.timeout, "no replica acknowledged the lock; releasing it");
            match sync.on_failure {
                SyncFailure::Error => Err(Error::ReplicasNotSynced {
                    replicas,
                    timeout: sync.timeout,
                }),
                // Try again shortly: the replicas may catch up.
                SyncFailure::Retry => Ok(Attempt::Waiting { hint_ms: 10 }),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "replica sync failed after a grant; releasing it");
            Err(e)
        }
    };
    // Unsynced, or its sync unknown: the grant is given back before the outcome is reported, so
    // a retry does not pile a second hold on it. (If the release cannot get through either, its
    // error is the one reported; a lost reply marks the call unsure, and the next attempt checks
    // for the grant first.)
    crate::retry::release(
        conn,
        &args.spec,
        &args.field,
        args.lease_ms,
        command_timeout,
    )
    .await?;
    outcome
}
