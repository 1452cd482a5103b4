//! The waiting engine behind `lock()` and `try_lock()`: attempts, pub/sub wake-ups, deadlines and
//! the cleanup a dropped future leaves to the driver.
//!
//! One acquisition is a loop of attempts. The first attempt runs without a subscription (the
//! uncontended path costs exactly one round trip) unless our channel is still subscribed from a
//! recent wait; if it queues us unsubscribed, we subscribe and attempt again before ever sleeping,
//! so a release between the first attempt and the subscription cannot be missed. After that we sleep until a message, the hint the script gave (the lock's
//! TTL when we are the head: nobody announces an expiry), our deadline, or a shutdown.
//!
//! Every attempt is a boxed future polled by the caller's future. If the caller drops the future
//! while one is in flight, the attempt itself is handed to the driver, which runs it to its end and
//! releases a lock granted too late or leaves the queue: no I/O in `Drop`, no task spawned on the
//! normal path, and nothing is left behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::client::Inner;
use crate::driver::{AttemptFuture, WaiterBeat, Work};
use crate::error::{duration_ms, Error, Result};
use crate::guard::LockGuard;
use crate::keys::{Kind, LockSpec};
use crate::ops::{self, AcquireArgs, Attempt, Mode};
use crate::subscriber::Subscription;

/// What one lock call asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) holder: i64,
    /// `None`: wait for ever.
    pub(crate) wait: Option<Duration>,
    /// `None`: watchdog.
    pub(crate) lease: Option<Duration>,
    pub(crate) fenced: bool,
}

/// Runs one acquisition to its end: `Some(guard)`, or `None` when `wait` elapsed.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    spec: &Arc<LockSpec>,
    req: Request,
) -> Result<Option<LockGuard>> {
    inner.check_open()?;
    let lease_ms = match req.lease {
        Some(lease) => duration_ms("lease", lease)?,
        None => inner.config.watchdog_timeout.as_millis() as i64,
    };
    let started = Instant::now();
    let deadline = match req.wait {
        None => None,
        Some(wait) => {
            if wait.as_millis() > i64::MAX as u128 {
                return Err(Error::invalid_argument(
                    "wait",
                    format!("{wait:?} does not fit in i64 milliseconds"),
                ));
            }
            // A wait too long to represent is a wait for ever.
            started.checked_add(wait)
        }
    };
    let field = inner.field(req.holder);
    // The last call of this holder ended after a lost reply: its grant may be waiting for us.
    let unsure = inner.holds.take_unsure(spec, &field);
    let span = tracing::debug_span!("acquire", lock = spec.name(), field = &*field);
    let mut waiter = Waiter {
        inner: inner.clone(),
        args: AcquireArgs {
            spec: spec.clone(),
            field,
            lease_ms,
            liveness_ms: inner.config.waiter_liveness.as_millis() as i64,
            mode: if req.wait == Some(Duration::ZERO) {
                Mode::Try
            } else {
                Mode::Queue
            },
            fenced: req.fenced,
        },
        in_flight: None,
        queued: false,
        subscription: None,
        zero_wait: req.wait == Some(Duration::ZERO),
        beat: None,
        unsure,
    };
    async move { waiter.run(deadline, req.lease.is_none()).await }
        .instrument(span)
        .await
}

/// Resolves once the client is shut down. (The borrow `wait_for` returns is not `Send`, so it is
/// dropped here rather than held across the caller's awaits.)
async fn shut_down(closed: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = closed.wait_for(|c| *c).await.map(|_| ());
}

/// Longest a waiter sleeps without any reason to re-check (a guard against a wake-up path that
/// failed in a way nobody noticed; every normal path wakes it sooner).
fn max_idle(inner: &Inner) -> Duration {
    inner
        .config
        .watchdog_timeout
        .max(inner.config.waiter_liveness)
}

struct Waiter {
    inner: Arc<Inner>,
    args: AcquireArgs,
    /// The attempt currently running, if the caller is awaiting one.
    in_flight: Option<AttemptFuture>,
    /// We may be in the fair queue (set before the first attempt that can enqueue).
    queued: bool,
    subscription: Option<Subscription>,
    /// A zero wait: the first failed attempt ends the call.
    zero_wait: bool,
    /// Kept alive while we wait; the driver heartbeats it through a `Weak`.
    beat: Option<Arc<WaiterBeat>>,
    /// The reply to our last attempt was lost: it may have taken the lock.
    unsure: bool,
}

/// A run of transient errors met by one waiter.
#[derive(Debug, Default)]
struct Outage {
    since: Option<Instant>,
    retries: u32,
}

