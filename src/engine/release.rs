//! Ending holds, under the field's turn: the release of one guard's hold, the settling of a dark
//! attempt (one whose reply was lost), and the release of every hold at shutdown. Each keeps the
//! field's account exact (see `engine/field/`), retries transient failures under the same expected
//! count (so a resend that already ran is recognised, not repeated), and re-learns the count
//! when Redis shows another one.
//!
//! It must never release more holds than it was asked to (a mismatch is re-learned and sent
//! again, never guessed), and never touch the account without the turn.

use std::time::{Duration, Instant};

use crate::conn::Conn;
use crate::engine::field::{FieldTurn, Held, What};
use crate::engine::validity::LostReason;
use crate::error::Result;
use crate::retry::retry_backoff;
use crate::wire::{self, Released, Unlocked};

/// How many command timeouts a release keeps retrying transient failures for: enough for a
/// Sentinel or Cluster failover to complete.
const RELEASE_WINDOW_TIMEOUTS: u32 = 3;

/// Releases under `turn` and keeps the account. Returns what the release found, as a guard
/// reports it; `Ok(Unlocked::Expired)` with nothing sent when the holds are of an older
/// generation.
pub(crate) async fn release(
    conn: &mut Conn,
    held: &Held,
    turn: &FieldTurn,
    what: What,
    command_timeout: Duration,
) -> Result<Unlocked> {
    let window = command_timeout * RELEASE_WINDOW_TIMEOUTS;
    let started = Instant::now();
    let mut retries: u32 = 0;
    let mut relearned = false;
    turn.release_started(what);
    loop {
        let Some(args) = turn.release_plan(what) else {
            return Ok(Unlocked::Expired);
        };
        let sent = wire::unlock(conn, &held.spec, &held.field, args).await;
        let found = match sent {
            Err(e) if e.is_transient() && started.elapsed() < window => {
                tracing::debug!(lock = held.name(), field = &*held.field, error = %crate::error::chain(&e), retries, "retrying release");
                retries += 1;
                let pause = retry_backoff(retries).min(window.saturating_sub(started.elapsed()));
                tokio::time::sleep(pause).await;
                continue;
            }
            Err(e) => {
                // Unknown whether it ran: Redis may have `by` holds fewer. Later operations
                // compare and set against Redis, so they re-learn the count; a hold left behind
                // expires with its TTL.
                turn.release_unknown(args.by);
                return Err(e);
            }
            Ok(found) => found,
        };
        let resent = retries > 0;
        match found {
            Released::Free => {
                // Guards still counted lose their holds with this release: at shutdown (`All`)
                // that is the reason they are told.
                let reason = if what == What::All {
                    LostReason::Shutdown
                } else {
                    LostReason::Gone
                };
                turn.emptied(reason);
                return Ok(Unlocked::Released);
            }
            Released::Remaining(count) => {
                turn.count_learned(count);
                return Ok(Unlocked::StillHeld);
            }
            Released::Absent | Released::NotOwner => {
                let not_owner = found == Released::NotOwner;
                // (A resend of a release that ran finds the lock gone too: then the guards left,
                // if any, were already counted out by the first run.)
                turn.emptied(LostReason::Gone);
                // A resend of a release of every hold finds the lock gone, or taken by somebody
                // else since the first send freed it: that release was ours. (The torture test
                // found the second case: a release answered NotHeld after a timeout behind a
                // long script, while its first send had done the work.)
                return Ok(if resent && args.by == args.expected {
                    Unlocked::Released
                } else if not_owner {
                    Unlocked::NotOwner
                } else {
                    Unlocked::Expired
                });
            }
            Released::Mismatch(count) => {
                // The connection may have run this very send twice (redis-rs's cluster client
                // sends again after a dropped connection): a count exactly `by` lower is then
                // our own first run's work, never a count to re-learn and release from again,
                // which would release a hold another guard still has. (A reply that finds the
                // lock gone or taken keeps its first-send reading: at worst a release that
                // worked is reported as not held.)
                if (resent || conn.may_run_twice()) && count + args.by == args.expected {
                    // A resend of a release that ran.
                    turn.count_learned(count);
                    return Ok(Unlocked::StillHeld);
                }
                if relearned {
                    // Twice in a row: leave the count as Redis has it and give up quietly.
                    turn.count_seen(count);
                    tracing::warn!(
                        lock = held.name(),
                        field = &*held.field,
                        count,
                        "hold count keeps changing; release skipped"
                    );
                    return Ok(Unlocked::StillHeld);
                }
                tracing::debug!(
                    lock = held.name(),
                    field = &*held.field,
                    expected = args.expected,
                    count,
                    "re-learned the hold count"
                );
                turn.count_learned(count);
                relearned = true;
            }
        }
    }
}

/// Sends a release under the field's turn and logs the outcome.
pub(crate) async fn release_logged(held: &Held, turn: &FieldTurn, what: What) -> Result<Unlocked> {
    let mut conn = held.inner.conn.clone();
    let timeout = held.inner.config.command_timeout;
    let outcome = release(&mut conn, held, turn, what, timeout).await;
    match &outcome {
        Ok(o) => {
            tracing::debug!(lock = held.name(), field = &*held.field, outcome = ?o, ?what, "unlocked")
        }
        Err(e) => {
            tracing::warn!(lock = held.name(), field = &*held.field, error = %crate::error::chain(&e), ?what,
                "release failed; the lock expires with its lease")
        }
    }
    outcome
}
