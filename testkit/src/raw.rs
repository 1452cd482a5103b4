//! Raw-protocol helpers: Redisson's derived key and channel names of a lock (PROTOCOL 1) and
//! reads of its fair queue with plain commands, as a Redisson peer or an operator sees them;
//! a dump of every key for a failing test to print.

/// A derived key by Redisson's prefix rule: `prefix:{name}`, or `prefix:name` when the name
/// already has a hash tag.
pub fn derived_key(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// The fair queue of `name`: a list of waiter owner fields, head first.
pub fn queue_key(name: &str) -> String {
    derived_key("redisson_lock_queue", name)
}

/// The waiter deadlines of `name`: a sorted set of owner fields scored by epoch ms.
pub fn timeout_key(name: &str) -> String {
    derived_key("redisson_lock_timeout", name)
}

/// The channel a release of `name` is published on (plain locks; fair waiters add their field).
pub fn release_channel(name: &str) -> String {
    derived_key("redisson_lock__channel", name)
}

/// The channel of one fair waiter of `name`, by its owner field.
pub fn waiter_channel(name: &str, field: &str) -> String {
    format!("{}:{field}", release_channel(name))
}

/// How many waiters the fair queue of `name` holds (`LLEN`).
pub fn queue_len(raw: &mut impl redis::ConnectionLike, name: &str) -> i64 {
    redis::cmd("LLEN").arg(queue_key(name)).query(raw).unwrap()
}

/// The server's clock (`TIME`) in epoch ms: the clock Redisson's deadline scores use.
pub fn server_now_ms(raw: &mut impl redis::ConnectionLike) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(raw).unwrap();
    secs * 1000 + micros / 1000
}

/// [`server_now_ms`] on an async connection.
pub async fn server_now_ms_async(conn: &mut impl redis::aio::ConnectionLike) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1000 + micros / 1000
}

/// Waits (up to 10 s) until `channel` has exactly one subscriber (`PUBSUB NUMSUB`).
pub fn wait_subscribed(raw: &mut redis::Connection, channel: &str) {
    crate::wait_until(std::time::Duration::from_secs(10), "subscribed", || {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query(raw)
            .unwrap();
        n == 1
    });
}

/// Kills every pub/sub connection of the server (`CLIENT KILL TYPE pubsub`), so messages
/// published until their clients resubscribe are lost; asserts at least one was killed.
pub fn kill_pubsub_connections(raw: &mut redis::Connection) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(raw)
        .unwrap();
    assert!(killed >= 1, "no pub/sub connection to kill");
}

/// Every key of the server at `url` with its type, TTL (ms) and contents, one line each, sorted:
/// what a test prints when a call hangs, so the failure shows who held what. Opens its own
/// blocking connection (a hung test's connections may be busy); a failure to read is reported
/// in the text, never a panic of its own.
pub fn dump_keys(url: &str) -> String {
    match try_dump_keys(url) {
        Ok(lines) if lines.is_empty() => "(no keys)".to_owned(),
        Ok(lines) => lines.join("\n"),
        Err(e) => format!("(could not read the server: {e})"),
    }
}

fn try_dump_keys(url: &str) -> redis::RedisResult<Vec<String>> {
    let mut conn =
        redis::Client::open(url)?.get_connection_with_timeout(std::time::Duration::from_secs(2))?;
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn)?;
    keys.sort();
    let mut lines = Vec::with_capacity(keys.len());
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn)?;
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn)?;
        let value: redis::Value = match kind.as_str() {
            "hash" => redis::cmd("HGETALL").arg(&key).query(&mut conn)?,
            "zset" => redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(&mut conn)?,
            "list" => redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query(&mut conn)?,
            "string" => redis::cmd("GET").arg(&key).query(&mut conn)?,
            _ => redis::Value::Nil,
        };
        lines.push(format!("{key} {kind} pttl={ttl} {value:?}"));
    }
    Ok(lines)
}

/// Kills a child process (`SIGKILL`) and reaps it.
pub fn sigkill(child: &mut std::process::Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}
