//! The client's one pub/sub connection, carrying every channel its waiters listen on.
//!
//! Waiters register a channel and get a [`Subscription`] whose [`Notify`] is poked (`notify_one`)
//! for every message on that channel. Messages are hints, never the truth: a waiter always re-runs
//! its acquire script after a wake-up, so a spurious wake costs one round trip and a lost one costs
//! latency, never correctness.
//!
//! A channel nobody waits on any more stays subscribed for a short linger period: a holder that
//! waits again soon (a busy lock, a retry loop) re-takes its live channel without a round trip, and
//! can make its very first attempt already subscribed.
//!
//! Outside a cluster the connection is a dedicated RESP2 pub/sub connection (behind Sentinel, to
//! the current master, moved when the master moves). On a cluster it is a RESP3 cluster connection
//! that carries nothing but subscriptions (each node's connection carries its own, and redis-rs
//! re-subscribes them after a reconnect or a slot move); sharded channels are subscribed one by one
//! on the master of their slot, a channel the server drops (its slot migrated) is subscribed again
//! and its waiters woken, and after any topology event every channel is subscribed again twice
//! over the next seconds.
//!
//! One background task owns the connection and reconciles what Redis has subscribed with what the
//! registry wants: registrations and drops only mark channels dirty, and the task issues one
//! `SUBSCRIBE`/`UNSUBSCRIBE` for everything dirty at once, in order, so an unsubscribe can never
//! overtake a later subscribe of the same channel. When the connection drops, the task reconnects
//! with backoff, resubscribes everything, and then wakes every waiter to re-check, because any
//! message published while it was away is gone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::aio::PubSubSink;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

use crate::conn::Pushes;
use crate::error::{Error, Result};
use crate::ops::join_all;
use crate::sentinel::SentinelMaster;

const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// After a cluster topology event (a subscription dropped by the server, a node connection
/// lost), every wanted channel is subscribed again this long after it, and again
/// `RESYNC_SECOND` later: slot maps and node connections settle over a few seconds, and a
/// subscription made in between can be lost with a connection the cluster client replaces.
/// Subscribing again is idempotent on the connection that already has it.
const RESYNC_FIRST: Duration = Duration::from_secs(1);
const RESYNC_SECOND: Duration = Duration::from_secs(3);
/// How long an unused channel stays subscribed.
const LINGER: Duration = Duration::from_secs(3);
/// At most this many unused channels linger; beyond it the oldest are dropped first.
const MAX_LINGERING: usize = 4096;

/// Registry of wanted channels, shared by the handles and the background task.
#[derive(Debug, Default)]
struct Registry {
    state: Mutex<RegistryState>,
}

#[derive(Debug, Default)]
struct RegistryState {
    /// Channel → interest. A channel is wanted while `refs > 0`.
    channels: HashMap<String, Slot>,
    /// Channels whose wanted state changed since the task last looked.
    dirty: Vec<String>,
}

