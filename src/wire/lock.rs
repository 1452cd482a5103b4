//! The locks' protocol (the mutexes and both sides of the read-write lock): the only place that
//! knows the keys, arguments and reply codes of each Lua script that works on one lock, and the
//! plain reads of a lock's keys. One function, one round trip; no retries, no waiting and no
//! bookkeeping here (the caller holds the field's turn and keeps its account). Batched calls
//! over many locks are in `wire/batch.rs`.
//!
//! This module must never decide anything from a reply beyond decoding it.

use std::sync::Arc;

use crate::conn::{Conn, ScriptCall};
use crate::error::{Error, Result};
use crate::keys::{Kind, LockSpec};
use crate::scripts;
use crate::state::{RawRwState, RawState};

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
    /// Taken or re-entered: our hold count is now `count`. `adopted`: the hold was already there
    /// (an earlier send of the attempt, or an attempt whose reply was lost, took it), so this
    /// attempt added nothing. `token`: the fencing counter, when fencing was asked for.
    Acquired {
        count: u64,
        adopted: bool,
        token: Option<u64>,
    },
    /// Not taken. `hint_ms`: how long nothing will change unannounced (-1: until told).
    /// `queued_at`: our place in the fair queue when this attempt joined it at the tail.
    /// `server_ms`: the server time the attempt ran at (0 when the script did not say: a try or
    /// a non-fair lock).
    Waiting {
        hint_ms: i64,
        queued_at: Option<u64>,
        server_ms: i64,
        /// A writer-preferring read-write waiter's place: its arrival number, and whether its
        /// turn has come (PROTOCOL 10).
        place: Option<QueuePlace>,
    },
}

/// A writer-preferring read-write waiter's place in its queue (PROTOCOL 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueuePlace {
    /// Its arrival number.
    pub(crate) seq: u64,
    /// Whether it may enter by the queue's rule (it waits for the lock, not for others ahead).
    pub(crate) may_enter: bool,
}

impl QueuePlace {
    /// Whether a waiter with arrival number `seq` may enter after the announcement
    /// `<head>:<first writer>` (`fairlock_rw_turns:{NAME}`): a reader before the first writer,
    /// a writer at the head. One no longer in the queue (`seq` before the head) should look.
    pub(crate) fn comes(seq: u64, writer: bool, head: u64, first_writer: u64) -> bool {
        if seq < head {
            return true;
        }
        if writer {
            seq == head
        } else {
            first_writer == 0 || seq < first_writer
        }
    }
}

/// What a release script found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// Every hold is gone: the lock is free and the next waiter was told.
    Free,
    /// Holds remain: this many.
    Remaining(u64),
    /// The lock no longer existed.
    Absent,
    /// Somebody else holds the lock.
    NotOwner,
    /// Our count in Redis was not the one expected: nothing was changed; it is this.
    Mismatch(u64),
}

/// What a release asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReleaseArgs {
    /// The hold count we believe Redis has.
    pub(crate) expected: u64,
    /// How many holds to release.
    pub(crate) by: u64,
    /// An attempt may have added one hold we never saw: release it too when it is there.
    pub(crate) dark: bool,
    /// The TTL (ms) the remaining holds need; -1 leaves the TTL alone.
    pub(crate) remaining_ttl_ms: i64,
}

/// Result of releasing one guard's hold, as the guard reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unlocked {
    /// Last hold released; the lock is free and the next waiter was told.
    Released,
    /// One hold fewer; the holder still has the lock.
    StillHeld,
    /// The lock had already expired (a fair lock treats this as released, as Redisson does).
    Expired,
    /// Somebody else holds it.
    NotOwner,
}

/// Parameters of one acquire attempt.
#[derive(Debug, Clone)]
pub(crate) struct AcquireArgs {
    pub(crate) spec: Arc<LockSpec>,
    pub(crate) field: Arc<str>,
    pub(crate) lease_ms: i64,
    pub(crate) liveness_ms: i64,
    /// The longest wait a Redisson client uses (`Builder::redisson_wait`).
    pub(crate) redisson_wait_ms: i64,
    pub(crate) mode: Mode,
    pub(crate) fenced: bool,
    /// The attempt's nonce when it takes a direct hand-off of a fair lock (PROTOCOL 8), 0 when
    /// not (in a call's own arguments: 1 when the call asks for hand-offs).
    pub(crate) nonce: u64,
    /// The TTL a direct grant gives the lock: `lease_ms`, at most `liveness_ms`.
    pub(crate) grant_ttl_ms: i64,
}

