//! The client's driver task: one per client, one hashed timing wheel, all background work.
//!
//! Work arrives over an unbounded channel from lock handles, guards and dropped futures (so `Drop`
//! never does I/O), and from the driver's own I/O tasks reporting back; registering and forgetting
//! a held lock goes through a lazy inbox the driver reads on its next tick instead, so the
//! uncontended lock/unlock path never wakes it. The concerns live one per file:
//!
//! * [`wheel`]: the hashed timing wheel, a pure data structure over integer ticks;
//! * [`watchdog`]: renewals and validity deadlines of held locks;
//! * [`heartbeat`]: deadline heartbeats of fair waiters that are still waiting;
//! * [`settle`]: what dropped guards and futures leave behind (releases, give-ups, attempts that
//!   were in flight when their caller stopped waiting);
//! * [`handoff`]: running an operation inside the caller's future, handing it to the driver only
//!   if the caller drops it.
//!
//! This module turns monotonic time into ticks and dispatches. The driver never awaits Redis
//! itself: I/O runs in spawned tasks that report back, so one slow round trip never delays a
//! timer. It ends when the client (every handle and guard) is gone.

mod handoff;
mod heartbeat;
mod settle;
mod watchdog;
mod wheel;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::config::Config;
use crate::conn::Conn;
use crate::engine::field::{FieldTurn, Held};
use crate::error::Result;
use crate::ops::batch::Beat;
use crate::ops::{AcquireArgs, Attempt};
use watchdog::Watchdog;
use wheel::{TimerHandle, Wheel};

pub(crate) use handoff::Handoff;
pub(crate) use heartbeat::WaiterBeat;
pub(crate) use settle::give_up_logged;

/// Work for the driver.
pub(crate) enum Work {
    /// A hold was taken on `held` (lazy): arm its validity timer, and its renewals when it is a
    /// watchdog hold.
    Acquired { held: Arc<Held>, watchdog: bool },
    /// Nothing refers to the field `id` any more (lazy): stop its timers.
    Forget { id: u64 },
    /// A fair waiter started waiting: heartbeat it while it is alive.
    Waiter(Arc<WaiterBeat>),
    /// A waiting future was dropped while an acquire attempt was in flight: settle its outcome
    /// (release what it took, or leave the queue), with the field's turn the attempt holds.
    Abandoned {
        attempt: AttemptFuture,
        held: Arc<Held>,
        args: AcquireArgs,
    },
    /// An operation that must run to its end though nobody awaits it: a dropped guard's release,
    /// a cancelled wait's give-up (each holding its field's turn), or the rest of an operation
    /// whose caller left.
    Finish(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Lazy work is waiting and the driver was idle: look at it.
    Wake,
    /// Renewal replies for the listed entries (sent at `sent`, covering grants up to `grants`).
    Renewed {
        ids: Vec<(u64, u64)>,
        sent: Instant,
        results: Vec<Result<bool>>,
    },
    /// Heartbeat replies for the listed waiters.
    Beaten {
        waiters: Vec<Weak<WaiterBeat>>,
        result: Result<Vec<Beat>>,
    },
    /// Stop every timer and end the task.
    Shutdown(oneshot::Sender<()>),
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Work::Acquired { .. } => "Acquired",
            Work::Forget { .. } => "Forget",
            Work::Waiter(_) => "Waiter",
            Work::Abandoned { .. } => "Abandoned",
            Work::Finish(_) => "Finish",
            Work::Wake => "Wake",
            Work::Renewed { .. } => "Renewed",
            Work::Beaten { .. } => "Beaten",
            Work::Shutdown(_) => "Shutdown",
        };
        f.write_str(name)
    }
}

/// An acquire attempt in flight with its field's turn: polled by the caller's future, handed to
/// the driver if the caller stops waiting before it completes.
pub(crate) type AttemptFuture = Pin<Box<dyn Future<Output = (Result<Attempt>, FieldTurn)> + Send>>;

/// Work that may wait for the driver's next tick: registering and forgetting held entries. The
/// first renewal or validity deadline of an entry is at least a third of a lease away, and both
/// are computed from instants carried in the work, so a delay of one tick changes nothing, while
/// not waking the driver on every lock and unlock keeps the uncontended path at two round trips
/// and no extra task wake-ups.
#[derive(Debug, Default)]
struct LazyInbox {
    items: Vec<Work>,
    /// The driver sleeps without a tick: the next lazy item must wake it.
    idle: bool,
}

/// Handle on the driver task.
#[derive(Debug, Clone)]
pub(crate) struct DriverHandle {
    tx: mpsc::UnboundedSender<Work>,
    lazy: Arc<Mutex<LazyInbox>>,
}

