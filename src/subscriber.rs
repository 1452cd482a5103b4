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
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

use crate::error::{Error, Result};

const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
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
        let registry = Arc::new(Registry::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task {
            client,
            connect_timeout,
            command_timeout,
            registry: registry.clone(),
            self_tx: tx.downgrade(),
            rx,
            conn: None,
            epoch: 0,
            subscribed: HashSet::new(),
            backoff: BACKOFF_MIN,
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

struct Connected {
    sink: PubSubSink,
    reader: JoinHandle<()>,
}

struct Task {
    client: redis::Client,
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
}

impl Task {
    async fn run(mut self) {
        let mut acks = Vec::new();
        loop {
            let wants_connection = !self.registry.lock().channels.is_empty();
            let next_sweep = self.registry.sweep(Instant::now());
            let reconnect_at =
                (self.conn.is_none() && wants_connection).then(|| Instant::now() + self.backoff);
            let wake_at = match (next_sweep, reconnect_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
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
        if let Some(conn) = self.conn.take() {
            conn.reader.abort();
        }
    }

    fn absorb(&mut self, request: Request, acks: &mut Vec<oneshot::Sender<()>>) {
        match request {
            Request::Sync(Some(ack)) => acks.push(ack),
            Request::Sync(None) => {}
            Request::Disconnected(epoch) if epoch == self.epoch => self.drop_connection(),
            Request::Disconnected(_) => {}
        }
    }

    fn drop_connection(&mut self) {
        if let Some(conn) = self.conn.take() {
            tracing::warn!("pub/sub connection lost; reconnecting");
            conn.reader.abort();
        }
        self.subscribed.clear();
        for slot in self.registry.lock().channels.values_mut() {
            slot.live = false;
        }
    }

    async fn connect(&mut self) -> bool {
        let attempt =
            tokio::time::timeout(self.connect_timeout, self.client.get_async_pubsub()).await;
        match attempt {
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
                self.conn = Some(Connected { sink, reader });
                self.subscribed.clear();
                self.backoff = BACKOFF_MIN;
                // Every wanted channel must be (re)subscribed on the new connection.
                let mut state = self.registry.lock();
                let all: Vec<String> = state.channels.keys().cloned().collect();
                state.dirty.extend(all);
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "pub/sub connect failed; retrying in {:?}", self.backoff);
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                false
            }
            Err(_) => {
                tracing::warn!("pub/sub connect timed out; retrying in {:?}", self.backoff);
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                false
            }
        }
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
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let timeout = self.command_timeout;
        if !to_unsub.is_empty() {
            match tokio::time::timeout(timeout, conn.sink.unsubscribe(&to_unsub)).await {
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
            match tokio::time::timeout(timeout, conn.sink.subscribe(&to_sub)).await {
                Ok(Ok(())) => {
                    let mut state = self.registry.lock();
                    for c in &to_sub {
                        if let Some(slot) = state.channels.get_mut(c) {
                            slot.live = true;
                        }
                    }
                    drop(state);
                    self.subscribed.extend(to_sub);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "SUBSCRIBE failed");
                    self.drop_connection();
                }
                Err(_) => {
                    tracing::warn!("SUBSCRIBE timed out");
                    self.drop_connection();
                }
            }
        }
    }
}