/// Runs one acquire attempt; `expected` is the hold count we believe Redis has for the field.
/// `drop_stale` (fair locks): `Some(mark)` to first take the field out of the queue wherever an
/// ended call of it was left (a give-up that failed or never ran); `mark` is drawn by the call
/// before any of its nonces, so an entry whose grant request names a nonce above it is the
/// call's own (queued by a send whose reply was lost, or by a first run of this send) and stays.
pub(crate) async fn acquire(
    conn: &mut Conn,
    args: &AcquireArgs,
    expected: u64,
    drop_stale: Option<u64>,
) -> Result<Attempt> {
    let keys = &args.spec.keys;
    let publish = conn.publish_command();
    let fenced = if args.fenced { "1" } else { "0" };
    let reply: Vec<i64> = match args.spec.kind {
        Kind::Fair => {
            scripts::FAIR_ACQUIRE
                .key(keys.name())
                .key(keys.queue())
                .key(keys.deadlines())
                .key(keys.liveness())
                .key(keys.token())
                .key(keys.grants())
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(expected)
                .arg(args.mode.as_arg())
                .arg(fenced)
                .arg(publish)
                .arg(keys.channel())
                .arg(args.liveness_ms)
                .arg(args.redisson_wait_ms)
                .arg(drop_stale.unwrap_or(0))
                .arg(if args.nonce == 0 {
                    String::new()
                } else {
                    args.nonce.to_string()
                })
                .arg(args.grant_ttl_ms)
                .invoke_async(conn)
                .await?
        }
        Kind::NonFair => {
            scripts::LOCK_ACQUIRE
                .key(keys.name())
                .key(keys.token())
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(expected)
                .arg(fenced)
                .invoke_async(conn)
                .await?
        }
        Kind::Read => {
            let [queue, writers, live, seq] = keys.rw_queue_keys();
            scripts::RW_READ_ACQUIRE
                .key(keys.name())
                .key(keys.lease_base())
                .key(queue)
                .key(writers)
                .key(live)
                .key(seq)
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(expected)
                .arg(format!("{}:write", args.field))
                .arg(rw_queueing(args))
                .arg(args.liveness_ms)
                .arg(publish)
                .arg(keys.rw_channel())
                .arg(keys.rw_turns_channel())
                .invoke_async(conn)
                .await?
        }
        Kind::Write => {
            let [queue, writers, live, seq] = keys.rw_queue_keys();
            scripts::RW_WRITE_ACQUIRE
                .key(keys.name())
                .key(keys.token())
                .key(queue)
                .key(writers)
                .key(live)
                .key(seq)
                .arg(args.lease_ms)
                .arg(&*args.field)
                .arg(expected)
                .arg(fenced)
                .arg(read_field(&args.field))
                .arg(rw_queueing(args))
                .arg(args.liveness_ms)
                .arg(publish)
                .arg(keys.rw_channel())
                .arg(keys.rw_turns_channel())
                .invoke_async(conn)
                .await?
        }
    };
    match reply.as_slice() {
        [-2, 0, 0] => Err(Error::UpgradeRefused {
            name: keys.name().to_owned(),
            field: read_field(&args.field).to_owned(),
        }),
        [code @ (1 | 2), count, token] if *count > 0 => Ok(Attempt::Acquired {
            count: *count as u64,
            adopted: *code == 2,
            token: args.fenced.then_some((*token).max(0) as u64),
        }),
        [0, position, hint, server_ms] => Ok(Attempt::Waiting {
            hint_ms: *hint,
            queued_at: (*position > 0).then_some(*position as u64),
            server_ms: *server_ms,
            place: None,
        }),
        [0, position, hint] => Ok(Attempt::Waiting {
            hint_ms: *hint,
            queued_at: (*position > 0).then_some(*position as u64),
            server_ms: 0,
            place: None,
        }),
        [0, position, hint, 0, seq, may_enter] => Ok(Attempt::Waiting {
            hint_ms: *hint,
            queued_at: (*position > 0).then_some(*position as u64),
            server_ms: 0,
            place: (*seq > 0).then_some(QueuePlace {
                seq: *seq as u64,
                may_enter: *may_enter == 1,
            }),
        }),
        _ => Err(Error::bad_reply("acquire", reply)),
    }
}

