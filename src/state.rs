//! Inspection types: what `state()` reports about a lock, whoever holds it (Java clients too).
//!
//! It must never judge a fairlock waiter by its deadline in the zset (Redisson clients shift it):
//! fairlock's waiters are judged by their liveness marks, as the scripts judge them.
//!
//! The rule for "this waiter looks dead" is written here once, in `judge`, for the library's
//! `QueuedWaiter::alive` and for every tool that reads locks from the outside (the `fairlock`
//! command-line tool calls [`QueuedWaiter::dead_reason`]). The scripts that act on that judgement
//! atomically keep their own Lua copy: `lua/fair_prologue.lua` (`purge_stale_head`, the library's
//! rule) and `lua/admin_prologue.lua` (`dead_reason`, this rule with its codes, for `fairlock::admin`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::keys;

/// A server time in Unix epoch milliseconds as a `SystemTime` (times before the epoch, which no
/// Redis clock reports, clamp to it).
fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// A `SystemTime` as Unix epoch milliseconds (the scripts' unit), saturating.
fn to_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

/// What `state.lua` returns, before decoding.
pub(crate) struct RawState {
    pub(crate) now_ms: i64,
    pub(crate) pttl_ms: i64,
    pub(crate) owners: Vec<(String, i64)>,
    pub(crate) waiters: Vec<(String, i64, i64)>,
}

/// What `rw_state.lua` returns, before decoding.
pub(crate) struct RawRwState {
    pub(crate) now_ms: i64,
    pub(crate) pttl_ms: i64,
    pub(crate) mode: String,
    pub(crate) holders: Vec<(String, i64, Vec<i64>)>,
    pub(crate) waiters: Vec<(String, i64)>,
}

/// Which side holds a [`ReadWriteLock`](crate::ReadWriteLock) (its `mode` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RwMode {
    /// Readers hold it (and nobody else can write).
    Read,
    /// A writer holds it (possibly with read holds of its own: a downgrade).
    Write,
}

/// A snapshot of one [`ReadWriteLock`](crate::ReadWriteLock), read atomically, Java holders
/// included.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockState {
    /// The lock's mode; `None` when nobody holds it.
    pub mode: Option<RwMode>,
    /// The writer (field `<client id>:<holder id>:write`), if any.
    pub writer: Option<Owner>,
    /// Every read holder field in the lock, dead ones included (see [`Reader::alive`]).
    pub readers: Vec<Reader>,
    /// Time to live of the lock; `None` when it is not held or has no expiry.
    pub ttl: Option<Duration>,
    /// Writer-preferring fairlock waiters, in arrival order
    /// ([`ReadWriteLock::writer_preferring`](crate::ReadWriteLock::writer_preferring); Java
    /// waiters and those of other handles are not queued anywhere).
    pub queue: Vec<RwWaiter>,
    /// The server's clock when the snapshot was taken.
    pub server_time: SystemTime,
}

/// A writer-preferring waiter of a [`ReadWriteLock`](crate::ReadWriteLock).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwWaiter {
    /// Its owner field (a writer's ends in `:write`).
    pub field: String,
    /// Whether it waits to write.
    pub writer: bool,
    /// Until when its liveness mark keeps its place (its client's heartbeats move it on);
    /// `None` without a mark.
    pub alive_until: Option<SystemTime>,
}

impl RwLockState {
    /// Whether anyone holds the lock.
    pub fn is_locked(&self) -> bool {
        self.mode.is_some()
    }