#[derive(Debug)]
struct Slot {
    refs: usize,
    notify: Arc<Notify>,
    /// Confirmed subscribed on the current connection.
    live: bool,
    /// When the last user left (the slot lingers until `LINGER` after this).
    idle_since: Option<Instant>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, RegistryState> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is a
        // single insert/remove), so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, channel: &str) -> bool {
        match self.lock().channels.get(channel) {
            Some(slot) => {
                slot.notify.notify_one();
                true
            }
            None => false,
        }
    }

    fn wake_all(&self) {
        for slot in self.lock().channels.values() {
            slot.notify.notify_one();
        }
    }

    /// Takes one more reference on `channel`, creating its slot if needed. Returns the notify and
    /// whether the channel is already live (no round trip needed). A slot taken back from
    /// lingering gets a fresh `Notify`, so a stale wake-up stored for its previous user is dropped.
    fn take(&self, channel: &str) -> (Arc<Notify>, bool) {
        let mut state = self.lock();
        let state = &mut *state;
        let slot = match state.channels.get_mut(channel) {
            Some(slot) => slot,
            None => {
                state.dirty.push(channel.to_owned());
                state.channels.entry(channel.to_owned()).or_insert(Slot {
                    refs: 0,
                    notify: Arc::new(Notify::new()),
                    live: false,
                    idle_since: None,
                })
            }
        };
        if slot.refs == 0 && slot.idle_since.take().is_some() {
            slot.notify = Arc::new(Notify::new());
        }
        slot.refs += 1;
        (slot.notify.clone(), slot.live)
    }

    /// Drops channels that have lingered unused for long enough (or too many of them); returns
    /// the time of the next expiry, if any slot still lingers.
    fn sweep(&self, now: Instant) -> Option<Instant> {
        let mut state = self.lock();
        let mut idle: Vec<(Instant, String)> = state
            .channels
            .iter()
            .filter_map(|(c, s)| s.idle_since.map(|t| (t, c.clone())))
            .collect();
        idle.sort();
        let excess = idle.len().saturating_sub(MAX_LINGERING);
        let mut next = None;
        for (i, (since, channel)) in idle.into_iter().enumerate() {
            if i < excess || now >= since + LINGER {
                state.channels.remove(&channel);
                state.dirty.push(channel);
            } else {
                next = Some(next.map_or(since + LINGER, |n: Instant| n.min(since + LINGER)));
            }
        }
        next
    }
}

enum Request {
    /// Reconcile dirty channels; answer once Redis has confirmed (or the connection is down and
    /// the reconnect will resubscribe and wake everyone).
    Sync(Option<oneshot::Sender<()>>),
    /// The reader of connection `epoch` saw its stream end.
    Disconnected(u64),
    /// The server dropped one of our subscriptions (a cluster slot moved): subscribe again.
    Dropped(String),
    /// Sentinel named a new master: move the connection there.
    MasterMoved,
    /// A cluster node connection dropped: the topology may be changing.
    TopologyChanged,
}

/// Handle on the client's subscriber task.
#[derive(Debug)]
pub(crate) struct Subscriber {
    registry: Arc<Registry>,
    tx: mpsc::UnboundedSender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Sync(_) => f.write_str("Sync"),
            Request::Disconnected(e) => write!(f, "Disconnected({e})"),
            Request::Dropped(c) => write!(f, "Dropped({c})"),
            Request::MasterMoved => f.write_str("MasterMoved"),
            Request::TopologyChanged => f.write_str("TopologyChanged"),
        }
    }
}

impl Subscriber {
    /// Starts the background task for a classic (`SUBSCRIBE`) connection to `client`.
    pub(crate) fn start(
        client: redis::Client,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        Self::start_with(
            Transport::Classic(client),
            connect_timeout,
            command_timeout,
            None,
        )
    }

    /// Starts the background task for a classic connection to the master `master` follows; the
    /// connection moves when the master does.
    pub(crate) fn start_sentinel(
        master: SentinelMaster,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        Self::start_with(
            Transport::Sentinel(master),
            connect_timeout,
            command_timeout,
            None,
        )
    }

    /// Starts the background task on a cluster connection and its push messages.
    pub(crate) fn start_cluster(
        conn: ClusterConnection,
        sharded: bool,
        pushes: Pushes,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        Self::start_with(
            Transport::Cluster { conn, sharded },
            connect_timeout,
            command_timeout,
            Some(pushes),
        )
    }

    fn start_with(
        transport: Transport,
        connect_timeout: Duration,
        command_timeout: Duration,
        pushes: Option<Pushes>,
    ) -> Self {
        let registry = Arc::new(Registry::default());
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(pushes) = pushes {
            tokio::spawn(read_pushes(pushes, registry.clone(), tx.downgrade()));
        }
        if let Transport::Sentinel(master) = &transport {
            tokio::spawn(follow_master(master.moves(), tx.downgrade()));
        }
        let task = Task {
            transport,
            connect_timeout,
            command_timeout,
            registry: registry.clone(),
            self_tx: tx.downgrade(),
            rx,
            conn: None,
            epoch: 0,
            subscribed: HashSet::new(),
            backoff: BACKOFF_MIN,
            resync: None,
        };
        tokio::spawn(task.run());
        Subscriber { registry, tx }
    }

