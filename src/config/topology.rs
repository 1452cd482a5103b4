//! Which Redis deployment a client talks to, and the credentials for a master behind Sentinel.

use std::fmt;
#[cfg(feature = "cluster")]
use std::sync::Arc;

#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
#[cfg(feature = "sentinel")]
use redis::sentinel::SentinelNodeConnectionInfo;
use redis::ConnectionInfo;

#[cfg(feature = "cluster")]
use super::settings::PubSubMode;
#[cfg(any(feature = "cluster", feature = "sentinel"))]
use super::target::ServerAddr;

/// Which Redis deployment the client talks to, with everything needed to connect to it.
#[derive(Clone)]
pub(crate) enum Topology {
    /// One Redis server (or a master whose replicas the client does not follow). Boxed: with
    /// redis-rs's TLS support on, a `redis::Client` is several times the size of the others.
    Standalone(Box<redis::Client>),
    /// A Redis Cluster.
    #[cfg(feature = "cluster")]
    Cluster {
        /// The seed nodes, or the caller's own cluster client builder.
        seeds: ClusterSeeds,
        /// How release messages travel.
        pubsub: PubSubMode,
    },
    /// A master with replicas watched by Redis Sentinel: the client asks the sentinels where the
    /// master is and follows it through failovers.
    #[cfg(feature = "sentinel")]
    Sentinel {
        /// The name the sentinels monitor the master under (`sentinel monitor <name> …`).
        master_name: String,
        /// How to reach the sentinels; any one that answers is enough.
        sentinels: Vec<ConnectionInfo>,
        /// How to connect to the master (and a promoted replica) the sentinels name.
        master: SentinelNodeConnectionInfo,
    },
}

/// Every item as a connection info (the first malformed one is the error).
#[cfg(any(feature = "cluster", feature = "sentinel"))]
pub(super) fn connection_infos<I, T>(items: I) -> redis::RedisResult<Vec<ConnectionInfo>>
where
    I: IntoIterator<Item = T>,
    T: ServerAddr,
{
    items
        .into_iter()
        .map(ServerAddr::into_connection_info)
        .collect()
}

/// Makes a cluster client builder with the caller's settings (see [`Builder::cluster_client`]).
#[cfg(feature = "cluster")]
pub(crate) type MakeClusterBuilder = Arc<dyn Fn() -> ClusterClientBuilder + Send + Sync>;

/// Where a cluster client starts from.
#[cfg(feature = "cluster")]
#[derive(Clone)]
pub(crate) enum ClusterSeeds {
    /// Seed nodes; credentials and TLS come from the first one, as in redis-rs.
    Nodes(Vec<ConnectionInfo>),
    /// The caller's builder, made afresh for each of the client's cluster connections.
    Builder(MakeClusterBuilder),
}

#[cfg(feature = "cluster")]
impl ClusterSeeds {
    /// A cluster client builder with the caller's settings.
    pub(crate) fn builder(&self) -> ClusterClientBuilder {
        match self {
            ClusterSeeds::Nodes(nodes) => ClusterClientBuilder::new(nodes.iter().cloned()),
            ClusterSeeds::Builder(make) => make(),
        }
    }
}

impl Topology {
    /// Whether two topologies name one deployment (a RedLock needs independent masters): the
    /// same server address, whatever the database (two databases of one server fail together).
    /// Two cluster clients made by closures are the same only when they share the closure.
    pub(crate) fn same_deployment(&self, other: &Topology) -> bool {
        fn addr(info: &ConnectionInfo) -> String {
            info.addr().to_string()
        }
        #[allow(unreachable_patterns)] // without the cluster and sentinel features
        match (self, other) {
            (Topology::Standalone(a), Topology::Standalone(b)) => {
                addr(a.get_connection_info()) == addr(b.get_connection_info())
            }
            #[cfg(feature = "cluster")]
            (Topology::Cluster { seeds: a, .. }, Topology::Cluster { seeds: b, .. }) => {
                match (a, b) {
                    (ClusterSeeds::Nodes(a), ClusterSeeds::Nodes(b)) => {
                        a.iter().any(|x| b.iter().any(|y| addr(x) == addr(y)))
                    }
                    (ClusterSeeds::Builder(a), ClusterSeeds::Builder(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
            }
            #[cfg(feature = "sentinel")]
            (
                Topology::Sentinel {
                    master_name: a,
                    sentinels: sa,
                    ..
                },
                Topology::Sentinel {
                    master_name: b,
                    sentinels: sb,
                    ..
                },
            ) => a == b && sa.iter().any(|x| sb.iter().any(|y| addr(x) == addr(y))),
            _ => false,
        }
    }
}

impl fmt::Debug for Topology {
    // redis-rs's `Debug` of a connection info never shows a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::Standalone(client) => f
                .debug_tuple("Standalone")
                .field(client.get_connection_info())
                .finish(),
            #[cfg(feature = "cluster")]
            Topology::Cluster { seeds, pubsub } => {
                let mut s = f.debug_struct("Cluster");
                match seeds {
                    ClusterSeeds::Nodes(nodes) => s.field("nodes", nodes),
                    ClusterSeeds::Builder(_) => s.field("nodes", &"<the caller's cluster builder>"),
                };
                s.field("pubsub", pubsub).finish()
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel {
                master_name,
                sentinels,
                master,
            } => f
                .debug_struct("Sentinel")
                .field("master_name", master_name)
                .field("sentinels", sentinels)
                .field("master", master)
                .finish(),
        }
    }
}

/// Credentials for the master (and replicas) behind Sentinel; the password never shows in
/// `Debug` output.
#[cfg(feature = "sentinel")]
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct MasterAuth {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

#[cfg(feature = "sentinel")]
impl MasterAuth {
    /// The master connection these credentials stand for (plain TCP, database 0).
    pub(super) fn node_info(&self) -> SentinelNodeConnectionInfo {
        let mut info = redis::RedisConnectionInfo::default().set_password(&self.password);
        if let Some(user) = &self.username {
            info = info.set_username(user);
        }
        SentinelNodeConnectionInfo::default().set_redis_connection_info(info)
    }
}

#[cfg(feature = "sentinel")]
impl fmt::Debug for MasterAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterAuth")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}
