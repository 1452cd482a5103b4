//! One acquisition call: its request, its record in the metrics, and the waiter that runs it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::waiter::Waiter;
use crate::engine::hold::Hold;
use crate::engine::inner::Inner;
use crate::engine::lane::{Entry, Lane};
use crate::error::{Error, Result};
use crate::keys::{Kind, LockSpec};
use crate::lease::Lease;
use crate::metrics;
use crate::wire::{AcquireArgs, Mode};

/// What one lock call asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) holder: i64,
    /// The holder is the call's own (not one the caller passed): the field may be reused by a
    /// later call of this client once nothing of it is left (`Inner::reuse_holder`).
    pub(crate) per_call: bool,
    /// `None`: wait for ever.
    pub(crate) wait: Option<Duration>,
    /// `None`: watchdog. Checked by the call (an invalid lease ends it as an error, counted in
    /// the metrics like any other).
    pub(crate) lease: Option<Duration>,
    pub(crate) fenced: bool,
}

/// Runs one acquisition to its end: `Some(guard)`, or `None` when `wait` elapsed.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    spec: &Arc<LockSpec>,
    req: Request,
) -> Result<Option<Hold>> {
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
    inner.check_open()?;
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
        lease,
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
        wait: Some(Duration::ZERO),
        lease,
        fenced: hold.token().is_some(),
    };
    acquire(&held.inner, &held.spec, req).await
}
