//! The waiter: one call's loop of attempts, sleeps and wake-ups, and what a dropped one leaves
//! to the driver. Its phases live beside it: `attempt.rs`, `grant.rs`, `wait.rs`, `outage.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::settle::{give_up_logged, settle_abandoned, AttemptFuture};
use super::wait::Queued;
use crate::conn::subscriber::Subscription;
use crate::engine::driver::{WaiterBeat, Work};
use crate::engine::field::Held;
use crate::engine::hold::Hold;
use crate::engine::inner::Inner;
use crate::engine::lane::Lane;
use crate::engine::outage::Outage;
use crate::error::Result;
use crate::lease::Lease;
use crate::wire::{AcquireArgs, Attempt, QueuePlace};
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
    /// The loop of one call: attempt (`attempt.rs`), then take a grant up (`grant.rs`) or wait
    /// for a reason to look again (`wait.rs`); transient errors are ridden out (`outage.rs`).
    pub(super) async fn run(&mut self, deadline: Option<Instant>) -> Result<Option<Hold>> {
        let mut closed = self.inner.closed.subscribe();
        self.take_lingering_subscription();
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
