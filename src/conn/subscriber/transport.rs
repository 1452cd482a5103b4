//! Where subscriptions physically live, per topology, and how messages come in: a dedicated RESP2
//! pub/sub connection (standalone, or the master Sentinel names), or the subscription-only RESP3
//! cluster connection with its push messages. Each message wakes its channel's waiter through the
//! registry; a dropped connection, a moved master or a cluster topology event is reported to the
//! task as a [`Request`].
//!
//! It must never decide what to subscribe (that is the task's reconcile) or keep state about
//! channels (that is the registry).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::PubSubSink;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

use super::registry::Registry;
use super::request::Request;
use crate::conn::sentinel::SentinelMaster;
use crate::conn::{PubSubLink, Pushes};
use crate::util::join_all;

/// Where subscriptions live.
pub(super) enum Transport {
    /// A dedicated RESP2 pub/sub connection opened from this client, reopened after a drop.
    /// (Boxed for the same reason as in [`PubSubLink`].)
    Classic(Box<redis::Client>),
    /// The subscription-only RESP3 cluster connection (it reconnects by itself).
    Cluster {
        conn: ClusterConnection,
        sharded: bool,
    },
    /// A classic connection to the master Sentinel names, reopened where the master is now.
    Sentinel(SentinelMaster),
}

/// The live side of the transport.
pub(super) enum Connected {
    Classic {
        sink: PubSubSink,
        reader: JoinHandle<()>,
    },
    Cluster,
}

impl Drop for Connected {
    fn drop(&mut self) {
        if let Connected::Classic { reader, .. } = self {
            reader.abort();
        }
    }
}

/// Splits the connection layer's link into the transport and, on a cluster, its push messages
/// (read by [`read_pushes`] for the client's lifetime).
pub(super) fn from_link(link: PubSubLink) -> (Transport, Option<Pushes>) {
    match link {
        PubSubLink::Classic(client) => (Transport::Classic(client), None),
        PubSubLink::Sentinel(master) => (Transport::Sentinel(master), None),
        PubSubLink::Cluster {
            conn,
            sharded,
            pushes,
        } => (Transport::Cluster { conn, sharded }, Some(pushes)),
    }
}

/// Opens a classic pub/sub connection to `client` and starts its reader, which wakes waiters per
/// message and reports `Disconnected(epoch)` when the stream ends.
pub(super) async fn open_classic(
    client: &redis::Client,
    connect_timeout: Duration,
    registry: Arc<Registry>,
    tx: mpsc::WeakUnboundedSender<Request>,
    epoch: u64,
) -> Result<Connected, String> {
    let pubsub = match tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await {
        Ok(Ok(pubsub)) => pubsub,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("timed out".to_owned()),
    };
    let (sink, mut stream) = pubsub.split();
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
    Ok(Connected::Classic { sink, reader })
}

/// Subscribes (`on`) or unsubscribes `channels` on the live connection.
pub(super) async fn set_subscribed(
    conn: &mut Option<Connected>,
    transport: &mut Transport,
    channels: &[String],
    on: bool,
) -> redis::RedisResult<()> {
    match (conn, transport) {
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

/// Moves the pub/sub connection whenever the master does: a message published on the new master
/// would never reach a connection left on the old one.
pub(super) async fn follow_master(
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
pub(super) async fn read_pushes(
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
                if registry.is_wanted(&channel) {
                    let Some(tx) = tx.upgrade() else { break };
                    let _ = tx.send(Request::Dropped(channel));
                }
            }
            _ => {}
        }
    }
}
