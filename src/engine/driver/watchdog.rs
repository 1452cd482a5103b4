//! The watchdog: renewals and validity deadlines of held locks, and renewals of the permits of
//! expirable semaphores taken without a lease (on the same grid, in their own batch).
//!
//! * A lock with a live watchdog hold is renewed every `watchdog_timeout / 3`, on a grid shared by
//!   every lock of the client, so all renewals due in one tick go out together (`wire/batch.rs`). A
//!   renewal that comes due while the lock's previous one is still in flight is not sent beside
//!   it, but if that one then fails it goes out at once rather than a period later (a server
//!   stalled for longer than the command timeout, e.g. writes paused by a manual failover, must not
//!   cost a lock whose lease has time left).
//! * Every held lock has a validity deadline (see `engine/field/`); a timer at it marks the guards lost
//!   for the log and for everyone who only polls (guards also see it lazily, exactly on time).
//! * A renewal that finds the lock gone, or two failing in a row, tell the holder at once, and
//!   renewals of that lock stop (its holds expire with their TTL) until it is taken again.
//! * A direct grant (PROTOCOL 8) gives the lock a TTL shorter than its hold needs (at most the
//!   waiter liveness window). Its extension to the lease is a renewal like the others, with the
//!   same rules, only sooner: a third of that TTL after the grant, and after a failure again a
//!   third of it later (at once when that one came due while the failed one was in flight); two
//!   failures in a row mark the hold lost. Once answered, a watchdog hold goes on the common
//!   grid and a fixed one needs nothing more. Until then the hold is trusted for the grant's
//!   TTL only.
//!
//! * What the timers of a lock cover is published to its field after every step that changes
//!   them ([`Watch`]), so a grant they already cover is not sent to the driver at all. A step
//!   reads the field's registrations before it looks at the field and publishes only if none
//!   came since; otherwise it arms the entry again for what the field holds now and publishes
//!   that. So a grant either found its timers published (and they look at the field again when
//!   they fire), or was registered before the driver looked, or after it published.
//!
//! It must never renew a lock none of whose holds is a live watchdog hold, never let a renewal
//! reply speak for a grant made after the renewal was sent, and never stop renewing silently:
//! every way out of the renewal cycle either follows the last watchdog hold's release or marks the
//! lock lost.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::timers::{Timer, Timers};
use super::tracked::{Tracked, Watch};
use super::wheel::TimerHandle;
use super::work::{Confirm, Work};
use crate::conn::Conn;
use crate::engine::permit::PermitLease;
use crate::engine::validity::LostReason;
use crate::error::Result;
use crate::metrics;
use crate::util::join_all;
use crate::wire;
use crate::wire::batch::{self, RenewOutcome};

/// The driver's view of one held lock and owner field.
#[derive(Debug)]
struct HeldEntry {
    held: Weak<dyn Tracked>,
    renew: Option<TimerHandle>,
    validity: Option<TimerHandle>,
    /// When `validity` fires.
    validity_at: Option<Instant>,
    failures: u8,
    in_flight: bool,
    /// A renewal came due while the previous one was still in flight (a slow or stalled
    /// server); if that one fails, the missed renewal goes out at once instead of a whole
    /// period later, which could be after the lease ran out.
    missed: bool,
    /// A direct grant's extension is due: renewals come every this often (not on the common
    /// grid) until one is answered.
    confirm_period: Option<Duration>,
    /// The last renewal found the lock's TTL set shorter by another client: renewals come
    /// every this often (a third of what it found) until one finds it no longer.
    short_period: Option<Duration>,
}

