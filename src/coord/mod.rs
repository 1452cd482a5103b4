//! Coordination primitives other than locks, in Redisson's layouts: the
//! [`Semaphore`](crate::Semaphore) (`RSemaphore`), the
//! [`ExpirableSemaphore`](crate::ExpirableSemaphore) (`RPermitExpirableSemaphore`) and the
//! [`CountDownLatch`](crate::CountDownLatch) (`RCountDownLatch`).
//!
//! What they share lives in `common.rs`:
//! * **The handle** ([`Named`]): client, name, channel, the name check, and the one way a marked
//!   count change is sent and resent.
//! * **Call marks** (`{NAME}:fairlock_call:<call id>`, PROTOCOL 11): a write that is not
//!   idempotent (take permits, give them back, add permits, count down) records its call id in a
//!   short-lived string in the name's slot, so the outcome of a call whose reply was lost can be
//!   learnt, and a resend is applied at most once. A mark lives [`mark_ms`]; every retry of a
//!   call stops well within that ([`settle_window`]).
//! * **Waiting**: through the engine's counting wait (`engine/wait.rs`).
//!
//! This module must never resend a write without its mark.

mod common;
pub(crate) mod latch;
pub(crate) mod permits;
pub(crate) mod semaphore;
