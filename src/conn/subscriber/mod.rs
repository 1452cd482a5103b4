//! The client's one pub/sub connection, carrying every channel its waiters listen on.
//!
//! Waiters register a channel and get a [`Subscription`] whose [`Mailbox`] is poked (`notify_one`)
//! for every message on that channel. Messages are hints, never the truth on their own: a waiter
//! re-runs its acquire script after a wake-up, so a spurious wake costs one round trip and a lost
//! one costs latency, never correctness. The one message a waiter acts on without a round trip is
//! a direct grant (PROTOCOL 8), which the mailbox keeps for it: the waiter checks it against what
//! its own last attempt asked for, under its field's turn (`engine/acquire/wait.rs`).
//!
//! A channel nobody waits on any more stays subscribed for a short linger period: a holder that
//! waits again soon (a busy lock, a retry loop) re-takes its live channel without a round trip, and
//! can make its very first attempt already subscribed.
//!
//! Three layers:
//! * [`registry`]: which channels are wanted, by how many, which are live, which linger; pure.
//! * [`task`]: the background task that owns the connection, reconciles Redis with the registry,
//!   reconnects, and wakes everyone after a reconnect.
//! * [`transport`]: the connection per topology (a RESP2 pub/sub connection, the master Sentinel
//!   names, or a subscription-only RESP3 cluster connection with its push messages).
//!
//! The handles and the transport talk to the task with an [`order::Order`].
//!
//! This module must never: do I/O in `Drop` (a dropped [`Subscription`] only marks the registry),
//! or report a subscription as ready before a message published from then on is sure to reach it.

mod mailbox;
mod order;
mod registry;
mod sleepers;
mod task;
mod transport;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::conn::PubSubLink;
use crate::error::{Error, Result};
pub(crate) use mailbox::Mailbox;
use order::Order;
use registry::Registry;
use task::Task;

/// The state of a client's subscription connection (see [`Health`](crate::Health)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SubscriberState {
    /// Connected: release messages reach this client's waiters.
    Connected,
    /// Not connected and not needed: no call of this client has waited yet (the connection is
    /// opened by the first call that has to wait).
    Idle,
    /// Calls wait and the connection is down; the client reconnects with backoff. Waiters still
    /// make progress (they re-check at their own deadlines and after the reconnect), only later.
    Reconnecting,
}

/// Handle on the client's subscriber task.
#[derive(Debug)]
pub(crate) struct Subscriber {
    registry: Arc<Registry>,
    tx: mpsc::UnboundedSender<Order>,
}

impl Subscriber {
    /// Starts the background task on the pub/sub link the connection layer opened.
    pub(crate) fn start(
        link: PubSubLink,
        name: String,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Self {
        let registry = Arc::new(Registry::default());
        let (tx, rx) = mpsc::unbounded_channel();
        #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
        let (transport, pushes) = transport::from_link(link);
        #[cfg(feature = "cluster")]
        if let Some(pushes) = pushes {
            tokio::spawn(transport::read_pushes(
                pushes,
                registry.clone(),
                tx.downgrade(),
            ));
        }
        #[cfg(feature = "sentinel")]
        if let transport::Transport::Sentinel(master) = &transport {
            tokio::spawn(transport::follow_master(master.moves(), tx.downgrade()));
        }
        let task = Task::new(
            transport,
            name,
            connect_timeout,
            command_timeout,
            registry.clone(),
            tx.downgrade(),
            rx,
        );
        tokio::spawn(task.run());
        Subscriber { registry, tx }
    }

    /// Registers interest in `channel` and returns once a message published on it from now on
    /// will reach the returned subscription (or, while disconnected, once the reconnect is sure to
    /// wake it).
    pub(crate) async fn subscribe(&self, channel: String) -> Result<Subscription> {
        let (mail, live) = self.registry.take(&channel);
        // From here on the subscription exists, so a dropped future unregisters through Drop.
        let subscription = Subscription {
            channel,
            mail,
            registry: self.registry.clone(),
            tx: self.tx.clone(),
        };
        if live {
            return Ok(subscription);
        }
        let (ack_tx, ack_rx) = oneshot::channel();
        self.tx
            .send(Order::Sync(Some(ack_tx)))
            .map_err(|_| Error::Shutdown)?;
        ack_rx.await.map_err(|_| Error::Shutdown)?;
        Ok(subscription)
    }

    /// The subscription to `channel` when it is live already (lingering from an earlier wait):
    /// no round trip, and a message published from now on reaches it.
    pub(crate) fn subscribe_if_live(&self, channel: &str) -> Option<Subscription> {
        let mail = self.registry.take_if_live(channel)?;
        Some(Subscription {
            channel: channel.to_owned(),
            mail,
            registry: self.registry.clone(),
            tx: self.tx.clone(),
        })
    }

    /// The state of the subscription connection, for `Client::health`.
    pub(crate) fn state(&self) -> SubscriberState {
        if self
            .registry
            .connected
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            SubscriberState::Connected
        } else if self.registry.is_empty() {
            SubscriberState::Idle
        } else {
            SubscriberState::Reconnecting
        }
    }

    /// Wakes every registered waiter (used on shutdown).
    pub(crate) fn wake_all(&self) {
        self.registry.wake_all();
    }
}

/// Interest in one channel; dropping it lets the channel linger, then unsubscribes it in the
/// background if nobody takes it back.
#[derive(Debug)]
pub(crate) struct Subscription {
    channel: String,
    mail: Arc<Mailbox>,
    registry: Arc<Registry>,
    tx: mpsc::UnboundedSender<Order>,
}

impl Subscription {
    /// The channel's mailbox (shared by every user of the channel).
    pub(crate) fn mail(&self) -> &Arc<Mailbox> {
        &self.mail
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.registry.release(&self.channel, Instant::now()) {
            // No I/O here; this only makes the task schedule its sweep.
            let _ = self.tx.send(Order::Sync(None));
        }
    }
}