    pub(crate) fn from_raw(raw: RawRwState) -> Self {
        let mode = match raw.mode.as_str() {
            "read" => Some(RwMode::Read),
            "write" => Some(RwMode::Write),
            _ => None,
        };
        let holds = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
        let mut writer = None;
        let mut readers = Vec::new();
        for (field, count, leases) in raw.holders {
            if field.ends_with(":write") {
                writer = Some(Owner {
                    field,
                    holds: holds(count),
                });
            } else {
                readers.push(Reader {
                    owner: Owner {
                        field,
                        holds: holds(count),
                    },
                    leases: leases
                        .into_iter()
                        .map(|ms| (ms > 0).then(|| Duration::from_millis(ms as u64)))
                        .collect(),
                });
            }
        }
        RwLockState {
            mode,
            writer,
            readers,
            ttl: (raw.pttl_ms >= 0).then(|| Duration::from_millis(raw.pttl_ms as u64)),
            queue: raw
                .waiters
                .into_iter()
                .map(|(field, mark)| RwWaiter {
                    writer: field.ends_with(":write"),
                    field,
                    alive_until: (mark >= 0).then(|| at_ms(mark)),
                })
                .collect(),
            server_time: at_ms(raw.now_ms),
        }
    }
}

/// One read holder field of a [`ReadWriteLock`](crate::ReadWriteLock).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reader {
    /// The field and its hold count.
    pub owner: Owner,
    /// The remaining time of the lease key of each hold (1 first; `None` when the key is gone,
    /// or has no expiry, which Redisson's rule counts as dead too).
    pub leases: Vec<Option<Duration>>,
}

impl Reader {
    /// Whether the reader still counts: a Redisson read unlock treats a reader whose lease keys
    /// all expired as dead (its field stays in the hash until the next unlock cleans up).
    pub fn alive(&self) -> bool {
        self.leases.iter().any(Option::is_some)
    }
}

/// A snapshot of one lock, read atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// Who holds it, if anyone. Normally one owner; a foreign writer could leave more.
    pub owners: Vec<Owner>,
    /// Time to live of the lock; `None` when it is not held or has no expiry.
    pub ttl: Option<Duration>,
    /// Fair waiters in queue order (always empty for a non-fair lock).
    pub queue: Vec<QueuedWaiter>,
    /// The server's clock when the snapshot was taken (`TIME` of the server, whose clock may
    /// differ from this process's).
    pub server_time: SystemTime,
}

impl LockState {
    /// Whether anyone holds the lock.
    pub fn is_locked(&self) -> bool {
        !self.owners.is_empty()
    }

    pub(crate) fn from_raw(raw: RawState) -> Self {
        LockState {
            owners: raw
                .owners
                .into_iter()
                .map(|(field, holds)| Owner {
                    field,
                    holds: u32::try_from(holds.max(0)).unwrap_or(u32::MAX),
                })
                .collect(),
            ttl: (raw.pttl_ms >= 0).then(|| Duration::from_millis(raw.pttl_ms as u64)),
            queue: raw
                .waiters
                .into_iter()
                .map(|(field, deadline, alive_until)| {
                    let deadline_ms = (deadline >= 0).then_some(deadline);
                    let alive_until_ms = (alive_until >= 0).then_some(alive_until);
                    // A fairlock waiter is judged by its liveness mark, any other by its deadline
                    // (PROTOCOL 7), as the purge in every fair script does; the snapshot alone
                    // cannot tell a fairlock client without a mark.
                    let alive = judge(deadline_ms, alive_until_ms, false, raw.now_ms).is_none();
                    QueuedWaiter {
                        field,
                        deadline: deadline_ms.map(at_ms),
                        expires_in: deadline_ms.map(|d| {
                            Duration::from_millis(d.saturating_sub(raw.now_ms).max(0) as u64)
                        }),
                        alive_until: alive_until_ms.map(at_ms),
                        alive,
                    }
                })
                .collect(),
            server_time: at_ms(raw.now_ms),
        }
    }
}

/// One owner record of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owner {
    /// The owner field, `<client uuid>:<holder id>` (Java: the thread id).
    pub field: String,
    /// Reentrant hold count (as [`LockGuard::hold_count`](crate::LockGuard::hold_count); a
    /// count beyond `u32::MAX`, which no client writes, reads as `u32::MAX`).
    pub holds: u32,
}

