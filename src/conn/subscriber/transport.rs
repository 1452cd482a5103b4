//! Where subscriptions physically live, per topology, and how messages come in: a dedicated RESP3
//! connection that carries only subscriptions (standalone, or the master Sentinel names; RESP3 so
//! that it can also be named with `CLIENT SETNAME`, which a RESP2 connection in subscribe mode
//! cannot send), or the subscription-only RESP3 cluster connection. Messages arrive as push
//! messages either way. Each message wakes its channel's waiter through the
//! registry; a dropped connection, a moved master or a cluster topology event is reported to the
//! task as a [`Order`].
//!
//! It must never decide what to subscribe (that is the task's reconcile) or keep state about
//! channels (that is the registry).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::order::Order;
use super::registry::Registry;
#[cfg(feature = "sentinel")]
use crate::conn::sentinel::SentinelMaster;
use crate::conn::PubSubLink;
#[cfg(feature = "cluster")]
use crate::conn::Pushes;
#[cfg(feature = "cluster")]
use crate::util::join_all;

/// Where subscriptions live.
pub(super) enum Transport {
    /// A dedicated RESP3 subscription connection opened from this client, reopened after a drop.
    /// (Boxed for the same reason as in [`PubSubLink`].)
    Classic(Box<redis::Client>),
    /// The subscription-only RESP3 cluster connection (it reconnects by itself).
    #[cfg(feature = "cluster")]
    Cluster {
        conn: ClusterConnection,
        sharded: bool,
    },
    /// A classic connection to the master Sentinel names, reopened where the master is now.
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelMaster),
}

/// The live side of the transport.
pub(super) enum Connected {
    Classic {
        conn: MultiplexedConnection,
        reader: JoinHandle<()>,
    },
    #[cfg(feature = "cluster")]
    Cluster,
}

impl Drop for Connected {
    fn drop(&mut self) {
        // Without the `cluster` feature, `Classic` is the only variant.
        #[allow(irrefutable_let_patterns)]
        if let Connected::Classic { reader, .. } = self {
            reader.abort();
        }
    }
}

/// Splits the connection layer's link into the transport and, on a cluster, its push messages
/// (read by [`read_pushes`] for the client's lifetime).
#[cfg(feature = "cluster")]
pub(super) fn from_link(link: PubSubLink) -> (Transport, Option<Pushes>) {
    match link {
        PubSubLink::Classic(client) => (Transport::Classic(client), None),
        #[cfg(feature = "sentinel")]
        PubSubLink::Sentinel(master) => (Transport::Sentinel(master), None),
        PubSubLink::Cluster {
            conn,
            sharded,
            pushes,
        } => (Transport::Cluster { conn, sharded }, Some(pushes)),
    }
}

/// The transport for the connection layer's link (no push stream outside a cluster).
#[cfg(not(feature = "cluster"))]
pub(super) fn from_link(link: PubSubLink) -> (Transport, Option<std::convert::Infallible>) {
    match link {
        PubSubLink::Classic(client) => (Transport::Classic(client), None),
        #[cfg(feature = "sentinel")]
        PubSubLink::Sentinel(master) => (Transport::Sentinel(master), None),
    }
}

/// Opens a subscription connection (RESP3, named `name`) to the server `client` points at, and
/// starts its reader, which wakes waiters per message and reports `Disconnected(epoch)` when the
/// connection ends.
pub(super) async fn open_classic(
    client: &redis::Client,
    name: &str,
    timeouts: (Duration, Duration),
    registry: Arc<Registry>,
    tx: mpsc::WeakUnboundedSender<Order>,
    epoch: u64,
) -> Result<Connected, String> {
    let (connect_timeout, command_timeout) = timeouts;
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client =
        redis::Client::open(info.set_redis_settings(settings)).map_err(|e| e.to_string())?;
    let (push_tx, mut pushes) = mpsc::unbounded_channel();
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(command_timeout))
        .set_push_sender(Deliver {
            registry: registry.clone(),
            rest: push_tx,
        });
    let opened = tokio::time::timeout(
        connect_timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await;
    let mut conn = match opened {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("timed out".to_owned()),
    };
    crate::conn::names::name_connection(&mut conn, name).await;
    let reader = tokio::spawn(async move {
        while let Some(push) = pushes.recv().await {
            // (Messages are delivered by `Deliver` itself.)
            if push.kind == PushKind::Disconnection {
                break;
            }
        }
        if let Some(tx) = tx.upgrade() {
            let _ = tx.send(Order::Disconnected(epoch));
        }
    });
    Ok(Connected::Classic { conn, reader })
}

