//! Holding a lock: the public [`LockGuard`] over the per-holder hold state the watchdog tracks.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use tokio::sync::Notify;

use crate::client::Inner;
use crate::driver::{Handoff, Work};
use crate::error::{Error, Result};
use crate::keys::LockSpec;
use crate::ops::Unlocked;

/// Why a held lock can no longer be trusted. See [`LockGuard::lost`].
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
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Gone => "the lock is gone or owned by someone else",
            LostReason::RenewalFailed => "two consecutive renewals failed",
            LostReason::LeaseExpired => "the lease ran out",
            LostReason::ValidityExpired => "no renewal succeeded within the lease",
            LostReason::Shutdown => "the client was shut down",
        })
    }
}

impl LostReason {
    /// Non-zero code stored in [`Held`] (0 means not lost).
    fn code(self) -> u8 {
        match self {
            LostReason::Gone => 1,
            LostReason::RenewalFailed => 2,
            LostReason::LeaseExpired => 3,
            LostReason::ValidityExpired => 4,
            LostReason::Shutdown => 5,
        }
    }

    fn from_code(code: u8) -> Option<LostReason> {
        Some(match code {
            1 => LostReason::Gone,
            2 => LostReason::RenewalFailed,
            3 => LostReason::LeaseExpired,
            4 => LostReason::ValidityExpired,
            5 => LostReason::Shutdown,
            _ => return None,
        })
    }
}

/// Registry key of a hold: one entry per (kind, name, owner field) in a client. It shares the
/// hold's spec and field rather than copying the name.
#[derive(Debug, Clone)]
struct HoldKey {
    spec: Arc<LockSpec>,
    field: Arc<str>,
}

impl PartialEq for HoldKey {
    fn eq(&self, other: &Self) -> bool {
        self.spec.kind == other.spec.kind
            && self.spec.name() == other.spec.name()
            && self.field == other.field
    }
}

impl Eq for HoldKey {}

impl Hash for HoldKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.spec.kind.hash(state);
        self.spec.name().hash(state);
        self.field.hash(state);
    }
}

static NEXT_HELD_ID: AtomicU64 = AtomicU64::new(1);

/// Hold state shared by every guard of one holder on one lock (reentrant holds are one entry),
/// and by the watchdog, which keeps only a `Weak` to it.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) id: u64,
    pub(crate) inner: Arc<Inner>,
    pub(crate) spec: Arc<LockSpec>,
    pub(crate) field: Arc<str>,
    /// Taken without a lease: the watchdog renews it.
    pub(crate) watchdog: bool,
    /// The lease (ms) re-applied when a hold is released and others remain.
    pub(crate) lease_ms: AtomicI64,
    /// The local validity deadline (see [`LockGuard::valid_until`]), as nanoseconds after
    /// [`clock_base`]; set at every grant and successful renewal.
    validity: AtomicU64,
    /// Local guards alive. Only changed under the client's hold-registry lock.
    holds: AtomicU64,
    /// Set when the last local hold is released: from then on the watchdog never renews it and
    /// ignores any renewal reply still in flight.
    released: AtomicBool,
    /// [`LostReason::code`] once lost, 0 before; set once, and `lost_notify` wakes the waiters.
    lost: AtomicU8,
    lost_notify: Notify,
}

impl Held {
    pub(crate) fn name(&self) -> &str {
        self.spec.name()
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        LostReason::from_code(self.lost.load(Ordering::Acquire))
    }

    /// Local guards alive on this entry.
    pub(crate) fn local_holds(&self) -> u64 {
        self.holds.load(Ordering::Relaxed)
    }

    /// Records a new local validity deadline.
    pub(crate) fn set_valid_until(&self, at: Instant) {
        let nanos = at.saturating_duration_since(clock_base()).as_nanos();
        self.validity
            .store(nanos.min(u64::MAX as u128) as u64, Ordering::Release);
    }

    /// The local validity deadline.
    pub(crate) fn valid_until(&self) -> Instant {
        clock_base() + std::time::Duration::from_nanos(self.validity.load(Ordering::Acquire))
    }

    /// Marks the lock lost (first reason wins). Returns whether this call did it.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        let first = self
            .lost
            .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            self.lost_notify.notify_waiters();
        }
        if first && !self.is_released() {
            tracing::warn!(lock = self.name(), field = &*self.field, %reason, "lock lost");
        }
        first
    }
}

/// A fixed point of the monotonic clock that validity deadlines are stored relative to.
fn clock_base() -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// The validity deadline of a grant or renewal sent at `sent` with a lease of `lease_ms`.
pub(crate) fn validity_deadline(sent: Instant, lease_ms: i64) -> Instant {
    let lease = std::time::Duration::from_millis(lease_ms.max(0) as u64);
    sent + lease.saturating_sub(crate::driver::drift(lease))
}

