//! [`Semaphore`]: a counting semaphore in Redisson's `RSemaphore` layout (PROTOCOL 11), and
//! [`Permits`], the guard of permits taken from it.
//!
//! Invariants, and where they are enforced:
//! * Permits are taken only by `semaphore_acquire.lua`, which takes them only when that many are
//!   available, so the count never goes below zero through an acquire.
//! * Every call that takes or returns permits carries a mark; an acquire whose reply is lost, or
//!   whose future is dropped while it is in flight, is settled by `semaphore_give_back.lua` (here
//!   at once, or by a background task when dropped): either its permits come back, or it is
//!   voided before it ran. A release is resent only with its mark, so it returns its permits once.
//! * A [`Permits`] guard dropped without [`Permits::release`] or [`Permits::forget`] is released
//!   by the client's driver (no I/O in `Drop`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::common::{call_id, mark_ms, overflow_as_argument, Named};
use crate::engine::inner::Inner;
use crate::engine::wait::wait_on;
use crate::error::{Error, Result};
use crate::keys::{self, call_mark, semaphore_channel};
use crate::wire::{self, Marked};

/// A counting semaphore shared with Java services, in Redisson's `RSemaphore` layout: the key
/// `NAME` holds the number of available permits as a plain integer, and every release publishes
/// the new number on `redisson_sc:{NAME}`. A Rust [`acquire`](Self::acquire) and a Java
/// `RSemaphore.acquire` on one name draw from the same permits and wake each other.
///
/// Permits are taken as a [`Permits`] guard, given back by [`Permits::release`] or, when the guard
/// is dropped, in the background. Waiters are woken by release messages, never by polling; the
/// semaphore is not fair (whoever asks when permits are free gets them).
///
/// # Permits of a crashed holder do not come back
/// Like Redisson's, this semaphore keeps no record of who holds its permits: a process that dies
/// (or a guard that is [`forget`](Permits::forget)-ed) while holding permits never returns them,
/// and nothing can tell them apart from permits in use. Where a holder may crash, use a semaphore
/// whose permits expire (Redisson's `RPermitExpirableSemaphore`), or give the key a TTL yourself.
/// What fairlock does guarantee is that its own failures leave nothing taken: an acquire whose
/// reply is lost, or whose future is dropped mid-flight, is settled so that its permits come back
/// (as long as Redis answers again within the settle window, a few seconds; see PROTOCOL 11).
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let slots = client.semaphore("render-slots");
/// slots.try_set_permits(4).await?; // only the first caller's count counts
/// if let Some(permits) = slots.try_acquire(1, Duration::from_secs(2)).await? {
///     // ... at most four of these run at once, Java's included ...
///     permits.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[doc(alias = "RSemaphore")]
#[must_use = "a semaphore handle does nothing until one of its methods is called"]
pub struct Semaphore {
    core: Named,
}

impl Semaphore {
    pub(crate) fn new(inner: Arc<Inner>, name: String) -> Self {
        let channel = semaphore_channel(&name);
        Semaphore {
            core: Named::new(inner, name, channel),
        }
    }