impl DriverHandle {
    /// Starts the driver. It holds no strong reference to the client.
    pub(crate) fn start(conn: Conn, config: &Config) -> Self {
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

    /// A handle whose work lands in the returned receiver instead of a driver (unit tests).
    #[cfg(test)]
    pub(crate) fn detached() -> (Self, mpsc::UnboundedReceiver<Work>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let lazy = Arc::new(Mutex::new(LazyInbox::default()));
        (DriverHandle { tx, lazy }, rx)
    }

    /// Hands work to the driver, waking it. Never blocks; silently dropped once the driver has
    /// ended.
    pub(crate) fn send(&self, work: Work) {
        if self.tx.send(work).is_ok() {
            crate::metrics::driver_pending(1.0);
        }
    }

    /// Hands work to the driver for its next tick (see [`LazyInbox`]); wakes it only when it
    /// has no tick scheduled.
    pub(crate) fn send_lazy(&self, work: Work) {
        let wake = {
            let mut inbox = lock_inbox(&self.lazy);
            inbox.items.push(work);
            std::mem::take(&mut inbox.idle)
        };
        crate::metrics::driver_pending(1.0);
        if wake {
            self.send(Work::Wake);
        }
    }
}

fn lock_inbox(inbox: &Mutex<LazyInbox>) -> std::sync::MutexGuard<'_, LazyInbox> {
    inbox.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the wheel holds.
#[derive(Debug)]
enum Timer {
    Renew(u64),
    Validity(u64),
    Heartbeat(Weak<WaiterBeat>),
}

/// The wheel and the clock that drives it: monotonic instants in, ticks out.
struct Timers {
    wheel: Wheel<Timer>,
    /// Tick 0.
    start: Instant,
    tick: Duration,
}

impl Timers {
    /// The tick an instant falls in (rounded down, so deadlines fire early rather than late).
    fn tick_of(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.start);
        (since.as_nanos() / self.tick.as_nanos().max(1)) as u64
    }

    /// When the next tick starts, if anything is scheduled. (In nanoseconds since the start, so
    /// it holds beyond 2^32 ticks: 50 days at a 1 ms tick.)
    fn next_tick(&self) -> Option<Instant> {
        if self.wheel.is_empty() {
            return None;
        }
        let ticks = u128::from(self.wheel.current_tick()) + 1;
        let nanos = (ticks * self.tick.as_nanos()).min(u128::from(u64::MAX));
        Some(self.start + Duration::from_nanos(nanos as u64))
    }

    /// The first point of a grid of `step` (anchored at the driver's start) at or after
    /// `earliest + step / 2`. Renewals and heartbeats are scheduled on such grids so that every
    /// entry of one kind comes due in the same tick and goes out in one batch, however the
    /// acquisitions were spread: after its first cycle, each entry fires on every grid point.
    /// The wait is between half a step and one and a half steps.
    fn next_grid(&self, earliest: Instant, step: Duration) -> Instant {
        let since = (earliest + step / 2).saturating_duration_since(self.start);
        let step_ns = step.as_nanos().max(1);
        let k = since.as_nanos().div_ceil(step_ns);
        self.start + Duration::from_nanos((k * step_ns).min(u64::MAX as u128) as u64)
    }

    fn schedule(&mut self, at: Instant, timer: Timer) -> TimerHandle {
        let tick = self.tick_of(at);
        self.wheel.insert(tick, timer)
    }

    fn cancel(&mut self, handle: TimerHandle) {
        self.wheel.cancel(handle);
    }
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
            Work::Acquired { held, watchdog } => {
                self.watchdog.on_acquired(&mut self.timers, &held, watchdog)
            }
            Work::Forget { id } => self.watchdog.forget(&mut self.timers, id),
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
        for (_, timer) in due.drain(..) {
            match timer {
                Timer::Renew(id) => {
                    self.watchdog
                        .renewal_due(&mut self.timers, id, now, &mut renew_ids)
                }
                Timer::Validity(id) => self.watchdog.validity_due(&mut self.timers, id, now),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_tick_holds_beyond_two_to_the_thirty_two_ticks() {
        let start = Instant::now();
        let tick = Duration::from_millis(1);
        let current = (1u64 << 32) + 5;
        let mut timers = Timers {
            wheel: Wheel::with_start(16, current),
            start,
            tick,
        };
        assert_eq!(timers.next_tick(), None, "nothing scheduled");
        timers.wheel.insert(current + 10, Timer::Validity(1));
        assert_eq!(
            timers.next_tick(),
            Some(start + Duration::from_millis(current + 1))
        );
        assert_eq!(
            timers.tick_of(start + Duration::from_millis(current + 1)),
            current + 1
        );
    }
}
