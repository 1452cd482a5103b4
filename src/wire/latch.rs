//! The count-down latch's protocol (Redisson's `RCountDownLatch` layout, PROTOCOL 12): its
//! scripts (`lua/latch_*.lua`). The count is read as a semaphore's is
//! ([`semaphore::count`](super::semaphore::count)); the count-down is a marked write
//! ([`marked`](super::marked)).

use crate::conn::{Conn, ScriptCall};
use crate::error::Result;
use crate::scripts;

/// Redisson's `trySetCount`: sets the count when the latch does not exist and publishes `1`.
/// Whether it was set.
pub(crate) async fn set_count(
    conn: &mut Conn,
    name: &str,
    channel: &str,
    count: i64,
) -> Result<bool> {
    let publish = conn.publish_command();
    let set: i64 = scripts::LATCH_SET_COUNT
        .key(name)
        .arg(count)
        .arg(publish)
        .arg(channel)
        .invoke_async(conn)
        .await?;
    Ok(set == 1)
}

/// Deletes the latch and, when there was one, publishes `0` (opened). Whether it existed.
pub(crate) async fn delete(conn: &mut Conn, name: &str, channel: &str) -> Result<bool> {
    let publish = conn.publish_command();
    let deleted: i64 = scripts::LATCH_DELETE
        .key(name)
        .arg(publish)
        .arg(channel)
        .invoke_async(conn)
        .await?;
    Ok(deleted == 1)
}