/// The client's registry of holds, keyed by (kind, name, field).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    map: Mutex<HashMap<HoldKey, Weak<Held>>>,
    /// Holders whose last acquire call ended right after a lost reply: that attempt may have
    /// taken the lock unseen, so their next acquisition checks first (see `acquire`).
    unsure: Mutex<HashSet<HoldKey>>,
}

impl Holds {
    fn lock(&self) -> MutexGuard<'_, HashMap<HoldKey, Weak<Held>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one successful acquisition sent at `sent`, returning the shared hold state. A
    /// re-entry joins the live entry; a fresh acquisition (or one after the old entry was lost)
    /// starts a new one. Either way the watchdog is told so it can (re)arm its timers.
    pub(crate) fn acquired(
        &self,
        inner: &Arc<Inner>,
        spec: &Arc<LockSpec>,
        field: &Arc<str>,
        lease_ms: i64,
        watchdog: bool,
        sent: Instant,
    ) -> Arc<Held> {
        let key = HoldKey {
            spec: spec.clone(),
            field: field.clone(),
        };
        let mut map = self.lock();
        if let Some(held) = map.get(&key).and_then(Weak::upgrade) {
            if held.lost_reason().is_none() && !held.is_released() {
                held.holds.fetch_add(1, Ordering::Relaxed);
                held.lease_ms.store(lease_ms, Ordering::Relaxed);
                held.set_valid_until(validity_deadline(sent, lease_ms));
                inner.driver.send_lazy(Work::Acquired {
                    held: held.clone(),
                    sent,
                    lease_ms,
                });
                return held;
            }
        }
        let held = Arc::new(Held {
            id: NEXT_HELD_ID.fetch_add(1, Ordering::Relaxed),
            inner: inner.clone(),
            spec: spec.clone(),
            field: field.clone(),
            watchdog,
            lease_ms: AtomicI64::new(lease_ms),
            validity: AtomicU64::new(0),
            holds: AtomicU64::new(1),
            released: AtomicBool::new(false),
            lost: AtomicU8::new(0),
            lost_notify: Notify::new(),
        });
        held.set_valid_until(validity_deadline(sent, lease_ms));
        map.insert(key, Arc::downgrade(&held));
        inner.driver.send_lazy(Work::Acquired {
            held: held.clone(),
            sent,
            lease_ms,
        });
        held
    }

    /// Drops one local hold. When it was the last, the entry is marked released (the watchdog stops
    /// renewing it before the unlock is even sent) and leaves the registry; returns `true` then.
    pub(crate) fn release(&self, held: &Arc<Held>) -> bool {
        let mut map = self.lock();
        let last = held.holds.fetch_sub(1, Ordering::Relaxed) == 1;
        if last {
            held.released.store(true, Ordering::Release);
            let key = HoldKey {
                spec: held.spec.clone(),
                field: held.field.clone(),
            };
            if map
                .get(&key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(held)))
            {
                map.remove(&key);
            }
        }
        last
    }

    /// How many holds this client counts for `field` on `spec`: those of its entry that are not
    /// released yet, lost ones included (their guards still send a release when dropped, so
    /// Redis may still count them and will see them go).
    pub(crate) fn count(&self, spec: &Arc<LockSpec>, field: &Arc<str>) -> u64 {
        let key = HoldKey {
            spec: spec.clone(),
            field: field.clone(),
        };
        self.lock()
            .get(&key)
            .and_then(Weak::upgrade)
            .filter(|held| !held.is_released())
            .map_or(0, |held| held.holds.load(Ordering::Relaxed))
    }

    /// Remembers that `field`'s last acquire call on `spec` ended after a lost reply.
    pub(crate) fn mark_unsure(&self, spec: &Arc<LockSpec>, field: &Arc<str>) {
        let key = HoldKey {
            spec: spec.clone(),
            field: field.clone(),
        };
        self.unsure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
    }

    /// Whether `field`'s last acquire call on `spec` ended after a lost reply (and forgets it).
    pub(crate) fn take_unsure(&self, spec: &Arc<LockSpec>, field: &Arc<str>) -> bool {
        let mut unsure = self.unsure.lock().unwrap_or_else(|p| p.into_inner());
        if unsure.is_empty() {
            return false;
        }
        unsure.remove(&HoldKey {
            spec: spec.clone(),
            field: field.clone(),
        })
    }

    /// Every live hold (for shutdown).
    pub(crate) fn all(&self) -> Vec<Arc<Held>> {
        self.lock().values().filter_map(Weak::upgrade).collect()
    }
}

/// Proof of one hold on a lock. Dropping it releases that hold in the background; [`unlock`]
/// releases it and reports the outcome.
///
/// Guards of the same holder on the same lock share their state: each is one reentrant hold, and
/// the lock is free again when the last is released. A guard keeps its client alive.
///
/// [`unlock`]: LockGuard::unlock
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    held: Arc<Held>,
    token: Option<u64>,
    armed: bool,
}

