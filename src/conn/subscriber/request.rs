//! What the subscriber's handles and its transport tell its task ([`Request`]).

use tokio::sync::oneshot;

/// What the handles and the transport tell the task.
pub(super) enum Request {
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
