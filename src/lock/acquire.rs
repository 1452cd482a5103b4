//! The waiting engine behind `lock()` and `try_lock()`: attempts, pub/sub wake-ups, deadlines and
//! the cleanup a dropped future leaves to the driver.
//!
//! One acquisition is a loop of attempts. The first attempt runs without a subscription (the
//! uncontended path costs exactly one round trip) unless our channel is still subscribed from a
//! recent wait; if it queues us unsubscribed, we subscribe and attempt again before ever sleeping,
//! so a release between the first attempt and the subscription cannot be missed. After that we
//! sleep until a message, the hint the script gave (the lock's TTL when we are the head: nobody
//! announces an expiry), our deadline, or a shutdown.
//!
//! Every attempt runs with the turn of the lock's owner field (`engine/field.rs`): it takes its place in
//! the field's line synchronously, before its first await, so whatever this holder left to the
//! background earlier (a dropped guard's release, a cancelled wait's give-up) reaches Redis first.
//! The attempt is a boxed future polled by the caller's future; if the caller drops it while one
//! is in flight, the attempt itself (turn included) is handed to the driver, which runs it to its
//! end and releases a lock granted too late or leaves the queue: no I/O in `Drop`, no task spawned
//! on the normal path, and nothing is left behind.
//!
//! This module must never: register a grant without the field's turn, return later than its wait
//! plus one round trip while Redis answers, or keep a grant made after shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::config::lease_ms;
use crate::config::ReplicaSync;
use crate::conn::subscriber::{Mailbox, Subscription};
use crate::conn::Conn;
use crate::engine::driver::{AttemptFuture, Confirm, Handoff, WaiterBeat, Work};
use crate::engine::field::{next_id, FieldTurn, FixedHold, Held};
use crate::engine::inner::Inner;
use crate::engine::lane::{Entry, Lane};
use crate::engine::release::{release_logged, What};
use crate::engine::validity::{validity_deadline, LostReason};
use crate::error::{Error, Result};
use crate::keys::{Kind, LockSpec};
use crate::lock::guard::{Lease, LockGuard};
use crate::metrics;
use crate::wire::{self, AcquireArgs, Attempt, Mode, QueuePlace};

/// What one lock call asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) holder: i64,
    /// The holder is the call's own (not one the caller passed): the field may be reused by a
    /// later call of this client once nothing of it is left (`Inner::reuse_holder`).
    pub(crate) per_call: bool,
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

