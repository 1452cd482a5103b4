//! One acquisition call: its request, its record in the metrics, and the waiter that runs it:
//! the loop of attempts (below).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::settle::{give_up_logged, settle_abandoned, AttemptFuture};
use super::wait::Queued;
use crate::conn::subscriber::Subscription;
use crate::engine::driver::{WaiterBeat, Work};
use crate::engine::field::Held;
use crate::engine::hold::Hold;
use crate::engine::inner::Inner;
use crate::engine::lane::{Entry, Lane};
use crate::engine::outage::Outage;
use crate::error::{Error, Result};
use crate::keys::{Kind, LockSpec};
use crate::lease::Lease;
use crate::metrics;
use crate::wire::{AcquireArgs, Attempt, Mode, QueuePlace};

/// What a lock handle is to the engine: a name on a client, the validated spec, an optional
/// holder and whether grants are fenced. The public handles (`FairLock`, `NonFairLock`, the
/// sides of a `ReadWriteLock`) wrap one and make each acquisition one call into it; their reads
/// and force-unlocks are in `lock/handle.rs`.
///
/// A handle without a holder gives every acquisition call a holder of its own
/// ([`Helds::call_holder`](crate::engine::field::Helds::call_holder)), so its calls never share a hold; one given a holder
/// (`with_holder`) makes all its calls that one holder. Making a handle never does I/O or fails:
/// a name that cannot be used is reported by every operation as `Error::InvalidName`.
#[derive(Clone, Debug)]
pub(crate) struct Handle {
    inner: Arc<Inner>,
    name: String,
    /// The validated spec, or why the name was rejected (reported by every operation).
    spec: std::result::Result<Arc<LockSpec>, &'static str>,
    /// `None`: every acquisition call is its own holder.
    holder: Option<i64>,
    fenced: bool,
}

impl Handle {
    pub(crate) fn new(inner: Arc<Inner>, name: String, kind: Kind) -> Self {
        let cluster = inner.conn.is_cluster();
        let spec = match crate::keys::validate(&name, cluster) {
            Ok(()) => Ok(LockSpec::new(kind, &name)),
            Err(Error::InvalidName { reason, .. }) => Err(reason),
            Err(_) => Err("invalid name"),
        };
        Handle {
            inner,
            name,
            spec,
            holder: None,
            fenced: false,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The client state this handle works through.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The holder id every call of this handle uses, if it was given one.
    pub(crate) fn holder(&self) -> Option<i64> {
        self.holder
    }

    pub(crate) fn set_holder(&mut self, holder: i64) {
        self.holder = Some(holder);
    }

    pub(crate) fn set_fenced(&mut self) {
        self.fenced = true;
    }

    /// Makes a side of a read-write lock writer-preferring (`ReadWriteLock::writer_preferring`).
    pub(crate) fn set_prefer_writers(&mut self) {
        if let Ok(spec) = &self.spec {
            self.spec = Ok(LockSpec::new_rw(spec.kind, spec.name(), true));
        }
    }

    /// The validated spec, or `Error::InvalidName`.
    pub(crate) fn spec(&self) -> Result<&Arc<LockSpec>> {
        self.spec.as_ref().map_err(|reason| Error::InvalidName {
            name: self.name.clone(),
            reason,
        })
    }

    /// One acquisition call: `Some(hold)`, or `None` when `wait` elapsed (`wait: None` waits for
    /// ever; `lease: None` is a watchdog hold).
    pub(crate) async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<Hold>> {
        let spec = self.spec()?;
        let (holder, per_call, lingering) = match self.holder {
            Some(holder) => (holder, false, true),
            None => {
                let (holder, subscribed) = self.inner.helds.call_holder(spec.name());
                (holder, true, subscribed)
            }
        };
        let req = Request {
            holder,
            per_call,
            lingering,
            wait,
            lease,
            fenced: self.fenced,
        };
        acquire(&self.inner, spec, req).await
    }

    /// An acquisition call that waits as long as it takes.
    pub(crate) async fn acquire_unbounded(&self, lease: Option<Duration>) -> Result<Hold> {
        match self.acquire(None, lease).await? {
            Some(hold) => Ok(hold),
            None => unreachable!("a wait without a deadline ends only with the lock or an error"),
        }
    }
}

/// What one lock call asks for.
#[derive(Debug, Clone, Copy)]
struct Request {
    pub(crate) holder: i64,
    /// The holder is the call's own (not one the caller passed): the field may be reused by a
    /// later call of this client once nothing of it is left (`Helds::reuse_holder`).
    pub(crate) per_call: bool,
    /// The field's waiter channel may still be subscribed from an earlier call of the holder:
    /// look for it before the first attempt (`false` only for a holder whose calls never
    /// subscribed it, where looking cannot find one).
    pub(crate) lingering: bool,
    /// `None`: wait for ever.
    pub(crate) wait: Option<Duration>,
    /// `None`: watchdog. Checked by the call (an invalid lease ends it as an error, counted in
    /// the metrics like any other).
    pub(crate) lease: Option<Duration>,
    pub(crate) fenced: bool,
}

/// Runs one acquisition to its end: `Some(guard)`, or `None` when `wait` elapsed.
async fn acquire(inner: &Arc<Inner>, spec: &Arc<LockSpec>, req: Request) -> Result<Option<Hold>> {
    let mut call = CallRecord {
        spec,
        names: inner.config.metrics_lock_names,
        started: Instant::now(),
        done: false,
    };
    let result = acquire_inner(inner, spec, req).await;
    call.done = true;
    let outcome = match &result {
        Ok(Some(_)) => metrics::Outcome::Acquired,
        Ok(None) => metrics::Outcome::TimedOut,
        Err(_) => metrics::Outcome::Error,
    };
    metrics::call_ended(spec, call.names, outcome, call.started.elapsed());
    result
}

/// Records a lock call that was dropped before it ended as cancelled.
struct CallRecord<'a> {
    spec: &'a LockSpec,
    names: bool,
    started: Instant,
    done: bool,
}

impl Drop for CallRecord<'_> {
    fn drop(&mut self) {
        if !self.done {
            let waited = self.started.elapsed();
            metrics::call_ended(self.spec, self.names, metrics::Outcome::Cancelled, waited);
        }
    }
}

