//! What an expirable semaphore's guard and the client's driver share about permits in use
//! (`coord/permits.rs` is the public side): their ids, their validity deadline, and why they were
//! lost. The driver renews a watchdog guard's permits every third of the watchdog timeout
//! (`engine/driver/mod.rs`) and reports each result here.
//!
//! It must never report permits as valid past a deadline no renewal has moved on, nor renew
//! permits whose guard has ended or was told they are lost. Lost stays lost: a deadline that has
//! passed is never moved on (a renewal's reply that comes after it is too late), so a guard that
//! once read its permits lost never reads them valid again.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::engine::validity::{validity_deadline, LostReason};
use crate::error::Result;

/// Permits in use under one guard.
#[derive(Debug)]
pub(crate) struct PermitLease {
    name: Arc<str>,
    expiries: Arc<str>,
    channel: Arc<str>,
    pub(crate) ids: Vec<[u8; 16]>,
    lease: Duration,
    watchdog: bool,
    valid_until: Mutex<Instant>,
    lost: watch::Sender<Option<LostReason>>,
    failures: AtomicU8,
    ended: AtomicBool,
    /// The semaphore's name goes on the loss metric (`Builder::metrics_lock_names`).
    metrics_names: bool,
}

impl PermitLease {
    /// Permits `ids` of semaphore `name` (expiries in `expiries`), granted by a call sent at
    /// `sent` with `lease`; `watchdog`: renewed by the driver.
    #[allow(clippy::too_many_arguments)] // each is one fact about the permits, named at the call
    pub(crate) fn new(
        name: Arc<str>,
        expiries: Arc<str>,
        channel: Arc<str>,
        ids: Vec<[u8; 16]>,
        sent: Instant,
        lease: Duration,
        watchdog: bool,
        metrics_names: bool,
    ) -> Self {
        PermitLease {
            name,
            expiries,
            channel,
            ids,
            lease,
            watchdog,
            valid_until: Mutex::new(validity_deadline(sent, lease)),
            lost: watch::Sender::new(None),
            failures: AtomicU8::new(0),
            ended: AtomicBool::new(false),
            metrics_names,
        }
    }

    /// The expiries key the renewal works on.
    pub(crate) fn expiries(&self) -> &str {
        &self.expiries
    }

    /// The lease each renewal gives.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// The guard released, forgot or dropped its permits: no more renewals, no more loss.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    /// Whether its guard released, forgot or dropped it.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Whether the driver should renew it still.
    pub(crate) fn renewable(&self) -> bool {
        !self.ended.load(Ordering::SeqCst)
            && self.lost.borrow().is_none()
            && Instant::now() < self.valid_until()
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A renewal sent at `sent` came back with `result`.
    pub(crate) fn on_renewed(&self, sent: Instant, result: &Result<bool>) {
        match result {
            Ok(true) => {
                self.failures.store(0, Ordering::SeqCst);
                let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
                // The clock is read under the lock: a reader that found the deadline passed read
                // its clock before it read the deadline (`lost_now`), so this clock is no earlier
                // and finds it passed too.
                if Instant::now() < *until {
                    *until = (*until).max(validity_deadline(sent, self.lease));
                }
            }
            Ok(false) => self.mark_lost(LostReason::Gone),
            Err(e) => {
                if self.failures.fetch_add(1, Ordering::SeqCst) + 1 >= 2 {
                    tracing::warn!(name = %self.name, error = %crate::error::chain(e), "permit renewal failed twice");
                    self.mark_lost(LostReason::RenewalFailed);
                }
            }
        }
    }

    /// The client shuts down: the permits are lost to their guard and given back (one send,
    /// bounded by the command timeout; if it fails they come back at their lease).
    pub(crate) async fn shut_down(&self, conn: &mut crate::conn::Conn) {
        if self.ended.load(Ordering::SeqCst) {
            return;
        }
        self.mark_lost(LostReason::Shutdown);
        self.end();
        let keys = crate::wire::permits::PermitKeys {
            name: &self.name,
            expiries: &self.expiries,
            channel: &self.channel,
        };
        if let Err(e) = crate::wire::permits::release(conn, keys, &self.ids).await {
            tracing::warn!(name = %self.name, error = %e, "shutdown: permits not released; they come back at their lease");
        }
    }

    fn mark_lost(&self, reason: LostReason) {
        if self.ended.load(Ordering::SeqCst) {
            return;
        }
        self.lost.send_if_modified(|r| {
            if r.is_none() {
                // As a lock guard's: once lost, trusted no later than when that was found.
                let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
                *until = (*until).min(Instant::now());
                drop(until);
                tracing::warn!(name = %self.name, %reason, "permits lost");
                crate::metrics::counting_lost(
                    "expirable_semaphore",
                    &self.name,
                    self.metrics_names,
                    reason.label(),
                );
                *r = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Why the permits can no longer be trusted, if so (a lapsed validity included).
    pub(crate) fn lost_now(&self) -> Option<LostReason> {
        if let Some(r) = *self.lost.borrow() {
            return Some(r);
        }
        // The clock before the deadline (see `on_renewed`): a deadline found passed here is
        // never moved on afterwards.
        let now = Instant::now();
        (now >= self.valid_until()).then_some(if self.watchdog {
            LostReason::ValidityExpired
        } else {
            LostReason::LeaseExpired
        })
    }

    /// Resolves when the permits can no longer be trusted (see [`lost_now`](Self::lost_now)).
    pub(crate) async fn lost(&self) -> LostReason {
        let mut rx = self.lost.subscribe();
        loop {
            if let Some(reason) = self.lost_now() {
                return reason;
            }
            let until = self.valid_until();
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(sent: Instant, lease: Duration) -> PermitLease {
        PermitLease::new(
            "sem".into(),
            "sem:expiries".into(),
            "sem:channel".into(),
            vec![[0; 16]],
            sent,
            lease,
            true,
            false,
        )
    }

    #[test]
    fn permits_read_lost_never_read_valid_again() {
        // Torture seed 13690576949177988948: a watchdog guard's permits lapsed (a renewal's reply
        // was late), `lost()` resolved with ValidityExpired, and the late reply then moved the
        // deadline on: `is_lost()` read false again.
        let lease_for = Duration::from_secs(3);
        let permits = lease(Instant::now() - lease_for, lease_for);
        assert_eq!(permits.lost_now(), Some(LostReason::ValidityExpired));
        permits.on_renewed(Instant::now(), &Ok(true));
        assert_eq!(permits.lost_now(), Some(LostReason::ValidityExpired));
        assert!(!permits.renewable());
    }

    #[test]
    fn permits_found_gone_are_trusted_no_later_than_when_that_was_found() {
        let permits = lease(Instant::now(), Duration::from_secs(30));
        permits.on_renewed(Instant::now(), &Ok(false));
        let found = Instant::now();
        assert_eq!(permits.lost_now(), Some(LostReason::Gone));
        assert!(permits.valid_until() <= found);
        // A later renewal reply changes nothing.
        permits.on_renewed(Instant::now(), &Ok(true));
        assert!(permits.valid_until() <= found);
        assert_eq!(permits.lost_now(), Some(LostReason::Gone));
    }

    #[test]
    fn a_renewal_before_the_deadline_moves_it_on() {
        let lease_for = Duration::from_secs(30);
        let sent = Instant::now();
        let permits = lease(sent, lease_for);
        let before = permits.valid_until();
        let later = sent + Duration::from_millis(5);
        permits.on_renewed(later, &Ok(true));
        assert!(permits.valid_until() > before);
        assert_eq!(permits.lost_now(), None);
    }
}
