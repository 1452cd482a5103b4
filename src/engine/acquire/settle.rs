//! What a dropped waiting future leaves behind, run to its end by the driver: the outcome of an acquire
//! attempt that was in flight when its caller stopped waiting (a late grant is released again, a
//! reply that was lost is cleared up, a queued waiter leaves the queue), and the give-up of a
//! waiter that stopped waiting between attempts. Each runs with the field's turn (the attempt
//! brings its own), so the same holder's next operation on the lock comes after it.
//!
//! It must never leave a lock or a queue entry behind that nobody will use: each piece of work runs
//! to its end in its own task, and what it could not do is logged with the lock's name.

use std::sync::Arc;

use crate::engine::field::What;
use crate::engine::field::{FieldTurn, Held};
use crate::engine::release::release_logged;
use crate::error::Result;
use crate::keys::LockSpec;
use crate::wire::{self, AcquireArgs, Attempt, Mode};

/// An acquire attempt in flight with its field's turn: polled by the caller's future, handed to
/// the driver if the caller stops waiting before it completes.
pub(super) type AttemptFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = (Result<Attempt>, FieldTurn)> + Send>>;

/// Runs an abandoned attempt to its end and settles its outcome (the driver runs it in its own
/// task).
pub(super) async fn settle_abandoned(attempt: AttemptFuture, held: Arc<Held>, args: AcquireArgs) {
    {
        let (outcome, turn) = attempt.await;
        let steps = plan(&outcome, &args);
        if steps.release {
            let _ = release_logged(&held, &turn, What::Orphan).await;
            tracing::debug!(
                lock = held.name(),
                field = &*held.field,
                "released a lock granted to a cancelled waiter"
            );
        }
        if steps.clear_dark {
            let _ = release_logged(&held, &turn, What::Dark).await;
        }
        if steps.give_up {
            give_up_logged(&held, &turn, &args.spec, &args.field).await;
        }
        drop(turn);
    }
}

/// Takes a waiter that stopped waiting out of its queue, and gives back a hold handed to it
/// directly meanwhile (the caller holds the field's turn). A grant announced for the waiter can no
/// longer be taken up from here on (`pending_nonce` is cleared before the give-up is sent); if
/// the give-up's reply is lost, Redis may still have that hold: the field is marked dark, so the
/// next operation on it counts against Redis first (and the field is not reused meanwhile).
pub(super) async fn give_up_logged(held: &Held, turn: &FieldTurn, spec: &LockSpec, field: &str) {
    let expected = turn.give_up_started();
    let mut conn = held.inner.conn.clone();
    let outcome = wire::give_up(&mut conn, spec, field, expected).await;
    turn.give_up_ended(outcome.is_ok());
    match outcome {
        Ok(outcome) => tracing::debug!(lock = spec.name(), field, ?outcome, "gave up waiting"),
        Err(e) => {
            if e.is_ambiguous() {
                turn.reply_lost();
            }
            tracing::warn!(lock = spec.name(), field, error = %crate::error::chain(&e),
            "give-up failed; the waiter is purged when its liveness window lapses, or by this \
             holder's next attempt")
        }
    }
}

/// What an abandoned attempt's outcome leaves to do, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Steps {
    /// The lock was granted after the caller left: give the hold back.
    release: bool,
    /// The attempt's reply was lost: it may have taken the lock unseen; give such a hold back.
    clear_dark: bool,
    /// The caller may be in a fair queue: leave it.
    give_up: bool,
}

/// Decides how to settle an abandoned attempt from its outcome.
fn plan(outcome: &Result<Attempt>, args: &AcquireArgs) -> Steps {
    let may_be_queued = args.spec.queues() && args.mode != Mode::Try;
    match outcome {
        Ok(Attempt::Acquired { .. }) => Steps {
            release: true,
            ..Steps::default()
        },
        Ok(Attempt::Waiting { .. }) => Steps {
            give_up: may_be_queued,
            ..Steps::default()
        },
        Err(e) => Steps {
            clear_dark: e.is_ambiguous(),
            give_up: may_be_queued,
            ..Steps::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{timed_out, Error};
    use crate::keys::Kind;

    fn args(kind: Kind, mode: Mode) -> AcquireArgs {
        AcquireArgs {
            spec: LockSpec::new(kind, "x"),
            field: "u:1".into(),
            lease_ms: 1000,
            liveness_ms: 1000,
            redisson_wait_ms: 300_000,
            mode,
            fenced: false,
            nonce: 0,
            grant_ttl_ms: 1000,
        }
    }

    #[test]
    fn a_late_grant_is_released_whatever_the_kind_or_mode() {
        let granted = Ok(Attempt::Acquired {
            count: 1,
            adopted: false,
            token: None,
        });
        for kind in [Kind::Fair, Kind::NonFair] {
            for mode in [Mode::Try, Mode::Queue, Mode::Requeue] {
                let steps = plan(&granted, &args(kind, mode));
                assert!(steps.release && !steps.give_up && !steps.clear_dark);
            }
        }
    }

    #[test]
    fn a_lost_reply_is_cleared_up_and_a_fair_waiter_leaves_the_queue() {
        let lost: Result<Attempt> = Err(Error::from(timed_out("lost reply")));
        let steps = plan(&lost, &args(Kind::Fair, Mode::Requeue));
        assert!(steps.clear_dark && steps.give_up && !steps.release);
        let steps = plan(&lost, &args(Kind::NonFair, Mode::Queue));
        assert!(steps.clear_dark && !steps.give_up);
    }

    #[test]
    fn a_fair_waiter_that_may_be_queued_gives_up() {
        let waiting = Ok(Attempt::Waiting {
            hint_ms: 5,
            queued_at: None,
            server_ms: 0,
            place: None,
        });
        assert!(plan(&waiting, &args(Kind::Fair, Mode::Queue)).give_up);
        assert!(plan(&waiting, &args(Kind::Fair, Mode::Requeue)).give_up);
        assert_eq!(
            plan(&waiting, &args(Kind::Fair, Mode::Try)),
            Steps::default()
        );
        assert_eq!(
            plan(&waiting, &args(Kind::NonFair, Mode::Queue)),
            Steps::default()
        );
    }
}
