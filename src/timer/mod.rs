//! The client's driver task: one per client, one hashed timing wheel, all background work.
//!
//! It owns the wheel ([`wheel::Wheel`], a pure data structure over ticks) and turns monotonic time
//! into ticks. Work arrives over an unbounded channel from lock handles, guards and dropped futures
//! (so `Drop` never does I/O), and from the driver's own I/O tasks reporting back; registering and
//! forgetting a held lock goes through a lazy inbox the driver reads on its next tick instead, so
//! the uncontended lock/unlock path never wakes it:
//!
//! * watchdog renewals for held locks taken without a lease, every `watchdog_timeout / 3`; all
//!   renewals due in one tick go out together, up to `batch_size` locks per script call, in
//!   pipelines of up to ten calls sent one after another (so a batch's buffers stay small however
//!   many locks are held); a renewal that comes due while the lock's previous one is still in
//!   flight is not sent beside it, but if that one then fails it goes out at once rather than a
//!   period later (a server stalled for longer than the command timeout, e.g. writes paused by a
//!   manual failover, must not cost a lock whose lease has time left);
//! * the local validity deadline of every held lock (send time of the last successful acquire or
//!   renewal + lease − drift), at which the holder is told the lock is lost even if renewals stall;
//! * deadline heartbeats for fair waiters that are still waiting, batched the same way;
//! * the give-up and release work handed over by dropped futures and guards.
//!
//! The driver never awaits Redis itself: I/O runs in spawned tasks that report back, so one slow
//! round trip never delays a timer. It ends when the client (every handle and guard) is gone.

pub(crate) mod wheel;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::RedisError;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::config::Config;
use crate::conn::Conn;
use crate::error::Result;
use crate::guard::{unlock_hold, Held, LostReason};
use crate::ops::{self, AcquireArgs, Attempt, Beat, Kind, LockSpec, Mode};
use wheel::{TimerHandle, Wheel};

/// The drift margin subtracted from a lease before the local validity deadline: 1 % + 2 ms, as
/// Redlock uses for clock drift between client and server.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// A fair waiter the driver keeps alive in the queue while its future waits.
#[derive(Debug)]
pub(crate) struct WaiterBeat {
    pub(crate) spec: Arc<LockSpec>,
    pub(crate) field: Arc<str>,
    /// The waiter's wake-up (shared with its subscription).
    pub(crate) notify: Arc<Notify>,
}

/// Work for the driver.
pub(crate) enum Work {
    /// A hold was taken (fresh or reentrant), with the send time of the acquire script.
    Acquired {
        held: Arc<Held>,
        sent: Instant,
        lease_ms: i64,
    },
    /// The last local hold of an entry was released with `unlock()`: stop its timers.
    Forget { id: u64 },
    /// A guard was dropped: release one hold in the background (and forget it if it was the last).
    Release { held: Arc<Held> },
    /// A fair waiter started waiting: heartbeat it while it is alive.
    Waiter(Arc<WaiterBeat>),
    /// A fair waiter stopped waiting without cleaning up itself.
    GiveUp {
        spec: Arc<LockSpec>,
        field: Arc<str>,
    },
    /// A waiting future was dropped while an acquire attempt was in flight: settle its outcome
    /// (release what it took, or leave the queue).
    Abandoned {
        attempt: AttemptFuture,
        args: AcquireArgs,
    },
    /// A caller stopped awaiting an operation that must still run to its end: finish it.
    Finish(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Lazy work is waiting and the driver was idle: look at it.
    Wake,
    /// Renewal replies for the listed entries (sent at `sent`).
    Renewed {
        ids: Vec<u64>,
        sent: Instant,
        results: Vec<Result<bool, RedisError>>,
    },
    /// Heartbeat replies for the listed waiters.
    Beaten {
        waiters: Vec<Weak<WaiterBeat>>,
        result: Result<Vec<Beat>, RedisError>,
    },
    /// Stop every timer and end the task.
    Shutdown(oneshot::Sender<()>),
}

/// An acquire attempt in flight: polled by the caller's future, handed to the driver if the
/// caller stops waiting before it completes.
pub(crate) type AttemptFuture = Pin<Box<dyn Future<Output = Result<Attempt>> + Send>>;

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
            watchdog: config.watchdog_timeout,
            liveness: config.waiter_liveness,
            tick: config.timer_tick,
            batch: config.batch_size,
            command_timeout: config.command_timeout,
            rx,
            self_tx: tx.downgrade(),
            lazy: lazy.clone(),
            wheel: Wheel::new(config.timer_slots),
            start: Instant::now(),
            helds: HashMap::new(),
        };
        tokio::spawn(driver.run());
        DriverHandle { tx, lazy }
    }

    /// Hands work to the driver, waking it. Never blocks; silently dropped once the driver has
    /// ended.
    pub(crate) fn send(&self, work: Work) {
        let _ = self.tx.send(work);
    }

    /// Hands work to the driver for its next tick (see [`LazyInbox`]); wakes it only when it
    /// has no tick scheduled.
    pub(crate) fn send_lazy(&self, work: Work) {
        let wake = {
            let mut inbox = lock_inbox(&self.lazy);
            inbox.items.push(work);
            std::mem::take(&mut inbox.idle)
        };
        if wake {
            self.send(Work::Wake);
        }
    }
}

