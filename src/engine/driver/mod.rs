//! The client's driver task: one per client, one hashed timing wheel, all background work.
//!
//! Work arrives over an unbounded channel from lock handles, guards and dropped futures (so `Drop`
//! never does I/O), and from the driver's own I/O tasks reporting back; registering and forgetting
//! a held lock goes through a lazy inbox the driver reads on its next tick instead, so the
//! uncontended lock/unlock path never wakes it. The concerns live one per file:
//!
//! * [`work`]: what the driver is sent ([`Work`]) and the handle that sends it ([`DriverHandle`]);
//! * [`wheel`]: the hashed timing wheel, a pure data structure over integer ticks;
//! * [`timers`]: what the wheel holds, and the clock that turns monotonic time into its ticks;
//! * [`watchdog`]: renewals and validity deadlines of held locks;
//! * [`heartbeat`]: deadline heartbeats of fair waiters that are still waiting;
//! * [`settle`]: what dropped guards and futures leave behind (releases, give-ups, attempts that
//!   were in flight when their caller stopped waiting);
//! * [`handoff`]: running an operation inside the caller's future, handing it to the driver only
//!   if the caller drops it.
//!
//! This module starts the driver and dispatches. The driver never awaits Redis
//! itself: I/O runs in spawned tasks that report back, so one slow round trip never delays a
//! timer. It ends when the client (every handle and guard) is gone.

mod handoff;
mod heartbeat;
mod settle;
mod timers;
mod watchdog;
mod wheel;
mod work;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::config::Config;
use crate::conn::Conn;
use timers::{Timer, Timers};
use watchdog::Watchdog;
use wheel::Wheel;
use work::{lock_inbox, LazyInbox};

pub(crate) use handoff::Handoff;
pub(crate) use heartbeat::WaiterBeat;
pub(crate) use settle::give_up_logged;
pub(crate) use work::{AttemptFuture, Confirm, DriverHandle, Work};

/// Starts the driver. It holds no strong reference to the client.
pub(crate) fn start(conn: Conn, config: &Config) -> DriverHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let lazy = Arc::new(Mutex::new(LazyInbox::default()));
    let driver = Driver {
        conn,
        liveness: config.waiter_liveness,
        redisson_wait: config.redisson_wait,
        batch: config.batch_size,
        rx,
        self_tx: tx.downgrade(),
        lazy: lazy.clone(),
        timers: Timers {
            wheel: Wheel::new(config.timer_slots),
            start: Instant::now(),
            tick: config.timer_tick,
        },
        watchdog: Watchdog::new(config.watchdog_timeout),
    };
    tokio::spawn(driver.run());
    DriverHandle { tx, lazy }
}

struct Driver {
    conn: Conn,
    liveness: Duration,
    redisson_wait: Duration,
    batch: usize,
    rx: mpsc::UnboundedReceiver<Work>,
    self_tx: mpsc::WeakUnboundedSender<Work>,
    lazy: Arc<Mutex<LazyInbox>>,
    timers: Timers,
    watchdog: Watchdog,
}

impl Driver {
    async fn run(mut self) {
        let mut due = Vec::new();
        loop {
            self.drain_lazy();
            let next_tick = self.timers.next_tick();
            if next_tick.is_none() {
                // About to sleep without a tick: lazy work must wake us from now on.
                let mut inbox = lock_inbox(&self.lazy);
                if !inbox.items.is_empty() {
                    continue;
                }
                inbox.idle = true;
            }
            tokio::select! {
                work = self.rx.recv() => match work {
                    None => break,
                    Some(Work::Shutdown(done)) => {
                        crate::metrics::driver_pending(-1.0);
                        self.drain_lazy();
                        self.shutdown();
                        let _ = done.send(());
                        self.after_shutdown().await;
                        break;
                    }
                    Some(work) => {
                        // Lazy work sent before this message is handled first, in order.
                        self.drain_lazy();
                        self.handle(work);
                    }
                },
                _ = sleep_until_opt(next_tick), if next_tick.is_some() => {
                    self.drain_lazy();
                    let now = self.timers.tick_of(Instant::now());
                    self.timers.wheel.advance(now, &mut due);
                    self.fire(&mut due);
                }
            }
        }
    }

    /// After a shutdown: no timers, renewals or heartbeats any more, but what dropped guards and
    /// dropped waiting calls hand over (a release, a give-up, an attempt in flight) still runs,
    /// until the last handle of the client is gone. A waiting call dropped just after `shutdown`
    /// passed its field must still leave the queue: before, the driver had stopped and its
    /// give-up was lost, leaving the entry for a liveness window (with only Redisson peers left,
    /// until its score lapsed).
    async fn after_shutdown(&mut self) {
        while let Some(work) = self.rx.recv().await {
            match work {
                Work::Abandoned { .. } | Work::Finish(_) => self.handle(work),
                Work::Shutdown(done) => {
                    crate::metrics::driver_pending(-1.0);
                    let _ = done.send(());
                }
                Work::Renewed { .. } | Work::Beaten { .. } => {}
                _ => crate::metrics::driver_pending(-1.0),
            }
            // Lazy work (watchdog bookkeeping) has no meaning any more.
            lock_inbox(&self.lazy).items.clear();
        }
    }

