//! Inspection types: what `state()` reports about a lock, whoever holds it (Java clients too).
//!
//! It must never judge a fairlock waiter by its deadline in the zset (Redisson clients shift it):
//! fairlock's waiters are judged by their liveness marks, as the scripts judge them.

use std::time::Duration;

use crate::keys;

/// What `state.lua` returns, before decoding.
pub(crate) struct RawState {
    pub(crate) now_ms: i64,
    pub(crate) pttl_ms: i64,
    pub(crate) owners: Vec<(String, i64)>,
    pub(crate) waiters: Vec<(String, i64, i64)>,
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
    /// The server's clock when the snapshot was taken (Unix epoch milliseconds).
    pub server_time_ms: i64,
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
                    holds: holds.max(0) as u64,
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
                    // (PROTOCOL 7), as the purge in every fair script does.
                    let judged_by = alive_until_ms.or(deadline_ms);
                    QueuedWaiter {
                        field,
                        deadline_ms,
                        expires_in: deadline_ms.map(|d| {
                            Duration::from_millis(d.saturating_sub(raw.now_ms).max(0) as u64)
                        }),
                        alive_until_ms,
                        alive: judged_by.is_some_and(|t| t > raw.now_ms),
                    }
                })
                .collect(),
            server_time_ms: raw.now_ms,
        }
    }
}

/// One owner record of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owner {
    /// The owner field, `<client uuid>:<holder id>` (Java: the thread id).
    pub field: String,
    /// Reentrant hold count.
    pub holds: u64,
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
    /// Its deadline in Unix epoch milliseconds (server clock), if it has one.
    pub deadline_ms: Option<i64>,
    /// Time until that deadline, by the server clock at the snapshot.
    pub expires_in: Option<Duration>,
    /// For a fairlock waiter, the server time (epoch ms) by which its client must refresh its
    /// liveness mark (`fairlock_liveness:{NAME}`, PROTOCOL 7); `None` for any other waiter
    /// (a Redisson one), which is judged by its deadline alone.
    pub alive_until_ms: Option<i64>,
    /// Whether the waiter looked alive at the snapshot: its liveness mark (fairlock) or its
    /// deadline (others) had not passed. The next fair script that finds a dead waiter at the
    /// head of the queue removes it.
    pub alive: bool,
}

impl QueuedWaiter {
    /// Whether the waiter is one of fairlock's (it has a liveness mark).
    pub fn is_fairlock(&self) -> bool {
        self.alive_until_ms.is_some()
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
        assert_eq!(s.queue[1].deadline_ms, None);
        assert!(s.queue[0].alive && !s.queue[0].is_fairlock());
        assert!(!s.queue[1].alive, "no deadline: dead");
        // A fairlock waiter is judged by its liveness mark, not its (shifted) deadline.
        assert!(s.queue[2].alive && s.queue[2].is_fairlock());
        assert!(!s.queue[3].alive);
        assert_eq!(s.server_time_ms, 1000);
        let free = LockState::from_raw(RawState {
            now_ms: 0,
            pttl_ms: -2,
            owners: vec![],
            waiters: vec![],
        });
        assert!(!free.is_locked());
        assert_eq!(free.ttl, None);
    }
}
