//! What a client asks the server itself: a `PING` (credentials when connecting, health), and
//! the eviction policy that decides whether held locks can be evicted.

use std::time::Duration;

use crate::conn::Conn;
use crate::error::{timed_out, Result};

/// One `PING`, bounded by `timeout`.
pub(crate) async fn ping(conn: &mut Conn, timeout: Duration) -> Result<()> {
    let cmd = redis::cmd("PING");
    let ping = cmd.query_async::<redis::Value>(conn);
    tokio::time::timeout(timeout, ping)
        .await
        .map_err(|_| timed_out("PING timed out"))??;
    Ok(())
}

/// The server's `maxmemory-policy` (`CONFIG GET`; `None` when it did not say).
pub(crate) async fn maxmemory_policy(conn: &mut Conn) -> redis::RedisResult<Option<String>> {
    // A flat pair list over RESP2, a map over RESP3 (cluster connections).
    let reply: std::collections::HashMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await?;
    Ok(reply.get("maxmemory-policy").cloned())
}