async fn acquire_inner(
    inner: &Arc<Inner>,
    spec: &Arc<LockSpec>,
    req: Request,
) -> Result<Option<Hold>> {
    inner.helds.check_open()?;
    let lease = Lease::new(req.lease)?;
    let lease_ms = lease.ttl_ms(inner.config.watchdog_timeout);
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
    let base = inner.helds.field(req.holder);
    // The two sides of a read-write lock are two owner fields of one holder, each with its own
    // line: what the holder left to the background on the other side (a dropped guard's
    // release, a cancelled wait's give-up) reaches Redis before this call, as it would on this
    // side. So `drop(read_guard); write.lock()` of one holder is `read_guard.unlock().await;
    // write.lock()`, not an upgrade the script refuses.
    if let Some(other) = spec
        .other_side_field(&base)
        .and_then(|f| inner.helds.existing(spec, &f))
    {
        let behind = Lane::reserve(&other);
        if matches!(behind, Entry::Waiting(..)) {
            tracing::trace!(
                lock = spec.name(),
                "waits for the other side's earlier work"
            );
            let until = match deadline {
                Some(d) if req.wait == Some(Duration::ZERO) => {
                    Some(d + inner.config.command_timeout)
                }
                d => d,
            };
            match until {
                Some(until) => {
                    if tokio::time::timeout_at(until.into(), behind.turn())
                        .await
                        .is_err()
                    {
                        return Ok(None);
                    }
                }
                None => drop(behind.turn().await),
            }
        }
    }
    let field = spec.owner_field(base);
    let held = inner.helds.get(inner, spec, &field)?;
    if req.per_call {
        held.mark_per_call();
    }
    let zero_wait = req.wait == Some(Duration::ZERO);
    // A call that may wait on a fair lock asks for direct hand-offs (PROTOCOL 8), unless the
    // client syncs replicas after each grant: a grant made by another client's script cannot be
    // waited for from here (`WAIT` counts this connection's writes), so such a call takes the
    // lock by itself after a wake-up, and syncs.
    // (`nonce` only says whether the call asks: each attempt sends a fresh one, see `attempt`.)
    let nonce =
        u64::from(spec.kind == Kind::Fair && !zero_wait && inner.config.replica_sync.is_none());
    let liveness_ms = inner.config.waiter_liveness.as_millis() as i64;
    let span = tracing::debug_span!("acquire", lock = spec.name(), field = &*field);
    let mut waiter = Waiter {
        inner: inner.clone(),
        held,
        args: AcquireArgs {
            spec: spec.clone(),
            field,
            lease_ms,
            liveness_ms,
            redisson_wait_ms: inner.config.redisson_wait.as_millis() as i64,
            mode: if zero_wait { Mode::Try } else { Mode::Queue },
            fenced: req.fenced,
            nonce,
            grant_ttl_ms: lease_ms.min(liveness_ms),
        },
        lease,
        in_flight: None,
        queued: false,
        counted: false,
        drop_stale: false,
        subscription: None,
        zero_wait,
        beat: None,
        woken_by_message: None,
        untrusted: 0,
        pending: None,
        last_nonce: 0,
        turns: None,
        place: None,
    };
    if req.lingering {
        waiter.take_lingering_subscription();
    }
    async move { waiter.run(deadline).await }
        .instrument(span)
        .await
}

