//! The waiting phase of one call: between an attempt that left it waiting and the next one.
//! A waiter is subscribed to its wake-up channel before it sleeps (and attempts once more right
//! after subscribing, so a release in between is not missed); it sleeps until a message, the
//! hint its attempt gave (the lock's TTL when it is the head: nobody announces an expiry), its
//! deadline or a shutdown, and takes up a direct grant announced for its last attempt without a
//! round trip (below). A writer-preferring read-write waiter whose turn has not come waits
//! on the queue's turns channel instead (PROTOCOL 10).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::call::{Step, Waiter};
use crate::conn::subscriber::Mailbox;
use crate::engine::driver::{WaiterBeat, Work};
use crate::engine::hold::Hold;
use crate::engine::inner::Inner;
use crate::engine::lane::Lane;
use crate::engine::outage::{shut_down, Outage};
use crate::error::{Error, Result};
use crate::keys::Kind;
use crate::metrics;
use crate::wire::{Mode, QueuePlace};

/// What the attempt that left us waiting said, and the message counts read before it.
pub(super) struct Queued {
    /// When that attempt was sent.
    pub(super) sent: Instant,
    /// How long nothing changes unannounced (-1: until told).
    pub(super) hint_ms: i64,
    /// Our place when the attempt joined the fair queue at its tail.
    pub(super) queued_at: Option<u64>,
    /// The server time the attempt ran at (0: not said).
    pub(super) server_ms: i64,
    /// A writer-preferring read-write waiter's place.
    pub(super) place: Option<QueuePlace>,
    /// Messages the broadcast side of our mailbox and the turns channel had before the attempt.
    pub(super) seen: (Option<u64>, Option<u64>),
}

impl Waiter {
    /// The waiting phase: the last attempt left us queued (or, for a non-fair lock, told us
    /// how long the lock stays). Subscribes first if we were not (then looks again at once, so a
    /// release between the attempt and the subscription is not missed), has the driver
    /// heartbeat our place, then sleeps until a message, the hint, the deadline or a shutdown,
    /// and takes up a direct grant announced for our last attempt.
    pub(super) async fn wait(
        &mut self,
        queued: Queued,
        deadline: Option<Instant>,
        turn_deadline: Option<Instant>,
        outage: &mut Option<Outage>,
        closed: &mut watch::Receiver<bool>,
    ) -> Result<Step> {
        let Queued {
            sent,
            hint_ms,
            queued_at,
            server_ms,
            place,
            seen: (seen, seen_turns),
        } = queued;
        self.place = place;
        self.pending =
            (server_ms > 0 && self.last_nonce != 0).then_some((self.last_nonce, sent, server_ms));
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
                            return Ok(Step::Done(None));
                        }
                    }
                }
                None => self.subscribe().await,
            };
            if let Err(e) = subscribed {
                self.ride_out(e, outage, deadline, closed).await?;
                return Ok(Step::Again);
            }
            self.start_heartbeat();
            // Re-check now that a release can no longer slip past us.
            return Ok(Step::Again);
        }
        self.start_heartbeat();
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            // Leaving the queue is our Drop's (in the background, in this field's
            // line, so the same holder's next call comes after it): the call returns
            // within its wait plus the one round trip it may have been in.
            tracing::debug!("wait elapsed");
            return Ok(Step::Done(None));
        }
        if let Some(place) = self.place.filter(|p| !p.may_enter) {
            // Others are ahead in the writer-preferring queue: wait until an
            // announcement says our turn came (not for releases, which we could not
            // use), or a wake-up without one, or our deadline.
            let until = match deadline {
                Some(d) => d.min(now + max_idle(&self.inner)),
                None => now + max_idle(&self.inner),
            };
            let turn_came = self.wait_for_turn(place, seen_turns, until, closed).await?;
            if !turn_came && deadline.is_some_and(|d| Instant::now() >= d) {
                tracing::debug!("wait elapsed");
                return Ok(Step::Done(None));
            }
            self.woken_by_message = Some(Instant::now());
            return Ok(Step::Again);
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
                _ = shut_down(closed) => {
                    // Our Drop leaves the queue in the background.
                    return Err(Error::Shutdown);
                }
            }
        }
        self.inner.helds.check_open()?;
        if let Some(outcome) = self.take_up_grant(&mail, turn_deadline).await {
            match outcome? {
                Some(guard) => return Ok(Step::Done(Some(guard))),
                // Given back (it could no longer be trusted): queue again, after
                // a pause.
                None => {
                    if !self.back_off_untrusted(deadline, closed).await? {
                        return Ok(Step::Done(None));
                    }
                }
            }
        }
        Ok(Step::Again)
    }

    /// Subscribes to our wake-up channel.
    async fn subscribe(&mut self) -> Result<()> {
        let channel = self.args.spec.wake_channel(&self.args.field);
        self.subscription = Some(self.inner.subscriber.subscribe(channel).await?);
        self.held.mark_subscribed();
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
    pub(super) fn broadcast(&self) -> bool {
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
    pub(super) async fn take_up_grant(
        &mut self,
        mail: &Mailbox,
        turn_deadline: Option<Instant>,
    ) -> Option<Result<Option<Hold>>> {
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
        let taken = turn.take_up_direct(grant.nonce);
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
}

/// Longest a waiter sleeps without any reason to re-check (a guard against a wake-up path that
/// failed in a way nobody noticed; every normal path wakes it sooner).
pub(super) fn max_idle(inner: &Inner) -> Duration {
    inner
        .config
        .watchdog_timeout
        .max(inner.config.waiter_liveness)
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
