//! The semaphore's protocol (Redisson's `RSemaphore` layout, PROTOCOL 11): its scripts
//! (`lua/semaphore_*.lua`) and the plain reads of its count. The marked writes (acquire's
//! give-back, release, add) go through [`marked`](super::marked).

use crate::conn::{Conn, ScriptCall};
use crate::error::Result;
use crate::scripts;

/// The count in `name` (`None` when the key does not exist). A latch's count is read the same
/// way.
pub(crate) async fn count(conn: &mut Conn, name: &str) -> Result<Option<i64>> {
    Ok(redis::cmd("GET").arg(name).query_async(conn).await?)
}

/// Deletes `keys`; how many existed.
pub(crate) async fn delete(conn: &mut Conn, keys: &[&str]) -> Result<i64> {
    Ok(redis::cmd("DEL").arg(keys).query_async(conn).await?)
}

/// Takes every available permit (Redisson's `drainPermits`): how many there were.
pub(crate) async fn drain(conn: &mut Conn, name: &str) -> Result<i64> {
    Ok(scripts::SEMAPHORE_DRAIN
        .key(name)
        .invoke_async(conn)
        .await?)
}

/// Redisson's `trySetPermits`: sets the count when the key does not exist and publishes it on
/// `channel`. Whether it was set.
pub(crate) async fn set_permits(
    conn: &mut Conn,
    name: &str,
    channel: &str,
    permits: u32,
) -> Result<bool> {
    let publish = conn.publish_command();
    let set: i64 = scripts::SEMAPHORE_SET_PERMITS
        .key(name)
        .arg(permits)
        .arg(publish)
        .arg(channel)
        .invoke_async(conn)
        .await?;
    Ok(set == 1)
}

/// One acquire attempt of `permits` under call mark `mark` (living `mark_ms`): 1 taken, 0 or
/// -1 not (not enough, or voided by a give-back that came first).
pub(crate) async fn acquire(
    conn: &mut Conn,
    name: &str,
    mark: &str,
    permits: u32,
    mark_ms: i64,
) -> Result<i64> {
    Ok(scripts::SEMAPHORE_ACQUIRE
        .key(name)
        .key(mark)
        .arg(permits)
        .arg(mark_ms)
        .invoke_async(conn)
        .await?)
}
