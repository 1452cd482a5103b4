//! The client builder: every setting with its default, and `validate()`, which checks them all
//! with typed errors before any I/O (`Builder::build` lives in `lock/client.rs`).

#[cfg(feature = "cluster")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
#[cfg(feature = "sentinel")]
use redis::sentinel::SentinelNodeConnectionInfo;

use super::settings::*;
use super::target::ServerAddr;
#[cfg(any(feature = "cluster", feature = "sentinel"))]
use super::topology::connection_infos;
use super::topology::*;
use crate::error::{Error, Result};

/// Builds a [`Client`](crate::Client) with every knob explicit. Each setter documents its default.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::builder()
///     .standalone("redis://127.0.0.1:6379")
///     .watchdog_timeout(Duration::from_secs(30))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Builder {
    topology: Option<Topology>,
    /// A connection setting that could not be turned into a connection info (a malformed URL):
    /// which setter, and why. Reported by `build` as [`Error::InvalidArgument`].
    bad_setting: Option<(&'static str, String)>,
    #[cfg(feature = "sentinel")]
    master_auth: Option<MasterAuth>,
    #[cfg(feature = "sentinel")]
    master_connection: Option<SentinelNodeConnectionInfo>,
    pubsub: PubSubMode,
    watchdog_timeout: Duration,
    waiter_liveness: Duration,
    command_timeout: Duration,
    connect_timeout: Duration,
    timer_tick: Duration,
    timer_slots: usize,
    batch_size: usize,
    replica_sync: Option<ReplicaSync>,
    redisson_wait: Duration,
    metrics_lock_names: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            topology: None,
            bad_setting: None,
            #[cfg(feature = "sentinel")]
            master_auth: None,
            #[cfg(feature = "sentinel")]
            master_connection: None,
            pubsub: PubSubMode::Auto,
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            waiter_liveness: DEFAULT_WAITER_LIVENESS,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timer_tick: DEFAULT_TIMER_TICK,
            timer_slots: DEFAULT_TIMER_SLOTS,
            batch_size: DEFAULT_BATCH_SIZE,
            replica_sync: None,
            redisson_wait: DEFAULT_REDISSON_WAIT,
            metrics_lock_names: false,
        }
    }
}

impl Builder {
    /// A builder with every default. Same as [`Client::builder`](crate::Client::builder).
    pub fn new() -> Self {
        Self::default()
    }

