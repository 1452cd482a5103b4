//! Lock operations: one script call per function (`calls.rs`), batched renewals and heartbeats
//! over many locks (`batch.rs`), waiting for replicas (`replica.rs`) and the backoff between
//! retries (`retry.rs`). Nothing here keeps state between calls.

pub(crate) mod batch;
mod calls;
pub(crate) mod replica;
pub(crate) mod retry;

pub(crate) use calls::{
    acquire, extend, force_unlock, give_up, rw_force_unlock, rw_state, state, unlock, AcquireArgs,
    Attempt, Mode, ReleaseArgs, Released, Turn, Unlocked,
};
