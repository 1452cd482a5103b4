//! One attempt of a call, with its field's turn: the script (`wire::acquire`), then the
//! account (`engine/field.rs`), then replica sync for a grant. The attempt takes its place in the
//! field's line synchronously, before its first await, so whatever this holder left to the
//! background earlier reaches Redis first; it is a boxed future the caller's future polls, and
//! if the caller drops it while it is in flight, the attempt (turn and all) is handed to the
//! driver to settle (`Waiter`'s `Drop`).

use std::time::{Duration, Instant};

use super::waiter::Waiter;
use crate::config::ReplicaSync;
use crate::conn::Conn;
use crate::engine::field::What;
use crate::engine::field::{next_id, FieldTurn, Held};
use crate::engine::lane::{Entry, Lane};
use crate::engine::release::release;
use crate::error::Result;
use crate::keys::Kind;
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
