//! Until when a hold can be trusted, and why it stopped: the drift margin taken off every lease,
//! the validity deadline of a grant or renewal, and the public [`LostReason`].

use std::time::{Duration, Instant};

/// The drift margin subtracted from a lease before the local validity deadline: 1 % + 2 ms, as
/// Redlock uses for clock drift between client and server.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// The validity deadline of a grant or renewal sent at `sent` with a lease of `lease`: the moment
/// up to which no other client can have taken the lock, allowing for clock drift.
pub(crate) fn validity_deadline(sent: Instant, lease: Duration) -> Instant {
    sent + lease.saturating_sub(drift(lease))
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
