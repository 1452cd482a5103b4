//! Following a Sentinel-managed master. The sentinels say where the master is; we keep one
//! multiplexed connection to it and ask them again whenever a command fails in a way a failover
//! explains, and whenever a sentinel announces `+switch-master` for our master. The announcement
//! matters: after a failover the old master can stay up, still a master, for seconds before the
//! sentinels demote it, and a client that kept renewing its locks there would let them expire on
//! the new master. Each new master address bumps a generation that the subscriber watches, so its
//! pub/sub connection moves too.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::ConnectionInfo;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind,
    Value,
};
use tokio::sync::watch;
use tokio_stream::StreamExt;

use crate::error::timed_out;

/// A cheap-to-clone handle on the current master of one Sentinel-monitored group.
#[derive(Clone)]
pub(crate) struct SentinelMaster {
    shared: Arc<Shared>,
}

struct Shared {
    master_name: String,
    /// The sentinels, for the `+switch-master` watcher.
    sentinel_infos: Vec<ConnectionInfo>,
    /// The name of each master connection (`CLIENT SETNAME`).
    conn_name: String,
    /// Asks the sentinels; one discovery at a time.
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Current>,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// Bumped whenever the master address changes.
    moved: watch::Sender<u64>,
    /// Dropped with the client: ends the `+switch-master` watcher.
    _watcher: tokio::sync::oneshot::Sender<()>,
}

#[derive(Default)]
struct Current {
    /// Counts connections made; a failure invalidates only the connection it happened on.
    generation: u64,
    master: Option<Master>,
    /// The last master address seen.
    addr: Option<String>,
    /// Counts `+switch-master` announcements: a discovery that was under way when one arrived
    /// may have been told the old master, so it asks again.
    switches: u64,
}

#[derive(Clone)]
struct Master {
    client: redis::Client,
    conn: MultiplexedConnection,
}

impl SentinelMaster {
    /// Finds the master and connects to it.
    pub(crate) async fn connect(
        master_name: &str,
        sentinels: &[ConnectionInfo],
        node_info: SentinelNodeConnectionInfo,
        conn_name: String,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> RedisResult<SentinelMaster> {
        // An owned name works with both signatures redis-rs has (`String`, and `impl AsRef<str>`
        // when its TLS support is on).
        let service_name: String = master_name.to_owned();
        let client = SentinelClient::build(
            sentinels.to_vec(),
            service_name,
            Some(node_info),
            SentinelServerType::Master,
        )?;
        let (watcher, stop) = tokio::sync::oneshot::channel();
        let master = SentinelMaster {
            shared: Arc::new(Shared {
                master_name: master_name.to_owned(),
                sentinel_infos: sentinels.to_vec(),
                conn_name,
                sentinels: tokio::sync::Mutex::new(client),
                current: Mutex::new(Current::default()),
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(command_timeout)),
                connect_timeout,
                moved: watch::Sender::new(0),
                _watcher: watcher,
            }),
        };
        master.master().await?;
        tokio::spawn(watch_switches(Arc::downgrade(&master.shared), stop));
        Ok(master)
    }

    /// Resolves each time the master address changes.
    pub(crate) fn moves(&self) -> watch::Receiver<u64> {
        self.shared.moved.subscribe()
    }

    /// A client for the current master (for the subscriber's pub/sub connection), with the
    /// generation to pass to [`unreachable`](Self::unreachable) if it cannot be reached.
    pub(crate) async fn client(&self) -> RedisResult<(u64, redis::Client)> {
        let (generation, master) = self.master().await?;
        Ok((generation, master.client))
    }

    /// The master of `generation` could not be reached: ask the sentinels again next time.
    pub(crate) fn unreachable(&self, generation: u64) {
        let mut current = self.current();
        if current.generation == generation {
            current.master = None;
        }
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        self.shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The connection to the current master, asking the sentinels first when there is none.
    async fn master(&self) -> RedisResult<(u64, Master)> {
        {
            let current = self.current();
            if let Some(master) = &current.master {
                return Ok((current.generation, master.clone()));
            }
        }
        let mut sentinels = self.shared.sentinels.lock().await;
        // Someone else may have reconnected while we waited for the sentinels.
        {
            let current = self.current();
            if let Some(master) = &current.master {
                return Ok((current.generation, master.clone()));
            }
        }
        let timeout = self.shared.connect_timeout;
        let (client, conn, mut current) = loop {
            let switches = self.current().switches;
            let client = tokio::time::timeout(timeout, sentinels.async_get_client())
                .await
                .map_err(|_| timed_out("asking the sentinels for the master timed out"))??;
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&self.shared.config)
                .await?;
            crate::conn::names::name_connection(&mut conn, &self.shared.conn_name).await;
            let current = self.current();
            if current.switches == switches {
                break (client, conn, current);
            }
            // A switch was announced while we asked: the answer may name the old master.
        };
        drop(sentinels);
        let addr = client.get_connection_info().addr().to_string();
        let master = Master { client, conn };
        current.generation += 1;
        current.master = Some(master.clone());
        if current.addr.as_deref() != Some(addr.as_str()) {
            if current.addr.is_some() {
                tracing::warn!(master_name = %self.shared.master_name, %addr, "following the new master");
            }
            current.addr = Some(addr);
            self.shared.moved.send_modify(|n| *n += 1);
        }
        Ok((current.generation, master))
    }

