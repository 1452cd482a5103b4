//! The crate's one error type.
//!
//! It must never lose the Redis error behind a failure: it is kept as the `source`, and only
//! there (the message does not repeat it), so error reporters that walk the chain, such as
//! anyhow's `{:#}`, print the cause once. The crate's own log lines print the whole chain
//! ([`chain`]).

use std::time::Duration;

/// Everything that can go wrong in fairlock.
///
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a wildcard arm. The
/// `is_*` predicates are the stable way to ask the common questions.
/// It is `Clone` (the Redis error inside is cheap to clone), so one failure can be reported to
/// every caller it concerns.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error, could not be reached, or answered in a shape fairlock's
    /// scripts never produce (a redis-rs parsing error). The Redis error is the
    /// [`source`](std::error::Error::source); the message does not repeat it.
    #[error("Redis request failed")]
    Redis(#[source] RedisCause),

    /// Redis refused the client's credentials when it connected: the server needs a password
    /// and none was given, or the username or password is wrong. Found by
    /// [`Client::connect`](crate::Client::connect) and [`Builder::build`](crate::Builder::build),
    /// before any lock is used. The server's reply (`NOAUTH`, `WRONGPASS`, …) is the
    /// [`source`](std::error::Error::source).
    #[error("Redis refused the client's credentials (check the username and password)")]
    Authentication(#[source] RedisCause),

    /// The lock is not held by this holder: it was released already, it expired, somebody
    /// force-unlocked it, or the guard had already been told it was lost.
    #[error("the lock is not held by this holder")]
    NotHeld,

    /// The lock name cannot be used.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// An argument (a duration, a count, a URL) is out of range.
    #[error("invalid argument `{argument}`: {reason}")]
    InvalidArgument {
        /// Which argument.
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// A Redlock acquisition did not reach a majority of masters in time.
    #[error("quorum not reached: {acquired} of {needed} masters")]
    QuorumNotReached {
        /// Masters that granted the lock.
        acquired: usize,
        /// Masters needed for a majority.
        needed: usize,
    },

    /// Replica synchronisation (`WAIT`) was requested and no replica acknowledged in time.
    #[error("no replica acknowledged the lock write within {timeout:?} ({replicas} connected)")]
    ReplicasNotSynced {
        /// Connected replicas when the write was made.
        replicas: u64,
        /// How long `WAIT` waited.
        timeout: Duration,
    },

    /// The holder already holds or waits for this name as the other kind of lock: a
    /// [`FairLock`](crate::FairLock) and a [`NonFairLock`](crate::NonFairLock) of one name and one holder
    /// would write one owner field in one hash, and each kind's release would take the other's
    /// holds away. Nothing was sent. (Different holders may use different kinds on one name;
    /// they simply exclude each other.)
    #[error("holder {field:?} already uses lock {name:?} as a {held_as} lock")]
    KindConflict {
        /// The lock name.
        name: String,
        /// The owner field of the holder.
        field: String,
        /// The kind the holder already uses it as: `"fair"`, `"plain"`, `"read"` or `"write"`.
        held_as: &'static str,
    },

    /// A write lock was asked for by a holder that holds the same
    /// [`ReadWriteLock`](crate::ReadWriteLock) for reading only. The writer would wait for ever
    /// behind its own read holds (Redisson's `RReadWriteLock` blocks there); release the read
    /// holds first. Nothing was taken. (The other way, write then read, is a downgrade and is
    /// allowed.) Only calls that share a [`Holder`](crate::Holder) with the reader can be
    /// refused: without one, a task that holds a read guard and asks for the write lock is a
    /// second holder and waits for ever on itself (see [`ReadWriteLock`](crate::ReadWriteLock)).
    #[error(
        "holder {field:?} holds lock {name:?} for reading: it cannot also take it for writing"
    )]
    UpgradeRefused {
        /// The lock name.
        name: String,
        /// The owner field of the holder's read holds.
        field: String,
    },

    /// The client was shut down; no further lock operations are possible.
    #[error("the fairlock client was shut down")]
    Shutdown,

    /// Work run under a lock ([`LockGuard::run`](crate::LockGuard::run)) was stopped because the
    /// lock was lost before it finished.
    #[error("lock {name:?} was lost before the work finished: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// Why the lock can no longer be trusted.
        reason: LostReason,
    },
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(RedisCause(e))
    }
}