    /// Talk to one Redis server: anything redis-rs accepts as a connection info, such as a URL
    /// (`redis://[user:password@]host:port[/db]`, `rediss://…` for TLS with one of the crate's
    /// `tls-*` features, `redis+unix:///path`), a `(host, port)` pair or a
    /// [`redis::ConnectionInfo`] you built. For custom TLS certificates, a credentials provider or
    /// anything else a [`redis::Client`] carries, use [`standalone_client`](Self::standalone_client).
    /// One of the topology setters is required; the last call wins. A malformed URL is reported
    /// by [`build`](Self::build) as [`Error::InvalidArgument`] (before any I/O).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn standalone(self, info: impl ServerAddr) -> Self {
        let client = info
            .into_connection_info()
            .and_then(redis::Client::open)
            .map(|c| Topology::Standalone(Box::new(c)));
        self.set_topology("standalone", client)
    }

    /// Talk to one Redis server through a [`redis::Client`] you built, with every setting it
    /// carries: for example [`redis::Client::build_with_tls`] with your own CA and client
    /// certificate (crate feature `tls-rustls`). fairlock opens its connections from it and adds
    /// only its own timeouts ([`command_timeout`](Self::command_timeout),
    /// [`connect_timeout`](Self::connect_timeout)) and connection names.
    ///
    /// ```no_run
    /// # async fn demo() -> fairlock::Result<()> {
    /// let redis = fairlock::redis::Client::open("redis://127.0.0.1:6379/2")?;
    /// let client = fairlock::Client::builder().standalone_client(redis).build().await?;
    /// # Ok(()) }
    /// ```
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn standalone_client(self, client: redis::Client) -> Self {
        self.set_topology("standalone", Ok(Topology::Standalone(Box::new(client))))
    }

    /// Talk to a Redis Cluster through these seed nodes (URLs or connection infos, as for
    /// [`standalone`](Self::standalone); one reachable master is enough, the client discovers
    /// the others and follows slot moves and failovers). As in redis-rs, credentials and TLS
    /// come from the first node. For other cluster options (your own certificates, a credentials
    /// provider, TCP settings, an address map) use [`cluster_client`](Self::cluster_client).
    /// Release messages use [`pubsub_mode`](Self::pubsub_mode), [`PubSubMode::Auto`] by default.
    ///
    /// Every key of one lock must live in one slot: fairlock derives the lock's keys from its name
    /// with Redisson's prefix rule, so a plain name is always fine, and a name containing `{` must
    /// carry a non-empty hash tag (`{orders}:42`) or every operation on it is
    /// [`Error::InvalidName`].
    ///
    /// # What a failover does to a lock
    /// Replication is asynchronous. When a master dies, its replica is promoted with whatever it
    /// had received: a lock (and a fair queue) written just before the crash can be missing on the
    /// new master. The client reconnects and re-subscribes on its own; waiters are woken to
    /// re-check, so none hangs. A held lock that the new master still has is renewed as before; one
    /// it lost is reported through [`LockGuard::lost`](crate::LockGuard::lost) at the next renewal
    /// (or at its validity deadline if renewals cannot get through), and another client may take
    /// it from then on. With [`replica_sync`](Self::replica_sync) a grant is only reported once a
    /// replica acknowledged it, which narrows that window but does not close it.
    ///
    /// # Example
    /// ```no_run
    /// # async fn run() -> fairlock::Result<()> {
    /// use fairlock::PubSubMode;
    /// let client = fairlock::Client::builder()
    ///     .cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
    ///     .pubsub_mode(PubSubMode::Auto)
    ///     .build()
    ///     .await?;
    /// let guard = client.fair_lock("{orders}:42").lock().await?;
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<I, T>(self, nodes: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: ServerAddr,
    {
        let pubsub = self.pubsub;
        let cluster = connection_infos(nodes).map(|nodes| Topology::Cluster {
            seeds: ClusterSeeds::Nodes(nodes),
            pubsub,
        });
        self.set_topology("cluster", cluster)
    }

    /// Talk to a Redis Cluster through a [`ClusterClientBuilder`](redis::cluster::ClusterClientBuilder)
    /// of yours, with every option it carries: TLS certificates, credentials or a credentials
    /// provider, TCP settings, an address map, a database. fairlock opens two cluster connections
    /// (commands, and subscriptions only), so it calls `make` once for each, and then sets its
    /// own connect and response timeouts, its retry count, and on the subscription connection
    /// RESP3 with a push sender; those four settings of yours are overridden. Everything said
    /// at [`cluster`](Self::cluster) applies.
    ///
    /// ```no_run
    /// # async fn demo() -> fairlock::Result<()> {
    /// use fairlock::redis::cluster::ClusterClientBuilder;
    /// let client = fairlock::Client::builder()
    ///     .cluster_client(|| {
    ///         ClusterClientBuilder::new(["redis://127.0.0.1:7000"]).password("s3cret")
    ///     })
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_client(
        self,
        make: impl Fn() -> ClusterClientBuilder + Send + Sync + 'static,
    ) -> Self {
        let cluster = Topology::Cluster {
            seeds: ClusterSeeds::Builder(Arc::new(make)),
            pubsub: self.pubsub,
        };
        self.set_topology("cluster", Ok(cluster))
    }

    /// Talk to the master that Redis Sentinel monitors as `master_name`, found through these
    /// sentinels (URLs or connection infos; `rediss://` for sentinels behind TLS, credentials
    /// for the sentinels in their URLs; one that answers is enough). The client asks the
    /// sentinels for the master, checks that the server it reaches calls itself master, and
    /// asks again whenever a sentinel announces `+switch-master` (the client listens on one
    /// sentinel at a time) or a command fails in a way that suggests a failover (a dropped
    /// connection, a timeout, `READONLY`); its pub/sub connection moves to the new master too,
    /// and waiters are woken to re-check. Listening matters: after a failover the old master
    /// can stay up as a master for seconds before the sentinels demote it, and renewals that
    /// kept landing there would let the lock expire on the new master. How the client connects
    /// to the master (TLS, database, credentials) is set with
    /// [`sentinel_master_connection`](Self::sentinel_master_connection), or for credentials
    /// alone [`sentinel_master_auth`](Self::sentinel_master_auth).
    ///
    /// # What a failover does to a lock
    /// As on a [cluster](Self::cluster): the promoted replica has whatever it had received. A held
    /// lock it has is renewed as before; one it lacks is reported through
    /// [`LockGuard::lost`](crate::LockGuard::lost), after which another client may take it.
    /// Waiters ride out the failover (see [`FairLock::lock`](crate::FairLock::lock)) and re-check
    /// on the new master; a fair queue the new master lacks is rebuilt as they re-queue, in the
    /// order they get back. With [`replica_sync`](Self::replica_sync) a grant is reported only once
    /// a replica acknowledged it.
    ///
    /// # Example
    /// ```no_run
    /// # async fn run() -> fairlock::Result<()> {
    /// let client = fairlock::Client::builder()
    ///     .sentinel("mymaster", ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"])
    ///     .build()
    ///     .await?;
    /// let guard = client.fair_lock("orders").lock().await?;
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel<I, T>(self, master_name: impl Into<String>, sentinels: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: ServerAddr,
    {
        let sentinel = connection_infos(sentinels).map(|sentinels| Topology::Sentinel {
            master_name: master_name.into(),
            sentinels,
            master: SentinelNodeConnectionInfo::default(),
        });
        self.set_topology("sentinel", sentinel)
    }

    /// The topology setters' one rule: the last call wins; a setting that could not be turned
    /// into connection infos (a malformed URL) is kept to be reported by `build`, and a later
    /// good setting replaces it.
    fn set_topology(
        mut self,
        setter: &'static str,
        topology: redis::RedisResult<Topology>,
    ) -> Self {
        match topology {
            Ok(topology) => {
                self.bad_setting = None;
                self.topology = Some(topology);
            }
            Err(e) => {
                self.bad_setting = Some((setter, e.to_string()));
                self.topology = None;
            }
        }
        self
    }

    /// How to connect to the master Sentinel names (and to a replica it promotes): TLS mode,
    /// database, credentials, protocol and TCP settings, as redis-rs's
    /// [`SentinelNodeConnectionInfo`](redis::sentinel::SentinelNodeConnectionInfo) holds them.
    /// Defaults to plain TCP, database 0, no credentials. With TLS, the master's certificate is
    /// checked against the system's root certificates; with the `tls-rustls` feature a private
    /// CA goes in the file the `SSL_CERT_FILE` environment variable names (client certificates
    /// for Sentinel-managed masters are not supported yet: redis-rs takes them only through a
    /// builder whose settings this client cannot read back). Only valid with
    /// [`sentinel`](Self::sentinel), and not together with
    /// [`sentinel_master_auth`](Self::sentinel_master_auth) (put the credentials in here).
    ///
    /// ```no_run
    /// # async fn demo() -> fairlock::Result<()> {
    /// use fairlock::redis::sentinel::SentinelNodeConnectionInfo;
    /// use fairlock::redis::RedisConnectionInfo;
    /// let master = SentinelNodeConnectionInfo::default().set_redis_connection_info(
    ///     RedisConnectionInfo::default().set_db(3).set_password("s3cret"),
    /// );
    /// let client = fairlock::Client::builder()
    ///     .sentinel("mymaster", ["redis://127.0.0.1:26379"])
    ///     .sentinel_master_connection(master)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_master_connection(mut self, master: SentinelNodeConnectionInfo) -> Self {
        self.master_connection = Some(master);
        self
    }

    /// Credentials for the master Sentinel names (and for the replicas it may promote), when
    /// it requires authentication: `username` `None` authenticates with the password alone
    /// (`requirepass`), `Some(user)` as that ACL user. Credentials for the sentinels themselves go
    /// in their URLs. Only valid with [`sentinel`](Self::sentinel); a shorthand for
    /// [`sentinel_master_connection`](Self::sentinel_master_connection), which also sets TLS and
    /// the database.
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_master_auth(
        mut self,
        username: Option<&str>,
        password: impl Into<String>,
    ) -> Self {
        self.master_auth = Some(MasterAuth {
            username: username.map(str::to_owned),
            password: password.into(),
        });
        self
    }

    /// How release messages travel on a cluster (see [`PubSubMode`]). Defaults to
    /// [`PubSubMode::Auto`]. Ignored outside a cluster, where messages always use classic pub/sub.
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn pubsub_mode(mut self, mode: PubSubMode) -> Self {
        self.pubsub = mode;
        #[cfg(feature = "cluster")]
        if let Some(Topology::Cluster { pubsub, .. }) = &mut self.topology {
            *pubsub = mode;
        }
        self
    }

    /// TTL of locks taken without a lease; the watchdog renews them every third of it.
    /// Defaults to [`DEFAULT_WATCHDOG_TIMEOUT`] (30 s), as in Redisson. Must be at least 30 ms,
    /// and at least three [`timer_tick`](Self::timer_tick)s (100 ms by default: below 300 ms,
    /// lower the tick too).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// How long a queued fair waiter of this client survives without a heartbeat. Live waiters
    /// are refreshed every third of it, so they are never purged however long the queue; a waiter
    /// whose process died is purged after at most this long. Defaults to
    /// [`DEFAULT_WAITER_LIVENESS`] (5 s). Must be at least 30 ms, and at least three
    /// [`timer_tick`](Self::timer_tick)s (100 ms by default: below 300 ms, lower the tick too).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn waiter_liveness(mut self, window: Duration) -> Self {
        self.waiter_liveness = window;
        self
    }

    /// Upper bound of one Redis round trip; a command that takes longer fails with a timeout
    /// error. Bounds how long `try_lock` can overrun its wait while Redis is unreachable.
    /// Defaults to [`DEFAULT_COMMAND_TIMEOUT`] (3 s).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Upper bound for opening a connection. Defaults to [`DEFAULT_CONNECT_TIMEOUT`] (3 s).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Tick of the timing wheel that drives renewals and heartbeats. Defaults to
    /// [`DEFAULT_TIMER_TICK`] (100 ms). Must be between 1 ms and a third of the smaller of the
    /// watchdog timeout and the waiter liveness window.
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn timer_tick(mut self, tick: Duration) -> Self {
        self.timer_tick = tick;
        self
    }

    /// Slots of the timing wheel. Defaults to [`DEFAULT_TIMER_SLOTS`] (1024).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn timer_slots(mut self, slots: usize) -> Self {
        self.timer_slots = slots;
        self
    }

    /// Locks renewed (or waiters refreshed) per script call; calls due together are pipelined,
    /// ten calls per pipeline.
    /// Defaults to [`DEFAULT_BATCH_SIZE`] (100). Between 1 and 1000.
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn batch_size(mut self, size: usize) -> Self {
        self.batch_size = size;
        self
    }

    /// The longest wait a Redisson client passes to its fair lock on the names this client
    /// shares with it: its `lock()` uses 5 minutes, `tryLock(wait, …)` uses `wait`. Defaults to
    /// [`DEFAULT_REDISSON_WAIT`] (5 minutes).
    ///
    /// Every Redisson acquisition (and every timed-out Redisson wait) moves the deadline of each
    /// waiter behind it that much earlier, fairlock's waiters included ([PROTOCOL 4]). fairlock's
    /// waiters keep one such margin in their deadline per Redisson waiter ahead of them, so
    /// Redisson's purge never takes a live one of ours for dead; whether one of ours is alive is
    /// judged by a liveness mark Redisson does not touch. A Redisson client that waits longer
    /// than this on the same fair lock can make a live fairlock waiter lose its place (it then
    /// rejoins at the head, out of order). Nothing changes for queues without Redisson waiters.
    ///
    /// [PROTOCOL 4]: crate::protocol
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn redisson_wait(mut self, wait: Duration) -> Self {
        self.redisson_wait = wait;
        self
    }

    /// Label per-lock metrics with the lock's name (`lock="…"`), on top of their kind. Off by
    /// default: lock names can be unbounded, and every distinct name is a new time series in the
    /// metrics backend. Only has an effect with the crate's `metrics` feature (see the README for
    /// every metric).
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn metrics_lock_names(mut self, on: bool) -> Self {
        self.metrics_lock_names = on;
        self
    }

    /// After every successful acquisition, send `WAIT <replicas> <timeout>` so the lock write
    /// reaches the master's replicas before the caller proceeds (Redisson's replica sync). When
    /// the master has replicas and none acknowledged within `timeout`, the hold just taken is
    /// released again and `on_failure` decides: [`SyncFailure::Error`] returns
    /// [`Error::ReplicasNotSynced`], [`SyncFailure::Retry`] tries again within the caller's wait.
    /// With no replica connected, acquisitions proceed unsynced.
    ///
    /// This narrows, but does not close, the window in which a failover loses a lock: replication
    /// stays asynchronous and a replica that acknowledged can still lose the write. `WAIT` also
    /// holds up the client's shared command connection until it returns. Off by default.
    #[must_use = "builder methods return the changed value; the original is unchanged"]
    pub fn replica_sync(mut self, timeout: Duration, on_failure: SyncFailure) -> Self {
        self.replica_sync = Some(ReplicaSync {
            timeout,
            on_failure,
        });
        self
    }

    /// Validates the settings without connecting.
    pub(crate) fn validate(&self) -> Result<Config> {
        if let Some((argument, reason)) = &self.bad_setting {
            return Err(Error::invalid_argument(argument, reason.clone()));
        }
        #[allow(unused_mut)] // changed only for Sentinel
        let mut topology = self.topology.clone().ok_or_else(|| {
            Error::invalid_argument(
                "topology",
                "call .standalone(url), .cluster(nodes) or .sentinel(name, sentinels) before .build()",
            )
        })?;
        #[cfg(feature = "sentinel")]
        let sentinel_only = |argument: &'static str| {
            Error::invalid_argument(
                argument,
                "only applies to .sentinel(..); put credentials in the URL otherwise",
            )
        };
        #[allow(unreachable_patterns)] // without the cluster and sentinel features
        match &mut topology {
            #[cfg(feature = "cluster")]
            Topology::Cluster {
                seeds: ClusterSeeds::Nodes(nodes),
                ..
            } if nodes.is_empty() => {
                return Err(Error::invalid_argument(
                    "cluster",
                    "needs at least one seed node",
                ));
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { master_name, .. } if master_name.is_empty() => {
                return Err(Error::invalid_argument(
                    "sentinel",
                    "the master name is empty",
                ));
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { sentinels, .. } if sentinels.is_empty() => {
                return Err(Error::invalid_argument(
                    "sentinel",
                    "needs at least one sentinel",
                ));
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { master, .. } => match (&self.master_auth, &self.master_connection)
            {
                (Some(_), Some(_)) => {
                    return Err(Error::invalid_argument(
                        "sentinel_master_auth",
                        "set the credentials in .sentinel_master_connection(..) instead",
                    ))
                }
                (Some(auth), None) => *master = auth.node_info(),
                (None, Some(info)) => *master = info.clone(),
                (None, None) => {}
            },
            #[cfg(feature = "sentinel")]
            _ if self.master_auth.is_some() => {
                return Err(sentinel_only("sentinel_master_auth"));
            }
            #[cfg(feature = "sentinel")]
            _ if self.master_connection.is_some() => {
                return Err(sentinel_only("sentinel_master_connection"));
            }
            _ => {}
        }
        let min = Duration::from_millis(30);
        duration_ms("watchdog_timeout", self.watchdog_timeout)?;
        duration_ms("waiter_liveness", self.waiter_liveness)?;
        duration_ms("command_timeout", self.command_timeout)?;
        duration_ms("connect_timeout", self.connect_timeout)?;
        duration_ms("timer_tick", self.timer_tick)?;
        if self.watchdog_timeout < min {
            return Err(Error::invalid_argument(
                "watchdog_timeout",
                "must be at least 30 ms",
            ));
        }
        if self.waiter_liveness < min {
            return Err(Error::invalid_argument(
                "waiter_liveness",
                "must be at least 30 ms",
            ));
        }
        if self.timer_tick * 3 > self.watchdog_timeout.min(self.waiter_liveness) {
            return Err(Error::invalid_argument(
                "timer_tick",
                "must be at most a third of the watchdog timeout and of the waiter liveness window",
            ));
        }
        if self.timer_slots == 0 || self.timer_slots > 1 << 20 {
            return Err(Error::invalid_argument(
                "timer_slots",
                "must be between 1 and 2^20",
            ));
        }
        if self.batch_size == 0 || self.batch_size > 1000 {
            return Err(Error::invalid_argument(
                "batch_size",
                "must be between 1 and 1000",
            ));
        }
        if let Some(sync) = &self.replica_sync {
            duration_ms("replica_sync timeout", sync.timeout)?;
        }
        duration_ms("redisson_wait", self.redisson_wait)?;
        Ok(Config {
            topology,
            watchdog_timeout: self.watchdog_timeout,
            waiter_liveness: self.waiter_liveness,
            command_timeout: self.command_timeout,
            connect_timeout: self.connect_timeout,
            timer_tick: self.timer_tick,
            timer_slots: self.timer_slots,
            batch_size: self.batch_size,
            replica_sync: self.replica_sync,
            redisson_wait: self.redisson_wait,
            metrics_lock_names: self.metrics_lock_names,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(feature = "cluster", feature = "sentinel"))]
    fn redacts_passwords() {
        let b = Builder::new().standalone("redis://u:pw@h:1");
        assert!(!format!("{b:?}").contains("pw"));
        let b = Builder::new().cluster(["redis://u:pw@h:1", "redis://h:2"]);
        assert!(!format!("{b:?}").contains("pw"));
        let b = Builder::new().sentinel("m", ["redis://u:pw@h:1"]);
        assert!(!format!("{b:?}").contains("pw"));
        let b = Builder::new()
            .sentinel("m", ["redis://h:1"])
            .sentinel_master_auth(Some("u"), "pw");
        assert!(!format!("{b:?}").contains("pw"));
        assert!(!format!("{:?}", b.validate().unwrap()).contains("pw"));
    }

    #[test]
    #[cfg(feature = "sentinel")]
    fn sentinel_needs_a_name_and_a_sentinel() {
        let empty: [&str; 0] = [];
        let err = Builder::new().sentinel("m", empty).validate().unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
        let err = Builder::new()
            .sentinel("", ["redis://h:1"])
            .validate()
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
        assert!(matches!(
            Builder::new()
                .sentinel("m", ["redis://h:1"])
                .validate()
                .unwrap()
                .topology,
            Topology::Sentinel { .. }
        ));
    }

    #[test]
    #[cfg(feature = "sentinel")]
    fn one_server_in_two_databases_is_one_deployment() {
        let topology = |url: &str| Builder::new().standalone(url).validate().unwrap().topology;
        let (a, b) = (topology("redis://h:1/0"), topology("redis://h:1/3"));
        assert!(a.same_deployment(&b));
        assert!(!a.same_deployment(&topology("redis://h:2/0")));
        let sentinel = Builder::new()
            .sentinel("m", ["redis://s:1"])
            .validate()
            .unwrap()
            .topology;
        assert!(!a.same_deployment(&sentinel));
    }

    #[test]
    #[cfg(feature = "sentinel")]
    fn a_malformed_url_is_kept_until_build_and_a_later_good_one_replaces_it() {
        let err = Builder::new()
            .standalone("nonsense")
            .validate()
            .unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        assert!(Builder::new()
            .standalone("nonsense")
            .standalone("redis://h:1")
            .validate()
            .is_ok());
        let err = Builder::new()
            .standalone("redis://h:1")
            .sentinel_master_connection(Default::default())
            .validate()
            .unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
    }

    #[test]
    #[cfg(feature = "cluster")]
    fn pubsub_mode_applies_in_either_order() {
        let want = |b: Builder| match b.validate().unwrap().topology {
            Topology::Cluster { pubsub, .. } => pubsub,
            other => panic!("{other:?}"),
        };
        let a = Builder::new()
            .pubsub_mode(PubSubMode::Classic)
            .cluster(["redis://h:1"]);
        let b = Builder::new()
            .cluster(["redis://h:1"])
            .pubsub_mode(PubSubMode::Classic);
        assert_eq!(want(a), PubSubMode::Classic);
        assert_eq!(want(b), PubSubMode::Classic);
        assert_eq!(
            want(Builder::new().cluster(["redis://h:1"])),
            PubSubMode::Auto
        );
    }

    #[test]
    fn validation_rejects_bad_settings() {
        assert!(Builder::new().validate().is_err());
        let ok = Builder::new().standalone("redis://127.0.0.1:1");
        assert!(ok.clone().validate().is_ok());
        for b in [
            ok.clone().watchdog_timeout(Duration::ZERO),
            ok.clone().watchdog_timeout(Duration::from_millis(10)),
            ok.clone().watchdog_timeout(Duration::MAX),
            ok.clone().waiter_liveness(Duration::ZERO),
            ok.clone().timer_tick(Duration::from_secs(20)),
            ok.clone().timer_slots(0),
            ok.clone().batch_size(0),
            ok.clone().command_timeout(Duration::from_nanos(10)),
        ] {
            assert!(b.validate().unwrap_err().is_invalid_input());
        }
        #[cfg(feature = "cluster")]
        assert!(Builder::new()
            .cluster(Vec::<String>::new())
            .validate()
            .unwrap_err()
            .is_invalid_input());
    }
}
