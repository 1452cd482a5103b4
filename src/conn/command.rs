//! The command connection, one type over every topology so lock code never looks at which one it
//! runs on. Standalone is a reconnecting multiplexed [`ConnectionManager`]; a cluster is redis-rs's
//! async cluster connection, twice: one for commands, and a RESP3 one that carries only the
//! client's subscriptions (redis-rs re-subscribes them after reconnects and slot moves). They are
//! kept apart because a node that loses a slot tells its shard subscribers with an unsolicited
//! `sunsubscribe` push, which redis-rs can take for the reply to a command in flight on the same
//! connection (seen in a manual-failover test: an acquire script "answered" by that push); behind
//! Sentinel it is a connection to the current master that asks the sentinels again after a
//! failure ([`SentinelMaster`]).

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
#[cfg(feature = "cluster")]
use redis::PushInfo;
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, ToRedisArgs, Value};
#[cfg(feature = "cluster")]
use tokio::sync::mpsc;
use tokio::sync::Notify;
use uuid::Uuid;

use std::sync::Arc;

#[cfg(feature = "cluster")]
use crate::config::PubSubMode;
use crate::config::{Config, Topology};
use crate::conn::names::{self, KeepNames};
#[cfg(feature = "sentinel")]
use crate::conn::sentinel::SentinelMaster;
use crate::error::{timed_out, Result};
use crate::scripts::Lua;

/// A cheap-to-clone handle on the client's command connection.
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone {
        manager: ConnectionManager,
        /// Keeps the connection's name after reconnects while the client lives: poked after a
        /// failure that makes the manager reconnect.
        names: Arc<(KeepNames, Arc<Notify>)>,
    },
    #[cfg(feature = "cluster")]
    Cluster {
        conn: ClusterConnection,
        /// Release messages use `SPUBLISH` / `SSUBSCRIBE`.
        sharded: bool,
        /// Keeps the node connections' names after reconnects while the client lives.
        _names: Arc<KeepNames>,
    },
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelMaster),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Standalone { .. } => f.write_str("Conn::Standalone"),
            #[cfg(feature = "cluster")]
            Conn::Cluster { sharded, .. } => write!(f, "Conn::Cluster {{ sharded: {sharded} }}"),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(_) => f.write_str("Conn::Sentinel"),
        }
    }
}

/// Push messages (subscription traffic and disconnect notices) of a cluster connection.
#[cfg(feature = "cluster")]
pub(crate) type Pushes = mpsc::UnboundedReceiver<PushInfo>;

/// What the subscriber opens its pub/sub connection on, per topology; made here beside the
/// command connection so the two always agree.
pub(crate) enum PubSubLink {
    /// A dedicated pub/sub connection to this server. (Boxed: with redis-rs's TLS support on, a
    /// `redis::Client` is several times the size of the other variants.)
    Classic(Box<redis::Client>),
    /// The cluster's subscription-only RESP3 connection, and its push messages.
    #[cfg(feature = "cluster")]
    Cluster {
        conn: ClusterConnection,
        /// Release messages use `SPUBLISH` / `SSUBSCRIBE`.
        sharded: bool,
        pushes: Pushes,
    },
    /// A pub/sub connection to the master the sentinels name, moved when it moves.
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelMaster),
}

/// How many times redis-rs's cluster client may send a command again by itself: after `MOVED` /
/// `ASK` (the command did not run), but also after a dropped connection, when it may have run (a
/// command that times out comes back to us as an error: `tests/cluster_resends.rs` sees our own
/// resend there). Every lock script is a compare-and-set on the holder's count, so a second run of the
/// same call changes nothing (`engine/field/`), and whoever reads a reply asks
/// [`Conn::may_run_twice`] to read it as the reply to a resend; the bound only keeps one call
/// within 3 command timeouts (the default, 16, would allow 17). Longer outages are ridden out by
/// our own retry loops.
#[cfg(feature = "cluster")]
pub(crate) const CLUSTER_RETRIES: u32 = 2;

