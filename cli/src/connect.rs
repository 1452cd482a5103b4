//! Connecting: the topology flags are parsed once into a [`Target`], from which both the
//! fairlock [`Client`](fairlock::Client) (for `state()`) and a raw redis-rs connection to the same
//! deployment (for SCAN, key types, TTLs, the CLI's own scripts and pub/sub) are made.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, Pipeline, RedisConnectionInfo, Value};

use crate::args::{ConnArgs, PubSub};
use crate::error::Failure;

/// The default server when neither a flag nor `$REDIS_URL` names one (as redis-cli does).
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The deployment the command talks to, parsed once from the flags.
#[derive(Clone)]
pub enum Topology {
    Standalone(String),
    Cluster(Vec<String>),
    Sentinel {
        master: String,
        sentinels: Vec<String>,
        user: Option<String>,
        password: Option<String>,
    },
}

impl Topology {
    /// Every URL given.
    fn urls(&self) -> Vec<&String> {
        match self {
            Topology::Standalone(url) => vec![url],
            Topology::Cluster(nodes) => nodes.iter().collect(),
            Topology::Sentinel { sentinels, .. } => sentinels.iter().collect(),
        }
    }
}

#[derive(Clone)]
pub struct Target {
    pub topology: Topology,
    pub pubsub: PubSub,
    pub timeout: Duration,
}

