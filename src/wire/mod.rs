//! The wire protocol: every script call and every command the library sends about a lock, a
//! semaphore or a latch, and nothing else. One module per primitive, each the only place that
//! knows the keys, arguments and reply codes of its scripts (`lua/*.lua`, compiled in by
//! `src/scripts.rs`); batched renewals and heartbeats over many locks (`batch`); waiting for
//! replicas (`replica`); the server checks a client makes when it connects (`server`).
//!
//! One function, one round trip (a pipeline for a batch); no retries, no waiting and no
//! bookkeeping here: the engine holds the field's turn and keeps its account. Connection
//! management itself (naming connections, subscribing, asking the sentinels) is the
//! connection layer's (`conn/`).
//!
//! It must never decide anything from a reply beyond decoding it.

pub(crate) mod admin;
pub(crate) mod batch;
pub(crate) mod latch;
mod lock;
pub(crate) mod permits;
pub(crate) mod replica;
pub(crate) mod semaphore;
pub(crate) mod server;

pub(crate) use lock::{
    acquire, extend, force_unlock, give_up, hold_count, is_locked, rw_force_unlock, rw_state,
    state, unlock, AcquireArgs, Attempt, Mode, QueuePlace, ReleaseArgs, Released, Unlocked,
};

use crate::conn::{Conn, ScriptCall};
use crate::error::Result;
use crate::scripts;

/// The marked writes of the counting kinds (PROTOCOL 11): each changes a count under a call
/// mark, so a resend is applied at most once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marked {
    /// Returns permits taken without a guard, or a guard's (`lead`: how many).
    SemaphoreRelease,
    /// Settles an acquire whose outcome is unknown: gives its permits back if it took them,
    /// voids it otherwise (`lead`: how many).
    SemaphoreGiveBack,
    /// Adds to the count (`lead`: by how much, negative to remove).
    SemaphoreAddPermits,
    /// Counts a latch down by one (no `lead`).
    LatchCountDown,
}

impl Marked {
    fn script(self) -> &'static scripts::Lua {
        match self {
            Marked::SemaphoreRelease => &scripts::SEMAPHORE_RELEASE,
            Marked::SemaphoreGiveBack => &scripts::SEMAPHORE_GIVE_BACK,
            Marked::SemaphoreAddPermits => &scripts::SEMAPHORE_ADD_PERMITS,
            Marked::LatchCountDown => &scripts::LATCH_COUNT_DOWN,
        }
    }
}

/// One send of a marked write on count `name` under `mark` (living `mark_ms`), announced on
/// `channel`. KEYS: the count, the mark; ARGV: `lead` when given, the mark's life, the publish
/// command, the channel.
pub(crate) async fn marked<T: redis::FromRedisValue>(
    conn: &mut Conn,
    write: Marked,
    name: &str,
    mark: &str,
    lead: Option<i64>,
    mark_ms: i64,
    channel: &str,
) -> Result<T> {
    let publish = conn.publish_command();
    let mut call = write.script().prepare_invoke();
    call.key(name).key(mark);
    if let Some(n) = lead {
        call.arg(n);
    }
    call.arg(mark_ms).arg(publish).arg(channel);
    Ok(call.invoke_async(conn).await?)
}
