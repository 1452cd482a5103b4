//! The script-call ABI of single-lock operations: the only place that knows the keys, arguments
//! and reply codes of each Lua script that works on one lock (`lua/*.lua`). One function, one
//! script call, one round trip; no retries and no waiting here (see `retry.rs` and `acquire.rs`).
//! Batched calls over many locks are in `batch.rs`.

use std::sync::Arc;

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::keys::{Kind, LockSpec};
use crate::scripts;
use crate::state::RawState;

/// How an acquire attempt may use the fair queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Never join the queue (zero wait).
    Try,
    /// First attempt: join the tail when the lock cannot be taken.
    Queue,
    /// Later attempt of a waiter still waiting: rejoin at the head if it was purged while alive.
    Requeue,
}

impl Mode {
    fn as_arg(self) -> &'static str {
        match self {
            Mode::Try => "try",
            Mode::Queue => "queue",
            Mode::Requeue => "requeue",
        }
    }
}

/// Result of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Taken (or re-entered); the fencing token when fencing was asked for.
    Acquired { token: Option<u64> },
    /// Not taken. `hint_ms`: how long nothing will change unannounced (-1: until told).
    Waiting { hint_ms: i64 },
}

/// Result of releasing one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unlocked {
    /// Last hold released; the lock is free and the next waiter was told.
    Released,
    /// One hold fewer; the holder still has the lock.
    StillHeld,
    /// The lock had already expired (a fair lock treats this as released, as Redisson does).
    Expired,
    /// Somebody else holds it (or nobody, for a non-fair lock).
    NotOwner,
}

/// Parameters of one acquire attempt.
#[derive(Debug, Clone)]
pub(crate) struct AcquireArgs {
    pub(crate) spec: Arc<LockSpec>,
    pub(crate) field: Arc<str>,
    pub(crate) lease_ms: i64,
    pub(crate) liveness_ms: i64,
    pub(crate) mode: Mode,
    pub(crate) fenced: bool,
}

/// Runs one acquire attempt.
pub(crate) async fn acquire(conn: &mut Conn, args: &AcquireArgs) -> Result<Attempt> {
    let keys = &args.spec.keys;
    let publish = conn.publish_command();
    let reply: Vec<i64> = match args.spec.kind {
        Kind::Fair => {
            scripts::FAIR_ACQUIRE
                .key(keys.name())
                .key(keys.queue())
                .key(keys.deadlines())
                .key(keys.token())
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(args.liveness_ms)
                .arg(args.mode.as_arg())
                .arg(if args.fenced { "1" } else { "0" })
                .arg(publish)
                .arg(keys.channel())
                .invoke_async(conn)
                .await?
        }
        Kind::NonFair => {
            scripts::LOCK_ACQUIRE
                .key(keys.name())
                .key(keys.token())
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(if args.fenced { "1" } else { "0" })
                .invoke_async(conn)
                .await?
        }
    };
    match reply.as_slice() {
        [1, token] => Ok(Attempt::Acquired {
            token: args.fenced.then_some(*token as u64),
        }),
        [0, hint] => Ok(Attempt::Waiting { hint_ms: *hint }),
        _ => Err(Error::bad_reply("acquire", reply)),
    }
}

/// What `field` holds on the lock right now: `(hold count, fencing counter)`. When that is more
/// than the `ours` holds the caller counts, the caller takes the extra grant up, and the lock's
/// TTL is set to `lease_ms` again.
pub(crate) async fn probe(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    ours: u64,
    lease_ms: i64,
) -> Result<(u64, u64)> {
    let keys = &spec.keys;
    let reply: Vec<i64> = scripts::HOLD_PROBE
        .key(keys.name())
        .key(keys.token())
        .arg(field)
        .arg(ours)
        .arg(lease_ms)
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [count, token] => Ok((*count.max(&0) as u64, *token.max(&0) as u64)),
        _ => Err(Error::bad_reply("probe", reply)),
    }
}

/// Releases one hold of `field`. `request` (32 lowercase hex) names this release: sending the same
/// request again (a retry after a timeout) returns the first outcome instead of releasing twice.
/// `retry` is set on every send of a request after the first: only then is the latch looked up
/// (always, on a connection that may resend by itself: [`Conn::may_resend`]).
pub(crate) async fn unlock(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    lease_ms: i64,
    request: &str,
    latch_ms: i64,
    retry: bool,
) -> Result<Unlocked> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let latch = format!("{}:{}", keys.latch_prefix(), request);
    let look_up_latch = if retry || conn.may_resend() { "1" } else { "0" };
    let code: i64 = match spec.kind {
        Kind::Fair => {
            scripts::FAIR_UNLOCK
                .key(keys.name())
                .key(keys.queue())
                .key(keys.deadlines())
                .key(&latch)
                .arg(lease_ms)
                .arg(field)
                .arg(publish)
                .arg(keys.channel())
                .arg(latch_ms)
                .arg(look_up_latch)
                .invoke_async(conn)
                .await?
        }
        Kind::NonFair => {
            scripts::LOCK_UNLOCK
                .key(keys.name())
                .key(&latch)
                .arg(lease_ms)
                .arg(field)
                .arg(publish)
                .arg(keys.channel())
                .arg(latch_ms)
                .arg(look_up_latch)
                .invoke_async(conn)
                .await?
        }
    };
    match code {
        1 => Ok(Unlocked::Released),
        0 => Ok(Unlocked::StillHeld),
        2 => Ok(Unlocked::Expired),
        -1 => Ok(Unlocked::NotOwner),
        other => Err(Error::bad_reply("unlock", other)),
    }
}

/// Removes a fair waiter from the queue and wakes the next head of a free lock. Returns whether
/// the waiter was still queued.
pub(crate) async fn give_up(conn: &mut Conn, spec: &LockSpec, field: &str) -> Result<bool> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let removed: i64 = scripts::FAIR_GIVE_UP
        .key(keys.name())
        .key(keys.queue())
        .key(keys.deadlines())
        .arg(field)
        .arg(publish)
        .arg(keys.channel())
        .invoke_async(conn)
        .await?;
    Ok(removed == 1)
}

/// Deletes the lock whoever holds it; wakes the next waiter. Returns whether a lock was deleted.
pub(crate) async fn force_unlock(conn: &mut Conn, spec: &LockSpec) -> Result<bool> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let deleted: i64 = match spec.kind {
        Kind::Fair => {
            scripts::FAIR_FORCE_UNLOCK
                .key(keys.name())
                .key(keys.queue())
                .key(keys.deadlines())
                .arg(publish)
                .arg(keys.channel())
                .invoke_async(conn)
                .await?
        }
        Kind::NonFair => {
            scripts::LOCK_FORCE_UNLOCK
                .key(keys.name())
                .arg(publish)
                .arg(keys.channel())
                .invoke_async(conn)
                .await?
        }
    };
    Ok(deleted == 1)
}

pub(crate) async fn state(conn: &mut Conn, spec: &LockSpec) -> Result<RawState> {
    let keys = &spec.keys;
    type Pairs = Vec<(String, i64)>;
    let (now_ms, pttl_ms, owners, waiters): (i64, i64, Pairs, Pairs) = scripts::STATE
        .key(keys.name())
        .key(keys.queue())
        .key(keys.deadlines())
        .invoke_async(conn)
        .await?;
    Ok(RawState {
        now_ms,
        pttl_ms,
        owners,
        waiters,
    })
}
