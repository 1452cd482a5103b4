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
    /// The driver starts a step that may change the field's timers: from now on, a grant that
    /// counts on the published [`Watch`] is noted.
    fn watch_look(&self);
    /// Publishes what the driver's timers for the field cover, unless a grant counted on the
    /// published watch since [`watch_look`](Self::watch_look): it may have counted on a timer
    /// the driver dropped since, so `false` asks the driver to look again.
    fn publish_watch(&self, watch: Watch) -> bool;
}

/// What the driver's timers for one field cover, as the driver last published it. A grant
/// registered within it needs no message to the driver: both timers look at the field again
/// when they fire, so a validity timer due no later than the new deadline follows it, and an
/// armed renewal timer renews a watchdog hold on the common grid. Only a field's first grant in
/// a while (or one that needs more) costs the driver a look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Watch {
    /// When the field's validity timer fires, if one is armed.
    pub(crate) validity_at: Option<Instant>,
    /// A renewal timer is armed.
    pub(crate) renewing: bool,
}