/// Every held lock the driver tracks, by id.
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

    /// The renewal period: a third of the watchdog timeout.
    pub(super) fn period(&self) -> Duration {
        self.timeout / 3
    }

    /// Permits of an expirable semaphore were taken without a lease: renew them on the grid.
    pub(super) fn on_permits(&mut self, timers: &mut Timers, lease: &Arc<PermitLease>) {
        let at = timers.next_grid(Instant::now(), self.period());
        timers.schedule(at, Timer::Permits(Arc::downgrade(lease)));
    }

    /// A permit renewal came due: collects it into `due` and schedules the next, unless its
    /// guard ended or its permits were lost.
    pub(super) fn permits_due(
        &mut self,
        timers: &mut Timers,
        weak: Weak<PermitLease>,
        now: Instant,
        due: &mut Vec<Arc<PermitLease>>,
    ) {
        if let Some(lease) = weak.upgrade().filter(|l| l.renewable()) {
            let at = timers.next_grid(now, self.period());
            timers.schedule(at, Timer::Permits(weak));
            due.push(lease);
        }
    }

    /// A hold was taken on `held`: (re)arm its validity timer, and its renewals when it is a
    /// watchdog hold, or a direct grant whose TTL must be extended to its lease (`confirm`).
    pub(super) fn on_acquired(
        &mut self,
        timers: &mut Timers,
        held: &Arc<dyn Tracked>,
        watchdog: bool,
        confirm: Option<Confirm>,
        deadline: Option<Instant>,
    ) {
        // The grant's deadline stands in for a hold already gone only while something else still
        // refers to the field (a guard, a call, a handle that kept it): a field this message is
        // the last reference to is forgotten at once, as it was before fields were kept.
        let deadline = deadline.filter(|_| Arc::strong_count(held) > 1);
        held.watch_look();
        self.arm(timers, held, watchdog, confirm, deadline);
        self.publish(timers, Some(held.clone()));
    }

    /// The field of `id`, told that a step starts looking at it (see
    /// [`publish`](Self::publish)).
    fn look(&self, id: u64) -> Option<Arc<dyn Tracked>> {
        let held = self.helds.get(&id)?.held.upgrade()?;
        held.watch_look();
        Some(held)
    }

    /// After a step on one entry: publishes what its timers now cover to its field. A grant
    /// that counted on the old watch since [`look`](Self::look) may have counted on a timer the
    /// step dropped: the entry is armed again for what the field holds now, and that is
    /// published instead.
    fn publish(&mut self, timers: &mut Timers, looked: Option<Arc<dyn Tracked>>) {
        let Some(held) = looked else {
            return;
        };
        let id = held.id();
        loop {
            let watch = self.helds.get(&id).map_or(Watch::default(), |e| Watch {
                validity_at: e.validity_at,
                renewing: e.renew.is_some(),
            });
            if held.publish_watch(watch) {
                return;
            }
            held.watch_look();
            self.arm(timers, &held, held.wants_renewal(), None, None);
        }
    }

    /// Arms the validity timer of `held` at its deadline (`deadline` when it has none any more),
    /// and its renewals as [`on_acquired`](Self::on_acquired) says.
    fn arm(
        &mut self,
        timers: &mut Timers,
        held: &Arc<dyn Tracked>,
        watchdog: bool,
        confirm: Option<Confirm>,
        deadline: Option<Instant>,
    ) {
        let id = held.id();
        let entry = self.helds.entry(id).or_insert_with(|| HeldEntry {
            held: Arc::downgrade(held),
            renew: None,
            validity: None,
            validity_at: None,
            failures: 0,
            in_flight: false,
            missed: false,
            confirm_period: None,
            short_period: None,
        });
        set_validity(timers, entry, id, held.valid_until().or(deadline));
        if let Some(confirm) = confirm {
            if let Some(h) = entry.renew.take() {
                timers.cancel(h);
            }
            entry.confirm_period = Some(confirm.period);
            entry.failures = 0;
            entry.renew = Some(timers.schedule(confirm.at, Timer::Renew(id)));
        } else if watchdog && entry.renew.is_none() {
            let at = timers.next_grid(Instant::now(), self.timeout / 3);
            entry.renew = Some(timers.schedule(at, Timer::Renew(id)));
            entry.failures = 0;
        }
        if entry.validity.is_none() && entry.renew.is_none() {
            // Released before this lazy registration was looked at.
            self.forget(timers, id);
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

    /// Stops renewing an entry (its validity timer stays, if any).
    fn stop_renewing(&mut self, timers: &mut Timers, id: u64) {
        let Some(entry) = self.helds.get_mut(&id) else {
            return;
        };
        if let Some(h) = entry.renew.take() {
            timers.cancel(h);
        }
        if entry.validity.is_none() && !entry.in_flight {
            self.forget(timers, id);
        }
    }

    /// A renewal timer fired: schedule the next one and, unless one is still in flight, put the
    /// entry in this tick's batch (`out`). A lock without a live watchdog hold (or a direct grant
    /// still to extend), or whose validity already lapsed, is not renewed any more.
    pub(super) fn renewal_due(
        &mut self,
        timers: &mut Timers,
        id: u64,
        now: Instant,
        out: &mut Vec<u64>,
    ) {
        let looked = self.look(id);
        self.renewal_step(timers, id, now, out);
        self.publish(timers, looked);
    }

    fn renewal_step(&mut self, timers: &mut Timers, id: u64, now: Instant, out: &mut Vec<u64>) {
        let Some(entry) = self.helds.get_mut(&id) else {
            return;
        };
        entry.renew = None;
        let renew = entry.held.upgrade().is_some_and(|held| {
            held.wants_renewal() && held.valid_until().is_some_and(|v| v > now)
        });
        if !renew {
            self.stop_renewing(timers, id);
            return;
        }
        if entry.in_flight {
            entry.missed = true;
        } else {
            entry.in_flight = true;
            out.push(id);
        }
        let at = match entry.confirm_period.or(entry.short_period) {
            Some(period) => now + period,
            None => timers.next_grid(now, self.timeout / 3),
        };
        entry.renew = Some(timers.schedule(at, Timer::Renew(id)));
    }

    /// A validity timer fired: let the field mark its guards lost if the deadline passed, and
    /// follow the deadline if it moved.
    pub(super) fn validity_due(&mut self, timers: &mut Timers, id: u64, now: Instant) {
        let looked = self.look(id);
        self.validity_step(timers, id, now);
        self.publish(timers, looked);
    }

    fn validity_step(&mut self, timers: &mut Timers, id: u64, now: Instant) {
        let Some(entry) = self.helds.get_mut(&id) else {
            return;
        };
        entry.validity = None;
        entry.validity_at = None;
        let Some(held) = entry.held.upgrade() else {
            self.forget(timers, id);
            return;
        };
        match held.check_validity() {
            Some(at) if at > now => set_validity(timers, entry, id, Some(at)),
            _ => {
                // Nothing valid any more: the holds are lost (or gone); stop renewing them.
                self.forget(timers, id);
            }
        }
    }

    /// Sends the renewals of `ids` in one batch, from a spawned task that reports back with
    /// [`Work::Renewed`]. Each lock is renewed to the watchdog timeout while it has a watchdog
    /// hold; a direct grant of fixed holds only is extended to what they need, one call each
    /// (rare: only a hold that outlives a third of the grant's TTL).
    pub(super) fn send_renewals(
        &mut self,
        timers: &mut Timers,
        ids: Vec<u64>,
        mut conn: Conn,
        batch: usize,
        tx: mpsc::UnboundedSender<Work>,
    ) {
        let ttl_ms = self.timeout.as_millis() as i64;
        let mut items: Vec<(Arc<dyn Tracked>, u64, u64, i64)> = Vec::with_capacity(ids.len());
        for id in ids {
            match self.helds.get(&id).and_then(|e| e.held.upgrade()) {
                Some(held) => {
                    let grants = held.grants();
                    let ttl = held.renewal_ttl_ms(self.timeout);
                    items.push((held, id, grants, ttl));
                }
                None => self.forget(timers, id),
            }
        }
        tracing::debug!(locks = items.len(), "renewing");
        tokio::spawn(async move {
            let sent = Instant::now();
            let (watchdog, fixed): (Vec<usize>, Vec<usize>) =
                (0..items.len()).partition(|&i| items[i].3 == ttl_ms);
            let pairs: Vec<(&str, &str, &str)> = watchdog
                .iter()
                .map(|&i| {
                    let h = &items[i].0;
                    (h.spec().name(), h.field(), h.spec().renewal_base())
                })
                .collect();
            let single = conn.clone();
            let (batched, extended) = tokio::join!(
                batch::renew(&mut conn, &pairs, ttl_ms, batch),
                join_all(fixed.iter().map(|&i| {
                    let (held, _, _, ttl) = &items[i];
                    let mut conn = single.clone();
                    async move {
                        wire::extend(&mut conn, held.spec(), held.field(), *ttl)
                            .await
                            .map(|held| {
                                if held {
                                    RenewOutcome::Renewed
                                } else {
                                    RenewOutcome::Gone
                                }
                            })
                    }
                }))
            );
            drop(pairs);
            let mut results: Vec<Option<Result<RenewOutcome>>> =
                (0..items.len()).map(|_| None).collect();
            for (i, result) in watchdog.into_iter().zip(batched) {
                results[i] = Some(result);
            }
            for (i, result) in fixed.into_iter().zip(extended) {
                results[i] = Some(result);
            }
            let results = results
                .into_iter()
                .map(|r| r.expect("every lock has a result"))
                .collect();
            let ids = items
                .iter()
                .map(|(_, id, grants, _)| (*id, *grants))
                .collect();
            drop(items);
            let _ = tx.send(Work::Renewed { ids, sent, results });
        });
    }

    /// Renewal replies: move validity deadlines on, report lost locks. Returns the entries to
    /// renew again at once (a renewal missed behind the one that just failed).
    pub(super) fn on_renewed(
        &mut self,
        timers: &mut Timers,
        ids: Vec<(u64, u64)>,
        sent: Instant,
        results: Vec<Result<RenewOutcome>>,
    ) -> Vec<u64> {
        let looked: Vec<_> = ids.iter().filter_map(|&(id, _)| self.look(id)).collect();
        let mut retry = Vec::new();
        let mut failed = 0usize;
        let mut first_error = None;
        for ((id, grants), result) in ids.into_iter().zip(results) {
            let Some(entry) = self.helds.get_mut(&id) else {
                continue;
            };
            entry.in_flight = false;
            let missed = std::mem::take(&mut entry.missed);
            let Some(held) = entry.held.upgrade() else {
                self.forget(timers, id);
                continue;
            };
            match result {
                Ok(outcome @ (RenewOutcome::Renewed | RenewOutcome::Shortened(_))) => {
                    metrics::renewal(metrics::Renewal::Ok);
                    entry.failures = 0;
                    // Another client keeps the lock's TTL shorter than ours (a Redisson reader
                    // with a shorter watchdog timeout): trusted only that long after this
                    // renewal, and renewed a third of it later, so the lock outlives that reader
                    // should it stop; back on the common grid once a renewal finds it no longer.
                    let short = match outcome {
                        RenewOutcome::Shortened(ttl) => Some(ttl),
                        _ => None,
                    };
                    if short.is_some() || entry.short_period.is_some() {
                        tracing::debug!(
                            lock = held.spec().name(),
                            ?short,
                            "renewal of a read hold found its TTL set shorter by another client"
                        );
                        let period = short.map(|ttl| (ttl / 3).max(Duration::from_millis(1)));
                        entry.short_period = period;
                        if let Some(h) = entry.renew.take() {
                            timers.cancel(h);
                        }
                        let at = match period {
                            Some(p) => Instant::now() + p,
                            None => timers.next_grid(Instant::now(), self.timeout / 3),
                        };
                        entry.renew = Some(timers.schedule(at, Timer::Renew(id)));
                    }
                    held.renewed(sent, short.unwrap_or(self.timeout), grants, short.is_some());
                    set_validity(timers, entry, id, held.valid_until());
                    if entry.confirm_period.is_some() && !held.unconfirmed() {
                        // The direct grant is extended: a watchdog hold goes on the common
                        // grid, a fixed one needs no renewal.
                        entry.confirm_period = None;
                        if let Some(h) = entry.renew.take() {
                            timers.cancel(h);
                        }
                        if held.wants_renewal() {
                            let at = timers.next_grid(Instant::now(), self.timeout / 3);
                            entry.renew = Some(timers.schedule(at, Timer::Renew(id)));
                        } else if entry.validity.is_none() {
                            self.forget(timers, id);
                        }
                    }
                    tracing::trace!(lock = held.spec().name(), "renewed");
                }
                Ok(RenewOutcome::Gone) => {
                    metrics::renewal(metrics::Renewal::Gone);
                    // Our field was gone when the renewal ran. A grant since then made a new
                    // hold, which this reply says nothing about.
                    if held.grants() == grants {
                        held.mark_lost(LostReason::Gone);
                        self.stop_renewing(timers, id);
                    }
                }
                Err(e) => {
                    metrics::renewal(metrics::Renewal::Failed);
                    failed += 1;
                    first_error.get_or_insert(e);
                    entry.failures = entry.failures.saturating_add(1);
                    if entry.failures >= 2 {
                        held.mark_lost(LostReason::RenewalFailed);
                        self.stop_renewing(timers, id);
                    } else if missed {
                        entry.in_flight = true;
                        retry.push(id);
                    }
                }
            }
        }
        if let Some(e) = first_error {
            tracing::warn!(error = %crate::error::chain(&e), locks = failed, "lock renewal failed");
        }
        for looked in looked {
            self.publish(timers, Some(looked));
        }
        retry
    }

    /// The client shut down: forget every entry (shutdown marked their guards lost).
    pub(super) fn shutdown(&mut self) {
        self.helds.clear();
    }
}

/// (Re)arms the validity timer of an entry at `at` (none: disarms it).
fn set_validity(timers: &mut Timers, entry: &mut HeldEntry, id: u64, at: Option<Instant>) {
    if let Some(h) = entry.validity.take() {
        timers.cancel(h);
    }
    entry.validity = at.map(|at| timers.schedule(at, Timer::Validity(id)));
    entry.validity_at = at;
}

/// Renews expirable-semaphore permits in one batch, from a spawned task that reports each
/// result to its guard's shared state (nothing comes back to the driver: a guard's next renewal
/// is already scheduled, and one that is lost or ended is not renewed again).
pub(super) fn renew_permits(mut conn: Conn, leases: Vec<Arc<PermitLease>>, batch: usize) {
    tokio::spawn(async move {
        let sent = Instant::now();
        let lease_ms = leases[0].lease().as_millis() as i64;
        let items: Vec<crate::wire::batch::PermitItem<'_>> =
            leases.iter().map(|l| (l.expiries(), &l.ids[..])).collect();
        tracing::debug!(guards = items.len(), "renewing permits");
        let results = crate::wire::batch::renew_permits(&mut conn, &items, lease_ms, batch).await;
        for (lease, result) in leases.iter().zip(&results) {
            lease.on_renewed(sent, result);
        }
    });
}
