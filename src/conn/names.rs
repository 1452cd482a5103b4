//! Connection names: every connection a client opens calls itself `fairlock:<client id>:cmd`
//! (commands) or `fairlock:<client id>:sub` (subscriptions) with `CLIENT SETNAME`, so operators
//! find a client's connections in `CLIENT LIST` and can tell them from other clients'.
//!
//! A name lives as long as the server connection: the connections we open ourselves (pub/sub,
//! the Sentinel master's) are named as they are opened; the ones redis-rs reopens by itself (the
//! standalone connection manager, cluster node connections) are named again after every
//! disconnection notice, until that succeeds or the client is gone. Naming is best effort: a
//! server that refuses `CLIENT SETNAME` (an ACL without it) leaves the connection unnamed and
//! the client working.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
#[cfg(feature = "cluster")]
use redis::{PushInfo, PushKind};

#[cfg(feature = "cluster")]
use tokio::sync::mpsc;
use tokio::sync::watch;
use uuid::Uuid;

/// The name of a client's command connections.
pub(crate) fn command_name(id: Uuid) -> String {
    format!("fairlock:{id}:cmd")
}

/// The name of a client's subscription connections.
pub(crate) fn subscriber_name(id: Uuid) -> String {
    format!("fairlock:{id}:sub")
}

fn setname(name: &str) -> redis::Cmd {
    redis::cmd("CLIENT").arg("SETNAME").arg(name).clone()
}

/// Names one connection; a refusal is logged, not returned.
pub(crate) async fn name_connection(conn: &mut impl ConnectionLike, name: &str) {
    if let Err(e) = conn.req_packed_command(&setname(name)).await {
        tracing::debug!(connection = name, error = %e, "CLIENT SETNAME failed; connection left unnamed");
    }
}

/// Names every node connection of a cluster connection.
#[cfg(feature = "cluster")]
pub(crate) async fn name_cluster(
    conn: &mut ClusterConnection,
    name: &str,
) -> redis::RedisResult<()> {
    let routing = RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllNodes,
        Some(ResponsePolicy::AllSucceeded),
    ));
    conn.route_command(setname(name), routing).await.map(drop)
}

/// Dropped with the last clone of the command connection: ends the tasks that keep names.
#[derive(Debug)]
pub(crate) struct KeepNames(#[allow(dead_code)] watch::Sender<()>);

impl KeepNames {
    pub(crate) fn new() -> (KeepNames, Stop) {
        let (tx, rx) = watch::channel(());
        (KeepNames(tx), Stop(rx))
    }
}

/// Fires when the [`KeepNames`] it came with is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Stop(watch::Receiver<()>);

impl Stop {
    async fn fired(&mut self) {
        while self.0.changed().await.is_ok() {}
    }
}

const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Sends `CLIENT SETNAME` through `send` until it succeeds or `stop` fires.
async fn rename<F, Fut>(mut send: F, mut stop: Stop) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<()>>,
{
    let mut wait = RETRY_MIN;
    loop {
        tokio::select! {
            _ = stop.fired() => return false,
            result = send() => match result {
                Ok(()) => return true,
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
                    return true;
                }
                Err(e) => tracing::trace!(error = %e, "renaming a reconnected connection failed; retrying"),
            }
        }
        tokio::select! {
            _ = stop.fired() => return false,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(RETRY_MAX);
    }
}

/// Names the standalone connection manager's connection again after each failure that makes it
/// reconnect (the command path pokes `failed`; a RESP2 manager has no disconnection notices).
pub(crate) async fn keep_standalone_named(
    manager: ConnectionManager,
    name: String,
    failed: std::sync::Arc<tokio::sync::Notify>,
    mut stop: Stop,
) {
    loop {
        tokio::select! {
            _ = stop.fired() => return,
            _ = failed.notified() => {}
        }
        let send = || {
            let mut manager = manager.clone();
            let cmd = setname(&name);
            async move { manager.req_packed_command(&cmd).await.map(drop) }
        };
        if !rename(send, stop.clone()).await {
            return;
        }
    }
}

/// Forwards the subscription connection's push messages to the subscriber, and after each
/// disconnection notice (a node connection that redis-rs reopens) names every node connection
/// of both cluster connections again.
#[cfg(feature = "cluster")]
pub(crate) async fn keep_cluster_named(
    commands: ClusterConnection,
    subscriptions: ClusterConnection,
    id: Uuid,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    forward: mpsc::UnboundedSender<PushInfo>,
    mut stop: Stop,
) {
    let (cmd_name, sub_name) = (command_name(id), subscriber_name(id));
    let mut renaming: Option<tokio::task::JoinHandle<bool>> = None;
    loop {
        let push = tokio::select! {
            _ = stop.fired() => return,
            push = pushes.recv() => push,
        };
        let Some(push) = push else { return };
        let disconnected = push.kind == PushKind::Disconnection;
        if forward.send(push).is_err() {
            return;
        }
        if !disconnected || renaming.as_ref().is_some_and(|r| !r.is_finished()) {
            continue;
        }
        // In a task of its own: messages keep flowing while nodes reconnect.
        let (commands, subscriptions) = (commands.clone(), subscriptions.clone());
        let (cmd_name, sub_name) = (cmd_name.clone(), sub_name.clone());
        renaming = Some(tokio::spawn(rename(
            move || {
                let (mut c, mut s) = (commands.clone(), subscriptions.clone());
                let (cn, sn) = (cmd_name.clone(), sub_name.clone());
                async move {
                    name_cluster(&mut c, &cn).await?;
                    name_cluster(&mut s, &sn).await
                }
            },
            stop.clone(),
        )));
    }
}