/// Releases holds of `field` (see [`ReleaseArgs`]).
pub(crate) async fn unlock(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    release: ReleaseArgs,
) -> Result<Released> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let dark = if release.dark { "1" } else { "0" };
    let mut invocation = match spec.kind {
        Kind::Fair => {
            let mut i = scripts::FAIR_UNLOCK.key(keys.name());
            i.key(keys.queue())
                .key(keys.deadlines())
                .key(keys.liveness())
                .key(keys.grants())
                .key(keys.token());
            i
        }
        Kind::NonFair => scripts::LOCK_UNLOCK.key(keys.name()),
        Kind::Read => {
            let mut i = scripts::RW_READ_UNLOCK.key(keys.name());
            i.key(keys.lease_base());
            i
        }
        Kind::Write => scripts::RW_WRITE_UNLOCK.key(keys.name()),
    };
    let reply: Vec<i64> = invocation
        .arg(field)
        .arg(release.expected)
        .arg(release.by)
        .arg(dark)
        .arg(release.remaining_ttl_ms)
        .arg(publish)
        .arg(spec.release_channel())
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [1, 0] => Ok(Released::Free),
        [0, count] if *count > 0 => Ok(Released::Remaining(*count as u64)),
        [2, 0] => Ok(Released::Absent),
        [-1, 0] => Ok(Released::NotOwner),
        [3, count] if *count > 0 => Ok(Released::Mismatch(*count as u64)),
        _ => Err(Error::bad_reply("unlock", reply)),
    }
}

/// What a give-up found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GaveUp {
    /// The waiter was queued and is now removed.
    Left,
    /// The waiter was not queued (any more).
    NotQueued,
    /// The lock had been handed to the waiter directly (PROTOCOL 8) while it gave up: that hold
    /// was given back and the lock handed on.
    GrantReturned,
}

/// Removes a fair waiter from the queue and hands a free lock on to the next head; gives back a
/// hold handed to the waiter directly while it gave up (`expected`: the hold count the client
/// believes Redis has for the field).
pub(crate) async fn give_up(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    expected: u64,
) -> Result<GaveUp> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    if spec.kind.is_rw() {
        let [queue, writers, live, seq] = keys.rw_queue_keys();
        let code: i64 = scripts::RW_GIVE_UP
            .key(keys.name())
            .key(queue)
            .key(writers)
            .key(live)
            .key(seq)
            .arg(field)
            .arg(publish)
            .arg(keys.rw_turns_channel())
            .invoke_async(conn)
            .await?;
        return match code {
            1 => Ok(GaveUp::Left),
            0 => Ok(GaveUp::NotQueued),
            other => Err(Error::bad_reply("give_up", vec![other])),
        };
    }
    let code: i64 = scripts::FAIR_GIVE_UP
        .key(keys.name())
        .key(keys.queue())
        .key(keys.deadlines())
        .key(keys.liveness())
        .key(keys.grants())
        .key(keys.token())
        .arg(field)
        .arg(publish)
        .arg(keys.channel())
        .arg(expected)
        .invoke_async(conn)
        .await?;
    match code {
        1 => Ok(GaveUp::Left),
        0 => Ok(GaveUp::NotQueued),
        2 => Ok(GaveUp::GrantReturned),
        other => Err(Error::bad_reply("give_up", vec![other])),
    }
}

/// Makes the lock live at least `ttl_ms` from now while `field` holds it (the watchdog's renewal
/// script for one lock: it never shortens the TTL). Returns whether the field still held it.
pub(crate) async fn extend(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    ttl_ms: i64,
) -> Result<bool> {
    let reply: Vec<i64> = scripts::RENEW
        .key(spec.keys.name())
        .arg(ttl_ms)
        .arg(field)
        .arg(spec.renewal_base())
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(Error::bad_reply("extend", reply)),
    }
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
                .key(keys.liveness())
                .key(keys.grants())
                .key(keys.token())
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
        Kind::Read | Kind::Write => {
            return rw_force_unlock(conn, spec, Some(spec.kind)).await;
        }
    };
    Ok(deleted == 1)
}

/// Deletes a read-write lock whoever holds it: only while it is in the mode of `side`
/// (Redisson's force unlock of that side), in any mode when `None`. Returns whether it was
/// deleted.
pub(crate) async fn rw_force_unlock(
    conn: &mut Conn,
    spec: &LockSpec,
    side: Option<Kind>,
) -> Result<bool> {
    let keys = &spec.keys;
    let publish = conn.publish_command();
    let mode = match side {
        Some(Kind::Read) => "read",
        Some(Kind::Write) => "write",
        _ => "",
    };
    let deleted: i64 = scripts::RW_FORCE_UNLOCK
        .key(keys.name())
        .arg(mode)
        .arg(publish)
        .arg(keys.rw_channel())
        .invoke_async(conn)
        .await?;
    Ok(deleted == 1)
}

/// Whether the lock is held, as Redisson's `isLocked` answers for its kind: the key exists
/// (fair, non-fair); for a side of a read-write lock, the hash's `mode` is that side's (a reader
/// also counts a writer's own read holds: more than `mode` and the writer's field).
pub(crate) async fn is_locked(conn: &mut Conn, spec: &LockSpec) -> Result<bool> {
    let name = spec.name();
    match spec.kind {
        Kind::Fair | Kind::NonFair => Ok(redis::cmd("EXISTS").arg(name).query_async(conn).await?),
        Kind::Read | Kind::Write => {
            let (mode, fields): (Option<String>, i64) = redis::pipe()
                .hget(name, "mode")
                .hlen(name)
                .query_async(conn)
                .await?;
            Ok(match (spec.kind, mode.as_deref()) {
                (Kind::Read, Some("read")) => true,
                (Kind::Read, Some("write")) => fields > 2,
                (Kind::Write, Some("write")) => true,
                _ => false,
            })
        }
    }
}

