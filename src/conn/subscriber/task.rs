//! The subscriber's background task: it owns the pub/sub connection and reconciles what Redis has
//! subscribed with what the registry wants. Registrations and drops only mark channels dirty; the
//! task sends one `SUBSCRIBE` / `UNSUBSCRIBE` for everything dirty at once, in order, so an
//! unsubscribe never overtakes a later subscribe of the same channel. When the connection drops it
//! reconnects with backoff, resubscribes everything, and then wakes every waiter to re-check,
//! because any message published while it was away is gone. On a cluster, after any topology
//! event, every channel is subscribed again twice over the next seconds.
//!
//! It must never hold the registry's lock across an await, and never acknowledge a subscription
//! before Redis confirmed it (or before a reconnect is certain to wake its waiter).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::order::Order;
use super::registry::Registry;
use super::transport::{self, Connected, Transport};

const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// After a cluster topology event (a subscription dropped by the server, a node connection
/// lost), every wanted channel is subscribed again this long after it, and again
/// `RESYNC_SECOND` later: slot maps and node connections settle over a few seconds, and a
/// subscription made in between can be lost with a connection the cluster client replaces.
/// Subscribing again is idempotent on the connection that already has it.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
const RESYNC_FIRST: Duration = Duration::from_secs(1);
const RESYNC_SECOND: Duration = Duration::from_secs(3);

pub(super) struct Task {
    transport: Transport,
    /// The name of the subscription connections (`CLIENT SETNAME`).
    name: String,
    connect_timeout: Duration,
    command_timeout: Duration,
    registry: Arc<Registry>,
    /// Weak, so the task ends when every handle is gone.
    self_tx: mpsc::WeakUnboundedSender<Order>,
    rx: mpsc::UnboundedReceiver<Order>,
    conn: Option<Connected>,
    epoch: u64,
    /// What Redis has confirmed on the current connection.
    subscribed: HashSet<String>,
    backoff: Duration,
    /// Cluster only: when to subscribe every wanted channel again, and whether another round
    /// follows that one.
    resync: Option<(Instant, bool)>,
}

impl Task {
    pub(super) fn new(
        transport: Transport,
        name: String,
        connect_timeout: Duration,
        command_timeout: Duration,
        registry: Arc<Registry>,
        self_tx: mpsc::WeakUnboundedSender<Order>,
        rx: mpsc::UnboundedReceiver<Order>,
    ) -> Self {
        Task {
            transport,
            name,
            connect_timeout,
            command_timeout,
            registry,
            self_tx,
            rx,
            conn: None,
            epoch: 0,
            subscribed: HashSet::new(),
            backoff: BACKOFF_MIN,
            resync: None,
        }
    }