    /// Registers interest in `channel` and returns once a message published on it from now on
    /// will reach the returned subscription (or, while disconnected, once the reconnect is sure to
    /// wake it).
    pub(crate) async fn subscribe(&self, channel: String) -> Result<Subscription> {
        let (notify, live) = self.registry.take(&channel);
        // From here on the subscription exists, so a dropped future unregisters through Drop.
        let subscription = Subscription {
            channel,
            notify,
            registry: self.registry.clone(),
            tx: self.tx.clone(),
        };
        if live {
            return Ok(subscription);
        }
        let (ack_tx, ack_rx) = oneshot::channel();
        self.tx
            .send(Request::Sync(Some(ack_tx)))
            .map_err(|_| Error::Shutdown)?;
        ack_rx.await.map_err(|_| Error::Shutdown)?;
        Ok(subscription)
    }

    /// The subscription to `channel` when it is live already (lingering from an earlier wait):
    /// no round trip, and a message published from now on reaches it.
    pub(crate) fn subscribe_if_live(&self, channel: &str) -> Option<Subscription> {
        {
            let state = self.registry.lock();
            if !state.channels.get(channel).is_some_and(|s| s.live) {
                return None;
            }
        }
        let (notify, live) = self.registry.take(channel);
        let subscription = Subscription {
            channel: channel.to_owned(),
            notify,
            registry: self.registry.clone(),
            tx: self.tx.clone(),
        };
        // Lost the race with a disconnect: the caller subscribes the slow way (and the dirty
        // slot is resubscribed on reconnect).
        live.then_some(subscription)
    }

    /// Wakes every registered waiter (used on shutdown).
    pub(crate) fn wake_all(&self) {
        self.registry.wake_all();
    }
}

/// Interest in one channel; dropping it unsubscribes (in the background) when it was the last.
#[derive(Debug)]
pub(crate) struct Subscription {
    channel: String,
    notify: Arc<Notify>,
    registry: Arc<Registry>,
    tx: mpsc::UnboundedSender<Request>,
}

impl Subscription {
    /// Poked once per message on the channel (a permit is stored when nobody is waiting).
    pub(crate) fn notify(&self) -> &Arc<Notify> {
        &self.notify
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        let first_idle = match state.channels.get_mut(&self.channel) {
            Some(slot) => {
                slot.refs -= 1;
                if slot.refs == 0 {
                    // Linger instead of unsubscribing: the task sweeps it later.
                    slot.idle_since = Some(Instant::now());
                }
                slot.refs == 0
            }
            None => false,
        };
        drop(state);
        if first_idle {
            // No I/O here; this only makes the task schedule its sweep.
            let _ = self.tx.send(Request::Sync(None));
        }
    }
}

/// Where subscriptions live.
enum Transport {
    /// A dedicated RESP2 pub/sub connection opened from this client, reopened after a drop.
    Classic(redis::Client),
    /// The subscription-only RESP3 cluster connection (it reconnects by itself).
    Cluster {
        conn: ClusterConnection,
        sharded: bool,
    },
    /// A classic connection to the master Sentinel names, reopened where the master is now.
    Sentinel(SentinelMaster),
}

/// Moves the pub/sub connection whenever the master does: a message published on the new master
/// would never reach a connection left on the old one.
async fn follow_master(
    mut moves: tokio::sync::watch::Receiver<u64>,
    tx: mpsc::WeakUnboundedSender<Request>,
) {
    moves.borrow_and_update();
    while moves.changed().await.is_ok() {
        let Some(tx) = tx.upgrade() else { return };
        if tx.send(Request::MasterMoved).is_err() {
            return;
        }
    }
}