/// Holds on the lock: of the owner field `field`, or with `None` of every field of the client
/// whose fields start with `client_prefix` (`<uuid>:`); a side of a read-write lock counts its
/// own fields only (a writer's end in `:write`).
pub(crate) async fn hold_count(
    conn: &mut Conn,
    spec: &LockSpec,
    field: Option<&str>,
    client_prefix: &str,
) -> Result<u32> {
    let name = spec.name();
    let count: i64 = match field {
        Some(field) => {
            let count: Option<i64> = redis::cmd("HGET")
                .arg(name)
                .arg(field)
                .query_async(conn)
                .await?;
            count.unwrap_or(0)
        }
        None => {
            let fields: Vec<(String, String)> =
                redis::cmd("HGETALL").arg(name).query_async(conn).await?;
            fields
                .iter()
                .filter(|(field, _)| field.starts_with(client_prefix))
                .filter(|(field, _)| match spec.kind {
                    Kind::Read => !field.ends_with(":write"),
                    Kind::Write => field.ends_with(":write"),
                    Kind::Fair | Kind::NonFair => true,
                })
                .filter_map(|(_, count)| count.parse::<i64>().ok())
                .sum()
        }
    };
    Ok(count.clamp(0, u32::MAX as i64) as u32)
}

/// How a read-write lock's attempt uses the writer-preferring queue (`lua/rw_read_acquire.lua`).
fn rw_queueing(args: &AcquireArgs) -> &'static str {
    match (args.spec.prefer_writers, args.mode) {
        (false, _) => "",
        (true, Mode::Try) => "try",
        (true, _) => "queue",
    }
}

/// The read field of a holder whose write field is `write_field` (`…:write` without the suffix).
fn read_field(write_field: &str) -> &str {
    write_field.strip_suffix(":write").unwrap_or(write_field)
}

/// An atomic snapshot of a read-write lock (see `rw_state.lua`).
pub(crate) async fn rw_state(conn: &mut Conn, spec: &LockSpec) -> Result<RawRwState> {
    let keys = &spec.keys;
    type Holders = Vec<(String, i64, Vec<i64>)>;
    type Waiters = Vec<(String, i64)>;
    let [queue, _, live, _] = keys.rw_queue_keys();
    let (now_ms, pttl_ms, mode, holders, waiters): (i64, i64, String, Holders, Waiters) =
        scripts::RW_STATE
            .key(keys.name())
            .key(keys.lease_base())
            .key(queue)
            .key(live)
            .invoke_async(conn)
            .await?;
    Ok(RawRwState {
        now_ms,
        pttl_ms,
        mode,
        holders,
        waiters,
    })
}

/// An atomic snapshot of the lock (see `state.lua`).
pub(crate) async fn state(conn: &mut Conn, spec: &LockSpec) -> Result<RawState> {
    let keys = &spec.keys;
    type Pairs = Vec<(String, i64)>;
    type Waiters = Vec<(String, i64, i64)>;
    let (now_ms, pttl_ms, owners, waiters): (i64, i64, Pairs, Waiters) = scripts::STATE
        .key(keys.name())
        .key(keys.queue())
        .key(keys.deadlines())
        .key(keys.liveness())
        .invoke_async(conn)
        .await?;
    Ok(RawState {
        now_ms,
        pttl_ms,
        owners,
        waiters,
    })
}

#[cfg(test)]
mod tests {
    use super::QueuePlace;

    #[test]
    fn a_turn_comes_for_readers_before_the_first_writer_and_for_a_writer_at_the_head() {
        // Queue 5 (reader), 6 (reader), 7 (writer), 8 (reader): head 5, first writer 7.
        assert!(QueuePlace::comes(5, false, 5, 7));
        assert!(QueuePlace::comes(6, false, 5, 7));
        assert!(!QueuePlace::comes(7, true, 5, 7));
        assert!(!QueuePlace::comes(8, false, 5, 7));
        // The readers entered: the writer is the head.
        assert!(QueuePlace::comes(7, true, 7, 7));
        assert!(!QueuePlace::comes(8, false, 7, 7));
        // No writer queued: every reader.
        assert!(QueuePlace::comes(9, false, 8, 0));
        // Gone from the queue (before the head): look.
        assert!(QueuePlace::comes(3, true, 7, 7));
    }
}