impl Conn {
    /// Opens the command connection for the configured topology, and says where the subscriber
    /// opens its own (on a cluster, the subscription-only connection is opened here too).
    pub(crate) async fn connect(config: &Config, id: Uuid) -> Result<(Conn, PubSubLink)> {
        let cmd_name = names::command_name(id);
        match &config.topology {
            Topology::Standalone(client) => {
                let client = (**client).clone();
                let cm_config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(config.command_timeout))
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_number_of_retries(2);
                let mut manager = tokio::time::timeout(
                    config.connect_timeout,
                    ConnectionManager::new_with_config(client.clone(), cm_config),
                )
                .await
                .map_err(|_| timed_out("connect timed out"))??;
                names::name_connection(&mut manager, &cmd_name).await;
                let (keep, stop) = KeepNames::new();
                let failed = Arc::new(Notify::new());
                tokio::spawn(names::keep_standalone_named(
                    manager.clone(),
                    cmd_name,
                    failed.clone(),
                    stop,
                ));
                Ok((
                    Conn::Standalone {
                        manager,
                        names: Arc::new((keep, failed)),
                    },
                    PubSubLink::Classic(Box::new(client)),
                ))
            }
            #[cfg(feature = "cluster")]
            Topology::Cluster { seeds, pubsub } => {
                let builder = || {
                    seeds
                        .builder()
                        .connection_timeout(config.connect_timeout)
                        .response_timeout(config.command_timeout)
                        .retries(CLUSTER_RETRIES)
                };
                let connect = |client: redis::cluster::ClusterClient| async move {
                    tokio::time::timeout(config.connect_timeout, client.get_async_connection())
                        .await
                        .map_err(|_| timed_out("cluster connect timed out"))?
                        .map_err(crate::error::Error::from)
                };
                let mut conn = connect(builder().build()?).await?;
                let (tx, raw_pushes) = mpsc::unbounded_channel();
                let mut subscriptions = connect(
                    builder()
                        .use_protocol(redis::ProtocolVersion::RESP3)
                        .push_sender(tx)
                        .build()?,
                )
                .await?;
                let sharded = match pubsub {
                    PubSubMode::Sharded => {
                        require_sharded_pubsub(server_major_version(&mut conn).await?)?;
                        true
                    }
                    PubSubMode::Classic => false,
                    PubSubMode::Auto => server_major_version(&mut conn).await? >= 7,
                };
                for (c, name) in [
                    (&mut conn, cmd_name),
                    (&mut subscriptions, names::subscriber_name(id)),
                ] {
                    if let Err(e) = names::name_cluster(c, &name).await {
                        tracing::debug!(connection = name, error = %e,
                            "CLIENT SETNAME failed on a cluster node; connection left unnamed");
                    }
                }
                let (keep, stop) = KeepNames::new();
                let (forward, pushes) = mpsc::unbounded_channel();
                tokio::spawn(names::keep_cluster_named(
                    conn.clone(),
                    subscriptions.clone(),
                    id,
                    raw_pushes,
                    forward,
                    stop,
                ));
                Ok((
                    Conn::Cluster {
                        conn,
                        sharded,
                        _names: Arc::new(keep),
                    },
                    PubSubLink::Cluster {
                        conn: subscriptions,
                        sharded,
                        pushes,
                    },
                ))
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel {
                master_name,
                sentinels,
                master,
            } => {
                let master = SentinelMaster::connect(
                    master_name,
                    sentinels,
                    master.clone(),
                    cmd_name,
                    config.connect_timeout,
                    config.command_timeout,
                )
                .await?;
                Ok((Conn::Sentinel(master.clone()), PubSubLink::Sentinel(master)))
            }
        }
    }