/// The live side of the transport.
enum Connected {
    Classic {
        sink: PubSubSink,
        reader: JoinHandle<()>,
    },
    Cluster,
}

struct Task {
    transport: Transport,
    connect_timeout: Duration,
    command_timeout: Duration,
    registry: Arc<Registry>,
    /// Weak, so the task ends when every handle is gone.
    self_tx: mpsc::WeakUnboundedSender<Request>,
    rx: mpsc::UnboundedReceiver<Request>,
    conn: Option<Connected>,
    epoch: u64,
    /// What Redis has confirmed on the current connection.
    subscribed: HashSet<String>,
    backoff: Duration,
    /// Cluster only: when to subscribe every wanted channel again, and whether another round
    /// follows that one.
    resync: Option<(Instant, bool)>,
}

/// The channel a push message is about (its first element).
fn push_channel(push: &PushInfo) -> Option<String> {
    match push.data.first()? {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Reads a cluster connection's push messages for the client's lifetime: wakes the waiters of a
/// channel a message arrived on, wakes everyone when a node connection dropped (messages may have
/// been lost while redis-rs reconnects and re-subscribes), and reports subscriptions the server
/// dropped on its own.
async fn read_pushes(
    mut pushes: Pushes,
    registry: Arc<Registry>,
    tx: mpsc::WeakUnboundedSender<Request>,
) {
    while let Some(push) = pushes.recv().await {
        tracing::trace!(kind = ?push.kind, data = ?push.data, "push");
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(channel) = push_channel(&push) {
                    if !registry.notify(&channel) {
                        tracing::trace!(channel, "message on a channel nobody waits on");
                    }
                }
            }
            PushKind::Disconnection => {
                tracing::warn!("a cluster node connection dropped; every waiter re-checks");
                registry.wake_all();
                let Some(tx) = tx.upgrade() else { break };
                let _ = tx.send(Request::TopologyChanged);
            }
            PushKind::SUnsubscribe | PushKind::Unsubscribe => {
                // Either the confirmation of our own unsubscribe (the channel is no longer
                // wanted) or the server dropping a wanted one: its slot moved to another shard.
                let Some(channel) = push_channel(&push) else {
                    continue;
                };
                if registry.lock().channels.contains_key(&channel) {
                    let Some(tx) = tx.upgrade() else { break };
                    let _ = tx.send(Request::Dropped(channel));
                }
            }
            _ => {}
        }
    }
}

impl Task {
    async fn run(mut self) {
        let mut acks = Vec::new();
        loop {
            let wants_connection = !self.registry.lock().channels.is_empty();
            let next_sweep = self.registry.sweep(Instant::now());
            let reconnect_at =
                (self.conn.is_none() && wants_connection).then(|| Instant::now() + self.backoff);
            let resync_at = self.resync.map(|(at, _)| at);
            let wake_at = [next_sweep, reconnect_at, resync_at]
                .into_iter()
                .flatten()
                .min();
            let request = match wake_at {
                Some(at) => tokio::select! {
                    r = self.rx.recv() => r,
                    _ = tokio::time::sleep_until(at.into()) => Some(Request::Sync(None)),
                },
                None => self.rx.recv().await,
            };
            let Some(request) = request else { break };
            self.absorb(request, &mut acks);
            while let Ok(request) = self.rx.try_recv() {
                self.absorb(request, &mut acks);
            }

            if let Some((at, again)) = self.resync {
                if Instant::now() >= at {
                    self.resync = again.then(|| (Instant::now() + RESYNC_SECOND, false));
                    self.resubscribe_all();
                }
            }
            let mut reconnected = false;
            if self.conn.is_none() && !self.registry.lock().channels.is_empty() {
                reconnected = self.connect().await;
            }
            if self.conn.is_some() {
                self.reconcile().await;
            }
            if reconnected && self.conn.is_some() {
                // Anything published while we were away is lost: everyone re-checks.
                tracing::debug!("subscriber reconnected; waking every waiter to re-check");
                self.registry.wake_all();
            }
            for ack in acks.drain(..) {
                let _ = ack.send(());
            }
        }
        if let Some(Connected::Classic { reader, .. }) = self.conn.take() {
            reader.abort();
        }
    }

