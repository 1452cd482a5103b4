//! The driver's loop: one task per client that dispatches the work it is sent and fires the
//! timers of its wheel (renewals, validity deadlines, heartbeats), batching what comes due in
//! one tick.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::heartbeat;
use super::timers::{Timer, Timers};
use super::watchdog::{self, Watchdog};
use super::wheel::Wheel;
use super::work::{lock_inbox, DriverHandle, LazyInbox, Work};
use crate::config::Config;
use crate::conn::Conn;

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
                Work::Finish(_) => self.handle(work),
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
                deadline,
            } => self
                .watchdog
                .on_acquired(&mut self.timers, &held, watchdog, confirm, deadline),
            Work::Forget { id } => self.watchdog.forget(&mut self.timers, id),
            Work::Permits(lease) => self.watchdog.on_permits(&mut self.timers, &lease),
            Work::Waiter(waiter) => {
                let at = self
                    .timers
                    .next_grid(Instant::now(), heartbeat::period(self.liveness));
                self.timers
                    .schedule(at, Timer::Heartbeat(Arc::downgrade(&waiter)));
            }
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
                    self.watchdog
                        .permits_due(&mut self.timers, weak, now, &mut permits)
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
            watchdog::renew_permits(self.conn.clone(), permits, self.batch);
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

async fn sleep_until_opt(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}