impl Outage {
    fn end(&mut self) {
        *self = Outage::default();
    }
}

/// After a lost acquire reply: `Some(grant)` when Redis counts more holds for our field than this
/// client does (`ours`), i.e. the lost attempt took the lock, else `None`. A grant taken up gets
/// its lease again from the probe, so the caller's validity, counted from before the probe, holds.
async fn adopt(
    conn: &mut crate::conn::Conn,
    args: &AcquireArgs,
    ours: u64,
) -> Result<Option<Attempt>> {
    let (count, token) = ops::probe(conn, &args.spec, &args.field, ours, args.lease_ms).await?;
    if count > ours {
        tracing::debug!(count, ours, "an attempt whose reply was lost took the lock");
        return Ok(Some(Attempt::Acquired {
            token: args.fenced.then_some(token),
        }));
    }
    Ok(None)
}

impl Waiter {
    async fn run(
        &mut self,
        deadline: Option<Instant>,
        watchdog: bool,
    ) -> Result<Option<LockGuard>> {
        let mut closed = self.inner.closed.subscribe();
        // A channel still lingering from this holder's last wait is taken at once, so even the
        // first attempt is covered and needs no re-check.
        if !self.zero_wait {
            let channel = self.args.spec.wake_channel(&self.args.field);
            self.subscription = self.inner.subscriber.subscribe_if_live(&channel);
        }
        let mut outage = Outage::default();
        loop {
            let sent = Instant::now();
            let attempt = match self.attempt().await {
                Ok(attempt) => {
                    outage.end();
                    attempt
                }
                Err(e) => {
                    self.ride_out(e, &mut outage, deadline, &mut closed).await?;
                    continue;
                }
            };
            match attempt {
                Attempt::Acquired { token } => {
                    self.queued = false;
                    let held = self.inner.holds.acquired(
                        &self.inner,
                        &self.args.spec,
                        &self.args.field,
                        self.args.lease_ms,
                        watchdog,
                        sent,
                    );
                    tracing::debug!(waited = ?sent.elapsed(), "acquired");
                    return Ok(Some(LockGuard::new(held, token)));
                }
                Attempt::Waiting { .. } if self.zero_wait => return Ok(None),
                Attempt::Waiting { hint_ms } => {
                    if self.args.spec.kind == Kind::Fair {
                        self.args.mode = Mode::Requeue;
                    }
                    if self.subscription.is_none() {
                        if let Err(e) = self.subscribe().await {
                            self.ride_out(e, &mut outage, deadline, &mut closed).await?;
                            continue;
                        }
                        self.start_heartbeat();
                        // Re-check now that a release can no longer slip past us.
                        continue;
                    }
                    self.start_heartbeat();
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        self.give_up().await?;
                        tracing::debug!("wait elapsed");
                        return Ok(None);
                    }
                    let mut wake_at = now + max_idle(&self.inner);
                    if hint_ms >= 0 {
                        wake_at = wake_at.min(now + Duration::from_millis(hint_ms as u64 + 1));
                    }
                    if let Some(d) = deadline {
                        wake_at = wake_at.min(d);
                    }
                    let notify = self
                        .subscription
                        .as_ref()
                        .map(|s| s.notify().clone())
                        .expect("subscribed above");
                    tokio::select! {
                        _ = notify.notified() => tracing::trace!("woken by message"),
                        _ = tokio::time::sleep_until(wake_at.into()) => tracing::trace!("woken by timer"),
                        _ = shut_down(&mut closed) => {
                            let _ = self.give_up().await;
                            return Err(Error::Shutdown);
                        }
                    }
                    self.inner.check_open()?;
                }
            }
        }
    }

    /// Sends one attempt and waits for it. The attempt is kept in `in_flight` while it runs, so
    /// a caller that drops us meanwhile hands it to the driver to settle.
    async fn attempt(&mut self) -> Result<Attempt> {
        if self.args.spec.kind == Kind::Fair && self.args.mode != Mode::Try {
            self.queued = true;
        }
        let mut conn = self.inner.conn.clone();
        let args = self.args.clone();
        let sync = self.inner.config.replica_sync;
        let timeout = self.inner.config.command_timeout;
        // After a lost reply, first find out whether that attempt took the lock.
        let ours = self
            .unsure
            .then(|| self.inner.holds.count(&self.args.spec, &self.args.field));
        let attempt = self.in_flight.insert(Box::pin(async move {
            let attempt = match ours {
                Some(ours) => match adopt(&mut conn, &args, ours).await? {
                    Some(granted) => granted,
                    None => ops::acquire(&mut conn, &args).await?,
                },
                None => ops::acquire(&mut conn, &args).await?,
            };
            match (attempt, sync) {
                (Attempt::Acquired { .. }, Some(sync)) => {
                    crate::replica::synced(&mut conn, &args, attempt, sync, timeout).await
                }
                _ => Ok(attempt),
            }
        }));
        let outcome = attempt.as_mut().await;
        self.in_flight = None;
        self.unsure = match &outcome {
            Ok(_) => false,
            Err(e) => self.unsure || e.is_ambiguous(),
        };
        outcome
    }

    /// Handles an error met while waiting. A transient one (see [`Error::is_transient`]) is
    /// ridden out: we pause with a growing backoff and the caller tries again, until the wait's
    /// deadline, or for a call without one, until the outage has lasted [`max_idle`]. Any other
    /// error, or a transient one past that point, is returned.
    async fn ride_out(
        &mut self,
        error: Error,
        outage: &mut Outage,
        deadline: Option<Instant>,
        closed: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<()> {
        if !error.is_transient() || self.zero_wait {
            return Err(error);
        }
        let now = Instant::now();
        let since = *outage.since.get_or_insert(now);
        let limit = deadline.unwrap_or(since + max_idle(&self.inner));
        if now >= limit {
            tracing::warn!(error = ?error, outage = ?now - since, "redis still failing; giving up");
            return Err(error);
        }
        outage.retries = outage.retries.saturating_add(1);
        let pause = crate::retry::retry_backoff(outage.retries).min(limit - now);
        tracing::warn!(error = ?error, retry_in = ?pause, "transient redis error while acquiring");
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shut_down(closed) => return Err(Error::Shutdown),
        }
        self.inner.check_open()
    }

    /// Subscribes to our wake-up channel.
    async fn subscribe(&mut self) -> Result<()> {
        let channel = self.args.spec.wake_channel(&self.args.field);
        self.subscription = Some(self.inner.subscriber.subscribe(channel).await?);
        Ok(())
    }

    /// Has the driver heartbeat our place in a fair queue while we wait (once).
    fn start_heartbeat(&mut self) {
        if self.args.spec.kind != Kind::Fair || self.beat.is_some() {
            return;
        }
        let Some(subscription) = &self.subscription else {
            return;
        };
        let beat = Arc::new(WaiterBeat {
            spec: self.args.spec.clone(),
            field: self.args.field.clone(),
            notify: subscription.notify().clone(),
        });
        self.inner.driver.send(Work::Waiter(beat.clone()));
        self.beat = Some(beat);
    }

    /// Leaves the queue now (and wakes the next head if the lock is free).
    async fn give_up(&mut self) -> Result<()> {
        if self.queued {
            let mut conn = self.inner.conn.clone();
            ops::give_up(&mut conn, &self.args.spec, &self.args.field).await?;
            self.queued = false;
        }
        Ok(())
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // (Waiters of a non-fair lock share one channel, and each message wakes one of them. A
        // wake-up is never lost by dropping a waiter: an unconsumed one is passed on by tokio's
        // `Notified` drop, and after a consumed one the next await is an attempt, whose outcome the
        // driver settles: a late grant is released, which publishes the next wake-up.)
        // No I/O here: the driver settles whatever we leave behind.
        if let Some(attempt) = self.in_flight.take() {
            // If its reply is lost, the attempt may hold the lock unseen: as below, the holder's
            // next acquisition checks for it first.
            let inner = self.inner.clone();
            let (spec, field) = (self.args.spec.clone(), self.args.field.clone());
            let attempt: AttemptFuture = Box::pin(async move {
                let outcome = attempt.await;
                if matches!(&outcome, Err(e) if e.is_ambiguous()) {
                    inner.holds.mark_unsure(&spec, &field);
                }
                outcome
            });
            self.inner.driver.send(Work::Abandoned {
                attempt,
                args: self.args.clone(),
            });
        } else {
            if self.unsure {
                // We stop right after a lost reply, so that attempt may hold the lock unseen. The
                // holder's next acquisition adopts it (it checks first); otherwise it expires
                // with its lease. Releasing it from here could race that next acquisition and
                // release a hold that is really the caller's.
                self.inner
                    .holds
                    .mark_unsure(&self.args.spec, &self.args.field);
            }
            if self.queued {
                self.inner.driver.send(Work::GiveUp {
                    spec: self.args.spec.clone(),
                    field: self.args.field.clone(),
                });
            }
        }
    }
}