    pub(super) async fn run(mut self) {
        let mut acks = Vec::new();
        let mut next_sweep = None;
        loop {
            let reconnect_at = (self.conn.is_none() && !self.registry.is_empty())
                .then(|| Instant::now() + self.backoff);
            let resync_at = self.resync.map(|(at, _)| at);
            let wake_at = [next_sweep, reconnect_at, resync_at]
                .into_iter()
                .flatten()
                .min();
            let request = match wake_at {
                Some(at) => tokio::select! {
                    r = self.rx.recv() => r,
                    _ = tokio::time::sleep_until(at.into()) => Some(Order::Sync(None)),
                },
                None => self.rx.recv().await,
            };
            let Some(request) = request else { break };
            self.absorb(request, &mut acks);
            while let Ok(request) = self.rx.try_recv() {
                self.absorb(request, &mut acks);
            }

            // Sweep right before reconciling, so a channel whose linger ran out is unsubscribed
            // in this same pass. (Sweeping only while computing the next wake-up left the swept
            // channels dirty until some later request arrived: an idle client stayed subscribed
            // to its last waiter's channel for ever.)
            next_sweep = self.registry.sweep(Instant::now());
            if let Some((at, again)) = self.resync {
                if Instant::now() >= at {
                    self.resync = again.then(|| (Instant::now() + RESYNC_SECOND, false));
                    self.resubscribe_all();
                }
            }
            let mut reconnected = false;
            if self.conn.is_none() && !self.registry.is_empty() {
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
    }

    fn absorb(&mut self, request: Order, acks: &mut Vec<oneshot::Sender<()>>) {
        match request {
            Order::Sync(Some(ack)) => acks.push(ack),
            Order::Sync(None) => {}
            Order::Disconnected(epoch) if epoch == self.epoch => self.drop_connection(),
            Order::Disconnected(_) => {}
            #[cfg(feature = "sentinel")]
            Order::MasterMoved => {
                if self.conn.is_some() {
                    tracing::warn!("the master moved; moving the pub/sub connection");
                    self.drop_connection();
                }
            }
            #[cfg(feature = "cluster")]
            Order::TopologyChanged => self.schedule_resync(),
            #[cfg(feature = "cluster")]
            Order::Dropped(channel) => {
                self.schedule_resync();
                tracing::debug!(
                    channel,
                    "subscription dropped by the server; subscribing again"
                );
                self.subscribed.remove(&channel);
                self.registry.dropped_by_server(&channel);
            }
        }
    }

    /// Cluster only: subscribe every wanted channel again soon, and once more later.
    #[cfg(feature = "cluster")]
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
        self.registry.mark_all_dirty();
    }

    fn drop_connection(&mut self) {
        self.registry
            .connected
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let had = match self.conn.take() {
            Some(Connected::Classic { .. }) => {
                tracing::warn!("pub/sub connection lost; reconnecting");
                true
            }
            #[cfg(feature = "cluster")]
            Some(Connected::Cluster) => {
                tracing::warn!("cluster subscriptions failed; subscribing everything again");
                true
            }
            None => false,
        };
        self.subscribed.clear();
        self.registry.mark_all_down();
        if had {
            // Every waiter looks now rather than at its next timer (up to the watchdog timeout
            // away): if Redis itself is gone, its attempt fails at once and the call's outage
            // clock starts when the outage did, not a sleep later (see `engine/acquire/outage.rs`).
            self.registry.wake_all();
        }
    }

    fn back_off(&mut self) {
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }

    async fn connect(&mut self) -> bool {
        #[cfg_attr(not(feature = "sentinel"), allow(unused_mut))]
        let mut sentinel_generation: Option<u64> = None;
        let client = match &self.transport {
            Transport::Classic(client) => redis::Client::clone(client),
            #[cfg(feature = "sentinel")]
            Transport::Sentinel(master) => match master.client().await {
                Ok((generation, client)) => {
                    sentinel_generation = Some(generation);
                    client
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no master to subscribe on; retrying in {:?}", self.backoff);
                    self.back_off();
                    return false;
                }
            },
            #[cfg(feature = "cluster")]
            Transport::Cluster { .. } => {
                // The cluster connection reconnects by itself; "connecting" here means
                // subscribing every wanted channel again (the backoff resets once that worked).
                self.conn = Some(Connected::Cluster);
                self.registry
                    .connected
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                self.resubscribe_all();
                return true;
            }
        };
        let epoch = self.epoch + 1;
        match transport::open_classic(
            &client,
            &self.name,
            (self.connect_timeout, self.command_timeout),
            self.registry.clone(),
            self.self_tx.clone(),
            epoch,
        )
        .await
        {
            Ok(connected) => {
                self.epoch = epoch;
                self.conn = Some(connected);
                self.registry
                    .connected
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                self.backoff = BACKOFF_MIN;
                // Every wanted channel must be (re)subscribed on the new connection.
                self.resubscribe_all();
                true
            }
            Err(error) => {
                #[cfg(feature = "sentinel")]
                if let (Transport::Sentinel(master), Some(generation)) =
                    (&self.transport, sentinel_generation)
                {
                    master.unreachable(generation);
                }
                let _ = sentinel_generation;
                tracing::warn!(%error, "pub/sub connect failed; retrying in {:?}", self.backoff);
                self.back_off();
                false
            }
        }
    }

    /// Brings the server-side subscriptions in line with the registry for every dirty channel.
    async fn reconcile(&mut self) {
        let changes = self.registry.take_changes(&self.subscribed);
        if self.conn.is_none() {
            return;
        }
        let timeout = self.command_timeout;
        if !changes.unsubscribe.is_empty() {
            let sent = transport::set_subscribed(
                &mut self.conn,
                &mut self.transport,
                &changes.unsubscribe,
                false,
            );
            match tokio::time::timeout(timeout, sent).await {
                Ok(Ok(())) => {
                    for c in &changes.unsubscribe {
                        self.subscribed.remove(c);
                    }
                }
                _ => {
                    self.drop_connection();
                    return;
                }
            }
        }
        if !changes.subscribe.is_empty() {
            let sent = transport::set_subscribed(
                &mut self.conn,
                &mut self.transport,
                &changes.subscribe,
                true,
            );
            match tokio::time::timeout(timeout, sent).await {
                Ok(Ok(())) => {
                    self.registry.set_live(&changes.subscribe);
                    self.subscribed.extend(changes.subscribe);
                    #[cfg(feature = "cluster")]
                    if matches!(self.conn, Some(Connected::Cluster)) {
                        self.backoff = BACKOFF_MIN;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "SUBSCRIBE failed");
                    self.back_off();
                    self.drop_connection();
                }
                Err(_) => {
                    tracing::warn!("SUBSCRIBE timed out");
                    self.back_off();
                    self.drop_connection();
                }
            }
        }
    }
}