    /// The semaphore's name (also the Redis key of its count).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    fn check(&self) -> Result<()> {
        self.core.check(keys::validate)
    }

    /// Sets the number of permits when the semaphore does not exist yet, and tells waiters
    /// (Redisson's `trySetPermits`). `Ok(false)`: it existed; nothing was changed.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one atomic script; dropped, it either ran or did not.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.check()?;
        self.core.set_permits(permits).await
    }

    /// Adds `delta` permits (negative: removes them, the count may go below zero as in
    /// Redisson), creating the semaphore at `delta` when it does not exist, and tells waiters.
    /// Returns the new number of available permits. A resend after a lost reply is applied once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero `delta` or a count that would overflow a Redis
    /// integer; [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: each send is one atomic marked script; dropped mid-flight, the change is
    /// made at most once (or not at all).
    pub async fn add_permits(&self, delta: i64) -> Result<i64> {
        self.check()?;
        self.core.add_permits(delta).await
    }

    /// The number of permits available now (0 when the semaphore does not exist; negative when
    /// more were removed than were free).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`] (also when the key holds
    /// something other than a number).
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    pub async fn available(&self) -> Result<i64> {
        self.check()?;
        let mut conn = self.core.inner.conn.clone();
        Ok(wire::semaphore::count(&mut conn, &self.core.name)
            .await?
            .unwrap_or(0))
    }

    /// Takes every available permit and returns how many there were (Redisson's
    /// `drainPermits`); the semaphore stays, at zero.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one atomic script; dropped, it either ran or did not (a drain whose reply is
    /// lost is not resent by this library). On a cluster, redis-rs sends a command again by
    /// itself after a dropped connection; a drain run twice that way answers 0 from its second
    /// run, though its first run took the permits.
    pub async fn drain(&self) -> Result<i64> {
        self.check()?;
        let mut conn = self.core.inner.conn.clone();
        wire::semaphore::drain(&mut conn, &self.core.name).await
    }

    /// Deletes the semaphore (its count); waiters keep waiting for permits to be set or
    /// released. `Ok(false)` when it did not exist.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one command.
    pub async fn delete(&self) -> Result<bool> {
        self.check()?;
        let mut conn = self.core.inner.conn.clone();
        Ok(wire::semaphore::delete(&mut conn, &[&self.core.name]).await? == 1)
    }

    /// Waits until `permits` permits are available and takes them, for as long as it takes.
    /// Woken by release messages (Java's too).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero permits; [`Error::InvalidName`], [`Error::Shutdown`]
    /// (also when the client shuts down while waiting), [`Error::Redis`] when attempts kept
    /// failing for one watchdog timeout (transient errors are retried, as `lock()` does), or at
    /// once for an error that is not transient (an attempt that may have taken permits gives them
    /// back first).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped while waiting, nothing is taken; dropped while an attempt is in
    /// flight, that attempt is settled in the background and any permits it took come back.
    pub async fn acquire(&self, permits: u32) -> Result<Permits> {
        match self.acquire_until(permits, None).await? {
            Some(p) => Ok(p),
            None => unreachable!("an acquire without a deadline ends only with permits"),
        }
    }

    /// Takes `permits` permits when they become available within `wait` (`Duration::ZERO`: one
    /// attempt, no waiting); `Ok(None)` when they did not.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), except that transient errors are retried only until the
    /// wait ran out; and [`Error::InvalidArgument`] for a `wait` too long for this platform's
    /// clock.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, permits: u32, wait: Duration) -> Result<Option<Permits>> {
        let deadline = Instant::now()
            .checked_add(wait)
            .ok_or_else(|| Error::invalid_argument("wait", "too long"))?;
        self.acquire_until(permits, Some(deadline)).await
    }

    async fn acquire_until(
        &self,
        permits: u32,
        deadline: Option<Instant>,
    ) -> Result<Option<Permits>> {
        self.check()?;
        if permits == 0 {
            return Err(Error::invalid_argument("permits", "must be at least 1"));
        }
        let inner = &self.core.inner;
        let call = crate::metrics::Call::start(
            "semaphore",
            &self.core.name,
            inner.config.metrics_lock_names,
        );
        let taken = wait_on(
            inner,
            &self.core.channel,
            Some(permits.into()),
            deadline,
            || async { Ok(self.attempt(permits).await?.into()) },
        )
        .await;
        call.end(&taken);
        Ok(taken?.map(|mark| Permits {
            semaphore: self.clone(),
            permits,
            mark: Some(mark),
        }))
    }

    /// One acquire attempt under a fresh mark: the mark when the permits were taken.
    async fn attempt(&self, permits: u32) -> Result<Option<String>> {
        let mark = call_mark(&self.core.name, &call_id(&self.core.inner));
        let mut conn = self.core.inner.conn.clone();
        let started = Instant::now();
        // From the send on, a drop settles the attempt in the background.
        let mut unsettled = Unsettled {
            semaphore: Some(self.clone()),
            mark: &mark,
            permits,
            started,
        };
        let reply = wire::semaphore::acquire(
            &mut conn,
            &self.core.name,
            &mark,
            permits,
            mark_ms(&self.core.inner),
        )
        .await;
        match reply {
            Ok(1) => {
                unsettled.semaphore = None;
                Ok(Some(mark.clone()))
            }
            Ok(0 | -1) => {
                unsettled.semaphore = None;
                Ok(None)
            }
            Ok(other) => {
                unsettled.semaphore = None;
                Err(Error::bad_reply("semaphore acquire", other))
            }
            Err(e) => {
                // The outcome is unknown: settle it before reporting the failure. `unsettled`
                // stays armed until the settle is answered: a caller that stops waiting during it
                // leaves the settle to the background (safe to send any number of times), never
                // half done with the permits still taken.
                let semaphore = unsettled.semaphore.clone().expect("still unsettled");
                let settled = semaphore.give_back(&mark, permits, started).await;
                unsettled.semaphore = None;
                if let Err(again) = settled {
                    tracing::warn!(
                        name = %self.core.name,
                        error = %crate::error::chain(&again),
                        "could not settle a semaphore acquire whose reply was lost; if it took \
                         permits, they stay taken"
                    );
                }
                Err(e)
            }
        }
    }

    /// Settles the acquire of `mark`: gives its permits back if it took them, voids it if it
    /// has not run. Resent within the settle window.
    async fn give_back(&self, mark: &str, permits: u32, started: Instant) -> Result<bool> {
        let given: i64 = self
            .core
            .marked(
                Marked::SemaphoreGiveBack,
                mark,
                Some(permits.into()),
                started,
            )
            .await?;
        Ok(given == 1)
    }

    /// Returns `permits` permits taken without a guard (by [`Permits::forget`], or by a Java
    /// client's `acquire`) and tells waiters; returns the new number available. Nothing checks
    /// that they were taken: as in Redisson, releasing more than was taken raises the count.
    /// A resend after a lost reply is applied once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero permits or a count that would overflow;
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: each send is one atomic marked script; dropped mid-flight, the permits are
    /// returned at most once (or not at all).
    pub async fn release(&self, permits: u32) -> Result<i64> {
        self.check()?;
        if permits == 0 {
            return Err(Error::invalid_argument("permits", "must be at least 1"));
        }
        let mark = call_mark(&self.core.name, &call_id(&self.core.inner));
        self.release_marked(&mark, permits, Instant::now())
            .await
            .map_err(|e| overflow_as_argument("permits", e))
    }

    /// Releases under `mark` (resent within the settle window): the number available after it
    /// (when an earlier send had done it, the number available now). Negative counts included.
    async fn release_marked(&self, mark: &str, permits: u32, started: Instant) -> Result<i64> {
        let (_released, now): (i64, i64) = self
            .core
            .marked(
                Marked::SemaphoreRelease,
                mark,
                Some(permits.into()),
                started,
            )
            .await?;
        Ok(now)
    }
}

