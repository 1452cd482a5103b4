//! Metrics through the `metrics` crate facade (cargo feature `metrics`): the application installs
//! the recorder and exporter it likes (Prometheus, StatsD, …); without the feature every function
//! here compiles to nothing. The names, types, units and labels are listed in the README.
//!
//! Labels: `kind` on per-lock metrics (`fair`, `plain`, `read`, `write`; and for the counting
//! kinds, which record their waiting calls and losses under the same names, `semaphore`,
//! `expirable_semaphore`, `latch`), and the lock's (or semaphore's, latch's) name as `lock` only
//! when the user opted in with `Builder::metrics_lock_names` (names can be unbounded).
//!
//! This module must never do I/O, take a lock, or allocate on a path that runs without a
//! recorder beyond what the facade itself does.

use std::time::Duration;

use crate::keys::{Kind, LockSpec};

/// How a lock call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired,
    TimedOut,
    Error,
    Cancelled,
}

impl Outcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::TimedOut => "timed_out",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// What a renewal reply said about one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Ok,
    Gone,
    Failed,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Fair => "fair",
        Kind::NonFair => "plain",
        Kind::Read => "read",
        Kind::Write => "write",
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use super::*;
    use metrics::{
        counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Label,
        Unit,
    };

    /// Gives every metric its help text and unit (Prometheus `# HELP`), on the recorder
    /// installed now; called at every client start (recorders keep the first description).
    pub(crate) fn describe() {
        describe_counter!(
            "fairlock_acquisitions_total",
            Unit::Count,
            "Waiting calls (locks, semaphores' acquires, latches' waits) by how they ended: \
             acquired (a latch: opened), timed_out, error, cancelled (future dropped)"
        );
        describe_histogram!(
            "fairlock_wait_seconds",
            Unit::Seconds,
            "How long each waiting call took, by how it ended"
        );
        describe_histogram!(
            "fairlock_handover_seconds",
            Unit::Seconds,
            "From a release message reaching a waiter to that waiter's grant"
        );
        describe_histogram!(
            "fairlock_hold_seconds",
            Unit::Seconds,
            "From a grant to the guard's release or drop"
        );
        describe_histogram!(
            "fairlock_queue_position",
            Unit::Count,
            "A fair waiter's place in the queue when it joined (1 = head)"
        );
        describe_counter!(
            "fairlock_lost_total",
            Unit::Count,
            "Holds told they are lost, by reason: gone, renewal_failed, lease_expired, \
             validity_expired, shutdown"
        );
        describe_counter!(
            "fairlock_renewals_total",
            Unit::Count,
            "Watchdog renewals per lock, by result: ok, gone, failed"
        );
        describe_counter!(
            "fairlock_renewal_calls_total",
            Unit::Count,
            "Renewal script calls (each renews up to batch_size locks)"
        );
        describe_gauge!(
            "fairlock_driver_pending",
            Unit::Count,
            "Work handed to the clients' background tasks and not looked at yet"
        );
    }

    fn labels(spec: &LockSpec, names: bool) -> Vec<Label> {
        let mut labels = vec![Label::from_static_parts("kind", kind_label(spec.kind))];
        if names {
            labels.push(Label::new("lock", spec.name().to_owned()));
        }
        labels
    }

    pub(crate) fn call_ended(spec: &LockSpec, names: bool, outcome: Outcome, waited: Duration) {
        let mut l = labels(spec, names);
        l.push(Label::from_static_parts("outcome", outcome.label()));
        counter!("fairlock_acquisitions_total", l.clone()).increment(1);
        histogram!("fairlock_wait_seconds", l).record(waited.as_secs_f64());
    }

    pub(crate) fn handover(spec: &LockSpec, names: bool, gap: Duration) {
        histogram!("fairlock_handover_seconds", labels(spec, names)).record(gap.as_secs_f64());
    }

    pub(crate) fn held(spec: &LockSpec, names: bool, held: Duration) {
        histogram!("fairlock_hold_seconds", labels(spec, names)).record(held.as_secs_f64());
    }

    pub(crate) fn queued_at(spec: &LockSpec, names: bool, position: u64) {
        histogram!("fairlock_queue_position", labels(spec, names)).record(position as f64);
    }

    /// `reason`: the lost reason's label (`LostReason::label` in `engine/validity.rs`).
    pub(crate) fn lost(spec: &LockSpec, names: bool, reason: &'static str) {
        let mut l = labels(spec, names);
        l.push(Label::from_static_parts("reason", reason));
        counter!("fairlock_lost_total", l).increment(1);
    }

    fn counting_labels(kind: &'static str, name: &str, names: bool) -> Vec<Label> {
        let mut labels = vec![Label::from_static_parts("kind", kind)];
        if names {
            labels.push(Label::new("lock", name.to_owned()));
        }
        labels
    }

    /// A waiting call of a counting kind ended (see [`Call`](super::Call)).
    pub(crate) fn counting_call_ended(
        kind: &'static str,
        name: &str,
        names: bool,
        outcome: Outcome,
        waited: Duration,
    ) {
        let mut l = counting_labels(kind, name, names);
        l.push(Label::from_static_parts("outcome", outcome.label()));
        counter!("fairlock_acquisitions_total", l.clone()).increment(1);
        histogram!("fairlock_wait_seconds", l).record(waited.as_secs_f64());
    }

    /// Permits of an expirable semaphore were lost.
    pub(crate) fn counting_lost(kind: &'static str, name: &str, names: bool, reason: &'static str) {
        let mut l = counting_labels(kind, name, names);
        l.push(Label::from_static_parts("reason", reason));
        counter!("fairlock_lost_total", l).increment(1);
    }

    pub(crate) fn renewal(result: Renewal) {
        let result = match result {
            Renewal::Ok => "ok",
            Renewal::Gone => "gone",
            Renewal::Failed => "failed",
        };
        counter!("fairlock_renewals_total", "result" => result).increment(1);
    }

    pub(crate) fn renewal_calls(calls: u64) {
        counter!("fairlock_renewal_calls_total").increment(calls);
    }

    pub(crate) fn driver_pending(delta: f64) {
        gauge!("fairlock_driver_pending").increment(delta);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use super::*;

    #[inline(always)]
    pub(crate) fn describe() {}
    #[inline(always)]
    pub(crate) fn call_ended(_: &LockSpec, _: bool, _: Outcome, _: Duration) {}
    #[inline(always)]
    pub(crate) fn handover(_: &LockSpec, _: bool, _: Duration) {}
    #[inline(always)]
    pub(crate) fn queued_at(_: &LockSpec, _: bool, _: u64) {}
    #[inline(always)]
    pub(crate) fn lost(_: &LockSpec, _: bool, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn counting_call_ended(_: &'static str, _: &str, _: bool, _: Outcome, _: Duration) {}
    #[inline(always)]
    pub(crate) fn counting_lost(_: &'static str, _: &str, _: bool, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn renewal(_: Renewal) {}
    #[inline(always)]
    pub(crate) fn renewal_calls(_: u64) {}
    #[inline(always)]
    pub(crate) fn driver_pending(_: f64) {}
}

pub(crate) use imp::*;

/// One waiting call of a counting kind (`semaphore`, `expirable_semaphore`, `latch`), recorded as a
/// lock call is when it ends: by outcome, with its wait; dropped before it ended, as cancelled.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    kind: &'static str,
    name: &'a str,
    names: bool,
    started: std::time::Instant,
    done: bool,
}

impl<'a> Call<'a> {
    pub(crate) fn start(kind: &'static str, name: &'a str, names: bool) -> Self {
        Call {
            kind,
            name,
            names,
            started: std::time::Instant::now(),
            done: false,
        }
    }

    /// The call ended with `result` (`Ok(None)`: its wait ran out).
    pub(crate) fn end<T>(mut self, result: &crate::error::Result<Option<T>>) {
        self.done = true;
        let outcome = match result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) => Outcome::TimedOut,
            Err(_) => Outcome::Error,
        };
        counting_call_ended(
            self.kind,
            self.name,
            self.names,
            outcome,
            self.started.elapsed(),
        );
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if !self.done {
            counting_call_ended(
                self.kind,
                self.name,
                self.names,
                Outcome::Cancelled,
                self.started.elapsed(),
            );
        }
    }
}