fn lock_inbox(inbox: &Mutex<LazyInbox>) -> std::sync::MutexGuard<'_, LazyInbox> {
    inbox.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs an operation inside the caller's future; if the caller drops the future before the
/// operation completes, the driver finishes it in the background. Cancel safety without a task
/// spawn on the normal path.
pub(crate) struct Handoff<T: Send + 'static> {
    fut: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    driver: DriverHandle,
}

impl<T: Send + 'static> Handoff<T> {
    pub(crate) fn new(
        driver: &DriverHandle,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Self {
        Handoff {
            fut: Some(Box::pin(fut)),
            driver: driver.clone(),
        }
    }

    /// Awaits the operation.
    pub(crate) async fn run(mut self) -> T {
        let out = self.fut.as_mut().expect("set until completed").await;
        self.fut = None;
        out
    }
}

impl<T: Send + 'static> Drop for Handoff<T> {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take() {
            self.driver.send(Work::Finish(Box::pin(async move {
                let _ = fut.await;
            })));
        }
    }
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Work::Acquired { .. } => "Acquired",
            Work::Forget { .. } => "Forget",
            Work::Release { .. } => "Release",
            Work::Waiter(_) => "Waiter",
            Work::GiveUp { .. } => "GiveUp",
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

#[derive(Debug)]
enum Timer {
    Renew(u64),
    Validity(u64),
    Heartbeat(Weak<WaiterBeat>),
}

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

struct Driver {
    conn: Conn,
    watchdog: Duration,
    liveness: Duration,
    tick: Duration,
    batch: usize,
    command_timeout: Duration,
    rx: mpsc::UnboundedReceiver<Work>,
    self_tx: mpsc::WeakUnboundedSender<Work>,
    lazy: Arc<Mutex<LazyInbox>>,
    wheel: Wheel<Timer>,
    start: Instant,
    helds: HashMap<u64, HeldEntry>,
}