    fn absorb(&mut self, request: Request, acks: &mut Vec<oneshot::Sender<()>>) {
        match request {
            Request::Sync(Some(ack)) => acks.push(ack),
            Request::Sync(None) => {}
            Request::Disconnected(epoch) if epoch == self.epoch => self.drop_connection(),
            Request::Disconnected(_) => {}
            Request::MasterMoved => {
                if self.conn.is_some() {
                    tracing::warn!("the master moved; moving the pub/sub connection");
                    self.drop_connection();
                }
            }
            Request::TopologyChanged => self.schedule_resync(),
            Request::Dropped(channel) => {
                self.schedule_resync();
                tracing::debug!(
                    channel,
                    "subscription dropped by the server; subscribing again"
                );
                self.subscribed.remove(&channel);
                let mut state = self.registry.lock();
                if let Some(slot) = state.channels.get_mut(&channel) {
                    slot.live = false;
                    slot.notify.notify_one();
                }
                state.dirty.push(channel);
            }
        }
    }

    /// Cluster only: subscribe every wanted channel again soon, and once more later.
    fn schedule_resync(&mut self) {
        if matches!(self.transport, Transport::Cluster { .. }) {
            self.resync = Some((Instant::now() + RESYNC_FIRST, true));
        }
    }

    /// Marks every wanted channel for subscribing again (the next reconcile sends them): on a
    /// new connection, or after a cluster topology change.
    fn resubscribe_all(&mut self) {
        tracing::debug!("subscribing every channel again");
        self.subscribed.clear();
        let mut state = self.registry.lock();
        let all: Vec<String> = state.channels.keys().cloned().collect();
        state.dirty.extend(all);
    }

    fn drop_connection(&mut self) {
        match self.conn.take() {
            Some(Connected::Classic { reader, .. }) => {
                tracing::warn!("pub/sub connection lost; reconnecting");
                reader.abort();
            }
            Some(Connected::Cluster) => {
                tracing::warn!("cluster subscriptions failed; subscribing everything again");
            }
            None => {}
        }
        self.subscribed.clear();
        for slot in self.registry.lock().channels.values_mut() {
            slot.live = false;
        }
    }