/// Subscribes (`on`) or unsubscribes `channels` on the live connection.
pub(super) async fn set_subscribed(
    conn: &mut Option<Connected>,
    transport: &mut Transport,
    channels: &[String],
    on: bool,
) -> redis::RedisResult<()> {
    match (conn, transport) {
        (Some(Connected::Classic { conn, .. }), _) if on => conn.subscribe(channels).await,
        (Some(Connected::Classic { conn, .. }), _) => conn.unsubscribe(channels).await,
        #[cfg(feature = "cluster")]
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
        #[cfg(feature = "cluster")]
        (Some(Connected::Cluster), Transport::Cluster { conn, .. }) if on => {
            conn.subscribe(channels).await
        }
        #[cfg(feature = "cluster")]
        (Some(Connected::Cluster), Transport::Cluster { conn, .. }) => {
            conn.unsubscribe(channels).await
        }
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "no pub/sub connection",
        ))),
    }
}

/// Moves the pub/sub connection whenever the master does: a message published on the new master
/// would never reach a connection left on the old one.
#[cfg(feature = "sentinel")]
pub(super) async fn follow_master(
    mut moves: tokio::sync::watch::Receiver<u64>,
    tx: mpsc::WeakUnboundedSender<Order>,
) {
    moves.borrow_and_update();
    while moves.changed().await.is_ok() {
        let Some(tx) = tx.upgrade() else { return };
        if tx.send(Order::MasterMoved).is_err() {
            return;
        }
    }
}

/// The channel a push message is about (its first element).
/// The push sender of a classic subscription connection: a message is delivered to its channel's
/// mailbox right where the connection reads it (no task in between: a direct grant reaches its
/// waiter one wake-up after the bytes arrive); every other push goes to the connection's reader
/// task.
struct Deliver {
    registry: Arc<Registry>,
    rest: mpsc::UnboundedSender<PushInfo>,
}

impl redis::aio::AsyncPushSender for Deliver {
    fn send(&self, push: PushInfo) -> Result<(), redis::aio::SendError> {
        if push.kind == PushKind::Message {
            if let Some(channel) = push_channel(&push) {
                if !self.registry.notify(&channel, push_payload(&push)) {
                    tracing::trace!(channel, "message on a channel nobody waits on");
                }
            }
            return Ok(());
        }
        self.rest.send(push).map_err(|_| redis::aio::SendError)
    }
}

/// The payload of a message push (`[channel, payload]`); empty when it has none.
fn push_payload(push: &PushInfo) -> &[u8] {
    match push.data.get(1) {
        Some(Value::BulkString(bytes)) => bytes,
        Some(Value::SimpleString(s)) => s.as_bytes(),
        _ => &[],
    }
}

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
#[cfg(feature = "cluster")]
pub(super) async fn read_pushes(
    mut pushes: Pushes,
    registry: Arc<Registry>,
    tx: mpsc::WeakUnboundedSender<Order>,
) {
    while let Some(push) = pushes.recv().await {
        tracing::trace!(kind = ?push.kind, data = ?push.data, "push");
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(channel) = push_channel(&push) {
                    if !registry.notify(&channel, push_payload(&push)) {
                        tracing::trace!(channel, "message on a channel nobody waits on");
                    }
                }
            }
            PushKind::Disconnection => {
                tracing::warn!("a cluster node connection dropped; every waiter re-checks");
                registry.wake_all();
                let Some(tx) = tx.upgrade() else { break };
                let _ = tx.send(Order::TopologyChanged);
            }
            PushKind::SUnsubscribe | PushKind::Unsubscribe => {
                // Either the confirmation of our own unsubscribe (the channel is no longer
                // wanted) or the server dropping a wanted one: its slot moved to another shard.
                let Some(channel) = push_channel(&push) else {
                    continue;
                };
                if registry.is_wanted(&channel) {
                    let Some(tx) = tx.upgrade() else { break };
                    let _ = tx.send(Order::Dropped(channel));
                }
            }
            _ => {}
        }
    }
}
