//! One attempt of a call, with its field's turn: the script (`wire::acquire`), then the
//! account (`engine/field/`), then replica sync for a grant; and how a grant becomes a guard
//! (below). The attempt takes its place in the field's line synchronously, before its first
//! await, so whatever this holder left to the background earlier reaches Redis first; it is a
//! boxed future the caller's future polls, and if the caller drops it while it is in flight,
//! the attempt (turn and all) is handed to the driver to settle (`Waiter`'s `Drop`).

use std::time::{Duration, Instant};

use super::call::Waiter;
use crate::config::ReplicaSync;
use crate::conn::subscriber::Mailbox;
use crate::conn::Conn;
use crate::engine::driver::{Confirm, RunToEnd, Work};
use crate::engine::field::What;
use crate::engine::field::{next_id, FieldTurn, Held};
use crate::engine::hold::Hold;
use crate::engine::lane::{Entry, Lane};
use crate::engine::release::{release, release_logged};
use crate::error::{Error, Result};
use crate::keys::Kind;
use crate::metrics;
use crate::wire::{self, AcquireArgs, Attempt, Mode};

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
    drop_stale: bool,
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
        let guard = Hold::new(held.clone(), registered, token);
        // A direct grant's short TTL is extended a third of it in, as the watchdog renews a
        // third of its timeout in: a hold released sooner (the common case under contention)
        // costs nothing more.
        self.inner.driver.send_lazy(Work::Acquired {
            held: held.clone(),
            watchdog: self.lease.is_watchdog(),
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

    /// A grant reached us after a message woke us: records the hand-over time (release seen →
    /// grant) for the metric, whichever way the grant came (an attempt, or a direct grant).
    pub(super) fn record_handover(&self) {
        if let Some(woken) = self.woken_by_message {
            let names = self.inner.config.metrics_lock_names;
            metrics::handover(&self.args.spec, names, woken.elapsed());
        }
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