    /// The command that publishes a release message on this topology.
    pub(crate) fn publish_command(&self) -> &'static str {
        match self {
            #[cfg(feature = "cluster")]
            Conn::Cluster { sharded: true, .. } => "SPUBLISH",
            _ => "PUBLISH",
        }
    }

    /// Whether lock names must keep all their keys in one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        return matches!(self, Conn::Cluster { .. });
        #[cfg(not(feature = "cluster"))]
        false
    }

    /// Runs a keyless command on the master that owns `slot` (cluster), or on the one server.
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) async fn on_master_of(&mut self, slot: u16, cmd: &Cmd) -> Result<Value> {
        match self {
            Conn::Standalone { manager: c, .. } => Ok(c.req_packed_command(cmd).await?),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => Ok(c.req_packed_command(cmd).await?),
            #[cfg(feature = "cluster")]
            Conn::Cluster { conn, .. } => {
                let route = redis::cluster_routing::Route::new(
                    slot,
                    redis::cluster_routing::SlotAddr::Master,
                );
                Ok(conn
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?)
            }
        }
    }
}

/// Refuses `PubSubMode::Sharded` on a cluster whose servers report a major version below 7: they
/// have no `SPUBLISH`, and a release script would fail on it after deleting the lock. (An
/// unknown version, 0, is let through.)
#[cfg(feature = "cluster")]
fn require_sharded_pubsub(major: u32) -> Result<()> {
    if (1..7).contains(&major) {
        return Err(crate::error::Error::InvalidArgument {
            argument: "pubsub_mode",
            reason: format!(
                "PubSubMode::Sharded needs Redis 7+ (SPUBLISH/SSUBSCRIBE); the cluster runs \
                 Redis {major}: use PubSubMode::Auto or PubSubMode::Classic"
            ),
        });
    }
    Ok(())
}

/// The major version of one cluster node (they are assumed to run the same release).
#[cfg(feature = "cluster")]
async fn server_major_version(conn: &mut ClusterConnection) -> Result<u32> {
    let info = conn
        .route_command(
            redis::cmd("INFO").arg("server").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
        )
        .await?;
    let text: String =
        redis::FromRedisValue::from_redis_value(info).map_err(redis::RedisError::from)?;
    let major = text
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse().ok())
        .unwrap_or(0);
    Ok(major)
}

/// Whether a standalone connection manager reconnects after this error (so its name is gone).
fn reconnects_after(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

impl Conn {
    /// Whether one command sent here may run more than once on the server: redis-rs's cluster
    /// client sends a command again by itself after a dropped connection ([`CLUSTER_RETRIES`]),
    /// when the first send may have run. A caller that reads a reply as
    /// the answer to its first send must then read it as it reads the reply to a resend. The
    /// standalone manager and the Sentinel connection never send a command twice by themselves.
    pub(crate) fn may_run_twice(&self) -> bool {
        match self {
            Conn::Standalone { .. } => false,
            #[cfg(feature = "cluster")]
            Conn::Cluster { .. } => true,
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(_) => false,
        }
    }

    /// After a failed command: a standalone manager that reconnects must be named again.
    fn after_failure<T>(&self, reply: &redis::RedisResult<T>) {
        if let (Conn::Standalone { names, .. }, Err(e)) = (self, reply) {
            if reconnects_after(e) {
                names.1.notify_one();
            }
        }
    }

    fn send<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone { manager: c, .. } => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster { conn, .. } => conn.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn send_pipeline<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone { manager: c, .. } => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster { conn, .. } => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
}

/// How a call of one of the library's scripts ([`Lua`]) is built: its keys and arguments are
/// written into two buffers as they are given, then sent as one `EVALSHA` ([`Invocation`]).
pub(crate) trait ScriptCall {
    /// A call of this script with no keys or arguments yet.
    fn prepare_invoke(&self) -> Invocation<'_>;

    /// A call of this script, its first key given.
    fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_>;
}

impl ScriptCall for Lua {
    fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: Cmd::with_capacity(8, 512),
            args: Cmd::with_capacity(16, 256),
        }
    }

    fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_> {
        let mut call = self.prepare_invoke();
        call.key(key);
        call
    }
}

/// One call of a script being built: its keys (`KEYS`) and arguments (`ARGV`), each list written
/// into one buffer as it is given, then sent as one `EVALSHA`. (`redis::ScriptInvocation` keeps
/// every key and argument in a buffer of its own and copies them into the command: about 20
/// allocations per call of the fair scripts, which this avoids.)
pub(crate) struct Invocation<'a> {
    lua: &'a Lua,
    /// Used as buffers only: never sent themselves.
    keys: Cmd,
    args: Cmd,
}

