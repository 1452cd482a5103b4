//! One acquisition call: its request, its record in the metrics, and the waiter that runs it:
//! the loop of attempts (below).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::settle::{give_up_logged, settle_abandoned, AttemptFuture};
use super::wait::Queued;
use crate::config::ReplicaSync;
use crate::conn::subscriber::Subscription;
use crate::conn::Conn;
use crate::engine::driver::{Confirm, RunToEnd, WaiterBeat, Work};
use crate::engine::field::{next_id, FieldTurn, Held, What};
use crate::engine::hold::Hold;
use crate::engine::inner::Inner;
use crate::engine::lane::{Entry, Lane};
use crate::engine::outage::Outage;
use crate::engine::release::{release, release_logged};
use crate::engine::validity::Lease;
use crate::error::{Error, Result};
use crate::keys::{Kind, LockSpec};
use crate::metrics;
use crate::wire::{self, AcquireArgs, Attempt, Mode, QueuePlace};

/// What a lock handle is to the engine: a name on a client, the validated spec, an optional
/// holder and whether grants are fenced. The public handles (`FairLock`, `NonFairLock`, the
/// sides of a `ReadWriteLock`) wrap one and make each acquisition one call into it; their reads
/// and force-unlocks are in `lock/handle.rs`.
///
/// A handle without a holder gives every acquisition call a holder of its own
/// ([`Helds::call_holder`](crate::engine::field::Helds::call_holder)), so its calls never share
/// a hold. It keeps the field of its last call that took the lock (`warm`; a clone starts
/// without one): the next call takes that holder over when nothing else refers to the field any more
/// and nothing of it is left (the rule the registry applies to the ids it gives back), so a
/// handle that locks and unlocks over and over keeps one field, with its driver timers (see
/// `Watch`), instead of making and dropping one per call. One given a holder
/// (`with_holder`) makes all its calls that one holder. Making a handle never does I/O or fails:
/// a name that cannot be used is reported by every operation as `Error::InvalidName`.
#[derive(Debug)]
pub(crate) struct Handle {
    inner: Arc<Inner>,
    name: String,
    /// The validated spec, or why the name was rejected (reported by every operation).
    spec: std::result::Result<Arc<LockSpec>, &'static str>,
    /// `None`: every acquisition call is its own holder.
    holder: Option<i64>,
    fenced: bool,
    /// The field of the last call that took the lock, while the handle lives (inline: making a
    /// handle allocates nothing for it).
    warm: Mutex<Option<Arc<Held>>>,
}