impl Owner {
    /// The client-instance part of the field (everything before the last `:`).
    pub fn client_id(&self) -> &str {
        keys::split_field(&self.field).0
    }

    /// The holder id (after the last `:`), when it is a number.
    pub fn holder_id(&self) -> Option<i64> {
        keys::split_field(&self.field).1
    }
}

/// One queued fair waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedWaiter {
    /// The waiter's owner field.
    pub field: String,
    /// Its deadline (server clock, millisecond precision), if it has one.
    pub deadline: Option<SystemTime>,
    /// Time until that deadline, by the server clock at the snapshot.
    pub expires_in: Option<Duration>,
    /// For a fairlock waiter, the server time by which its client must refresh its liveness
    /// mark (`fairlock_liveness:{NAME}`, PROTOCOL 7); `None` for any other waiter (a Redisson
    /// one), which is judged by its deadline alone.
    pub alive_until: Option<SystemTime>,
    /// Whether the waiter looked alive at the snapshot: its liveness mark (fairlock) or its
    /// deadline (others) had not passed, that is
    /// [`dead_reason(server_time, false)`](QueuedWaiter::dead_reason) is `None`. The next fair
    /// script that finds a dead waiter at the head of the queue removes it.
    pub alive: bool,
}

impl QueuedWaiter {
    /// Whether the waiter is one of fairlock's (it has a liveness mark).
    pub fn is_fairlock(&self) -> bool {
        self.alive_until.is_some()
    }

    /// Why the waiter looks dead at `now` (server clock, compared in whole milliseconds as the
    /// scripts compare), or `None` while
    /// it looks alive. In this order:
    ///
    /// 1. it has a liveness mark (a fairlock waiter): dead once the mark is not in the future
    ///    ([`DeadReason::LivenessLapsed`]), whatever its deadline says (Redisson clients shift
    ///    those);
    /// 2. it has no mark, but `fairlock_client` says its client id is that of a fairlock client
    ///    (one with a mark on this lock for another waiter): dead
    ///    ([`DeadReason::LivenessMissing`]), since a queued fairlock waiter keeps a mark;
    /// 3. otherwise (a Redisson waiter): dead when it has no deadline
    ///    ([`DeadReason::NoDeadline`]) or its deadline is not in the future
    ///    ([`DeadReason::DeadlinePassed`]).
    ///
    /// [`alive`](QueuedWaiter::alive) is this with `fairlock_client = false` at the snapshot's
    /// server time: the snapshot alone cannot tell a fairlock client without a mark.
    ///
    /// The `fairlock` command-line tool reports with this rule and acts on it atomically in its
    /// scripts, whose one Lua copy of it is `dead_reason` in the repository's
    /// `lua/admin_prologue.lua` (same order, same codes): change both together.
    ///
    /// ```
    /// # fn demo(state: fairlock::LockState) {
    /// for w in &state.queue {
    ///     if let Some(reason) = w.dead_reason(state.server_time, false) {
    ///         eprintln!("{} looks dead: {}", w.field, reason.code());
    ///     }
    /// }
    /// # }
    /// ```
    pub fn dead_reason(&self, now: SystemTime, fairlock_client: bool) -> Option<DeadReason> {
        judge(
            self.deadline.map(to_ms),
            self.alive_until.map(to_ms),
            fairlock_client,
            to_ms(now),
        )
    }
}

/// Why a queued waiter looks dead (see [`QueuedWaiter::dead_reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadReason {
    /// A fairlock waiter whose liveness mark is not in the future.
    LivenessLapsed,
    /// A waiter without a liveness mark whose client is known to be a fairlock client.
    LivenessMissing,
    /// A waiter without a liveness mark or a deadline.
    NoDeadline,
    /// A waiter without a liveness mark whose deadline is not in the future.
    DeadlinePassed,
}

