//! The watchdog: renewals and validity deadlines of held locks.
//!
//! * Locks taken without a lease are renewed every `watchdog_timeout / 3`, on a grid shared by
//!   every lock of the client, so all renewals due in one tick go out together (`batch.rs`). A
//!   renewal that comes due while the lock's previous one is still in flight is not sent beside
//!   it, but if that one then fails it goes out at once rather than a period later (a server
//!   stalled for longer than the command timeout, e.g. writes paused by a manual failover, must not
//!   cost a lock whose lease has time left).
//! * Every held lock has a local validity deadline (send time of the last successful acquire or
//!   renewal + lease − drift), at which the holder is told the lock is lost even if renewals stall.
//! * A renewal that finds the lock gone, or two failing in a row, tell the holder at once.
//!
//! It must never renew an entry whose last local hold was released (the hold registry marks it
//! released before the unlock is even sent), and never stop renewing silently: every way out of
//! the renewal cycle either follows a release or marks the lock lost.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::wheel::TimerHandle;
use super::{drift, Timer, Timers, Work};
use crate::batch;
use crate::conn::Conn;
use crate::error::Result;
use crate::guard::{Held, LostReason};

/// The driver's view of one held entry.
#[derive(Debug)]
struct HeldEntry {
    held: Weak<Held>,
    watchdog: bool,
    renew: Option<TimerHandle>,
    validity: Option<TimerHandle>,
    failures: u8,
    in_flight: bool,
    /// A renewal came due while the previous one was still in flight (a slow or stalled
    /// server); if that one fails, the missed renewal goes out at once instead of a whole
    /// period later, which could be after the lease ran out.
    missed: bool,
}

/// Every held entry the driver tracks, by id.
pub(super) struct Watchdog {
    helds: HashMap<u64, HeldEntry>,
    /// The lease watchdog locks are renewed to.
    timeout: Duration,
}

impl Watchdog {
    pub(super) fn new(timeout: Duration) -> Self {
        Watchdog {
            helds: HashMap::new(),
            timeout,
        }
    }

    fn period(&self) -> Duration {
        self.timeout / 3
    }

    /// A hold was taken at `sent` with `lease_ms`: (re)arm its validity deadline, and its renewal
    /// when it is a watchdog lock.
    pub(super) fn on_acquired(
        &mut self,
        timers: &mut Timers,
        held: &Arc<Held>,
        sent: Instant,
        lease_ms: i64,
    ) {
        if held.is_released() || held.lost_reason().is_some() {
            // Released (or lost) before this lazy registration was looked at.
            self.forget(timers, held.id);
            return;
        }
        let lease = Duration::from_millis(lease_ms as u64);
        let validity_at = sent + lease.saturating_sub(drift(lease));
        let renew_at = timers.next_grid(Instant::now(), self.period());
        let id = held.id;
        let entry = self.helds.entry(id).or_insert_with(|| HeldEntry {
            held: Arc::downgrade(held),
            watchdog: held.watchdog,
            renew: None,
            validity: None,
            failures: 0,
            in_flight: false,
            missed: false,
        });
        if let Some(h) = entry.validity.take() {
            timers.cancel(h);
        }
        entry.validity = Some(timers.schedule(validity_at, Timer::Validity(id)));
        if entry.watchdog && entry.renew.is_none() {
            entry.renew = Some(timers.schedule(renew_at, Timer::Renew(id)));
        }
    }

    /// Stops every timer of an entry.
    pub(super) fn forget(&mut self, timers: &mut Timers, id: u64) {
        if let Some(entry) = self.helds.remove(&id) {
            for h in [entry.renew, entry.validity].into_iter().flatten() {
                timers.cancel(h);
            }
        }
    }

    /// A renewal timer fired: schedule the next one and, unless one is still in flight, put the
    /// entry in this tick's batch (`out`).
    pub(super) fn renewal_due(
        &mut self,
        timers: &mut Timers,
        id: u64,
        now: Instant,
        out: &mut Vec<u64>,
    ) {
        let Some(entry) = self.helds.get_mut(&id) else {
            return;
        };
        entry.renew = None;
        let live = entry
            .held
            .upgrade()
            .is_some_and(|h| !h.is_released() && h.lost_reason().is_none());
        if !live {
            self.forget(timers, id);
            return;
        }
        if entry.in_flight {
            entry.missed = true;
        } else {
            entry.in_flight = true;
            out.push(id);
        }
        entry.renew =
            Some(timers.schedule(timers.next_grid(now, self.timeout / 3), Timer::Renew(id)));
    }

