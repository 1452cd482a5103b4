//! Until when a hold can be trusted, and why it stopped: the drift margin taken off every lease,
//! the validity deadline of a grant or renewal; re-exports the public [`LostReason`].

use std::time::{Duration, Instant};

pub(crate) use crate::config::drift;

/// The validity deadline of a grant or renewal sent at `sent` with a lease of `lease`: the moment
/// up to which no other client can have taken the lock, allowing for clock drift.
pub(crate) fn validity_deadline(sent: Instant, lease: Duration) -> Instant {
    sent + lease.saturating_sub(drift(lease))
}

// `LostReason` lives with the error type (the data layer), which names it too.
pub use crate::error::LostReason;