    async fn connect(&mut self) -> bool {
        let mut sentinel_generation = None;
        let client = match &self.transport {
            Transport::Classic(client) => client.clone(),
            Transport::Sentinel(master) => match master.client().await {
                Ok((generation, client)) => {
                    sentinel_generation = Some(generation);
                    client
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no master to subscribe on; retrying in {:?}", self.backoff);
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    return false;
                }
            },
            Transport::Cluster { .. } => {
                // The cluster connection reconnects by itself; "connecting" here means
                // subscribing every wanted channel again (the backoff resets once that worked).
                self.conn = Some(Connected::Cluster);
                self.resubscribe_all();
                return true;
            }
        };
        let error =
            match tokio::time::timeout(self.connect_timeout, client.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => {
                    let (sink, mut stream) = pubsub.split();
                    self.epoch += 1;
                    let epoch = self.epoch;
                    let registry = self.registry.clone();
                    let tx = self.self_tx.clone();
                    let reader = tokio::spawn(async move {
                        while let Some(msg) = stream.next().await {
                            let channel = msg.get_channel_name();
                            if !registry.notify(channel) {
                                tracing::trace!(channel, "message on a channel nobody waits on");
                            }
                        }
                        if let Some(tx) = tx.upgrade() {
                            let _ = tx.send(Request::Disconnected(epoch));
                        }
                    });
                    self.conn = Some(Connected::Classic { sink, reader });
                    self.backoff = BACKOFF_MIN;
                    // Every wanted channel must be (re)subscribed on the new connection.
                    self.resubscribe_all();
                    return true;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "timed out".to_owned(),
            };
        if let (Transport::Sentinel(master), Some(generation)) =
            (&self.transport, sentinel_generation)
        {
            master.unreachable(generation);
        }
        tracing::warn!(%error, "pub/sub connect failed; retrying in {:?}", self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        false
    }

    /// Brings the server-side subscriptions in line with the registry for every dirty channel.
    async fn reconcile(&mut self) {
        let (to_sub, to_unsub) = {
            let mut state = self.registry.lock();
            let dirty = std::mem::take(&mut state.dirty);
            let mut to_sub = Vec::new();
            let mut to_unsub = Vec::new();
            let mut seen = HashSet::new();
            for channel in dirty {
                if !seen.insert(channel.clone()) {
                    continue;
                }
                let wanted = state.channels.contains_key(&channel);
                let have = self.subscribed.contains(&channel);
                if wanted && !have {
                    to_sub.push(channel);
                } else if !wanted && have {
                    to_unsub.push(channel);
                }
            }
            (to_sub, to_unsub)
        };
        if self.conn.is_none() {
            return;
        }
        let timeout = self.command_timeout;
        if !to_unsub.is_empty() {
            match tokio::time::timeout(timeout, self.unsubscribe(&to_unsub)).await {
                Ok(Ok(())) => {
                    for c in &to_unsub {
                        self.subscribed.remove(c);
                    }
                }
                _ => {
                    self.drop_connection();
                    return;
                }
            }
        }
        if !to_sub.is_empty() {
            match tokio::time::timeout(timeout, self.subscribe(&to_sub)).await {
                Ok(Ok(())) => {
                    let mut state = self.registry.lock();
                    for c in &to_sub {
                        if let Some(slot) = state.channels.get_mut(c) {
                            slot.live = true;
                        }
                    }
                    drop(state);
                    self.subscribed.extend(to_sub);
                    if matches!(self.conn, Some(Connected::Cluster)) {
                        self.backoff = BACKOFF_MIN;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "SUBSCRIBE failed");
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    self.drop_connection();
                }
                Err(_) => {
                    tracing::warn!("SUBSCRIBE timed out");
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    self.drop_connection();
                }
            }
        }
    }

    async fn subscribe(&mut self, channels: &[String]) -> redis::RedisResult<()> {
        self.set_subscribed(channels, true).await
    }

    async fn unsubscribe(&mut self, channels: &[String]) -> redis::RedisResult<()> {
        self.set_subscribed(channels, false).await
    }

    /// Subscribes (`on`) or unsubscribes `channels` on the current transport.
    async fn set_subscribed(&mut self, channels: &[String], on: bool) -> redis::RedisResult<()> {
        match (&mut self.conn, &mut self.transport) {
            (Some(Connected::Classic { sink, .. }), _) if on => sink.subscribe(channels).await,
            (Some(Connected::Classic { sink, .. }), _) => sink.unsubscribe(channels).await,
            (
                Some(Connected::Cluster),
                Transport::Cluster {
                    conn,
                    sharded: true,
                },
            ) => {
                // One call per channel: each goes to the master of its own slot.
                let replies = join_all(channels.iter().map(|c| {
                    let mut conn = conn.clone();
                    async move {
                        if on {
                            conn.ssubscribe(c).await
                        } else {
                            conn.sunsubscribe(c).await
                        }
                    }
                }))
                .await;
                replies.into_iter().collect()
            }
            (Some(Connected::Cluster), Transport::Cluster { conn, .. }) if on => {
                conn.subscribe(channels).await
            }
            (Some(Connected::Cluster), Transport::Cluster { conn, .. }) => {
                conn.unsubscribe(channels).await
            }
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no pub/sub connection",
            ))),
        }
    }
}