impl LockGuard {
    pub(crate) fn new(held: Arc<Held>, token: Option<u64>) -> Self {
        LockGuard {
            held,
            token,
            armed: true,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held.name()
    }

    /// The owner field this hold is recorded under in Redis: `<client uuid>:<holder id>`.
    pub fn owner_field(&self) -> &str {
        &self.held.field
    }

    /// The fencing token of this acquisition, when the handle was [`fenced`](crate::FairLock::fenced).
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// The local validity deadline: the send time (on this process's monotonic clock) of the last
    /// acquisition or watchdog renewal that succeeded, plus its lease, minus a drift margin of
    /// 1 % + 2 ms. Until then no other client can take the lock (barring a failover that lost it);
    /// from then on it may. [`lost`](Self::lost) resolves at this deadline at the latest while
    /// renewals cannot extend it. Work that must finish under the lock can be bounded by it.
    pub fn valid_until(&self) -> Instant {
        self.held.valid_until()
    }

    /// Whether the lock is known to be lost (cheap, no I/O). See [`lost`](Self::lost).
    pub fn is_lost(&self) -> bool {
        self.held.lost_reason().is_some()
    }

    /// Resolves once the lock can no longer be trusted, with the reason: a renewal found it gone,
    /// two renewals in a row failed, the fixed lease or the validity window ran out, or the client
    /// was shut down. Any number of callers may await it; it never resolves for a lock that is
    /// still held and renewed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing, and awaiting again later still resolves.
    pub async fn lost(&self) -> LostReason {
        loop {
            let notified = self.held.lost_notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a `mark_lost` after it cannot be missed.
            notified.as_mut().enable();
            if let Some(reason) = self.held.lost_reason() {
                return reason;
            }
            notified.await;
        }
    }

    /// Releases this hold and reports the outcome.
    ///
    /// For a reentrant holder this releases one hold; the lock stays held until the last.
    ///
    /// On a fair lock, releasing a lock whose lease ran out and that nobody has taken since
    /// succeeds, as in Redisson (the next waiter is woken). Releasing a lock that is known
    /// [lost](Self::lost) for any other reason (gone, renewals failed, validity window passed,
    /// shutdown), or that Redis shows held by somebody else, is [`Error::NotHeld`].
    ///
    /// # Errors
    /// [`Error::NotHeld`] as above; [`Error::Redis`] when the release could not be sent. After an error the
    /// watchdog no longer renews this hold, so the lock expires within its lease.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before the release completes, the client's
    /// background task finishes it, so the hold is still released exactly once; only the outcome
    /// is lost.
    pub async fn unlock(mut self) -> Result<()> {
        self.armed = false;
        let held = self.held.clone();
        if held.inner.holds.release(&held) {
            held.inner.driver.send_lazy(Work::Forget { id: held.id });
        }
        let known_lost = held.lost_reason();
        let task_held = held.clone();
        let release = Handoff::new(
            &held.inner.driver,
            async move { unlock_hold(&task_held).await },
        );
        let outcome = release.run().await?;
        match (known_lost, outcome) {
            // A fixed lease that simply ran out with nobody taking the lock since: Redisson's fair
            // unlock succeeds here, and so do we.
            (Some(LostReason::LeaseExpired), Unlocked::Expired) => Ok(()),
            (Some(_), _) => Err(Error::NotHeld),
            (None, Unlocked::Released | Unlocked::StillHeld | Unlocked::Expired) => Ok(()),
            (None, Unlocked::NotOwner) => {
                held.mark_lost(LostReason::Gone);
                Err(Error::NotHeld)
            }
        }
    }
}

/// Sends the release of one hold and logs the outcome.
pub(crate) async fn unlock_hold(held: &Held) -> Result<Unlocked> {
    let mut conn = held.inner.conn.clone();
    let lease_ms = held.lease_ms.load(Ordering::Relaxed);
    let timeout = held.inner.config.command_timeout;
    let outcome =
        crate::retry::release(&mut conn, &held.spec, &held.field, lease_ms, timeout).await;
    match &outcome {
        Ok(o) => {
            tracing::debug!(lock = held.name(), field = &*held.field, outcome = ?o, "unlocked")
        }
        Err(e) => {
            tracing::warn!(lock = held.name(), field = &*held.field, error = %e, "unlock failed; the lock expires with its lease")
        }
    }
    outcome
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.armed {
            self.held.inner.holds.release(&self.held);
            // No I/O in Drop: the client's driver task sends the release.
            self.held.inner.driver.send(Work::Release {
                held: self.held.clone(),
            });
        }
    }
}