impl Invocation<'_> {
    /// Adds a key (`KEYS[i]`).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.arg(key);
        self
    }

    /// Adds an argument (`ARGV[i]`).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// The call as one `EVALSHA` command.
    pub(crate) fn eval_cmd(&self) -> Cmd {
        let parts = || self.keys.args_iter().chain(self.args.args_iter());
        let bytes: usize = parts()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.len(),
                _ => 0,
            })
            .sum();
        let mut cmd = Cmd::with_capacity(
            3 + self.keys.args_iter().len() + self.args.args_iter().len(),
            bytes + 64,
        );
        cmd.arg("EVALSHA")
            .arg(self.lua.script.get_hash())
            .arg(self.keys.args_iter().len());
        for part in parts() {
            if let redis::Arg::Simple(b) = part {
                cmd.arg(b);
            }
        }
        cmd
    }

    /// Sends the call. On our connection a `NOSCRIPT` never reaches here (the connection sends
    /// the call again as `EVAL`: [`eval_instead`](crate::scripts::eval_instead)); on any other connection it is answered the
    /// same way here.
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        let cmd = self.eval_cmd();
        match cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                match crate::scripts::eval_instead(&cmd) {
                    Some(eval) => eval.query_async(conn).await,
                    None => Err(e),
                }
            }
            reply => reply,
        }
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A `NOSCRIPT` error value (how pipelines, and possibly single replies, carry it).
fn noscript_value(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}

/// A `NOSCRIPT` reply, as an error or as an error value.
fn noscript_reply(reply: &redis::RedisResult<Value>) -> bool {
    match reply {
        Err(e) => is_noscript(e),
        Ok(value) => noscript_value(value),
    }
}

/// Commands go to the connection of the topology; an `EVALSHA` of one of our scripts that meets
/// `NOSCRIPT` is sent again as `EVAL` of its source (see [`scripts`](crate::scripts)), so callers
/// never see `NOSCRIPT`. A pipeline of them is sent again whole: our pipelines (renewals and
/// heartbeats) are idempotent, and all calls of one go to one node, where either all or none
/// find the script.
impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let reply = self.send(cmd).await;
            self.after_failure(&reply);
            if noscript_reply(&reply) {
                if let Some(eval) = crate::scripts::eval_instead(cmd) {
                    tracing::debug!("script not cached on the node; sent as EVAL");
                    return self.send(&eval).await;
                }
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let replies = self.send_pipeline(pipeline, offset, count).await;
            self.after_failure(&replies);
            let noscript = match &replies {
                Err(e) => is_noscript(e),
                Ok(values) => values.iter().any(noscript_value),
            };
            if noscript {
                if let Some(eval) = crate::scripts::eval_pipeline(pipeline) {
                    tracing::debug!("script not cached on the node; pipeline sent as EVAL");
                    return self.send_pipeline(&eval, offset, count).await;
                }
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone { manager: c, .. } => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster { conn, .. } => conn.get_db(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::{FAIR_ACQUIRE, RENEW};

    #[test]
    fn an_invocation_is_one_evalsha_with_its_keys_counted_then_its_arguments() {
        let mut call = FAIR_ACQUIRE.key("k1");
        call.arg(30_000)
            .key("k2")
            .arg("field")
            .arg(&["a", "b"][..])
            .key(&["k3"][..]);
        let args: Vec<Vec<u8>> = call
            .eval_cmd()
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => panic!("cursor argument"),
            })
            .collect();
        let expected: Vec<&[u8]> = vec![
            b"EVALSHA",
            FAIR_ACQUIRE.script.get_hash().as_bytes(),
            b"3",
            b"k1",
            b"k2",
            b"k3",
            b"30000",
            b"field",
            b"a",
            b"b",
        ];
        assert_eq!(args, expected);
        let none = RENEW.prepare_invoke().eval_cmd();
        assert_eq!(none.args_iter().count(), 3, "EVALSHA, the hash and 0 keys");
    }
}
