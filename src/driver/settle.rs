//! What dropped guards and futures leave behind, run from the driver: the release of a dropped
//! guard, the give-up of a waiter that stopped waiting, and the outcome of an acquire attempt that
//! was in flight when its caller stopped waiting (a late grant is released again, a queued waiter
//! leaves the queue).
//!
//! It must never leave a lock or a queue entry behind that nobody will use: each piece of work runs
//! to its end in its own task, and what it could not do is logged with the lock's name.

use std::sync::Arc;
use std::time::Duration;

use super::AttemptFuture;
use crate::conn::Conn;
use crate::error::Result;
use crate::guard::{unlock_hold, Held};
use crate::keys::{Kind, LockSpec};
use crate::ops::{self, AcquireArgs, Attempt, Mode};

/// Releases one hold of a dropped guard.
pub(super) fn release_in_background(held: Arc<Held>) {
    tokio::spawn(async move {
        let _ = unlock_hold(&held).await;
    });
}

/// Takes a waiter that stopped waiting out of its queue.
pub(super) fn give_up_in_background(mut conn: Conn, spec: Arc<LockSpec>, field: Arc<str>) {
    tokio::spawn(async move { give_up_logged(&mut conn, &spec, &field).await });
}

/// Runs an abandoned attempt to its end and settles its outcome.
pub(super) fn abandoned_in_background(
    mut conn: Conn,
    attempt: AttemptFuture,
    args: AcquireArgs,
    command_timeout: Duration,
) {
    tokio::spawn(async move { settle_abandoned(&mut conn, attempt, args, command_timeout).await });
}

async fn give_up_logged(conn: &mut Conn, spec: &LockSpec, field: &str) {
    match ops::give_up(conn, spec, field).await {
        Ok(removed) => tracing::debug!(lock = spec.name(), field, removed, "gave up waiting"),
        Err(e) => tracing::warn!(lock = spec.name(), field, error = %e,
            "give-up failed; the waiter is purged when its liveness window lapses"),
    }
}

/// What an abandoned attempt's outcome leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    /// The lock was granted after the caller left: give the hold back.
    Release,
    /// The attempt may have left us in a fair queue: leave it.
    GiveUp,
    /// Nothing was taken and no queue was joined.
    Nothing,
}

/// Decides how to settle an abandoned attempt from its outcome.
fn plan(outcome: &Result<Attempt>, args: &AcquireArgs) -> Settle {
    match outcome {
        Ok(Attempt::Acquired { .. }) => Settle::Release,
        _ if args.mode == Mode::Try || args.spec.kind != Kind::Fair => Settle::Nothing,
        _ => Settle::GiveUp,
    }
}

/// Settles an acquire attempt whose caller stopped waiting while it was in flight.
async fn settle_abandoned(
    conn: &mut Conn,
    attempt: AttemptFuture,
    args: AcquireArgs,
    command_timeout: Duration,
) {
    let spec = &args.spec;
    match plan(&attempt.await, &args) {
        Settle::Release => {
            match crate::retry::release(conn, spec, &args.field, args.lease_ms, command_timeout)
                .await
            {
                Ok(outcome) => tracing::debug!(
                    lock = spec.name(),
                    field = &*args.field,
                    ?outcome,
                    "released a lock granted to a cancelled waiter"
                ),
                Err(e) => tracing::warn!(lock = spec.name(), field = &*args.field, error = %e,
                    "could not release a lock granted to a cancelled waiter; it expires with its lease"),
            }
        }
        Settle::GiveUp => give_up_logged(conn, spec, &args.field).await,
        Settle::Nothing => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{timed_out, Error};

    fn args(kind: Kind, mode: Mode) -> AcquireArgs {
        AcquireArgs {
            spec: LockSpec::new(kind, "x"),
            field: "u:1".into(),
            lease_ms: 1000,
            liveness_ms: 1000,
            mode,
            fenced: false,
        }
    }

    #[test]
    fn a_late_grant_is_released_whatever_the_kind_or_mode() {
        let granted = Ok(Attempt::Acquired { token: None });
        for kind in [Kind::Fair, Kind::NonFair] {
            for mode in [Mode::Try, Mode::Queue, Mode::Requeue] {
                assert_eq!(plan(&granted, &args(kind, mode)), Settle::Release);
            }
        }
    }

    #[test]
    fn a_fair_waiter_that_may_be_queued_gives_up() {
        let waiting = Ok(Attempt::Waiting { hint_ms: 5 });
        let failed: Result<Attempt> = Err(Error::from(timed_out("lost reply")));
        for outcome in [&waiting, &failed] {
            assert_eq!(
                plan(outcome, &args(Kind::Fair, Mode::Queue)),
                Settle::GiveUp
            );
            assert_eq!(
                plan(outcome, &args(Kind::Fair, Mode::Requeue)),
                Settle::GiveUp
            );
        }
    }

    #[test]
    fn nothing_to_do_without_a_queue() {
        let waiting = Ok(Attempt::Waiting { hint_ms: 5 });
        assert_eq!(
            plan(&waiting, &args(Kind::Fair, Mode::Try)),
            Settle::Nothing
        );
        assert_eq!(
            plan(&waiting, &args(Kind::NonFair, Mode::Queue)),
            Settle::Nothing
        );
    }
}
