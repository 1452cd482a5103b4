//! Replica sync (`Builder::replica_sync`): after a grant, `WAIT` until a replica has the lock
//! write, and give the grant back when none acknowledged.
//!
//! It must never report a grant as synced unless a replica acknowledged it (or there is none).

use crate::config::{ReplicaSync, SyncFailure};
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::wire::AcquireArgs;

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
    redis::FromRedisValue::from_redis_value(acked)
        .map_err(|e| Error::from(redis::RedisError::from(e)))
}

/// Replica sync after a grant (see `Builder::replica_sync`): waits for a replica to acknowledge
/// the hold just taken. `Ok(true)`: acknowledged, or no replica to wait for. `Ok(false)`: none
/// acknowledged and the configured reaction is to try again; `Err(ReplicasNotSynced)`: none
/// acknowledged and the reaction is an error; any other error: the sync itself failed. In every
/// case but `Ok(true)` the caller gives the grant back (under the field's turn it still holds).
pub(crate) async fn synced(conn: &mut Conn, args: &AcquireArgs, sync: ReplicaSync) -> Result<bool> {
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
    match counted {
        Ok((0, _)) => Ok(true),
        Ok((_, acked)) if acked > 0 => Ok(true),
        Ok((replicas, _)) => {
            tracing::warn!(replicas, timeout = ?sync.timeout, "no replica acknowledged the lock; releasing it");
            match sync.on_failure {
                SyncFailure::Error => Err(Error::ReplicasNotSynced {
                    replicas,
                    timeout: sync.timeout,
                }),
                // Try again shortly: the replicas may catch up.
                SyncFailure::Retry => Ok(false),
            }
        }
        Err(e) => {
            tracing::warn!(error = %crate::error::chain(&e), "replica sync failed after a grant; releasing it");
            Err(e)
        }
    }
}