/// One more hold for `hold`'s holder, at once, without waiting or queueing (`None`: the lock
/// turned out to be somebody else's).
pub(crate) async fn reenter(hold: &Hold, lease: Option<Duration>) -> Result<Option<Hold>> {
    if hold.is_lost() {
        return Err(Error::NotHeld);
    }
    let held = hold.field();
    let req = Request {
        holder: held.holder_id(),
        per_call: false,
        lingering: true,
        wait: Some(Duration::ZERO),
        lease,
        fenced: hold.token().is_some(),
    };
    acquire(&held.inner, &held.spec, req).await
}

// -----------------------------------------------------------------------------------------------
// The waiter: one call's loop of attempts, sleeps and wake-ups, and what a dropped one leaves
// to the driver. Its phases live beside it: `attempt.rs` (an attempt, and a grant taken up),
// `wait.rs`, `outage.rs`.

/// Longest a waiter sleeps without any reason to re-check (a guard against a wake-up path that
/// failed in a way nobody noticed; every normal path wakes it sooner).
pub(super) fn max_idle(inner: &Inner) -> Duration {
    inner
        .config
        .watchdog_timeout
        .max(inner.config.waiter_liveness)
}

pub(super) struct Waiter {
    pub(super) inner: Arc<Inner>,
    /// The lock and owner field this call works on.
    pub(super) held: Arc<Held>,
    pub(super) args: AcquireArgs,
    pub(super) lease: Lease,
    /// The attempt currently running, if the caller is awaiting one.
    pub(super) in_flight: Option<AttemptFuture>,
    /// We may be in the fair queue (set before the first attempt that can enqueue).
    pub(super) queued: bool,
    /// We are one of the field's `waiting_calls` (see `Account` in `engine/field/account.rs`).
    pub(super) counted: bool,
    /// No other call of ours waited on the field when we began: any entry of the field in the
    /// queue was left by an ended call, and our attempts drop it before joining, until one of them
    /// gets a reply (after that, an entry of the field may be the one we made).
    pub(super) drop_stale: bool,
    pub(super) subscription: Option<Subscription>,
    /// A zero wait: the first failed attempt ends the call.
    pub(super) zero_wait: bool,
    /// Kept alive while we wait; the driver heartbeats it through a `Weak`.
    pub(super) beat: Option<Arc<WaiterBeat>>,
    /// When a message last woke us (for the hand-over metric: release seen → grant).
    pub(super) woken_by_message: Option<Instant>,
    /// Grants given back in a row because they could no longer be trusted when they reached us
    /// (see [`granted`](Self::granted)): each makes the next attempt wait a growing backoff.
    pub(super) untrusted: u32,
    /// Our last attempt that left us queued asking for a direct grant: its nonce, when it was
    /// sent, and the server time it ran at. A grant announced for that nonce is counted from
    /// there (`grant_start`).
    pub(super) pending: Option<(u64, Instant, i64)>,
    /// The nonce the last attempt sent (0: it asked for no hand-off).
    pub(super) last_nonce: u64,
    /// A writer-preferring read-write waiter: the turns channel of its queue, and its place as
    /// its last attempt reported it (PROTOCOL 10).
    pub(super) turns: Option<Subscription>,
    pub(super) place: Option<QueuePlace>,
}

/// What a phase of the loop leaves to do.
pub(super) enum Step {
    /// Attempt again.
    Again,
    /// The call ends with this.
    Done(Option<Hold>),
}

impl Waiter {
    /// A channel still lingering from this holder's last wait is taken at once, so even the
    /// first attempt is covered and needs no re-check. (Called only when the holder's calls
    /// may have subscribed it: [`Request::lingering`].)
    pub(super) fn take_lingering_subscription(&mut self) {
        if self.zero_wait {
            return;
        }
        let channel = self.args.spec.wake_channel(&self.args.field);
        self.subscription = self.inner.subscriber.subscribe_if_live(&channel);
        if self.args.spec.prefer_writers {
            let turns = self.args.spec.keys.rw_turns_channel();
            self.turns = self.inner.subscriber.subscribe_if_live(&turns);
            if self.turns.is_none() {
                // Both or neither: the first attempt is re-checked after subscribing.
                self.subscription = None;
            }
        }
        if self.subscription.is_some() {
            self.held.mark_subscribed();
        }
    }

