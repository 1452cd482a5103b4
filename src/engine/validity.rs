//! Until when a hold can be trusted, and why it stopped: the lease of a hold, one type
//! ([`Lease`]) from the call that asks for it to the hold that keeps it, renewed by the watchdog
//! or fixed; a fixed lease is checked once, where it enters the library ([`Lease::new`]), and
//! Redis sees it in whole milliseconds ([`Lease::ttl_ms`]). Also the rules every lease follows:
//! the drift margin taken off it and the validity deadline that leaves ([`validity_deadline`]),
//! and the shortest lease that leaves any ([`lease_ms`]). Re-exports the public [`LostReason`].

use std::time::{Duration, Instant};

use crate::config::{duration_ms, MIN_LEASE};
use crate::error::{Error, Result};

// `LostReason` lives with the error type (the data layer), which names it too.
pub use crate::error::LostReason;

/// How long a hold lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the client's watchdog while the hold lives.
    Watchdog,
    /// Expires this long after its grant was sent, unless extended.
    Fixed(Duration),
}

impl Lease {
    /// What a caller passed (`None`: the watchdog's), checked: a fixed lease must leave validity
    /// after its drift margin ([`MIN_LEASE`](crate::MIN_LEASE)) and fit what Redis is sent
    /// ([`MAX_DURATION`](crate::MAX_DURATION)).
    pub(crate) fn new(lease: Option<Duration>) -> Result<Lease> {
        match lease {
            None => Ok(Lease::Watchdog),
            Some(d) => {
                lease_ms("lease", d)?;
                Ok(Lease::Fixed(d))
            }
        }
    }

    /// The fixed lease, if it is one.
    pub(crate) fn fixed(self) -> Option<Duration> {
        match self {
            Lease::Watchdog => None,
            Lease::Fixed(d) => Some(d),
        }
    }

    pub(crate) fn is_watchdog(self) -> bool {
        self == Lease::Watchdog
    }

    /// How long the lock's TTL must reach for this hold: its fixed lease, or the watchdog timeout
    /// (renewed before it runs out).
    pub(crate) fn span(self, watchdog_timeout: Duration) -> Duration {
        self.fixed().unwrap_or(watchdog_timeout)
    }

    /// [`span`](Self::span) in whole milliseconds, as the scripts set it.
    pub(crate) fn ttl_ms(self, watchdog_timeout: Duration) -> i64 {
        self.span(watchdog_timeout).as_millis() as i64
    }
}

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

/// Converts a lease to whole milliseconds for Redis, as [`duration_ms`] does, and refuses one
/// that leaves no validity after its drift margin (under [`MIN_LEASE`]): a grant made with it
/// could never be trusted, and a call would retry it until its wait ran out.
pub(crate) fn lease_ms(argument: &'static str, lease: Duration) -> Result<i64> {
    let ms = duration_ms(argument, lease)?;
    if lease < MIN_LEASE {
        return Err(Error::invalid_argument(
            argument,
            format!(
                "{lease:?} leaves no validity after the drift margin of {:?} (the shortest lease is {MIN_LEASE:?})",
                drift(lease)
            ),
        ));
    }
    Ok(ms)
}