impl DeadReason {
    /// A stable code: `liveness_lapsed`, `liveness_missing`, `no_deadline` or `deadline_passed`
    /// (the codes the `fairlock` tool prints and its scripts return).
    pub fn code(self) -> &'static str {
        match self {
            DeadReason::LivenessLapsed => "liveness_lapsed",
            DeadReason::LivenessMissing => "liveness_missing",
            DeadReason::NoDeadline => "no_deadline",
            DeadReason::DeadlinePassed => "deadline_passed",
        }
    }

    /// The reason with this [`code`](Self::code) (as the admin scripts reply it).
    pub(crate) fn from_code(code: &str) -> Option<DeadReason> {
        [
            DeadReason::LivenessLapsed,
            DeadReason::LivenessMissing,
            DeadReason::NoDeadline,
            DeadReason::DeadlinePassed,
        ]
        .into_iter()
        .find(|r| r.code() == code)
    }
}

/// The one "looks dead" rule (documented on [`QueuedWaiter::dead_reason`]).
fn judge(
    deadline_ms: Option<i64>,
    alive_until_ms: Option<i64>,
    fairlock_client: bool,
    now_ms: i64,
) -> Option<DeadReason> {
    if let Some(mark) = alive_until_ms {
        return (mark <= now_ms).then_some(DeadReason::LivenessLapsed);
    }
    if fairlock_client {
        return Some(DeadReason::LivenessMissing);
    }
    match deadline_ms {
        None => Some(DeadReason::NoDeadline),
        Some(d) if d <= now_ms => Some(DeadReason::DeadlinePassed),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_raw_state() {
        let s = LockState::from_raw(RawState {
            now_ms: 1000,
            pttl_ms: 250,
            owners: vec![("abc-def:7".into(), 2)],
            waiters: vec![
                ("x:1".into(), 1500, -1),
                ("y:-2".into(), -1, -1),
                ("z:3".into(), 900, 1200),
                ("w:4".into(), 90_000, 990),
            ],
        });
        assert!(s.is_locked());
        assert_eq!(s.ttl, Some(Duration::from_millis(250)));
        assert_eq!(s.owners[0].client_id(), "abc-def");
        assert_eq!(s.owners[0].holder_id(), Some(7));
        assert_eq!(s.queue[0].expires_in, Some(Duration::from_millis(500)));
        assert_eq!(s.queue[1].deadline, None);
        assert_eq!(s.queue[0].deadline, Some(at_ms(1500)));
        assert_eq!(to_ms(at_ms(1500)), 1500);
        assert!(s.queue[0].alive && !s.queue[0].is_fairlock());
        assert!(!s.queue[1].alive, "no deadline: dead");
        // A fairlock waiter is judged by its liveness mark, not its (shifted) deadline.
        assert!(s.queue[2].alive && s.queue[2].is_fairlock());
        assert!(!s.queue[3].alive);
        assert_eq!(s.server_time, UNIX_EPOCH + Duration::from_secs(1));
        let free = LockState::from_raw(RawState {
            now_ms: 0,
            pttl_ms: -2,
            owners: vec![],
            waiters: vec![],
        });
        assert!(!free.is_locked());
        assert_eq!(free.ttl, None);
    }

    #[test]
    fn waiters_are_judged_by_mark_then_client_then_deadline() {
        use DeadReason::*;
        // A mark decides alone, whatever the deadline or the client says.
        assert_eq!(judge(Some(10), Some(200), true, 100), None);
        assert_eq!(
            judge(Some(999), Some(100), false, 100),
            Some(LivenessLapsed)
        );
        // No mark, but a fairlock client: dead.
        assert_eq!(judge(Some(999), None, true, 100), Some(LivenessMissing));
        // Others by their deadline.
        assert_eq!(judge(Some(101), None, false, 100), None);
        assert_eq!(judge(Some(100), None, false, 100), Some(DeadlinePassed));
        assert_eq!(judge(None, None, false, 100), Some(NoDeadline));
        assert_eq!(LivenessMissing.code(), "liveness_missing");
    }
}