impl Target {
    pub fn from_args(args: &ConnArgs) -> Result<Target, Failure> {
        let chosen = usize::from(args.url.is_some())
            + usize::from(!args.cluster.is_empty())
            + usize::from(args.sentinel.is_some());
        if chosen > 1 {
            return Err(Failure::Usage(
                "choose one of --url, --cluster and --sentinel".into(),
            ));
        }
        let password = args
            .master_password
            .clone()
            .or_else(|| std::env::var("FAIRLOCK_MASTER_PASSWORD").ok());
        if args.sentinel.is_none() && (args.master_user.is_some() || args.master_password.is_some())
        {
            return Err(Failure::Usage(
                "--master-user and --master-password only apply to --sentinel; put credentials \
                 in the URL otherwise"
                    .into(),
            ));
        }
        if args.timeout.is_zero() {
            return Err(Failure::Usage("--timeout must be more than 0".into()));
        }
        let topology = if let Some(sentinel) = &args.sentinel {
            let (master, urls) = match sentinel.as_slice() {
                [master, urls] => (master.clone(), urls),
                _ => {
                    return Err(Failure::Usage(
                        "--sentinel takes a master name and a comma-separated list of URLs".into(),
                    ))
                }
            };
            let sentinels: Vec<String> = urls
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect();
            if master.is_empty() || sentinels.is_empty() {
                return Err(Failure::Usage(
                    "--sentinel needs a master name and at least one sentinel URL".into(),
                ));
            }
            Topology::Sentinel {
                master,
                sentinels,
                user: args.master_user.clone(),
                password,
            }
        } else if !args.cluster.is_empty() {
            let nodes: Vec<String> = args
                .cluster
                .iter()
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect();
            if nodes.is_empty() {
                return Err(Failure::Usage("--cluster needs at least one URL".into()));
            }
            Topology::Cluster(nodes)
        } else {
            let url = args
                .url
                .clone()
                .or_else(|| std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()))
                .unwrap_or_else(|| DEFAULT_URL.to_owned());
            Topology::Standalone(url)
        };
        for url in topology.urls() {
            check_url(url)?;
        }
        Ok(Target {
            topology,
            pubsub: args.pubsub,
            timeout: args.timeout,
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// Where the command connects, without passwords, for messages.
    pub fn describe(&self) -> String {
        match &self.topology {
            Topology::Standalone(url) => redact(url),
            Topology::Cluster(nodes) => format!(
                "cluster {}",
                nodes
                    .iter()
                    .map(|n| redact(n))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Topology::Sentinel {
                master, sentinels, ..
            } => format!(
                "master {master:?} of sentinels {}",
                sentinels
                    .iter()
                    .map(|n| redact(n))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }

    /// The fairlock client for the same deployment.
    async fn library(&self) -> Result<fairlock::Client, Failure> {
        let mut builder = fairlock::Client::builder()
            .connect_timeout(self.timeout)
            .command_timeout(self.timeout);
        builder =
            match &self.topology {
                Topology::Standalone(url) => builder.standalone(url.clone()),
                Topology::Cluster(nodes) => builder.cluster(nodes.clone()).pubsub_mode(match self
                    .pubsub
                {
                    PubSub::Auto => fairlock::PubSubMode::Auto,
                    PubSub::Sharded => fairlock::PubSubMode::Sharded,
                    PubSub::Classic => fairlock::PubSubMode::Classic,
                }),
                Topology::Sentinel {
                    master,
                    sentinels,
                    user,
                    password,
                } => {
                    let b = builder.sentinel(master.clone(), sentinels.clone());
                    match password {
                        Some(p) => b.sentinel_master_auth(user.as_deref(), p.clone()),
                        None => b,
                    }
                }
            };
        builder.build().await.map_err(|e| {
            if e.is_invalid_input() {
                Failure::from(e)
            } else {
                Failure::redis(&format!("cannot connect to {}", self.describe()), e)
            }
        })
    }

    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
    }

    fn cluster_builder(&self, nodes: &[String]) -> ClusterClientBuilder {
        ClusterClientBuilder::new(nodes.iter().map(String::as_str))
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout)
            .retries(2)
    }

    /// A client of the server to talk to (standalone: the URL; Sentinel: the current master).
    pub async fn server_client(&self) -> Result<redis::Client, Failure> {
        let fail = |e: redis::RedisError| connect_failure(&self.describe(), e);
        match &self.topology {
            Topology::Standalone(url) => redis::Client::open(url.as_str()).map_err(fail),
            Topology::Sentinel {
                master,
                sentinels,
                user,
                password,
            } => {
                let node = password.as_ref().map(|p| {
                    let mut info = RedisConnectionInfo::default().set_password(p);
                    if let Some(u) = user {
                        info = info.set_username(u);
                    }
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(info)
                });
                let mut client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master.clone(),
                    node,
                    SentinelServerType::Master,
                )
                .map_err(fail)?;
                within(self.timeout, client.async_get_client())
                    .await
                    .map_err(fail)
            }
            Topology::Cluster(_) => {
                Err(Failure::Internal("server_client() on a cluster".to_owned()))
            }
        }
    }

    /// The raw connection.
    async fn raw(&self) -> Result<Raw, Failure> {
        let fail = |e: redis::RedisError| connect_failure(&self.describe(), e);
        match &self.topology {
            Topology::Cluster(nodes) => {
                let client = self.cluster_builder(nodes).build().map_err(fail)?;
                let conn = within(self.timeout, client.get_async_connection())
                    .await
                    .map_err(fail)?;
                Ok(Raw::Cluster(conn))
            }
            _ => {
                let client = self.server_client().await?;
                let conn = within(
                    self.timeout,
                    client.get_multiplexed_async_connection_with_config(&self.config()),
                )
                .await
                .map_err(fail)?;
                Ok(Raw::Server(conn))
            }
        }
    }

    /// A RESP3 cluster connection whose subscription messages arrive on `pushes` (`watch`).
    pub async fn cluster_subscriber(
        &self,
        pushes: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
    ) -> Result<ClusterConnection, Failure> {
        let Topology::Cluster(nodes) = &self.topology else {
            return Err(Failure::Internal(
                "cluster_subscriber() outside a cluster".into(),
            ));
        };
        let fail = |e: redis::RedisError| {
            Failure::redis(&format!("cannot subscribe on {}", self.describe()), e)
        };
        let client: ClusterClient = self
            .cluster_builder(nodes)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes)
            .build()
            .map_err(fail)?;
        within(self.timeout, client.get_async_connection())
            .await
            .map_err(fail)
    }
}

/// Everything a command works with: the target, the library client, a raw connection, and how
/// release messages travel on it.
pub struct Session {
    pub target: Target,
    pub lib: fairlock::Client,
    pub raw: Raw,
    /// The commands a wake-up is published with: `PUBLISH`, and on a Redis 7+ cluster in
    /// `auto` mode also `SPUBLISH` (a waiter's client may use either kind).
    pub publish: Vec<&'static str>,
    /// Whether `watch` listens to classic / sharded pub/sub.
    pub classic: bool,
    pub sharded: bool,
}

impl Session {
    pub async fn open(target: Target) -> Result<Session, Failure> {
        let mut raw = target.raw().await?;
        let lib = target.library().await?;
        let (classic, sharded) = match (&raw, target.pubsub) {
            (Raw::Server(_), _) => (true, false),
            (Raw::Cluster(_), PubSub::Classic) => (true, false),
            (Raw::Cluster(_), PubSub::Sharded) => (false, true),
            (Raw::Cluster(_), PubSub::Auto) => (true, raw.major_version().await? >= 7),
        };
        let mut publish = Vec::new();
        if sharded {
            publish.push("SPUBLISH");
        }
        if classic {
            publish.push("PUBLISH");
        }
        Ok(Session {
            target,
            lib,
            raw,
            publish,
            classic,
            sharded,
        })
    }

