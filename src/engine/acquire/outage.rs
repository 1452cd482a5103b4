//! Riding out trouble: transient errors are retried by the rule every waiting call follows
//! (`engine/outage.rs`; a lock call without a deadline rides one out for the longest idle time),
//! and a grant given back because it could not be trusted on arrival is asked for again after a
//! growing backoff, never in a tight loop.

use std::time::Instant;

use tokio::sync::watch;

use super::call::Waiter;
use super::wait::max_idle;
use crate::engine::outage::{nap, pause, Outage};
use crate::error::{Error, Result};

impl Waiter {
    /// Handles an error met while waiting. A transient one (see [`Error::is_transient`]) is
    /// ridden out: we pause with a growing backoff and the caller tries again, until the wait's
    /// deadline, or for a call without one, until the outage has lasted [`max_idle`]. Any other
    /// error, or a transient one past that point, is returned.
    pub(super) async fn ride_out(
        &mut self,
        error: Error,
        outage: &mut Option<Outage>,
        deadline: Option<Instant>,
        closed: &mut watch::Receiver<bool>,
    ) -> Result<()> {
        if self.zero_wait {
            return Err(error);
        }
        let pause = pause(outage, error, deadline, max_idle(&self.inner))?;
        nap(pause, closed).await?;
        self.inner.helds.check_open()
    }

    /// A grant was given back because it could no longer be trusted when it reached us (its
    /// lease, counted from the send, ran out on the way: a paused process, a slow reply, a lease
    /// close to the round trip). Pauses before the next attempt with the transient-error
    /// backoff, growing with each such grant in a row, so a lease the round trip keeps eating is
    /// retried a few times a second, never in a tight loop. Returns `false` when the call's
    /// deadline passed (the call then ends with `None`).
    pub(super) async fn back_off_untrusted(
        &mut self,
        deadline: Option<Instant>,
        closed: &mut watch::Receiver<bool>,
    ) -> Result<bool> {
        self.untrusted = self.untrusted.saturating_add(1);
        let now = Instant::now();
        let mut pause = crate::retry::retry_backoff(self.untrusted);
        if let Some(d) = deadline {
            if now >= d {
                return Ok(false);
            }
            pause = pause.min(d - now);
        }
        tracing::debug!(retry_in = ?pause, "a grant could not be trusted on arrival; pausing");
        nap(pause, closed).await?;
        self.inner.helds.check_open()?;
        Ok(deadline.is_none_or(|d| Instant::now() < d))
    }
}
