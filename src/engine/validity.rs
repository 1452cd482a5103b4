//! Until when a hold can be trusted, and why it stopped: the drift margin taken off every lease,
//! the validity deadline of a grant or renewal; re-exports the public [`LostReason`].

// Both are written beside the lease they are taken from (`lease.rs`).
pub(crate) use crate::engine::hold::{drift, validity_deadline};

// `LostReason` lives with the error type (the data layer), which names it too.
pub use crate::error::LostReason;