/// The count's own operations, shared with the [`ExpirableSemaphore`](crate::ExpirableSemaphore)
/// (its available count is the same plain integer with the same channel).
impl Named {
    /// `trySetPermits`: sets the count when the key does not exist, and tells waiters.
    pub(super) async fn set_permits(&self, permits: u32) -> Result<bool> {
        let mut conn = self.inner.conn.clone();
        wire::semaphore::set_permits(&mut conn, &self.name, &self.channel, permits).await
    }

    /// `addPermits`, marked (applied once however often it is resent): the new count.
    pub(super) async fn add_permits(&self, delta: i64) -> Result<i64> {
        if delta == 0 {
            return Err(Error::invalid_argument("delta", "must not be zero"));
        }
        let mark = call_mark(&self.name, &call_id(&self.inner));
        let reply: (i64, i64) = self
            .marked(
                Marked::SemaphoreAddPermits,
                &mark,
                Some(delta),
                Instant::now(),
            )
            .await
            .map_err(|e| overflow_as_argument("delta", e))?;
        Ok(reply.1)
    }
}

/// An acquire attempt sent but not yet answered: dropped while `semaphore` is set, it settles
/// the attempt in the background.
struct Unsettled<'a> {
    semaphore: Option<Semaphore>,
    mark: &'a str,
    permits: u32,
    started: Instant,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        let Some(semaphore) = self.semaphore.take() else {
            return;
        };
        // No I/O here: the driver runs it.
        let (mark, permits, started) = (self.mark.to_owned(), self.permits, self.started);
        let inner = semaphore.core.inner.clone();
        inner.in_background(async move {
            if let Err(e) = semaphore.give_back(&mark, permits, started).await {
                tracing::warn!(
                    name = %semaphore.core.name,
                    error = %crate::error::chain(&e),
                    "could not settle a dropped semaphore acquire; if it took permits, they stay taken"
                );
            }
        });
    }
}

/// Permits taken from a [`Semaphore`]. Give them back with [`release`](Self::release); a guard
/// dropped without it releases them in the background (best effort: a process that exits first
/// leaves them taken). [`forget`](Self::forget) keeps them taken on purpose.
#[derive(Debug)]
#[must_use = "dropping the permits releases them at once"]
pub struct Permits {
    semaphore: Semaphore,
    permits: u32,
    /// The acquire's mark; `None` once released or forgotten.
    mark: Option<String>,
}

impl Permits {
    /// How many permits this guard holds.
    pub fn count(&self) -> u32 {
        self.permits
    }

    /// The semaphore they were taken from.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    /// Gives the permits back and tells waiters; returns the number available after it. Sent
    /// under the acquire's mark, so a resend after a lost reply returns them once.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis could not be reached within the settle window (the guard is
    /// gone; the permits may stay taken); [`Error::Shutdown`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropped mid-flight, the release goes on in the background under the same
    /// mark, so the permits come back exactly once.
    pub async fn release(mut self) -> Result<i64> {
        let Some(mark) = self.mark.clone() else {
            return Ok(0);
        };
        let now = self
            .semaphore
            .release_marked(&mark, self.permits, Instant::now())
            .await;
        // Sent and answered (or failed within the window): nothing for Drop to do.
        self.mark = None;
        now
    }

    /// Keeps the permits taken: nobody gives them back (release them later with
    /// [`Semaphore::release`]).
    pub fn forget(mut self) {
        self.mark = None;
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        let Some(mark) = self.mark.take() else {
            return;
        };
        // No I/O here: the driver runs it.
        let semaphore = self.semaphore.clone();
        let permits = self.permits;
        let inner = semaphore.core.inner.clone();
        inner.in_background(async move {
            if let Err(e) = semaphore
                .release_marked(&mark, permits, Instant::now())
                .await
            {
                tracing::warn!(
                    name = %semaphore.core.name,
                    error = %crate::error::chain(&e),
                    "could not release dropped permits"
                );
            }
        });
    }
}
