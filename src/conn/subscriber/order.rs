//! What the subscriber's handles and its transport tell its task ([`Order`]).

use tokio::sync::oneshot;

/// What the handles and the transport tell the task.
pub(super) enum Order {
    /// Reconcile dirty channels; answer once Redis has confirmed (or the connection is down and
    /// the reconnect will resubscribe and wake everyone).
    Sync(Option<oneshot::Sender<()>>),
    /// The reader of connection `epoch` saw its stream end.
    Disconnected(u64),
    /// The server dropped one of our subscriptions (a cluster slot moved): subscribe again.
    #[cfg(feature = "cluster")]
    Dropped(String),
    /// Sentinel named a new master: move the connection there.
    #[cfg(feature = "sentinel")]
    MasterMoved,
    /// A cluster node connection dropped: the topology may be changing.
    #[cfg(feature = "cluster")]
    TopologyChanged,
}

impl std::fmt::Debug for Order {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Order::Sync(_) => f.write_str("Sync"),
            Order::Disconnected(e) => write!(f, "Disconnected({e})"),
            #[cfg(feature = "cluster")]
            Order::Dropped(c) => write!(f, "Dropped({c})"),
            #[cfg(feature = "sentinel")]
            Order::MasterMoved => f.write_str("MasterMoved"),
            #[cfg(feature = "cluster")]
            Order::TopologyChanged => f.write_str("TopologyChanged"),
        }
    }
}
