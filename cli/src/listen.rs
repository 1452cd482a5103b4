//! The subscriptions of `fairlock watch`: which channels of one lock it listens on, per
//! topology, and how a lost subscription is made again. It only reports that something was
//! published (or that listening stopped); it never reads the lock itself.

use std::time::Duration;

use fairlock::keys::LockKeys;
use redis::cluster_async::ClusterConnection;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use crate::connect::{Session, Target};
use crate::error::Failure;
use crate::glob;
use crate::snapshot::Snapshot;

/// Pause before a lost subscription is made again.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// What the listener reports.
pub enum Notice {
    Message,
    Lost(String),
}

/// The subscriptions of `watch`.
pub enum Listener {
    /// A standalone server or Sentinel master: a task owns a classic pub/sub connection and
    /// makes it again (following the master) when it is lost.
    Server(tokio::task::JoinHandle<()>),
    /// A cluster: a RESP3 cluster connection that redis-rs re-subscribes after reconnects and
    /// slot moves; with sharded pub/sub the head's channel is followed here.
    Cluster {
        conn: ClusterConnection,
        sharded: bool,
        keys: LockKeys,
        head: Option<String>,
        forward: tokio::task::JoinHandle<()>,
    },
}

impl Listener {
    pub async fn start(
        session: &Session,
        keys: &LockKeys,
        tx: mpsc::UnboundedSender<Notice>,
    ) -> Result<Listener, Failure> {
        if !session.is_cluster() {
            let target = session.target.clone();
            let keys = keys.clone();
            // The first subscription is made before returning, so nothing published after
            // the first read can be missed.
            let pubsub = subscribe_server(&target, &keys).await?;
            return Ok(Listener::Server(tokio::spawn(serve(
                target,
                keys,
                tx,
                Some(pubsub),
            ))));
        }
        let (push_tx, mut push_rx) = mpsc::unbounded_channel::<redis::PushInfo>();
        let mut conn = session.target.cluster_subscriber(push_tx).await?;
        let fail = |e: redis::RedisError| Failure::redis("cannot subscribe", e);
        if session.classic {
            conn.subscribe(keys.channel()).await.map_err(fail)?;
            conn.subscribe(keys.rw_channel()).await.map_err(fail)?;
            conn.psubscribe(glob::waiter_channel_pattern(keys))
                .await
                .map_err(fail)?;
        }
        if session.sharded {
            conn.ssubscribe(keys.channel()).await.map_err(fail)?;
            conn.ssubscribe(keys.rw_channel()).await.map_err(fail)?;
        }
        let forward = tokio::spawn(async move {
            while let Some(push) = push_rx.recv().await {
                let notice = match push.kind {
                    redis::PushKind::Message
                    | redis::PushKind::PMessage
                    | redis::PushKind::SMessage => Notice::Message,
                    redis::PushKind::Disconnection => {
                        Notice::Lost("a subscription connection was lost".into())
                    }
                    _ => continue,
                };
                if tx.send(notice).is_err() {
                    return;
                }
            }
        });
        Ok(Listener::Cluster {
            conn,
            sharded: session.sharded,
            keys: keys.clone(),
            head: None,
            forward,
        })
    }

    /// With sharded pub/sub, listens on the channel of the current head of the queue.
    pub async fn follow_head(&mut self, snap: &Snapshot) {
        let Listener::Cluster {
            conn,
            sharded: true,
            keys,
            head,
            ..
        } = self
        else {
            return;
        };
        let new = snap.queue.first().map(|w| w.field.clone());
        if *head == new {
            return;
        }
        if let Some(old) = head.take() {
            let _ = conn.sunsubscribe(keys.waiter_channel(&old)).await;
        }
        if let Some(field) = &new {
            if conn.ssubscribe(keys.waiter_channel(field)).await.is_ok() {
                *head = new;
            }
        }
    }

    pub fn stop(self) {
        match self {
            Listener::Server(task) => task.abort(),
            Listener::Cluster { forward, .. } => forward.abort(),
        }
    }
}

async fn subscribe_server(target: &Target, keys: &LockKeys) -> Result<redis::aio::PubSub, Failure> {
    let client = target.server_client().await?;
    let fail = |e: redis::RedisError| Failure::redis("cannot subscribe", e);
    let mut pubsub = tokio::time::timeout(target.timeout, client.get_async_pubsub())
        .await
        .map_err(|_| Failure::Redis("cannot subscribe: connecting timed out".into()))?
        .map_err(fail)?;
    pubsub.subscribe(keys.channel()).await.map_err(fail)?;
    // A read-write lock's releases are announced on its own channel.
    pubsub.subscribe(keys.rw_channel()).await.map_err(fail)?;
    pubsub
        .psubscribe(glob::waiter_channel_pattern(keys))
        .await
        .map_err(fail)?;
    Ok(pubsub)
}

/// Forwards messages of a server's pub/sub connection; makes it again when it is lost.
async fn serve(
    target: Target,
    keys: LockKeys,
    tx: mpsc::UnboundedSender<Notice>,
    mut pubsub: Option<redis::aio::PubSub>,
) {
    loop {
        let current = match pubsub.take() {
            Some(p) => p,
            None => match subscribe_server(&target, &keys).await {
                Ok(p) => p,
                Err(e) => {
                    if tx.send(Notice::Lost(e.to_string())).is_err() {
                        return;
                    }
                    tokio::time::sleep(RESUBSCRIBE_AFTER).await;
                    continue;
                }
            },
        };
        let mut messages = current.into_on_message();
        while messages.next().await.is_some() {
            if tx.send(Notice::Message).is_err() {
                return;
            }
        }
        if tx
            .send(Notice::Lost(
                "the subscription connection was closed".into(),
            ))
            .is_err()
        {
            return;
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}