    pub fn is_cluster(&self) -> bool {
        self.target.is_cluster()
    }
}

/// A node to run a keyless command on: its address, and one slot it serves (cluster routing).
#[derive(Debug, Clone)]
pub struct Node {
    pub addr: String,
    pub slot: u16,
}

/// The raw command connection.
#[derive(Clone)]
pub enum Raw {
    /// A standalone server or the Sentinel master.
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Raw {
    /// One command, routed by its key on a cluster.
    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Raw::Server(c) => cmd.query_async(c).await,
            Raw::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// A pipeline; on a cluster every key of it must share one slot.
    pub async fn pipe<T: FromRedisValue>(&mut self, pipe: &Pipeline) -> redis::RedisResult<T> {
        match self {
            Raw::Server(c) => pipe.query_async(c).await,
            Raw::Cluster(c) => pipe.query_async(c).await,
        }
    }

    /// A keyless command on one node (cluster: the master serving `node.slot`).
    pub async fn on_node<T: FromRedisValue>(
        &mut self,
        node: &Node,
        cmd: &Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Raw::Server(c) => cmd.query_async(c).await,
            Raw::Cluster(c) => {
                let route = Route::new(node.slot, SlotAddr::Master);
                let value = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                Ok(T::from_redis_value(value)?)
            }
        }
    }

    /// Every master: one node on a standalone server or behind Sentinel; on a cluster each
    /// master of `CLUSTER SLOTS`, with the first slot it serves.
    pub async fn masters(&mut self) -> redis::RedisResult<Vec<Node>> {
        match self {
            Raw::Server(_) => Ok(vec![Node {
                addr: "server".into(),
                slot: 0,
            }]),
            Raw::Cluster(c) => {
                let value = c
                    .route_command(
                        redis::cmd("CLUSTER").arg("SLOTS").clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await?;
                let mut nodes: Vec<Node> = Vec::new();
                for (first, addr) in parse_cluster_slots(&value) {
                    match nodes.iter_mut().find(|n| n.addr == addr) {
                        Some(n) => n.slot = n.slot.min(first),
                        None => nodes.push(Node { addr, slot: first }),
                    }
                }
                nodes.sort_by(|a, b| a.addr.cmp(&b.addr));
                Ok(nodes)
            }
        }
    }

    /// The major version of the server (a cluster's nodes are assumed to run one release).
    async fn major_version(&mut self) -> Result<u32, Failure> {
        let cmd = redis::cmd("INFO").arg("server").clone();
        let text: String = match self {
            Raw::Server(c) => cmd.query_async(c).await?,
            Raw::Cluster(c) => {
                let v = c
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
                    )
                    .await?;
                String::from_redis_value(v).map_err(redis::RedisError::from)?
            }
        };
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .and_then(|v| v.trim().split('.').next()?.parse().ok())
            .unwrap_or(0))
    }
}

/// (first slot, "host:port" of the master) for each range of a `CLUSTER SLOTS` reply.
fn parse_cluster_slots(value: &Value) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    let Value::Array(ranges) = value else {
        return out;
    };
    for range in ranges {
        let Value::Array(items) = range else { continue };
        let (Some(Value::Int(first)), Some(Value::Array(master))) = (items.first(), items.get(2))
        else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            continue;
        };
        out.push((*first as u16, format!("{host}:{port}")));
    }
    out
}

/// Runs `fut` with a deadline, as a Redis I/O error when it runs out.
/// Why connecting to `target` failed, in one line; a server that refused the credentials (or
/// their absence) says so in the words the library uses.
fn connect_failure(target: &str, e: redis::RedisError) -> Failure {
    let refused = e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
    if refused {
        Failure::Redis(format!(
            "cannot connect to {target}: Redis refused the client's credentials (check the \
             username and password)"
        ))
    } else {
        Failure::redis(&format!("cannot connect to {target}"), e)
    }
}

async fn within<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        ))),
    }
}

/// Rejects what is certainly not a Redis URL before trying to connect.
fn check_url(url: &str) -> Result<(), Failure> {
    let ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    if !ok {
        return Err(Failure::Usage(format!(
            "not a Redis URL: {:?} (expected redis://host:port or rediss://host:port)",
            redact(url)
        )));
    }
    redis::Client::open(url)
        .map(drop)
        .map_err(|e| Failure::Usage(format!("bad Redis URL {:?}: {e}", redact(url))))
}

/// Hides the password of `scheme://user:password@host`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://pw@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("redis://127.0.0.1:6379").is_ok());
        assert!(check_url("127.0.0.1:6379").is_err());
        assert!(check_url("http://x").is_err());
    }
}