/// The redis-rs error behind [`Error::Redis`] and [`Error::Authentication`], as their
/// [`source`](std::error::Error::source). redis-rs's own message already carries what went wrong
/// underneath (`Connection refused (os error 111)`), so this shows that message and reports no
/// further source: a reporter that walks the chain, such as anyhow's `{:#}`, prints each cause
/// once. [`redis_error`](Self::redis_error) gives the redis-rs error itself (its kind, its code).
#[derive(Debug, Clone)]
pub struct RedisCause(redis::RedisError);

impl RedisCause {
    /// The redis-rs error.
    pub fn redis_error(&self) -> &redis::RedisError {
        &self.0
    }

    /// The redis-rs error, owned.
    pub fn into_redis_error(self) -> redis::RedisError {
        self.0
    }
}

impl std::ops::Deref for RedisCause {
    type Target = redis::RedisError;

    fn deref(&self) -> &redis::RedisError {
        &self.0
    }
}

impl std::fmt::Display for RedisCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for RedisCause {}

impl From<redis::RedisError> for RedisCause {
    fn from(e: redis::RedisError) -> Self {
        RedisCause(e)
    }
}

impl Error {
    /// The lock was not (or no longer) held by the caller.
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld)
    }

    /// The error came from Redis or from the connection to it (authentication failures
    /// included).
    pub fn is_redis(&self) -> bool {
        matches!(self, Error::Redis(_) | Error::Authentication(_))
    }

    /// The redis-rs error behind an [`Error::Redis`] or [`Error::Authentication`].
    pub fn redis_error(&self) -> Option<&redis::RedisError> {
        match self {
            Error::Redis(e) | Error::Authentication(e) => Some(e.redis_error()),
            _ => None,
        }
    }

    /// Redis refused the client's credentials ([`Authentication`](Error::Authentication)).
    pub fn is_authentication(&self) -> bool {
        matches!(self, Error::Authentication(_))
    }

    /// `e` is Redis refusing the credentials (or their absence): the error redis-rs gives when
    /// `AUTH` fails, or a server's `NOAUTH` / `WRONGPASS` reply.
    pub(crate) fn authentication(e: redis::RedisError) -> Self {
        let refused = e.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
        if refused {
            Error::Authentication(RedisCause(e))
        } else {
            Error::Redis(RedisCause(e))
        }
    }

    /// A Redis command timed out (see `Builder::command_timeout`).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Redis(e) if e.is_timeout())
    }

    /// The connection to Redis was refused, dropped or could not be made.
    pub fn is_connection_error(&self) -> bool {
        matches!(self, Error::Redis(e) if e.is_connection_dropped() || e.is_connection_refusal() || e.is_io_error())
    }

    /// A failure that may clear up by itself: the connection dropped or timed out, or the server
    /// is failing over, loading, or (in a cluster) moving slots. Waiting calls retry these until
    /// their deadline.
    pub fn is_transient(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        let Error::Redis(e) = self else {
            return false;
        };
        matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::MasterNameNotFoundBySentinel
                | ErrorKind::NoValidReplicasFoundBySentinel
                | ErrorKind::Server(
                    ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                )
        )
    }

    /// A transient failure after which a command may or may not have run (its reply was lost).
    pub(crate) fn is_ambiguous(&self) -> bool {
        matches!(self, Error::Redis(e) if e.kind() == redis::ErrorKind::Io)
    }

    /// The lock name or another argument was rejected before anything was sent (including a
    /// [`KindConflict`](Error::KindConflict)).
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidName { .. } | Error::InvalidArgument { .. } | Error::KindConflict { .. }
        )
    }

    /// The client was shut down.
    pub fn is_shutdown(&self) -> bool {
        matches!(self, Error::Shutdown)
    }

    /// The lock name was rejected ([`InvalidName`](Error::InvalidName)).
    pub fn is_invalid_name(&self) -> bool {
        matches!(self, Error::InvalidName { .. })
    }

    /// An argument or setting was rejected ([`InvalidArgument`](Error::InvalidArgument)).
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument { .. })
    }

    /// The holder uses the name as the other kind of lock ([`KindConflict`](Error::KindConflict)).
    pub fn is_kind_conflict(&self) -> bool {
        matches!(self, Error::KindConflict { .. })
    }

    /// A Redlock round missed its majority ([`QuorumNotReached`](Error::QuorumNotReached)).
    pub fn is_quorum_not_reached(&self) -> bool {
        matches!(self, Error::QuorumNotReached { .. })
    }

    /// No replica acknowledged the lock write ([`ReplicasNotSynced`](Error::ReplicasNotSynced)).
    pub fn is_replicas_not_synced(&self) -> bool {
        matches!(self, Error::ReplicasNotSynced { .. })
    }

    /// Work under a lock was stopped because the lock was lost ([`Lost`](Error::Lost)).
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }

    pub(crate) fn invalid_argument(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }

    /// A reply of a shape no fairlock script produces, as the redis-rs parsing error it is.
    pub(crate) fn bad_reply(what: &str, detail: impl std::fmt::Debug) -> Self {
        let parsing = redis::ParsingError::from(format!("{what}: unexpected reply {detail:?}"));
        Error::Redis(RedisCause(redis::RedisError::from(parsing)))
    }
}

