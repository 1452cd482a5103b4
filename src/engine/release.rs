//! Ending holds, under the field's turn: the release of one guard's hold, the settling of a dark
//! attempt (one whose reply was lost), and the release of every hold at shutdown. Each keeps the
//! field's account exact (see `field.rs`), retries transient failures under the same expected
//! count (so a resend that already ran is recognised, not repeated), and re-learns the count
//! when Redis shows another one.
//!
//! It must never release more holds than it was asked to (a mismatch is re-learned and sent
//! again, never guessed), and never touch the account without the turn.

use std::time::{Duration, Instant};

use crate::conn::Conn;
use crate::engine::field::{FieldTurn, Held};
use crate::engine::validity::LostReason;
use crate::error::Result;
use crate::retry::retry_backoff;
use crate::wire::{self, ReleaseArgs, Released, Unlocked};

/// How many command timeouts a release keeps retrying transient failures for: enough for a
/// Sentinel or Cluster failover to complete.
const RELEASE_WINDOW_TIMEOUTS: u32 = 3;

/// What to release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    /// One guard's hold, of generation `gen` (the guard has already left the account).
    Guard { gen: u64 },
    /// A hold granted to a caller that had left (the grant is in the count, no guard has it).
    Orphan,
    /// Only what a dark attempt may have added (nothing else changes).
    Dark,
    /// Every hold of the field (shutdown).
    All,
}

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
    if let What::Guard { gen } = what {
        // This release is no longer waiting in the line (see `Account::pending_releases`).
        turn.with(|a| {
            if a.gen == gen {
                a.pending_releases = a.pending_releases.saturating_sub(1);
            }
        });
    }
    loop {
        let Some(args) = turn.with(|a| plan(a, what)) else {
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
                turn.with(|a| a.uncertain = a.uncertain.saturating_add(args.by));
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
                turn.with(|a| held.emptied(a, reason));
                return Ok(Unlocked::Released);
            }
            Released::Remaining(count) => {
                turn.with(|a| {
                    a.count = count;
                    a.dark = false;
                    a.uncertain = 0;
                });
                return Ok(Unlocked::StillHeld);
            }
            Released::Absent | Released::NotOwner => {
                let not_owner = found == Released::NotOwner;
                turn.with(|a| {
                    // (A resend of a release that ran finds the lock gone too: then the guards
                    // left, if any, were already counted out by the first run.)
                    held.emptied(a, LostReason::Gone);
                });
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
                if resent && count + args.by == args.expected {
                    // A resend of a release that ran.
                    turn.with(|a| {
                        a.count = count;
                        a.dark = false;
                        a.uncertain = 0;
                    });
                    return Ok(Unlocked::StillHeld);
                }
                if relearned {
                    // Twice in a row: leave the count as Redis has it and give up quietly.
                    turn.with(|a| a.count = count);
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
                turn.with(|a| {
                    a.count = count;
                    a.dark = false;
                    a.uncertain = 0;
                });
                relearned = true;
            }
        }
    }
}

/// The release arguments for `what`, from the account; `None` when there is nothing to send.
fn plan(a: &crate::engine::field::Account, what: What) -> Option<ReleaseArgs> {
    let now = Instant::now();
    match what {
        What::Guard { gen } if gen != a.gen => None,
        What::Guard { .. } | What::Orphan => {
            // The last local hold of the field releases every hold Redis has for it (orphans of
            // lost replies included): nothing local needs them, and the lock is then free. A
            // release of another guard still waiting in the line is the last one, not this.
            let by = if a.has_guards() || a.pending_releases > 0 {
                1
            } else {
                a.count.max(1)
            };
            Some(ReleaseArgs {
                expected: a.count,
                by,
                dark: a.dark,
                remaining_ttl_ms: a.remaining_ttl_ms(now),
            })
        }
        What::Dark if !a.dark => None,
        What::Dark => Some(ReleaseArgs {
            expected: a.count,
            by: if a.has_guards() || a.pending_releases > 0 {
                0
            } else {
                a.count
            },
            dark: true,
            remaining_ttl_ms: a.remaining_ttl_ms(now),
        }),
        What::All if a.count == 0 && !a.dark => None,
        What::All => Some(ReleaseArgs {
            expected: a.count,
            by: a.count,
            dark: a.dark,
            remaining_ttl_ms: -1,
        }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::field::{Account, FixedHold};

    fn account(count: u64, watchdog: u32, fixed: usize) -> Account {
        let now = Instant::now();
        Account {
            count,
            watchdog_guards: watchdog,
            fixed: (0..fixed)
                .map(|i| FixedHold::new(i as u64, now, Duration::from_secs(10)))
                .collect(),
            ..Account::default()
        }
    }

    #[test]
    fn a_guard_of_an_older_generation_sends_nothing() {
        let mut a = account(1, 1, 0);
        a.gen = 3;
        assert_eq!(plan(&a, What::Guard { gen: 2 }), None);
        assert!(plan(&a, What::Guard { gen: 3 }).is_some());
    }

    #[test]
    fn a_release_with_another_one_waiting_in_line_gives_back_only_its_own_hold() {
        // Two guards left, neither counted any more: the first release to run is not the last.
        let mut a = account(2, 0, 0);
        a.pending_releases = 1;
        let first = plan(&a, What::Guard { gen: 0 }).unwrap();
        assert_eq!((first.expected, first.by), (2, 1));
        a.pending_releases = 0;
        a.count = 1;
        let last = plan(&a, What::Guard { gen: 0 }).unwrap();
        assert_eq!((last.expected, last.by), (1, 1));
    }

    #[test]
    fn the_last_guard_releases_every_hold_and_others_release_one() {
        let last = plan(&account(3, 0, 0), What::Guard { gen: 0 }).unwrap();
        assert_eq!((last.expected, last.by), (3, 3));
        let one = plan(&account(3, 1, 1), What::Guard { gen: 0 }).unwrap();
        assert_eq!((one.expected, one.by), (3, 1));
        // A watchdog hold remains: the TTL is left to the watchdog.
        assert_eq!(one.remaining_ttl_ms, -1);
        // Only a fixed lease remains: the TTL becomes what it needs.
        let fixed = plan(&account(2, 0, 1), What::Guard { gen: 0 }).unwrap();
        assert!(fixed.remaining_ttl_ms > 9_000 && fixed.remaining_ttl_ms <= 10_000);
    }

    #[test]
    fn a_dark_attempt_is_settled_only_when_there_is_one() {
        assert_eq!(plan(&account(1, 1, 0), What::Dark), None);
        let mut a = account(1, 1, 0);
        a.dark = true;
        let settle = plan(&a, What::Dark).unwrap();
        // With a live guard, only the dark hold (if it is there) goes.
        assert_eq!((settle.expected, settle.by, settle.dark), (1, 0, true));
        let mut a = account(0, 0, 0);
        a.dark = true;
        let settle = plan(&a, What::Dark).unwrap();
        assert_eq!((settle.expected, settle.by, settle.dark), (0, 0, true));
    }

    #[test]
    fn shutdown_releases_everything_it_knows_of() {
        assert_eq!(plan(&account(0, 0, 0), What::All), None);
        let all = plan(&account(4, 1, 2), What::All).unwrap();
        assert_eq!((all.expected, all.by), (4, 4));
    }
}