    /// Handles the lazy work queued since the last look, in the order it was sent.
    fn drain_lazy(&mut self) {
        let items = {
            let mut inbox = lock_inbox(&self.lazy);
            inbox.idle = false;
            std::mem::take(&mut inbox.items)
        };
        for work in items {
            self.handle(work);
        }
    }

    fn handle(&mut self, work: Work) {
        // Everything but the replies of the driver's own I/O tasks came through the handle.
        if !matches!(work, Work::Renewed { .. } | Work::Beaten { .. }) {
            crate::metrics::driver_pending(-1.0);
        }
        match work {
            Work::Acquired {
                held,
                watchdog,
                confirm,
            } => self
                .watchdog
                .on_acquired(&mut self.timers, &held, watchdog, confirm),
            Work::Forget { id } => self.watchdog.forget(&mut self.timers, id),
            Work::Permits(lease) => {
                let at = self
                    .timers
                    .next_grid(Instant::now(), self.watchdog.period());
                self.timers
                    .schedule(at, Timer::Permits(Arc::downgrade(&lease)));
            }
            Work::Waiter(waiter) => {
                let at = self
                    .timers
                    .next_grid(Instant::now(), heartbeat::period(self.liveness));
                self.timers
                    .schedule(at, Timer::Heartbeat(Arc::downgrade(&waiter)));
            }
            Work::Abandoned {
                attempt,
                held,
                args,
            } => settle::abandoned_in_background(attempt, held, args),
            Work::Finish(fut) => {
                tokio::spawn(fut);
            }
            Work::Wake => {}
            Work::Renewed { ids, sent, results } => {
                let retry = self
                    .watchdog
                    .on_renewed(&mut self.timers, ids, sent, results);
                if !retry.is_empty() {
                    tracing::debug!(
                        locks = retry.len(),
                        "renewing again at once after a failure"
                    );
                    self.send_renewals(retry);
                }
            }
            Work::Beaten { waiters, result } => heartbeat::on_beaten(&waiters, result),
            Work::Shutdown(_) => unreachable!("handled in run"),
        }
    }

    /// Handles every timer that came due in one tick; renewals and heartbeats are batched.
    fn fire(&mut self, due: &mut Vec<(u64, Timer)>) {
        let now = Instant::now();
        let mut renew_ids = Vec::new();
        let mut beats = Vec::new();
        let mut permits = Vec::new();
        for (_, timer) in due.drain(..) {
            match timer {
                Timer::Renew(id) => {
                    self.watchdog
                        .renewal_due(&mut self.timers, id, now, &mut renew_ids)
                }
                Timer::Validity(id) => self.watchdog.validity_due(&mut self.timers, id, now),
                Timer::Permits(weak) => {
                    if let Some(lease) = weak.upgrade().filter(|l| l.renewable()) {
                        let at = self.timers.next_grid(now, self.watchdog.period());
                        self.timers.schedule(at, Timer::Permits(weak));
                        permits.push(lease);
                    }
                }
                Timer::Heartbeat(weak) => {
                    if weak.strong_count() > 0 {
                        let at = self.timers.next_grid(now, heartbeat::period(self.liveness));
                        self.timers.schedule(at, Timer::Heartbeat(weak.clone()));
                        beats.push(weak);
                    }
                }
            }
        }
        if !renew_ids.is_empty() {
            self.send_renewals(renew_ids);
        }
        if !permits.is_empty() {
            renew_permits(self.conn.clone(), permits, self.batch);
        }
        if !beats.is_empty() {
            if let Some(tx) = self.self_tx.upgrade() {
                heartbeat::send(
                    self.conn.clone(),
                    beats,
                    self.liveness,
                    self.redisson_wait,
                    self.batch,
                    tx,
                );
            }
        }
    }

    fn send_renewals(&mut self, ids: Vec<u64>) {
        let Some(tx) = self.self_tx.upgrade() else {
            return;
        };
        self.watchdog
            .send_renewals(&mut self.timers, ids, self.conn.clone(), self.batch, tx);
    }

    fn shutdown(&mut self) {
        self.watchdog.shutdown();
        let mut all = Vec::new();
        self.timers.wheel.advance(u64::MAX, &mut all);
    }
}

/// Renews expirable-semaphore permits in one batch, from a spawned task that reports each
/// result to its guard's shared state (nothing comes back to the driver: a guard's next renewal
/// is already scheduled, and one that is lost or ended is not renewed again).
fn renew_permits(
    mut conn: Conn,
    leases: Vec<Arc<crate::engine::permit::PermitLease>>,
    batch: usize,
) {
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

async fn sleep_until_opt(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}