/// A timeout of ours (connecting, asking the sentinels) as a Redis I/O error: transient, and
/// [`Error::is_timeout`] holds for it.
pub(crate) fn timed_out(what: &'static str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

/// Displays an error with every cause behind it (`outer: cause: …`), for the crate's log lines:
/// [`Error`]'s own message leaves its source out.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// `Result` with fairlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_error_keeps_its_cause_as_source_only() {
        let e = Error::from(timed_out("connect timed out"));
        assert!(!e.to_string().contains("connect timed out"), "{e}");
        let source = std::error::Error::source(&e).expect("the Redis error is the source");
        assert!(source.to_string().contains("connect timed out"), "{source}");
        assert!(chain(&e).contains("connect timed out"), "{}", chain(&e));
        assert!(e.is_timeout() && e.is_transient());
        let copy = e.clone();
        assert_eq!(copy.to_string(), e.to_string());
    }

    #[test]
    fn a_bad_reply_is_a_redis_parsing_error() {
        let e = Error::bad_reply("acquire", [7, 7]);
        assert!(e.is_redis() && !e.is_transient());
        assert!(chain(&e).contains("acquire"), "{}", chain(&e));
    }
}

/// Why a held lock can no longer be trusted. See [`LockGuard::lost`](crate::LockGuard::lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal (or the unlock) found our owner field gone: the lock expired, was deleted
    /// (force unlock, eviction, failover) or belongs to someone else now.
    Gone,
    /// Two consecutive renewals failed (Redis unreachable or answering with errors).
    RenewalFailed,
    /// The fixed lease given at acquisition has run out (never renewed by design).
    LeaseExpired,
    /// No acquisition or renewal has succeeded for a whole lease minus a drift margin, so another
    /// client may be able to take the lock now (renewals stalled, e.g. during a failover).
    ValidityExpired,
    /// The client was shut down.
    Shutdown,
    /// The guard was unlocked or dropped: only a [`LostSignal`](crate::LostSignal) reports
    /// this, to tell subtasks that the hold they worked under has ended.
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Gone => "the lock is gone or owned by someone else",
            LostReason::RenewalFailed => "two consecutive renewals failed",
            LostReason::LeaseExpired => "the lease ran out",
            LostReason::ValidityExpired => "no renewal succeeded within the lease",
            LostReason::Shutdown => "the client was shut down",
            LostReason::Released => "the guard was released",
        })
    }
}

impl LostReason {
    /// A short snake_case name (the `reason` label of the `fairlock_lost_total` metric).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            LostReason::Gone => "gone",
            LostReason::RenewalFailed => "renewal_failed",
            LostReason::LeaseExpired => "lease_expired",
            LostReason::ValidityExpired => "validity_expired",
            LostReason::Shutdown => "shutdown",
            LostReason::Released => "released",
        }
    }
}