    /// A validity deadline passed without a renewal moving it: the lock may be someone else's.
    pub(super) fn validity_due(&mut self, timers: &mut Timers, id: u64) {
        let Some(entry) = self.helds.get_mut(&id) else {
            return;
        };
        entry.validity = None;
        if let Some(held) = entry.held.upgrade() {
            if !held.is_released() {
                held.mark_lost(if entry.watchdog {
                    LostReason::ValidityExpired
                } else {
                    LostReason::LeaseExpired
                });
            }
        }
        self.forget(timers, id);
    }

    /// Sends the renewals of `ids` in one batch, from a spawned task that reports back with
    /// [`Work::Renewed`].
    pub(super) fn send_renewals(
        &mut self,
        timers: &mut Timers,
        ids: Vec<u64>,
        mut conn: Conn,
        batch: usize,
        tx: mpsc::UnboundedSender<Work>,
    ) {
        let mut items: Vec<(Arc<Held>, u64)> = Vec::with_capacity(ids.len());
        for id in ids {
            match self.helds.get(&id).and_then(|e| e.held.upgrade()) {
                Some(h) => items.push((h, id)),
                None => self.forget(timers, id),
            }
        }
        let ttl_ms = self.timeout.as_millis() as i64;
        tracing::debug!(locks = items.len(), "renewing");
        tokio::spawn(async move {
            let sent = Instant::now();
            let pairs: Vec<(&str, &str)> =
                items.iter().map(|(h, _)| (h.name(), &*h.field)).collect();
            let results = batch::renew(&mut conn, &pairs, ttl_ms, batch).await;
            drop(pairs);
            let ids = items.iter().map(|(_, id)| *id).collect();
            drop(items);
            let _ = tx.send(Work::Renewed { ids, sent, results });
        });
    }

    /// Renewal replies: move validity deadlines on, report lost locks. Returns the entries to
    /// renew again at once (a renewal missed behind the one that just failed).
    pub(super) fn on_renewed(
        &mut self,
        timers: &mut Timers,
        ids: Vec<u64>,
        sent: Instant,
        results: Vec<Result<bool>>,
    ) -> Vec<u64> {
        let mut retry = Vec::new();
        let mut failed = 0usize;
        let mut first_error = None;
        for (id, result) in ids.into_iter().zip(results) {
            let Some(entry) = self.helds.get_mut(&id) else {
                continue;
            };
            entry.in_flight = false;
            let missed = std::mem::take(&mut entry.missed);
            let held = match entry.held.upgrade() {
                // Released while the renewal was in flight: its reply means nothing.
                Some(held) if !held.is_released() => held,
                _ => {
                    self.forget(timers, id);
                    continue;
                }
            };
            match result {
                Ok(true) => {
                    entry.failures = 0;
                    if let Some(h) = entry.validity.take() {
                        timers.cancel(h);
                    }
                    let valid_until = sent + self.timeout - drift(self.timeout);
                    held.set_valid_until(valid_until);
                    entry.validity = Some(timers.schedule(valid_until, Timer::Validity(id)));
                    tracing::trace!(lock = held.name(), "renewed");
                }
                Ok(false) => {
                    held.mark_lost(LostReason::Gone);
                    self.forget(timers, id);
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                    entry.failures = entry.failures.saturating_add(1);
                    if entry.failures >= 2 {
                        if held.lost_reason().is_none() {
                            held.mark_lost(LostReason::RenewalFailed);
                        }
                        self.forget(timers, id);
                    } else if missed && held.lost_reason().is_none() {
                        entry.in_flight = true;
                        retry.push(id);
                    }
                }
            }
        }
        if let Some(e) = first_error {
            tracing::warn!(error = %e, locks = failed, "lock renewal failed");
        }
        retry
    }

    /// The client shuts down: every held entry is lost.
    pub(super) fn shutdown(&mut self) {
        for (_, entry) in self.helds.drain() {
            if let Some(held) = entry.held.upgrade() {
                held.mark_lost(LostReason::Shutdown);
            }
        }
    }
}