/// Re-entry from a guard is an acquisition call of the guard's holder, so it lives here, beside
/// the loop it runs (`lock/guard.rs` then needs nothing from this module).
impl LockGuard {
    /// Takes one more hold on this guard's lock for the same holder (re-entry): at once, without
    /// waiting or queueing, because the holder holds it. The new guard is a hold of its own (the
    /// count in Redis goes up by one, as Redisson's reentrant count) with its own lease: `None`
    /// for the watchdog, `Some(lease)` for a fixed one; the lock lives as long as the longest
    /// live hold needs it. A fenced guard's re-entry is fenced too (a new token).
    ///
    /// This is the way to re-enter from code that holds a guard; calls that do not have one can
    /// share a hold through [`holder`](Self::holder) and `with_holder`.
    ///
    /// If the holds were taken away without the client knowing yet (a force unlock not yet seen
    /// by a renewal) and the lock is free, the call takes it afresh: the new guard is a valid
    /// hold of its own, and this guard is then reported [lost](Self::lost).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the guard is known [lost](Self::lost) or the lock turns out to be
    /// held by somebody else; [`Error::InvalidArgument`] for a lease under [`MIN_LEASE`](crate::MIN_LEASE); [`Error::Redis`],
    /// [`Error::Shutdown`].
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while its attempt is in flight, a hold granted
    /// too late is given back in the background, in the holder's order.
    pub async fn reenter(&self, lease: Option<Duration>) -> Result<LockGuard> {
        if self.is_lost() {
            return Err(Error::NotHeld);
        }
        let req = Request {
            holder: self.held.holder_id(),
            per_call: false,
            wait: Some(Duration::ZERO),
            lease,
            fenced: self.token.is_some(),
        };
        match acquire(&self.held.inner, &self.held.spec, req).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::NotHeld),
        }
    }
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
) -> Result<Option<LockGuard>> {
    inner.check_open()?;
    let lease_ms = match req.lease {
        Some(lease) => lease_ms("lease", lease)?,
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
    let base = inner.field(req.holder);
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
        lease: req.lease,
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
    async move { waiter.run(deadline).await }
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
    /// The lock and owner field this call works on.
    held: Arc<Held>,
    args: AcquireArgs,
    /// `None`: the watchdog keeps the lock.
    lease: Option<Duration>,
    /// The attempt currently running, if the caller is awaiting one.
    in_flight: Option<AttemptFuture>,
    /// We may be in the fair queue (set before the first attempt that can enqueue).
    queued: bool,
    /// We are one of the field's `waiting_calls` (see [`Account`](crate::engine::field::Account)).
    counted: bool,
    /// No other call of ours waited on the field when we began: any entry of the field in the
    /// queue was left by an ended call, and our attempts drop it before joining, until one of them
    /// gets a reply (after that, an entry of the field may be the one we made).
    drop_stale: bool,
    subscription: Option<Subscription>,
    /// A zero wait: the first failed attempt ends the call.
    zero_wait: bool,
    /// Kept alive while we wait; the driver heartbeats it through a `Weak`.
    beat: Option<Arc<WaiterBeat>>,
    /// When a message last woke us (for the hand-over metric: release seen → grant).
    woken_by_message: Option<Instant>,
    /// Grants given back in a row because they could no longer be trusted when they reached us
    /// (see [`granted`](Self::granted)): each makes the next attempt wait a growing backoff.
    untrusted: u32,
    /// Our last attempt that left us queued asking for a direct grant: its nonce, when it was
    /// sent, and the server time it ran at. A grant announced for that nonce is counted from
    /// there (`grant_start`).
    pending: Option<(u64, Instant, i64)>,
    /// The nonce the last attempt sent (0: it asked for no hand-off).
    last_nonce: u64,
    /// A writer-preferring read-write waiter: the turns channel of its queue, and its place as
    /// its last attempt reported it (PROTOCOL 10).
    turns: Option<Subscription>,
    place: Option<QueuePlace>,
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

impl Waiter {
    async fn run(&mut self, deadline: Option<Instant>) -> Result<Option<LockGuard>> {
        let mut closed = self.inner.closed.subscribe();
        // A channel still lingering from this holder's last wait is taken at once, so even the
        // first attempt is covered and needs no re-check.
        if !self.zero_wait {
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
        }
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
            // Messages the broadcast side of a read-write lock's mailbox had before this attempt
            // (when we wait there): one that comes while the attempt runs is seen before we sleep.
            let seen = self
                .subscription
                .as_ref()
                .filter(|_| self.broadcast())
                .map(|s| s.mail().seq());
            // The same for the turns channel of a writer-preferring queue.
            let seen_turns = self.turns.as_ref().map(|s| s.mail().seq());
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
            match attempt {
                Attempt::Acquired { token, .. } => {
                    self.queued = false;
                    self.record_handover();
                    match self.granted(turn, sent, token, None).await? {
                        Some(guard) => return Ok(Some(guard)),
                        // Given back: it could no longer be trusted when it reached us.
                        None if self.zero_wait => return Ok(None),
                        None => {
                            if !self.back_off_untrusted(deadline, &mut closed).await? {
                                return Ok(None);
                            }
                            continue;
                        }
                    }
                }
                Attempt::Waiting { .. } if self.zero_wait => return Ok(None),
                Attempt::Waiting {
                    hint_ms,
                    queued_at,
                    server_ms,
                    place,
                } => {
                    drop(turn);
                    self.place = place;
                    self.pending = (server_ms > 0 && self.last_nonce != 0).then_some((
                        self.last_nonce,
                        sent,
                        server_ms,
                    ));
                    if let Some(position) = queued_at {
                        tracing::debug!(position, "queued");
                        let names = self.inner.config.metrics_lock_names;
                        metrics::queued_at(&self.args.spec, names, position);
                    }
                    if self.args.spec.kind == Kind::Fair {
                        self.args.mode = Mode::Requeue;
                    }
                    if self.subscription.is_none() {
                        // Bounded by our deadline: a slow subscribe must not stretch a try_lock.
                        let subscribed = match deadline {
                            Some(d) => {
                                match tokio::time::timeout_at(d.into(), self.subscribe()).await {
                                    Ok(result) => result,
                                    Err(_) => {
                                        // Leaving the queue is our Drop's (in the background,
                                        // in this field's line): the call returns now.
                                        tracing::debug!("wait elapsed while subscribing");
                                        return Ok(None);
                                    }
                                }
                            }
                            None => self.subscribe().await,
                        };
                        if let Err(e) = subscribed {
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
                        // Leaving the queue is our Drop's (in the background, in this field's
                        // line, so the same holder's next call comes after it): the call returns
                        // within its wait plus the one round trip it may have been in.
                        tracing::debug!("wait elapsed");
                        return Ok(None);
                    }
                    if let Some(place) = self.place.filter(|p| !p.may_enter) {
                        // Others are ahead in the writer-preferring queue: wait until an
                        // announcement says our turn came (not for releases, which we could not
                        // use), or a wake-up without one, or our deadline.
                        let until = match deadline {
                            Some(d) => d.min(now + max_idle(&self.inner)),
                            None => now + max_idle(&self.inner),
                        };
                        let turn_came = self
                            .wait_for_turn(place, seen_turns, until, &mut closed)
                            .await?;
                        if !turn_came && deadline.is_some_and(|d| Instant::now() >= d) {
                            tracing::debug!("wait elapsed");
                            return Ok(None);
                        }
                        self.woken_by_message = Some(Instant::now());
                        continue;
                    }
                    let mut wake_at = now + max_idle(&self.inner);
                    if hint_ms >= 0 {
                        wake_at = wake_at.min(now + Duration::from_millis(hint_ms as u64 + 1));
                    }
                    if let Some(d) = deadline {
                        wake_at = wake_at.min(d);
                    }
                    let mail = self
                        .subscription
                        .as_ref()
                        .map(|s| s.mail().clone())
                        .expect("subscribed above");
                    self.woken_by_message = None;
                    let notified = if self.broadcast() {
                        mail.readers().notified()
                    } else {
                        mail.notify().notified()
                    };
                    tokio::pin!(notified);
                    // Registered before the check below, so a broadcast after it wakes us.
                    notified.as_mut().enable();
                    if seen.is_some_and(|seen| seen != mail.seq()) {
                        self.woken_by_message = Some(Instant::now());
                        tracing::trace!("a message came during the attempt");
                    } else {
                        tokio::select! {
                            _ = &mut notified => {
                                self.woken_by_message = Some(Instant::now());
                                tracing::trace!("woken by message")
                            }
                            _ = tokio::time::sleep_until(wake_at.into()) => tracing::trace!("woken by timer"),
                            _ = shut_down(&mut closed) => {
                                // Our Drop leaves the queue in the background.
                                return Err(Error::Shutdown);
                            }
                        }
                    }
                    self.inner.check_open()?;
                    if let Some(outcome) = self.take_up_grant(&mail, turn_deadline).await {
                        match outcome? {
                            Some(guard) => return Ok(Some(guard)),
                            // Given back (it could no longer be trusted): queue again, after
                            // a pause.
                            None => {
                                if !self.back_off_untrusted(deadline, &mut closed).await? {
                                    return Ok(None);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Sends one attempt with the field's turn and waits for it. The attempt takes its place in
    /// the field's line before anything else, and is kept in `in_flight` while it runs, so a
    /// caller that drops us meanwhile hands it (turn and all) to the driver to settle. Returns
    /// the outcome with the turn still held, so a grant is registered before anyone else's
    /// operation on the field.
    ///
    /// `None` when `turn_deadline` passed before the field's turn came: nothing was sent (the
    /// place in line is given up, and the turn passes on to whoever is behind).
    async fn attempt(
        &mut self,
        turn_deadline: Option<Instant>,
    ) -> Option<(Result<Attempt>, FieldTurn)> {
        let fair = self.args.spec.kind == Kind::Fair;
        if fair && !self.counted {
            // Decided when the attempt takes its place in the line: a call that ended before
            // this one began has its give-up (or settling) ahead of us in the line, and a call
            // that is still waiting shares its entry with us.
            let joins = self.args.mode != Mode::Try;
            self.drop_stale = self.held.lane.with(|a| {
                let alone = a.waiting_calls == 0;
                a.waiting_calls += u32::from(joins);
                alone
            });
            self.counted = joins;
        }
        if self.args.spec.queues() && self.args.mode != Mode::Try {
            self.queued = true;
        }
        let drop_stale = self.drop_stale && self.args.mode != Mode::Requeue;
        let entry = match (Lane::reserve(&self.held), turn_deadline) {
            (entry @ Entry::Waiting(..), Some(until)) => {
                tracing::trace!("waits for its turn behind earlier work of its field");
                // Taken here, before the attempt exists, so giving up sends nothing.
                match tokio::time::timeout_at(until.into(), entry.turn()).await {
                    Ok(turn) => Entry::Ready(turn),
                    Err(_) => return None,
                }
            }
            (entry, _) => {
                if matches!(entry, Entry::Waiting(..)) {
                    tracing::trace!("waits for its turn behind earlier work of its field");
                }
                entry
            }
        };
        let mut conn = self.inner.conn.clone();
        let held = self.held.clone();
        let mut args = self.args.clone();
        if args.nonce != 0 {
            args.nonce = if self.held.lane.with(|a| a.waiting_calls > 1) {
                // Another call of this holder waits on the lock too and shares our entry: a
                // grant must not name one of us, so the entry asks for none (the head is told
                // instead).
                0
            } else {
                // A nonce per attempt: a grant names the attempt whose request it answers, and
                // only the latest attempt's grant can be taken up from its message (a message of
                // an earlier grant whose hold vanished meanwhile never matches again).
                next_id()
            };
        }
        self.last_nonce = args.nonce;
        let sync = self.inner.config.replica_sync;
        let timeout = self.inner.config.command_timeout;
        let attempt = self.in_flight.insert(Box::pin(async move {
            let turn = entry.turn().await;
            let outcome =
                attempt_with_turn(&mut conn, &held, &turn, &args, drop_stale, sync, timeout).await;
            (outcome, turn)
        }));
        let outcome = attempt.as_mut().await;
        self.in_flight = None;
        if outcome.0.is_ok() {
            self.drop_stale = false;
        }
        Some(outcome)
    }

    /// Turns a grant into a guard, still holding the turn: the hold joins the field's account
    /// (its lease, its validity) before any other operation on the field can run. A grant that
    /// arrives after the client began shutting down is given back instead.
    ///
    /// So is a grant that can no longer be trusted when we get to it (`None`): its lease, counted
    /// from when the attempt was sent, has run out (our process was paused, or the reply was that
    /// slow), and no live hold of the field keeps the lock valid. Another client may hold the lock
    /// by now; a guard made from it would be valid for no time at all, so none is made.
    ///
    /// `granted_ttl`: for a direct grant (PROTOCOL 8), the TTL the grant gave the lock, which
    /// may be shorter than the hold's lease (at most the liveness window). The hold is trusted for
    /// that long from `sent` until the lock is extended to its lease: the client's watchdog does
    /// that a third of that TTL in, if the hold still lives then, with its renewal rules (a
    /// failed extension is tried again a third of the TTL later, or at once when the next one
    /// came due while it was in flight; two failures in a row mark the hold lost).
    async fn granted(
        &mut self,
        turn: FieldTurn,
        sent: Instant,
        token: Option<u64>,
        granted_ttl: Option<Duration>,
    ) -> Result<Option<LockGuard>> {
        if self.inner.check_open().is_err() {
            // Shutdown releases what it finds; this grant came after it looked (or while it
            // waited for our turn): give it back here, to its end even if the caller leaves.
            let held = self.held.clone();
            let release = Handoff::new(&self.inner.driver.clone(), async move {
                let _ = release_logged(&held, &turn, What::Orphan).await;
            });
            release.run().await;
            return Err(Error::Shutdown);
        }
        let held = &self.held;
        let watchdog_timeout = self.inner.config.watchdog_timeout;
        let full = self.lease.unwrap_or(watchdog_timeout);
        // What the lock's TTL covers now, and whether it must still be extended to the lease.
        let (covered, confirm) = match granted_ttl {
            Some(ttl) if ttl < full => (ttl, true),
            _ => (full, false),
        };
        let registered = turn.with(|a| {
            let own = validity_deadline(sent, covered);
            let trusted = a.validity().map_or(own, |(live, _)| live.max(own));
            if trusted <= Instant::now() {
                return None;
            }
            let lease = match self.lease {
                None => {
                    a.watchdog_guards += 1;
                    let valid = validity_deadline(sent, covered);
                    if a.watchdog_valid.is_none_or(|v| v < valid) {
                        a.watchdog_valid = Some(valid);
                    }
                    Lease::WATCHDOG
                }
                Some(lease) => {
                    let id = next_id();
                    let mut hold = FixedHold::new(id, sent, lease);
                    hold.valid = own;
                    a.fixed.push(hold);
                    Lease::fixed(id)
                }
            };
            if confirm {
                a.unconfirmed = true;
            }
            held.revalidate(a);
            Some((a.gen, lease))
        });
        let Some((gen, lease)) = registered else {
            tracing::warn!(
                since_sent = ?sent.elapsed(),
                "a grant reached us after its lease ran out; giving it back"
            );
            let held = self.held.clone();
            let release = Handoff::new(&self.inner.driver.clone(), async move {
                let _ = release_logged(&held, &turn, What::Orphan).await;
            });
            release.run().await;
            return Ok(None);
        };
        let guard = LockGuard::new(held.clone(), gen, held.guard_made(), lease, token);
        // A direct grant's short TTL is extended a third of it in, as the watchdog renews a
        // third of its timeout in: a hold released sooner (the common case under contention)
        // costs nothing more.
        self.inner.driver.send_lazy(Work::Acquired {
            held: held.clone(),
            watchdog: self.lease.is_none(),
            confirm: confirm.then(|| Confirm {
                at: sent + covered / 3,
                period: covered / 3,
            }),
        });
        drop(turn);
        tracing::debug!(waited = ?sent.elapsed(), "acquired");
        Ok(Some(guard))
    }

    /// Takes up a direct grant (PROTOCOL 8) announced in `mail` for this call's latest attempt, without a round
    /// trip: the lock was granted to us by the script that freed it, and the hold joins our
    /// field's account under the field's turn, like an attempt's grant. `None` when there is no
    /// such grant, or it cannot be taken from the message (our field's account changed since the
    /// attempt it answers, or an attempt's reply was lost): the caller's next attempt then finds
    /// the hold in Redis and takes it up (`adopted`), or queues again.
    ///
    /// The hold is trusted from a moment that is never later than the grant: the send time of
    /// the attempt that left us queued, moved on by the server time that passed between that
    /// attempt and the grant, less a drift margin (`grant_start`).
    async fn take_up_grant(
        &mut self,
        mail: &Mailbox,
        turn_deadline: Option<Instant>,
    ) -> Option<Result<Option<LockGuard>>> {
        let grant = mail.take_grant()?;
        let (nonce, sent, attempt_ms) = self.pending?;
        if grant.nonce != nonce {
            return None;
        }
        let entry = Lane::reserve(&self.held);
        let turn = match turn_deadline {
            Some(until) => tokio::time::timeout_at(until.into(), entry.turn())
                .await
                .ok()?,
            None => entry.turn().await,
        };
        let taken = turn.with(|a| {
            if a.pending_nonce != grant.nonce || a.count != 0 || a.dark {
                return false;
            }
            a.pending_nonce = 0;
            a.count = 1;
            a.grants += 1;
            true
        });
        if !taken {
            tracing::debug!("a grant message no longer matches the field; checking with Redis");
            return None;
        }
        self.queued = false;
        self.pending = None;
        self.record_handover();
        let start = grant_start(sent, attempt_ms, grant.server_ms, Instant::now());
        let token = self.args.fenced.then_some(grant.token);
        tracing::debug!(nonce = grant.nonce, "took up a direct grant");
        let ttl = Duration::from_millis(self.args.grant_ttl_ms as u64);
        Some(self.granted(turn, start, token, Some(ttl)).await)
    }

    /// A grant reached us after a message woke us: records the hand-over time (release seen →
    /// grant) for the metric, whichever way the grant came (an attempt, or a direct grant).
    fn record_handover(&self) {
        if let Some(woken) = self.woken_by_message {
            let names = self.inner.config.metrics_lock_names;
            metrics::handover(&self.args.spec, names, woken.elapsed());
        }
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
            tracing::warn!(error = %crate::error::chain(&error), outage = ?now - since, "redis still failing; giving up");
            return Err(error);
        }
        outage.retries = outage.retries.saturating_add(1);
        let pause = crate::retry::retry_backoff(outage.retries).min(limit - now);
        tracing::warn!(error = %crate::error::chain(&error), retry_in = ?pause, "transient redis error while acquiring");
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shut_down(closed) => return Err(Error::Shutdown),
        }
        self.inner.check_open()
    }

    /// A grant was given back because it could no longer be trusted when it reached us (its
    /// lease, counted from the send, ran out on the way: a paused process, a slow reply, a lease
    /// close to the round trip). Pauses before the next attempt with the transient-error
    /// backoff, growing with each such grant in a row, so a lease the round trip keeps eating is
    /// retried a few times a second, never in a tight loop. Returns `false` when the call's
    /// deadline passed (the call then ends with `None`).
    async fn back_off_untrusted(
        &mut self,
        deadline: Option<Instant>,
        closed: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<bool> {
        self.untrusted = self.untrusted.saturating_add(1);
        let now = Instant::now();
        let mut pause = crate::retry::retry_backoff(self.untrusted);
        if let Some(d) = deadline {
            if now >= d {
                return Ok(false);
            }
            pause = pause.min(d - now);
        }
        tracing::debug!(retry_in = ?pause, "a grant could not be trusted on arrival; pausing");
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shut_down(closed) => return Err(Error::Shutdown),
        }
        self.inner.check_open()?;
        Ok(deadline.is_none_or(|d| Instant::now() < d))
    }

    /// Subscribes to our wake-up channel.
    async fn subscribe(&mut self) -> Result<()> {
        let channel = self.args.spec.wake_channel(&self.args.field);
        self.subscription = Some(self.inner.subscriber.subscribe(channel).await?);
        if self.args.spec.prefer_writers && self.turns.is_none() {
            let turns = self.args.spec.keys.rw_turns_channel();
            self.turns = Some(self.inner.subscriber.subscribe(turns).await?);
        }
        Ok(())
    }

    /// Waits on the turns channel of a writer-preferring queue until an announcement says the
    /// turn of our place came (`true`), a wake-up without one came (`true`: look), or `until`
    /// passed (`false`). `seen`: the channel's count of messages before our last attempt, so an
    /// announcement that came during it is not missed.
    async fn wait_for_turn(
        &mut self,
        place: QueuePlace,
        seen: Option<u64>,
        until: Instant,
        closed: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<bool> {
        let Some(turns) = self.turns.as_ref().map(|s| s.mail().clone()) else {
            return Ok(true);
        };
        let writer = self.args.spec.kind == Kind::Write;
        let mut seen = seen.unwrap_or_else(|| turns.seq());
        loop {
            let notified = turns.readers().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if turns.seq() == seen {
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(until.into()) => return Ok(false),
                    _ = shut_down(closed) => return Err(Error::Shutdown),
                }
            }
            seen = turns.seq();
            match turns.turn() {
                Some((head, first_writer))
                    if !QueuePlace::comes(place.seq, writer, head, first_writer) =>
                {
                    tracing::trace!(head, first_writer, seq = place.seq, "not our turn yet");
                }
                _ => return Ok(true),
            }
        }
    }

    /// Whether we wait on the broadcast side of a read-write lock's mailbox: a reader (readers
    /// may all enter at once), or any waiter of a writer-preferring lock (which of them may enter
    /// is the queue's to say, so every one of them looks). Writers of a default read-write lock
    /// wait as a non-fair lock's waiters do, one woken per message.
    fn broadcast(&self) -> bool {
        let spec = &self.args.spec;
        spec.kind == Kind::Read || (spec.kind == Kind::Write && spec.prefer_writers)
    }

    /// Has the driver heartbeat our place in a fair queue while we wait (once).
    fn start_heartbeat(&mut self) {
        if !self.args.spec.queues() || self.beat.is_some() {
            return;
        }
        let Some(subscription) = &self.subscription else {
            return;
        };
        let beat = Arc::new(WaiterBeat {
            spec: self.args.spec.clone(),
            field: self.args.field.clone(),
            mail: subscription.mail().clone(),
            turns: self.turns.as_ref().map(|t| t.mail().clone()),
        });
        self.inner.driver.send(Work::Waiter(beat.clone()));
        self.beat = Some(beat);
    }
}

/// One attempt, with the field's turn: the script, then the account (see `engine/field.rs`), then
/// replica sync for a grant. A grant that replica sync gives back is released under the same turn.
async fn attempt_with_turn(
    conn: &mut Conn,
    held: &Held,
    turn: &FieldTurn,
    args: &AcquireArgs,
    drop_stale: bool,
    sync: Option<ReplicaSync>,
    command_timeout: Duration,
) -> Result<Attempt> {
    let expected = turn.with(|a| a.count);
    let reply = wire::acquire(conn, args, expected, drop_stale).await;
    match &reply {
        Ok(Attempt::Acquired { count, adopted, .. }) => turn.with(|a| {
            // What Redis had for us before this attempt: `count - 1`, or for an adopted hold the
            // count we expected (the hold above it was the one taken up).
            let before = if *adopted { expected } else { count - 1 };
            if before + a.uncertain < a.count {
                // Fewer holds than we count (beyond releases whose outcome we never learned):
                // they expired or were deleted without us.
                held.holds_vanished(a, LostReason::Gone);
            }
            a.count = *count;
            a.dark = false;
            a.uncertain = 0;
            a.grants += 1;
            a.pending_nonce = 0;
            // The script gave the lock at least this hold's whole lease.
            a.unconfirmed = false;
        }),
        Ok(Attempt::Waiting { .. }) => turn.with(|a| {
            // Not granted, so not re-entered: Redis has no hold of ours on the lock.
            if a.count > 0 || a.dark {
                held.emptied(a, LostReason::Gone);
            }
            a.pending_nonce = args.nonce;
        }),
        // The attempt may have run and its reply been lost: it may hold the lock unseen. The
        // next operation on the field compares and sets against Redis and finds out.
        Err(e) if e.is_ambiguous() => turn.with(|a| a.dark = true),
        Err(_) => {}
    }
    match (reply?, sync) {
        (granted @ Attempt::Acquired { .. }, Some(sync)) => {
            match crate::wire::replica::synced(conn, args, sync).await {
                Ok(true) => Ok(granted),
                outcome => {
                    // Unsynced, or its sync unknown: the grant is given back before the outcome
                    // is reported, so a retry does not pile a second hold on it.
                    crate::engine::release::release(
                        conn,
                        held,
                        turn,
                        What::Orphan,
                        command_timeout,
                    )
                    .await?;
                    outcome.map(|_| Attempt::Waiting {
                        hint_ms: 10,
                        queued_at: None,
                        server_ms: 0,
                        place: None,
                    })
                }
            }
        }
        (attempt, _) => Ok(attempt),
    }
}

/// The moment a direct grant is trusted from: `sent` (the send time of the attempt that ran at
/// server time `attempt_ms`) moved on by the server time between that attempt and the grant
/// (`grant_ms`), less one millisecond of rounding and 0.1 % of the interval for the two clocks'
/// drift, and never later than `now`. The attempt ran after `sent`, so this is never later than
/// the grant while the clocks drift less than that (a server clock stepped backwards only moves
/// it earlier).
fn grant_start(sent: Instant, attempt_ms: i64, grant_ms: i64, now: Instant) -> Instant {
    let between = grant_ms.saturating_sub(attempt_ms);
    let margin = 1 + between.unsigned_abs() / 1000;
    let shift = i128::from(between) - i128::from(margin);
    let start = if shift >= 0 {
        sent + Duration::from_millis(shift as u64)
    } else {
        sent.checked_sub(Duration::from_millis(shift.unsigned_abs() as u64))
            .unwrap_or(sent)
    };
    start.min(now)
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
            self.held.lane.with(|a| a.waiting_calls -= 1);
        }
        if let Some(attempt) = self.in_flight.take() {
            // The attempt keeps its place in the field's line (and its turn, once it has it)
            // until the driver has settled its outcome.
            self.inner.driver.send(Work::Abandoned {
                attempt,
                held: self.held.clone(),
                args: self.args.clone(),
            });
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
                    crate::engine::driver::give_up_logged(&held, &spec, &field).await;
                    drop(turn);
                })));
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_trusted_from_no_later_than_it_was_made() {
        let sent = Instant::now();
        let now = sent + Duration::from_secs(100);
        // 10 s of server time after the attempt: 10 s after the send, less 1 ms + 10 ms.
        assert_eq!(
            grant_start(sent, 1_000_000, 1_010_000, now),
            sent + Duration::from_millis(10_000 - 11)
        );
        // Never later than now, however far the server clock jumped.
        assert_eq!(grant_start(sent, 0, 10_000_000, now), now);
        // A server clock stepped back: earlier than the send.
        assert!(grant_start(sent, 5_000, 4_000, now) < sent);
        // The same millisecond: 1 ms before the send.
        assert_eq!(
            grant_start(sent, 7, 7, now),
            sent.checked_sub(Duration::from_millis(1)).unwrap_or(sent)
        );
    }
}