    /// The message counts before an attempt: of the broadcast side of a read-write lock's
    /// mailbox (when we wait there) and of the turns channel of a writer-preferring queue, so a
    /// message that comes while the attempt runs is seen before we sleep.
    pub(super) fn messages_seen(&self) -> (Option<u64>, Option<u64>) {
        let seen = self
            .subscription
            .as_ref()
            .filter(|_| self.broadcast())
            .map(|s| s.mail().seq());
        (seen, self.turns.as_ref().map(|s| s.mail().seq()))
    }

    /// The loop of one call: attempt (`attempt.rs`), then take a grant up (also `attempt.rs`) or wait
    /// for a reason to look again (`wait.rs`); transient errors are ridden out (`outage.rs`).
    pub(super) async fn run(&mut self, deadline: Option<Instant>) -> Result<Option<Hold>> {
        let mut closed = self.inner.helds.closed.subscribe();
        let mut outage = Outage::default();
        // How long an attempt may wait for its field's turn behind earlier work of the same
        // holder on this lock (a release retrying through an outage keeps the turn for up to its
        // retry window): never past the call's deadline; a zero wait, whose deadline is now,
        // may wait one command timeout for it.
        let turn_deadline = match deadline {
            Some(d) if self.zero_wait => Some(d + self.inner.config.command_timeout),
            d => d,
        };
        loop {
            let sent = Instant::now();
            let seen = self.messages_seen();
            let Some((outcome, turn)) = self.attempt(turn_deadline).await else {
                tracing::debug!("wait elapsed in the field's line");
                return Ok(None);
            };
            let attempt = match outcome {
                Ok(attempt) => {
                    outage.end();
                    attempt
                }
                Err(e) => {
                    drop(turn);
                    self.ride_out(e, &mut outage, deadline, &mut closed).await?;
                    continue;
                }
            };
            let step = match attempt {
                Attempt::Acquired { token, .. } => {
                    self.queued = false;
                    self.record_handover();
                    match self.granted(turn, sent, token, None).await? {
                        Some(guard) => Step::Done(Some(guard)),
                        // Given back: it could no longer be trusted when it reached us.
                        None if self.zero_wait => Step::Done(None),
                        None if self.back_off_untrusted(deadline, &mut closed).await? => {
                            Step::Again
                        }
                        None => Step::Done(None),
                    }
                }
                Attempt::Waiting { .. } if self.zero_wait => Step::Done(None),
                Attempt::Waiting {
                    hint_ms,
                    queued_at,
                    server_ms,
                    place,
                } => {
                    drop(turn);
                    let queued = Queued {
                        sent,
                        hint_ms,
                        queued_at,
                        server_ms,
                        place,
                        seen,
                    };
                    self.wait(queued, deadline, turn_deadline, &mut outage, &mut closed)
                        .await?
                }
            };
            if let Step::Done(outcome) = step {
                return Ok(outcome);
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // (Waiters of a non-fair lock share one channel, and each message wakes one of them. A
        // wake-up is never lost by dropping a waiter: an unconsumed one is passed on by tokio's
        // `Notified` drop, and after a consumed one the next await is an attempt, whose outcome the
        // driver settles: a late grant is released, which publishes the next wake-up.)
        // No I/O here: the driver settles whatever we leave behind.
        if self.counted {
            // Whatever we leave queued is given up (or settled) ahead of any later call's first
            // attempt in the field's line; if that fails, that call drops the entry.
            self.held.call_ended();
        }
        if let Some(attempt) = self.in_flight.take() {
            // The attempt keeps its place in the field's line (and its turn, once it has it)
            // until the driver has settled its outcome.
            self.inner
                .driver
                .send(Work::Finish(Box::pin(settle_abandoned(
                    attempt,
                    self.held.clone(),
                    self.args.clone(),
                ))));
        } else if self.queued {
            // Our give-up takes its place in the field's line now: the same holder's next
            // attempt on this lock reaches Redis after it, so a cancel-and-retry never finds (and
            // refreshes) the entry this give-up is about to remove.
            let held = self.held.clone();
            let spec = self.args.spec.clone();
            let field = self.args.field.clone();
            Lane::enter_background(&self.held, move |turn| {
                let driver = held.inner.driver.clone();
                driver.send(Work::Finish(Box::pin(async move {
                    give_up_logged(&held, &turn, &spec, &field).await;
                    drop(turn);
                })));
            });
        }
    }
}