    /// A sentinel announced a new master: drop the connection and find the master again now
    /// (which moves the subscriber too).
    async fn switched(&self) {
        {
            let mut current = self.current();
            current.master = None;
            current.switches += 1;
        }
        if let Err(e) = self.master().await {
            tracing::warn!(master_name = %self.shared.master_name, error = %e,
                "the master switched but cannot be reached yet");
        }
    }

    /// The master address the client uses now, if connected.
    fn current_addr(&self) -> Option<String> {
        let current = self.current();
        current.master.as_ref().and(current.addr.clone())
    }

    /// After `error` on the connection of `generation`: forget it if a failover could explain
    /// the error, so the next command asks the sentinels again.
    fn failed(&self, generation: u64, error: &RedisError) {
        let suspicious = matches!(
            error.kind(),
            ErrorKind::Io
                | ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        ) || error.is_unrecoverable_error();
        if suspicious {
            tracing::debug!(master_name = %self.shared.master_name, error = %error,
                "master connection failed; asking the sentinels again");
            self.unreachable(generation);
        }
    }
}

/// Listens for `+switch-master` on one sentinel at a time (the next one when it drops) and
/// follows our master when it moves. On every (re)connection it also asks that sentinel where the
/// master is, in case a switch happened while nobody was listening. Ends with the client.
async fn watch_switches(shared: Weak<Shared>, mut stop: tokio::sync::oneshot::Receiver<()>) {
    let mut backoff = Duration::from_millis(50);
    let mut next = 0usize;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = watch_one(&shared, &mut next, &mut backoff) => {}
        }
    }
}

/// One watch connection: connect to the next sentinel, check, listen until it drops.
async fn watch_one(shared: &Weak<Shared>, next: &mut usize, backoff: &mut Duration) {
    let Some(strong) = shared.upgrade() else {
        return;
    };
    let master = SentinelMaster { shared: strong };
    let infos = &master.shared.sentinel_infos;
    let info = infos[*next % infos.len()].clone();
    let url = info.addr().to_string();
    *next += 1;
    let timeout = master.shared.connect_timeout;
    let name = master.shared.master_name.clone();
    let connected = async {
        let client = redis::Client::open(info)?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe("+switch-master").await?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&name)
            .query_async(&mut conn)
            .await?;
        RedisResult::Ok((pubsub, addr))
    };
    let (pubsub, addr) = match tokio::time::timeout(timeout, connected).await {
        Ok(Ok(ok)) => ok,
        Ok(Err(e)) => {
            tracing::debug!(sentinel = %url, error = %e, "cannot watch this sentinel; trying the next");
            drop(master);
            tokio::time::sleep(*backoff).await;
            *backoff = (*backoff * 2).min(Duration::from_secs(2));
            return;
        }
        Err(_) => {
            tracing::debug!(sentinel = %url, "sentinel did not answer in time; trying the next");
            drop(master);
            tokio::time::sleep(*backoff).await;
            *backoff = (*backoff * 2).min(Duration::from_secs(2));
            return;
        }
    };
    *backoff = Duration::from_millis(50);
    // A switch we did not hear about: the sentinel names another master than ours.
    if let (Some((host, port)), Some(ours)) = (addr, master.current_addr()) {
        if !same_addr(&ours, &host, port) {
            master.switched().await;
        }
    }
    // Only a weak reference while we wait for messages, so the client can go away.
    drop(master);
    let mut messages = pubsub.into_on_message();
    while let Some(msg) = messages.next().await {
        let Ok(payload) = msg.get_payload::<String>() else {
            continue;
        };
        // "<name> <old ip> <old port> <new ip> <new port>"
        if payload.split(' ').next() != Some(name.as_str()) {
            continue;
        }
        let Some(strong) = shared.upgrade() else {
            return;
        };
        tracing::warn!(master_name = %name, %payload, "sentinel announced a new master");
        SentinelMaster { shared: strong }.switched().await;
    }
    tracing::debug!(sentinel = %url, "sentinel watch connection closed; reconnecting");
}

/// Whether `addr` (a `ConnectionAddr` rendered as `host:port`) is `host`:`port`.
fn same_addr(addr: &str, host: &str, port: u16) -> bool {
    addr == format!("{host}:{port}")
}

impl ConnectionLike for SentinelMaster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut master) = self.master().await?;
            let reply = master.conn.req_packed_command(cmd).await;
            if let Err(e) = &reply {
                self.failed(generation, e);
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut master) = self.master().await?;
            let reply = master
                .conn
                .req_packed_commands(pipeline, offset, count)
                .await;
            if let Err(e) = &reply {
                self.failed(generation, e);
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        let current = self.current();
        current
            .master
            .as_ref()
            .map_or(0, |m| m.client.get_connection_info().redis_settings().db())
    }
}
