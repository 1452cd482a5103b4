//! What the driver needs from a held lock: [`Tracked`]. The engine's field (`engine/field/`)
//! implements it, so the driver reaches a hold through this handle and never through the
//! client's state.

use std::time::{Duration, Instant};

use crate::engine::validity::LostReason;
use crate::keys::LockSpec;

/// A held lock and owner field, as the watchdog renews and watches it.
pub(crate) trait Tracked: Send + Sync + std::fmt::Debug + 'static {
    /// The field's id, unique in the process.
    fn id(&self) -> u64;
    /// The lock.
    fn spec(&self) -> &LockSpec;
    /// The owner field.
    fn field(&self) -> &str;
    /// Grants so far: a renewal reply speaks only for the grants made before it was sent.
    fn grants(&self) -> u64;
    /// Whether the watchdog renews the field now.
    fn wants_renewal(&self) -> bool;
    /// The TTL (ms) a renewal sets.
    fn renewal_ttl_ms(&self, timeout: Duration) -> i64;
    /// A renewal sent at `sent`, when the field had made `grants` grants, succeeded for
    /// `timeout` (`shortened`: another client keeps the TTL that short).
    fn renewed(&self, sent: Instant, timeout: Duration, grants: u64, shortened: bool);
    /// Whether a direct grant's short TTL still waits for its extension.
    fn unconfirmed(&self) -> bool;
    /// Marks the holds lost if their validity deadline passed, and returns the deadline in
    /// force (`None`: nothing valid any more).
    fn check_validity(&self) -> Option<Instant>;
    /// The validity deadline in force, if any.
    fn valid_until(&self) -> Option<Instant>;
    /// Tells every live guard the holds are lost.
    fn mark_lost(&self, reason: LostReason);
}
