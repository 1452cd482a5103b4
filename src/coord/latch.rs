//! [`CountDownLatch`]: a count-down latch in Redisson's `RCountDownLatch` layout (PROTOCOL 12).
//!
//! Invariants, and where they are enforced:
//! * A count-down is applied once per call: `latch_count_down.lua` records the call's mark, and
//!   a resend after a lost reply finds it.
//! * A waiter never misses the opening: it reads the channel's message count before each look at
//!   the count (`engine/wait.rs`).
//! * On a cluster, a name whose channel would hash to another slot is refused before any I/O
//!   (`keys::check_latch_name`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::common::{call_id, positive, Named};
use crate::engine::inner::Inner;
use crate::engine::wait::wait_on;
use crate::error::{Error, Result};
use crate::keys::{self, call_mark, count_down_channel};
use crate::wire::{self, Marked};

/// A count-down latch shared with Java services, in Redisson's `RCountDownLatch` layout: the key
/// `NAME` holds the count (deleted when it reaches zero), and the channel
/// `redisson_countdownlatch__channel__{NAME}` carries `0` when it opens (counted down to zero, or
/// deleted by fairlock) and `1` when it is set. Java's `await` and ours on one name open
/// together, whichever side counts down.
///
/// A latch that does not exist counts zero: [`wait`](Self::wait) returns at once. Set it first
/// with [`try_set_count`](Self::try_set_count).
///
/// **On a cluster**, the name must not contain braces: Redisson always wraps the whole name in
/// braces for the channel, so a hash-tagged name's channel lands in another slot (Redisson's own
/// scripts fail there). Such a name gets [`Error::InvalidName`] before any I/O.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let ready = client.count_down_latch("warmup");
/// ready.try_set_count(3).await?;
/// // ... three workers each call `ready.count_down().await?` when done ...
/// if ready.wait_timeout(Duration::from_secs(30)).await? {
///     // every worker is done
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[doc(alias = "RCountDownLatch")]
#[must_use = "a latch handle does nothing until one of its methods is called"]
pub struct CountDownLatch {
    core: Named,
}

impl CountDownLatch {
    pub(crate) fn new(inner: Arc<Inner>, name: String) -> Self {
        let channel = count_down_channel(&name);
        CountDownLatch {
            core: Named::new(inner, name, channel),
        }
    }

    /// The latch's name (also the Redis key of its count).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    fn check(&self) -> Result<()> {
        self.core.check(keys::validate_latch)
    }

    /// Sets the count when the latch does not exist (Redisson's `trySetCount`), closing it for
    /// waiters; `Ok(false)` when it existed (nothing changed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero count (a latch at zero is open and does not exist)
    /// or one beyond `i64::MAX`; [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one atomic script; dropped, it either ran or did not.
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        self.check()?;
        let count = positive("count", count)?;
        let mut conn = self.core.inner.conn.clone();
        wire::latch::set_count(&mut conn, &self.core.name, &self.core.channel, count).await
    }

    /// Counts down by one and returns the count left (0: the latch is open, its key deleted and
    /// waiters told). Counting down a latch that does not exist does nothing, as in Redisson. A
    /// resend after a lost reply counts once; `Ok(0)` also when that resend found its first send
    /// done (the count is then read again by [`count`](Self::count)).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`] when Redis could not be
    /// reached within the settle window (the count-down then happened at most once).
    ///
    /// # Cancel safety
    /// Cancel safe: each send is one atomic marked script; dropped mid-flight, the latch is
    /// counted down at most once.
    pub async fn count_down(&self) -> Result<u64> {
        self.check()?;
        let mark = call_mark(&self.core.name, &call_id(&self.core.inner));
        let left: i64 = self
            .core
            .marked(Marked::LatchCountDown, &mark, None, Instant::now())
            .await?;
        if left < 0 {
            return self.count().await;
        }
        Ok(left as u64)
    }

    /// The current count (0 when the latch does not exist, i.e. is open).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`] (also when the key holds
    /// something other than a number).
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    pub async fn count(&self) -> Result<u64> {
        self.check()?;
        let mut conn = self.core.inner.conn.clone();
        let value = wire::semaphore::count(&mut conn, &self.core.name).await?;
        Ok(value.unwrap_or(0).max(0) as u64)
    }

    /// Deletes the latch and tells its waiters, which then find it open (a missing latch counts
    /// zero) and return, Java's included: the delete publishes `0` ("opened"), the message
    /// Redisson's waiters re-read the count on. (Redisson's own `delete` publishes `1`, on which
    /// a Java `await()` keeps waiting: for ever without a timeout, while ours still return.)
    /// `Ok(false)` when it did not exist.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one atomic script.
    pub async fn delete(&self) -> Result<bool> {
        self.check()?;
        let mut conn = self.core.inner.conn.clone();
        wire::latch::delete(&mut conn, &self.core.name, &self.core.channel).await
    }

    /// Waits until the count reaches zero (or the latch is deleted), for as long as it takes.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`] (also when the client shuts down while
    /// waiting), [`Error::Redis`] when looks at the count kept failing for one watchdog timeout
    /// (`wait_timeout`: until its timeout ran out), or at once for an error that is not
    /// transient.
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await.map(|_| ())
    }

    /// Waits at most `timeout` for the count to reach zero: `Ok(true)` when it did,
    /// `Ok(false)` when time ran out (`Duration::ZERO`: one look).
    ///
    /// # Errors
    /// As [`wait`](Self::wait), and [`Error::InvalidArgument`] for a `timeout` too long for this
    /// platform's clock.
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now()
            .checked_add(timeout)
            .ok_or_else(|| Error::invalid_argument("timeout", "too long"))?;
        self.wait_until(Some(deadline)).await
    }

    async fn wait_until(&self, deadline: Option<Instant>) -> Result<bool> {
        self.check()?;
        let call = crate::metrics::Call::start(
            "latch",
            &self.core.name,
            self.core.inner.config.metrics_lock_names,
        );
        let open = wait_on(
            &self.core.inner,
            &self.core.channel,
            None,
            deadline,
            || async { Ok((self.count().await? == 0).then_some(()).into()) },
        )
        .await;
        call.end(&open);
        Ok(open?.is_some())
    }
}
