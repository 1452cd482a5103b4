//! The expirable semaphore's protocol (Redisson's `RPermitExpirableSemaphore` layout, PROTOCOL
//! 11): the permits' scripts (`lua/permit_*.lua`, with their shared prologue). Each permit is a
//! raw 16-byte id sent as an argument of its own. The watchdog's renewals are batched in
//! `wire/batch.rs`.

use crate::conn::{Conn, ScriptCall};
use crate::error::Result;
use crate::scripts;

/// The keys and channel of one expirable semaphore.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PermitKeys<'a> {
    /// The available count, `NAME`.
    pub(crate) name: &'a str,
    /// The permits in use, `{NAME}:timeout`.
    pub(crate) expiries: &'a str,
    /// Where releases are announced.
    pub(crate) channel: &'a str,
}

/// One acquire attempt of `permits` permits under `ids` with `lease_ms`: `(1, 0)` taken,
/// `(0, ms)` not enough (the earliest expiry is `ms` away, -1: none coming). `resend`: these ids
/// may have been sent before, by us or by the connection itself ([`Conn::may_run_twice`]): the
/// script then looks for them first (new ids sent once cannot be there).
pub(crate) async fn acquire(
    conn: &mut Conn,
    keys: PermitKeys<'_>,
    permits: u32,
    lease_ms: i64,
    ids: &[[u8; 16]],
    resend: bool,
) -> Result<(i64, i64)> {
    let publish = conn.publish_command();
    let mut call = scripts::PERMIT_ACQUIRE.key(keys.name);
    call.key(keys.expiries)
        .arg(permits)
        .arg(lease_ms)
        .arg(publish)
        .arg(keys.channel)
        .arg(if resend { "1" } else { "0" });
    for id in ids {
        call.arg(&id[..]);
    }
    Ok(call.invoke_async(conn).await?)
}

/// Gives permits back by id; how many of them were there.
pub(crate) async fn release(
    conn: &mut Conn,
    keys: PermitKeys<'_>,
    ids: &[[u8; 16]],
) -> Result<i64> {
    let publish = conn.publish_command();
    let mut call = scripts::PERMIT_RELEASE.key(keys.name);
    call.key(keys.expiries).arg(publish).arg(keys.channel);
    for id in ids {
        call.arg(&id[..]);
    }
    Ok(call.invoke_async(conn).await?)
}

/// Reclaims expired permits, then `(available, in use)`.
pub(crate) async fn counts(conn: &mut Conn, keys: PermitKeys<'_>) -> Result<(i64, u64)> {
    let publish = conn.publish_command();
    Ok(scripts::PERMIT_COUNTS
        .key(keys.name)
        .key(keys.expiries)
        .arg(publish)
        .arg(keys.channel)
        .invoke_async(conn)
        .await?)
}
