//! The operators' repairs of a fair lock (`lua/admin_*.lua`): force-unlock with the dead heads
//! dropped, and purging dead waiters. They run on any connection (the `fairlock` tool's own),
//! not only a client's.

use redis::aio::ConnectionLike;
use redis::FromRedisValue;

use crate::conn::ScriptCall;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::scripts;

/// What `admin_force_unlock.lua` replies: deleted (1/0), the owners `{field, count, ...}`, the
/// dead heads dropped `{field, reason, ...}`, the live head told (or ''), the receivers on the
/// release channel and on the head's channel.
pub(crate) type RawForceUnlock = (i64, Vec<String>, Vec<String>, String, i64, i64);

/// What `admin_purge_dead.lua` replies: the waiters removed `{field, reason, ...}`, the head told
/// (or ''), its receivers, the queue's length after, whether the lock is held and whether it had
/// a queue (1/0).
pub(crate) type RawPurge = (Vec<String>, String, i64, i64, i64, i64);

pub(crate) async fn force_unlock<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    publish: &[&str],
) -> Result<RawForceUnlock> {
    run(&scripts::ADMIN_FORCE_UNLOCK, conn, keys, publish).await
}

pub(crate) async fn purge_dead<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &LockKeys,
    publish: &[&str],
) -> Result<RawPurge> {
    run(&scripts::ADMIN_PURGE_DEAD, conn, keys, publish).await
}

/// Both repairs take the fair lock's five keys, its release channel, and the publish commands
/// the deployment needs (`PUBLISH`, `SPUBLISH`, or both).
async fn run<C: ConnectionLike + Send, T: FromRedisValue>(
    script: &scripts::Lua,
    conn: &mut C,
    keys: &LockKeys,
    publish: &[&str],
) -> Result<T> {
    let mut inv = script.prepare_invoke();
    inv.key(keys.name())
        .key(keys.queue())
        .key(keys.deadlines())
        .key(keys.liveness())
        .key(keys.grants())
        .arg(keys.channel());
    for command in publish {
        inv.arg(*command);
    }
    Ok(inv.invoke_async(conn).await?)
}