impl Clone for Handle {
    fn clone(&self) -> Self {
        Handle {
            inner: self.inner.clone(),
            name: self.name.clone(),
            spec: self.spec.clone(),
            holder: self.holder,
            fenced: self.fenced,
            warm: Mutex::new(None),
        }
    }
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
            warm: Mutex::new(None),
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
        let (holder, per_call, lingering, warm) = match self.holder {
            Some(holder) => (holder, false, true, None),
            None => match self.take_warm() {
                Some((held, subscribed)) => (held.holder_id(), true, subscribed, Some(held)),
                None => {
                    let (holder, subscribed) = self.inner.helds.call_holder(spec.name());
                    (holder, true, subscribed, None)
                }
            },
        };
        let req = Request {
            holder,
            per_call,
            lingering,
            wait,
            lease,
            fenced: self.fenced,
        };
        // `warm` keeps the field alive until the call has found it in the registry.
        let result = acquire(&self.inner, spec, req).await;
        drop(warm);
        if let (true, Ok(Some(hold))) = (per_call, &result) {
            let old = self.warm_slot().replace(hold.field().clone());
            drop(old);
        }
        result
    }

    fn warm_slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Held>>> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept field, if a call may take its holder over now: nothing else refers to it and
    /// [`Held::reusable`] says yes (with whether its waiter channel may linger). A kept field
    /// that is still in use is let go (its `Drop` gives the id back later, as for any field).
    fn take_warm(&self) -> Option<(Arc<Held>, bool)> {
        let held = self.warm_slot().take()?;
        if Arc::strong_count(&held) != 1 {
            return None;
        }
        let subscribed = held.reusable()?;
        Some((held, subscribed))
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
        call_mark: 0,
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
// to the driver. An attempt, and how a grant becomes a hold, are below; the waiting phase (with
// a direct grant's take-up) is `wait.rs`, riding out errors `outage.rs`.

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
    /// We are one of the field's `waiting_calls` (see `Account` in `engine/field.rs`).
    pub(super) counted: bool,
    /// No other call of ours waited on the field when we began: an entry of the field in the
    /// queue that does not name one of our nonces was left by an ended call, and our attempts
    /// drop it before joining, until one of them gets a reply (after that, an entry of the field
    /// may be the one we made).
    pub(super) drop_stale: bool,
    /// Drawn from the nonces' counter when the call began, before any of its nonces (see
    /// `wire::acquire`).
    pub(super) call_mark: u64,
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

    /// The loop of one call: attempt (below), then take a grant up (below) or wait
    /// for a reason to look again (`wait.rs`); transient errors are ridden out (`outage.rs`).
    pub(super) async fn run(&mut self, deadline: Option<Instant>) -> Result<Option<Hold>> {
        let mut closed = self.inner.helds.closed.subscribe();
        let mut outage: Option<Outage> = None;
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
                    outage = None;
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

// -----------------------------------------------------------------------------------------------
// An attempt, and how a grant becomes a hold.
// One attempt of a call, with its field's turn: the script (`wire::acquire`), then the
// account (`engine/field/`), then replica sync for a grant; and how a grant becomes a guard
// (below). The attempt takes its place in the field's line synchronously, before its first
// await, so whatever this holder left to the background earlier reaches Redis first; it is a
// boxed future the caller's future polls, and if the caller drops it while it is in flight,
// the attempt (turn and all) is handed to the driver to settle (`Waiter`'s `Drop`).

impl Waiter {
    /// Sends one attempt with the field's turn and waits for it. The attempt takes its place in
    /// the field's line before anything else, and is kept in `in_flight` while it runs, so a
    /// caller that drops us meanwhile hands it (turn and all) to the driver to settle. Returns
    /// the outcome with the turn still held, so a grant is registered before anyone else's
    /// operation on the field.
    ///
    /// `None` when `turn_deadline` passed before the field's turn came: nothing was sent (the
    /// place in line is given up, and the turn passes on to whoever is behind).
    pub(super) async fn attempt(
        &mut self,
        turn_deadline: Option<Instant>,
    ) -> Option<(Result<Attempt>, FieldTurn)> {
        let fair = self.args.spec.kind == Kind::Fair;
        if fair && !self.counted {
            // Decided when the attempt takes its place in the line: a call that ended before
            // this one began has its give-up (or settling) ahead of us in the line, and a call
            // that is still waiting shares its entry with us.
            let joins = self.args.mode != Mode::Try;
            self.drop_stale = self.held.call_starts(joins);
            self.counted = joins;
            // Drawn before any nonce of this call: the script tells this call's own entry (its
            // grant request names a later nonce) from one an ended call left.
            self.call_mark = next_id();
        }
        if self.args.spec.queues() && self.args.mode != Mode::Try {
            self.queued = true;
        }
        let drop_stale =
            (self.drop_stale && self.args.mode != Mode::Requeue).then_some(self.call_mark);
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
            args.nonce = if self.held.calls_share_entry() {
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
}

/// One attempt, with the field's turn: the script, then the account (see `engine/field/`), then
/// replica sync for a grant. A grant that replica sync gives back is released under the same turn.
async fn attempt_with_turn(
    conn: &mut Conn,
    held: &Held,
    turn: &FieldTurn,
    args: &AcquireArgs,
    drop_stale: Option<u64>,
    sync: Option<ReplicaSync>,
    command_timeout: Duration,
) -> Result<Attempt> {
    let expected = turn.count();
    let reply = wire::acquire(conn, args, expected, drop_stale).await;
    match &reply {
        Ok(Attempt::Acquired { count, adopted, .. }) => {
            turn.attempt_granted(expected, *count, *adopted)
        }
        Ok(Attempt::Waiting { .. }) => turn.attempt_waiting(args.nonce),
        // The attempt may have run and its reply been lost: it may hold the lock unseen. The
        // next operation on the field compares and sets against Redis and finds out.
        Err(e) if e.is_ambiguous() => turn.reply_lost(),
        Err(_) => {}
    }
    match (reply?, sync) {
        (granted @ Attempt::Acquired { .. }, Some(sync)) => {
            match wire::replica::synced(conn, args, sync).await {
                Ok(true) => Ok(granted),
                outcome => {
                    // Unsynced, or its sync unknown: the grant is given back before the outcome
                    // is reported, so a retry does not pile a second hold on it.
                    release(conn, held, turn, What::Orphan, command_timeout).await?;
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

// -----------------------------------------------------------------------------------------------
// A grant becomes a guard: registered in the field's account under the field's turn, before any
// other operation on the field can run, with its lease and validity; a grant that can no longer
// be trusted when it reaches us (its lease, counted from the send, ran out on the way) or that
// arrives after shutdown is given back instead. A direct grant (PROTOCOL 8) is taken up from
// its message without a round trip when it names the call's latest attempt.

impl Waiter {
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
    pub(super) async fn granted(
        &mut self,
        turn: FieldTurn,
        sent: Instant,
        token: Option<u64>,
        granted_ttl: Option<Duration>,
    ) -> Result<Option<Hold>> {
        if self.inner.helds.check_open().is_err() {
            // Shutdown releases what it finds; this grant came after it looked (or while it
            // waited for our turn): give it back here, to its end even if the caller leaves.
            let held = self.held.clone();
            let release = RunToEnd::new(&self.inner.driver.clone(), async move {
                let _ = release_logged(&held, &turn, What::Orphan).await;
            });
            release.run().await;
            return Err(Error::Shutdown);
        }
        let held = &self.held;
        let watchdog_timeout = self.inner.config.watchdog_timeout;
        let full = self.lease.span(watchdog_timeout);
        // What the lock's TTL covers now, and whether it must still be extended to the lease.
        let (covered, confirm) = match granted_ttl {
            Some(ttl) if ttl < full => (ttl, true),
            _ => (full, false),
        };
        let registered = turn.register_hold(sent, covered, self.lease, confirm);
        let Some(registered) = registered else {
            tracing::warn!(
                since_sent = ?sent.elapsed(),
                "a grant reached us after its lease ran out; giving it back"
            );
            let held = self.held.clone();
            let release = RunToEnd::new(&self.inner.driver.clone(), async move {
                let _ = release_logged(&held, &turn, What::Orphan).await;
            });
            release.run().await;
            return Ok(None);
        };
        let (tell_driver, deadline) = (registered.tell_driver, registered.valid_until);
        let guard = Hold::new(held.clone(), registered, token);
        // A direct grant's short TTL is extended a third of it in, as the watchdog renews a
        // third of its timeout in: a hold released sooner (the common case under contention)
        // costs nothing more. A grant the driver's timers already cover costs it nothing.
        if tell_driver {
            self.inner.driver.send_lazy(Work::Acquired {
                held: held.clone(),
                watchdog: self.lease.is_watchdog(),
                confirm: confirm.then(|| Confirm {
                    at: sent + covered / 3,
                    period: covered / 3,
                }),
                deadline: Some(deadline),
            });
        }
        drop(turn);
        tracing::debug!(waited = ?sent.elapsed(), "acquired");
        Ok(Some(guard))
    }

    /// A grant reached us after a message woke us: records the hand-over time (release seen →
    /// grant) for the metric, whichever way the grant came (an attempt, or a direct grant).
    pub(super) fn record_handover(&self) {
        if let Some(woken) = self.woken_by_message {
            let names = self.inner.config.metrics_lock_names;
            metrics::handover(&self.args.spec, names, woken.elapsed());
        }
    }
}