impl Driver {
    async fn run(mut self) {
        let mut due = Vec::new();
        loop {
            self.drain_lazy();
            let next_tick = (!self.wheel.is_empty())
                .then(|| self.start + self.tick * (self.wheel.current_tick() as u32 + 1));
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
                    let now = self.tick_of(Instant::now());
                    self.wheel.advance(now, &mut due);
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

    /// The tick an instant falls in (rounded down, so deadlines fire early rather than late).
    fn tick_of(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.start);
        (since.as_nanos() / self.tick.as_nanos().max(1)) as u64
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

    fn handle(&mut self, work: Work) {
        match work {
            Work::Acquired {
                held,
                sent,
                lease_ms,
            } => self.on_acquired(&held, sent, lease_ms),
            Work::Forget { id } => self.forget(id),
            Work::Release { held } => {
                if held.is_released() {
                    self.forget(held.id);
                }
                tokio::spawn(async move {
                    let _ = unlock_hold(&held).await;
                });
            }
            Work::Waiter(waiter) => {
                let at = self.next_grid(Instant::now(), self.liveness / 3);
                self.schedule(at, Timer::Heartbeat(Arc::downgrade(&waiter)));
            }
            Work::GiveUp { spec, field } => {
                let mut conn = self.conn.clone();
                tokio::spawn(async move { give_up_logged(&mut conn, &spec, &field).await });
            }
            Work::Abandoned { attempt, args } => {
                let mut conn = self.conn.clone();
                let timeout = self.command_timeout;
                tokio::spawn(
                    async move { settle_abandoned(&mut conn, attempt, args, timeout).await },
                );
            }
            Work::Finish(fut) => {
                tokio::spawn(fut);
            }
            Work::Wake => {}
            Work::Renewed { ids, sent, results } => self.on_renewed(ids, sent, results),
            Work::Beaten { waiters, result } => match result {
                Ok(beats) => {
                    for (waiter, beat) in waiters.iter().zip(beats) {
                        if beat != Beat::Queued {
                            if let Some(w) = waiter.upgrade() {
                                tracing::debug!(
                                    lock = w.spec.name(),
                                    field = &*w.field,
                                    ?beat,
                                    "heartbeat wakes waiter"
                                );
                                w.notify.notify_one();
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, waiters = waiters.len(), "waiter heartbeat failed")
                }
            },
            Work::Shutdown(_) => unreachable!("handled in run"),
        }
    }

    fn on_acquired(&mut self, held: &Arc<Held>, sent: Instant, lease_ms: i64) {
        if held.is_released() || held.lost_reason().is_some() {
            // Released (or lost) before this lazy registration was looked at.
            self.forget(held.id);
            return;
        }
        let lease = Duration::from_millis(lease_ms as u64);
        let validity_at = sent + lease.saturating_sub(drift(lease));
        let renew_at = self.next_grid(Instant::now(), self.watchdog / 3);
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
        let needs_renew = entry.watchdog && entry.renew.is_none();
        let old_validity = entry.validity.take();
        if let Some(h) = old_validity {
            self.wheel.cancel(h);
        }
        let validity = self.schedule(validity_at, Timer::Validity(id));
        let renew = needs_renew.then(|| self.schedule(renew_at, Timer::Renew(id)));
        if let Some(entry) = self.helds.get_mut(&id) {
            entry.validity = Some(validity);
            if renew.is_some() {
                entry.renew = renew;
            }
        }
    }

    fn forget(&mut self, id: u64) {
        if let Some(entry) = self.helds.remove(&id) {
            for h in [entry.renew, entry.validity].into_iter().flatten() {
                self.wheel.cancel(h);
            }
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
                    let Some(entry) = self.helds.get_mut(&id) else {
                        continue;
                    };
                    entry.renew = None;
                    let held = match entry.held.upgrade() {
                        Some(h) if !h.is_released() && h.lost_reason().is_none() => h,
                        _ => {
                            self.forget(id);
                            continue;
                        }
                    };
                    drop(held);
                    if entry.in_flight {
                        entry.missed = true;
                    } else {
                        entry.in_flight = true;
                        renew_ids.push(id);
                    }
                    let handle =
                        self.schedule(self.next_grid(now, self.watchdog / 3), Timer::Renew(id));
                    if let Some(entry) = self.helds.get_mut(&id) {
                        entry.renew = Some(handle);
                    }
                }
                Timer::Validity(id) => {
                    let Some(entry) = self.helds.get_mut(&id) else {
                        continue;
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
                    self.forget(id);
                }
                Timer::Heartbeat(weak) => {
                    if weak.strong_count() > 0 {
                        self.schedule(
                            self.next_grid(now, self.liveness / 3),
                            Timer::Heartbeat(weak.clone()),
                        );
                        beats.push(weak);
                    }
                }
            }
        }
        if !renew_ids.is_empty() {
            self.send_renewals(renew_ids);
        }
        if !beats.is_empty() {
            self.send_heartbeats(beats);
        }
    }

    fn send_renewals(&mut self, ids: Vec<u64>) {
        let mut items: Vec<(Arc<Held>, u64)> = Vec::with_capacity(ids.len());
        let mut gone = Vec::new();
        for id in ids {
            match self.helds.get(&id).and_then(|e| e.held.upgrade()) {
                Some(h) => items.push((h, id)),
                None => gone.push(id),
            }
        }
        for id in gone {
            self.forget(id);
        }
        let Some(tx) = self.self_tx.upgrade() else {
            return;
        };
        let mut conn = self.conn.clone();
        let ttl_ms = self.watchdog.as_millis() as i64;
        let batch = self.batch;
        tracing::debug!(locks = items.len(), "renewing");
        tokio::spawn(async move {
            let sent = Instant::now();
            let pairs: Vec<(&str, &str)> =
                items.iter().map(|(h, _)| (h.name(), &*h.field)).collect();
            let results = ops::renew(&mut conn, &pairs, ttl_ms, batch).await;
            drop(pairs);
            let ids = items.iter().map(|(_, id)| *id).collect();
            drop(items);
            let _ = tx.send(Work::Renewed { ids, sent, results });
        });
    }

    fn on_renewed(&mut self, ids: Vec<u64>, sent: Instant, results: Vec<Result<bool, RedisError>>) {
        let mut retry = Vec::new();
        let mut failed = 0usize;
        let mut first_error = None;
        for (id, result) in ids.into_iter().zip(results) {
            let Some(entry) = self.helds.get_mut(&id) else {
                continue;
            };
            entry.in_flight = false;
            let missed = std::mem::take(&mut entry.missed);
            let Some(held) = entry.held.upgrade() else {
                self.forget(id);
                continue;
            };
            if held.is_released() {
                // Released while the renewal was in flight: its reply means nothing.
                self.forget(id);
                continue;
            }
            match result {
                Ok(true) => {
                    entry.failures = 0;
                    let old = entry.validity.take();
                    if let Some(h) = old {
                        self.wheel.cancel(h);
                    }
                    let valid_until = sent + self.watchdog - drift(self.watchdog);
                    held.set_valid_until(valid_until);
                    let validity = self.schedule(valid_until, Timer::Validity(id));
                    if let Some(entry) = self.helds.get_mut(&id) {
                        entry.validity = Some(validity);
                    }
                    tracing::trace!(lock = held.name(), "renewed");
                }
                Ok(false) => {
                    held.mark_lost(LostReason::Gone);
                    self.forget(id);
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                    entry.failures = entry.failures.saturating_add(1);
                    if entry.failures >= 2 {
                        if held.lost_reason().is_none() {
                            held.mark_lost(LostReason::RenewalFailed);
                        }
                        self.forget(id);
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
        if !retry.is_empty() {
            tracing::debug!(
                locks = retry.len(),
                "renewing again at once after a failure"
            );
            self.send_renewals(retry);
        }
    }

    fn send_heartbeats(&mut self, waiters: Vec<Weak<WaiterBeat>>) {
        let live: Vec<Arc<WaiterBeat>> = waiters.iter().filter_map(Weak::upgrade).collect();
        if live.is_empty() {
            return;
        }
        let Some(tx) = self.self_tx.upgrade() else {
            return;
        };
        let mut conn = self.conn.clone();
        let liveness_ms = self.liveness.as_millis() as i64;
        let batch = self.batch;
        tokio::spawn(async move {
            let items: Vec<(&LockSpec, &str)> =
                live.iter().map(|w| (&*w.spec, &*w.field)).collect();
            let result = ops::heartbeat(&mut conn, &items, liveness_ms, batch).await;
            drop(items);
            let waiters = live.iter().map(Arc::downgrade).collect();
            drop(live);
            let _ = tx.send(Work::Beaten { waiters, result });
        });
    }

    fn shutdown(&mut self) {
        for (_, entry) in self.helds.drain() {
            if let Some(held) = entry.held.upgrade() {
                held.mark_lost(LostReason::Shutdown);
            }
        }
        let mut all = Vec::new();
        self.wheel.advance(u64::MAX, &mut all);
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

async fn give_up_logged(conn: &mut Conn, spec: &LockSpec, field: &str) {
    match ops::give_up(conn, spec, field).await {
        Ok(removed) => tracing::debug!(lock = spec.name(), field, removed, "gave up waiting"),
        Err(e) => tracing::warn!(lock = spec.name(), field, error = %e,
            "give-up failed; the waiter is purged when its liveness window lapses"),
    }
}

/// Settles an acquire attempt whose caller stopped waiting while it was in flight.
async fn settle_abandoned(
    conn: &mut Conn,
    attempt: AttemptFuture,
    args: AcquireArgs,
    command_timeout: Duration,
) {
    let spec = &args.spec;
    match attempt.await {
        Ok(Attempt::Acquired { .. }) => {
            // Granted after the caller left: give the hold straight back.
            match ops::release(conn, spec, &args.field, args.lease_ms, command_timeout).await {
                Ok(outcome) => tracing::debug!(
                    lock = spec.name(),
                    field = &*args.field,
                    ?outcome,
                    "released a lock granted to a cancelled waiter"
                ),
                Err(e) => tracing::warn!(lock = spec.name(), field = &*args.field, error = %e,
                    "could not release a lock granted to a cancelled waiter; it expires with its lease"),
            }
        }
        _ if args.mode == Mode::Try || args.spec.kind != Kind::Fair => {}
        _ => give_up_logged(conn, spec, &args.field).await,
    }
}
