//! [`ExpirableSemaphore`]: a semaphore whose permits expire, in Redisson's
//! `RPermitExpirableSemaphore` layout (PROTOCOL 11), and [`ExpirablePermits`], the guard of
//! permits taken from it, renewed by the client's watchdog when taken without a lease.
//!
//! Invariants, and where they are enforced:
//! * Each permit is one member of `{NAME}:timeout` (its raw 16-byte id, scored by its expiry on
//!   the server's clock); `permit_acquire.lua` takes permits only when that many are available,
//!   and a resend of it (same ids) finds its first id and takes nothing more.
//! * An acquire whose reply is lost is resent with the same ids until it is answered; one
//!   abandoned (dropped mid-flight, or never answered) is released by id, in the background when
//!   dropped. Should the abandoned send still arrive after that release, its permits are taken by
//!   nobody and come back when their lease ends: never later than one lease.
//! * A watchdog permit is renewed every third of the watchdog timeout by the client's driver
//!   (batched with every other guard due in the same tick); a renewal that finds one of its ids
//!   gone, two failed renewals in a row, or a lease that ran out without renewal, mark the guard
//!   lost. Renewal stops when the guard is released or dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::common::{resend, Named};
use crate::engine::inner::Inner;
use crate::engine::permit::PermitLease;
use crate::engine::validity::{validity_deadline, LostReason};
use crate::engine::wait::{wait_on, Look};
use crate::error::{Error, Result};
use crate::keys::{self, permit_expiries, semaphore_channel};
use crate::wire::{self, permits::PermitKeys};

/// A semaphore whose permits expire, shared with Java services in Redisson's
/// `RPermitExpirableSemaphore` layout: `NAME` holds the available count, `{NAME}:timeout` (a
/// sorted set) every permit in use by its 16-byte id with its expiry, and releases publish on
/// `redisson_sc:{NAME}`. Java and Rust draw from the same permits; a permit's id, as
/// [`ExpirablePermits::ids`] shows it (32 hex digits), is what Java's `release(id)` takes.
///
/// Unlike [`Semaphore`](crate::Semaphore), a crashed holder's permits come back: each permit
/// expires at its lease. Taken **without a lease**, a permit is renewed by the client's watchdog
/// (every third of [`watchdog_timeout`](crate::Builder::watchdog_timeout)) for as long as its
/// guard lives, and so comes back one watchdog timeout after its process died; taken with a lease,
/// it is never renewed. Redisson has no such renewal (its permits without a lease never expire).
/// Either way the guard is told when its permits are lost ([`ExpirablePermits::lost`]).
///
/// # Clocks
/// fairlock's scripts decide expiries on the Redis server's clock. Redisson's decide them on the
/// clock of the Java client that runs them: a Java client whose clock runs ahead of the server's
/// by *d* reclaims our permits *d* early (and ours reclaim its permits late by as much when it
/// runs behind). Keep the Java hosts' clocks synchronised, or leave a margin in the lease.
///
/// Permits are reclaimed lazily, as in Redisson: an expired permit comes back when the next
/// acquire (or [`available`](Self::available)) runs. A waiter whose acquire found none free
/// looks again at the earliest expiry, so it never waits on a message that nobody will send.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// use std::time::Duration;
/// let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
/// let slots = client.expirable_semaphore("gpu-slots");
/// slots.try_set_permits(2).await?;
/// let permit = slots.acquire(1, None).await?; // renewed while held
/// tokio::select! {
///     _ = async { /* the work */ } => {}
///     reason = permit.lost() => eprintln!("permit lost: {reason}"),
/// }
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[doc(alias = "RPermitExpirableSemaphore")]
#[must_use = "a semaphore handle does nothing until one of its methods is called"]
pub struct ExpirableSemaphore {
    /// The available count: the same plain integer and channel as a [`Semaphore`]'s.
    core: Named,
    expiries: Arc<str>,
}

impl ExpirableSemaphore {
    /// The most permits one call takes (or one guard holds): 65,536. Each permit is an id of its
    /// own that every acquire, renewal and release of the guard sends, so a larger count is
    /// refused with [`Error::InvalidArgument`] before anything is allocated or sent. Every count
    /// up to it can be acquired, renewed and released.
    pub const MAX_PERMITS: u32 = 65_536;

    pub(crate) fn new(inner: Arc<Inner>, name: String) -> Self {
        let (expiries, channel) = (permit_expiries(&name).into(), semaphore_channel(&name));
        ExpirableSemaphore {
            core: Named::new(inner, name, channel),
            expiries,
        }
    }

    /// The semaphore's name (also the Redis key of its available count).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    fn check(&self) -> Result<()> {
        self.core.check(keys::validate)
    }

    /// Sets the number of available permits when the semaphore does not exist yet, and tells
    /// waiters (Redisson's `trySetPermits`); `Ok(false)` when it existed.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one atomic script.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.check()?;
        self.core.set_permits(permits).await
    }

    /// Adds `delta` available permits (negative: removes them) and tells waiters; returns the new
    /// available count. A resend after a lost reply is applied once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero `delta` or a count that would overflow;
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: the change is made at most once.
    pub async fn add_permits(&self, delta: i64) -> Result<i64> {
        self.check()?;
        self.core.add_permits(delta).await
    }

    /// Reclaims expired permits (as Redisson's `availablePermits` does), then returns how many
    /// are available.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one atomic script (a reclaim it made stays made).
    pub async fn available(&self) -> Result<i64> {
        Ok(self.counts().await?.0)
    }

    /// Reclaims expired permits, then returns how many are in use (Redisson's
    /// `acquiredPermits`).
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one atomic script.
    pub async fn acquired(&self) -> Result<u64> {
        Ok(self.counts().await?.1)
    }

    /// Deletes the semaphore, its count and every permit in use (as Redisson's `delete`): the
    /// guards of those permits are told they are lost at their next renewal. `Ok(false)` when
    /// there was nothing to delete.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: one command.
    pub async fn delete(&self) -> Result<bool> {
        self.check()?;
        let mut conn = self.core.inner.conn.clone();
        let deleted =
            wire::semaphore::delete(&mut conn, &[&self.core.name, &self.expiries]).await?;
        Ok(deleted > 0)
    }

    async fn counts(&self) -> Result<(i64, u64)> {
        self.check()?;
        let mut conn = self.core.inner.conn.clone();
        wire::permits::counts(&mut conn, self.keys()).await
    }

    /// Waits until `permits` permits are available and takes them, for as long as it takes.
    /// `lease`: `None` renews them by the watchdog while the guard lives; `Some(d)` lets them
    /// expire `d` after they were taken.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero permits, more than [`MAX_PERMITS`](Self::MAX_PERMITS)
    /// or a bad lease; [`Error::InvalidName`],
    /// [`Error::Shutdown`], [`Error::Redis`] when attempts kept failing for one watchdog timeout
    /// (transient errors are retried, as `lock()` does; `try_acquire`: until its wait ran out),
    /// or at once for an error that is not transient (anything an attempt took is released
    /// first).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped while waiting, nothing is taken; dropped while an attempt is in
    /// flight, its ids are released in the background (should that attempt still arrive later,
    /// its permits come back at their lease).
    pub async fn acquire(&self, permits: u32, lease: Option<Duration>) -> Result<ExpirablePermits> {
        match self.acquire_until(permits, None, lease).await? {
            Some(p) => Ok(p),
            None => unreachable!("an acquire without a deadline ends only with permits"),
        }
    }

    /// Takes `permits` permits when they become available within `wait` (`Duration::ZERO`: one
    /// attempt); `Ok(None)` when they did not. `lease` as for [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(
        &self,
        permits: u32,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<ExpirablePermits>> {
        let deadline = Instant::now()
            .checked_add(wait)
            .ok_or_else(|| Error::invalid_argument("wait", "too long"))?;
        self.acquire_until(permits, Some(deadline), lease).await
    }

    /// Releases one permit by its id (32 hex digits, as [`ExpirablePermits::ids`] and Redisson
    /// show them), whoever took it; `Ok(false)` when no such permit is in use (released already,
    /// or expired and reclaimed). For permits a Java client took, or a guard that was
    /// [`forget`](ExpirablePermits::forget)-ed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an id that is not 32 hex digits; [`Error::InvalidName`],
    /// [`Error::Shutdown`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: releasing by id is idempotent, and a send dropped in flight releases at most
    /// that permit.
    pub async fn release_id(&self, id: &str) -> Result<bool> {
        self.check()?;
        let raw = parse_id(id)?;
        Ok(self.release_ids(&[raw], Instant::now()).await? == 1)
    }

    async fn acquire_until(
        &self,
        permits: u32,
        deadline: Option<Instant>,
        lease: Option<Duration>,
    ) -> Result<Option<ExpirablePermits>> {
        self.check()?;
        if permits == 0 || permits > Self::MAX_PERMITS {
            return Err(Error::invalid_argument(
                "permits",
                format!(
                    "{permits} is not between 1 and {} (ExpirableSemaphore::MAX_PERMITS)",
                    Self::MAX_PERMITS
                ),
            ));
        }
        let lease = crate::engine::validity::Lease::new(lease)?;
        let lease_ms = lease.ttl_ms(self.core.inner.config.watchdog_timeout);
        let watchdog = lease.is_watchdog();
        let untrusted = std::sync::atomic::AtomicU32::new(0);
        let call = crate::metrics::Call::start(
            "expirable_semaphore",
            &self.core.name,
            self.core.inner.config.metrics_lock_names,
        );
        let taken = wait_on(
            &self.core.inner,
            &self.core.channel,
            Some(u64::from(permits)),
            deadline,
            || self.attempt(permits, lease_ms, &untrusted),
        )
        .await;
        call.end(&taken);
        Ok(taken?.map(|(ids, sent)| {
            let lease = Duration::from_millis(lease_ms as u64);
            let state = Arc::new(PermitLease::new(
                self.core.name.clone(),
                self.expiries.clone(),
                self.core.channel.clone(),
                ids,
                sent,
                lease,
                watchdog,
                self.core.inner.config.metrics_lock_names,
            ));
            self.core.inner.permits_taken(&state);
            if watchdog {
                self.core
                    .inner
                    .driver
                    .send(crate::engine::driver::Work::Permits(state.clone()));
            }
            ExpirablePermits {
                semaphore: self.clone(),
                state,
                done: false,
            }
        }))
    }

    /// One attempt under fresh ids, resent (same ids) after transient failures within the
    /// settle window. The ids and the send instant when the permits are ours.
    ///
    /// Permits whose lease, counted from the first send, ran out before the reply came (a slow
    /// reply, or a resend that found them taken by a send long before) are not handed out: they
    /// are released by id and the caller looks again after a backoff that grows with each such
    /// attempt (`untrusted` counts them), as a lock call does with a grant it cannot trust.
    async fn attempt(
        &self,
        permits: u32,
        lease_ms: i64,
        untrusted: &std::sync::atomic::AtomicU32,
    ) -> Result<Look<(Vec<[u8; 16]>, std::time::Instant)>> {
        let ids: Vec<[u8; 16]> = (0..permits)
            .map(|_| *uuid::Uuid::new_v4().as_bytes())
            .collect();
        let mut unsettled = Unsettled {
            semaphore: Some(self.clone()),
            ids: &ids,
        };
        let started = Instant::now();
        // The validity counts from the first send: a resend may find the permits taken by a
        // send that ran before it (its reply lost or late), at that earlier time.
        let sent = std::time::Instant::now();
        // Every send after the first may repeat one that ran (its reply lost), and so may the
        // first one's second run where the connection resends by itself (a cluster).
        let mut sends = 0u32;
        let reply: Result<(i64, i64)> = resend(&self.core.inner, started, || {
            let mut conn = self.core.inner.conn.clone();
            let ids = &ids;
            let again = sends > 0 || conn.may_run_twice();
            sends += 1;
            async move {
                wire::permits::acquire(&mut conn, self.keys(), permits, lease_ms, ids, again).await
            }
        })
        .await;
        let lease = Duration::from_millis(lease_ms as u64);
        match reply {
            Ok((1, _)) if validity_deadline(sent, lease) <= std::time::Instant::now() => {
                // Ours, but no longer to be trusted: given back (the guard stays armed until
                // the release is answered, as below).
                let semaphore = unsettled.semaphore.clone().expect("still unsettled");
                let released = semaphore.release_ids(&ids, Instant::now()).await;
                unsettled.semaphore = None;
                released?;
                let n = untrusted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                tracing::debug!(name = %self.core.name, "permits ran out before their reply came; given back");
                Ok(Look::Backoff(crate::retry::retry_backoff(n)))
            }
            Ok((1, _)) => {
                unsettled.semaphore = None;
                Ok(Look::Ready((ids.clone(), sent)))
            }
            Ok((_, hint)) => {
                unsettled.semaphore = None;
                Ok(Look::NotYet(
                    u64::try_from(hint).ok().map(Duration::from_millis),
                ))
            }
            Err(e) => {
                // Never answered: release what it may have taken. `unsettled` stays armed until
                // the release is answered: a caller that stops waiting during it leaves the
                // release to the background (releasing ids is idempotent), never half done.
                let semaphore = unsettled.semaphore.clone().expect("still unsettled");
                let released = semaphore.release_ids(&ids, Instant::now()).await;
                unsettled.semaphore = None;
                if let Err(again) = released {
                    tracing::warn!(
                        name = %self.core.name,
                        error = %crate::error::chain(&again),
                        "could not release the ids of an unanswered acquire; anything it took \
                         comes back at its lease"
                    );
                }
                Err(e)
            }
        }
    }

    /// Releases `ids` (resent within the settle window); how many were there.
    async fn release_ids(&self, ids: &[[u8; 16]], started: Instant) -> Result<i64> {
        resend(&self.core.inner, started, || {
            let mut conn = self.core.inner.conn.clone();
            async move { wire::permits::release(&mut conn, self.keys(), ids).await }
        })
        .await
    }

    /// The keys and channel the protocol works on.
    fn keys(&self) -> PermitKeys<'_> {
        PermitKeys {
            name: &self.core.name,
            expiries: &self.expiries,
            channel: &self.core.channel,
        }
    }
}

/// Reads a permit id as Redisson shows it: 32 hex digits.
fn parse_id(id: &str) -> Result<[u8; 16]> {
    let bad = || Error::invalid_argument("id", format!("{id:?} is not 32 hex digits"));
    // Hex digits only: `from_str_radix` alone would also take a sign ("+f").
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut raw = [0u8; 16];
    for (i, byte) in raw.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&id[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(raw)
}

/// A permit id as Redisson shows it: 32 lowercase hex digits.
fn show_id(raw: &[u8; 16]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// An acquire sent but not answered: dropped while `semaphore` is set, it releases the ids in
/// the background.
struct Unsettled<'a> {
    semaphore: Option<ExpirableSemaphore>,
    ids: &'a [[u8; 16]],
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if let Some(semaphore) = self.semaphore.take() {
            release_in_background(semaphore, self.ids.to_vec(), "a dropped acquire");
        }
    }
}

/// Releases `ids` from the client's driver (no I/O in `Drop`).
fn release_in_background(semaphore: ExpirableSemaphore, ids: Vec<[u8; 16]>, what: &'static str) {
    let inner = semaphore.core.inner.clone();
    inner.in_background(async move {
        if let Err(e) = semaphore.release_ids(&ids, Instant::now()).await {
            tracing::warn!(
                name = %semaphore.core.name,
                what,
                error = %crate::error::chain(&e),
                "could not release permits; they come back at their lease"
            );
        }
    });
}

/// Permits taken from an [`ExpirableSemaphore`]. Give them back with
/// [`release`](Self::release); a guard dropped without it releases them in the background (and
/// should that fail, they come back at their lease). Taken without a lease, they are renewed by
/// the client's watchdog while the guard lives.
#[derive(Debug)]
#[must_use = "dropping the permits releases them at once"]
pub struct ExpirablePermits {
    semaphore: ExpirableSemaphore,
    state: Arc<PermitLease>,
    done: bool,
}

impl ExpirablePermits {
    /// How many permits this guard holds.
    pub fn count(&self) -> usize {
        self.state.ids.len()
    }

    /// The permits' ids as Redisson shows them (32 hex digits each): a Java client's
    /// `release(id)` takes them.
    pub fn ids(&self) -> Vec<String> {
        self.state.ids.iter().map(show_id).collect()
    }

    /// Until when the permits can be trusted: their last grant or renewal's send time plus the
    /// lease, less a drift margin (as [`LockGuard::valid_until`](crate::LockGuard::valid_until)).
    /// Nobody else can reclaim them before it. Once they are known [lost](Self::lost), the
    /// deadline they had then or the moment the loss was found, whichever is earlier; a deadline
    /// that has passed is never moved on.
    pub fn valid_until(&self) -> std::time::Instant {
        self.state.valid_until()
    }

    /// Whether the permits are known to be lost (see [`lost`](Self::lost)); no I/O.
    pub fn is_lost(&self) -> bool {
        self.state.lost_now().is_some()
    }

    /// Resolves when the permits can no longer be trusted: a renewal found one gone
    /// ([`LostReason::Gone`]: it expired and was reclaimed, or was released by id elsewhere), two
    /// renewals in a row failed, or the lease ran out without a renewal
    /// ([`LostReason::LeaseExpired`] for a fixed lease). Pending for as long as they hold.
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> LostReason {
        self.state.lost().await
    }

    /// Gives the permits back and tells waiters; returns how many were still ours (fewer than
    /// [`count`](Self::count) when some expired and were reclaimed meanwhile). Safe to resend,
    /// and resent after transient failures within the settle window.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis could not be reached within the window (the permits then
    /// come back at their lease).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped mid-flight, the release goes on in the background (it is idempotent).
    pub async fn release(mut self) -> Result<usize> {
        self.state.end();
        let started = Instant::now();
        let semaphore = self.semaphore.clone();
        let released = semaphore.release_ids(&self.state.ids, started).await;
        self.done = true;
        let released = released?;
        if released as usize != self.state.ids.len() {
            tracing::debug!(name = %semaphore.core.name, released, "some permits had expired before the release");
        }
        Ok(released as usize)
    }

    /// Keeps the permits taken without renewing them: they come back at their lease unless
    /// released by id ([`ExpirableSemaphore::release_id`], or Java's `release(id)`).
    pub fn forget(mut self) {
        self.state.end();
        self.done = true;
    }
}

impl Drop for ExpirablePermits {
    fn drop(&mut self) {
        self.state.end();
        if !self.done {
            release_in_background(
                self.semaphore.clone(),
                self.state.ids.clone(),
                "dropped permits",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_id, show_id};

    #[test]
    fn ids_read_and_show_as_32_hex_digits() {
        let raw = parse_id("00ff10a0b1c2d3e4f5061728394a5b6c").unwrap();
        assert_eq!(raw[0], 0);
        assert_eq!(raw[1], 0xff);
        assert_eq!(show_id(&raw), "00ff10a0b1c2d3e4f5061728394a5b6c");
        assert_eq!(
            show_id(&parse_id("00FF10A0B1C2D3E4F5061728394A5B6C").unwrap()),
            "00ff10a0b1c2d3e4f5061728394a5b6c"
        );
        for bad in [
            "",
            "00ff",
            "zzff10a0b1c2d3e4f5061728394a5b6c",
            "é0ff10a0b1c2d3e4f5061728394a5b6",
            "+0ff10a0b1c2d3e4f5061728394a5b6c",
            "+f+f+f+f+f+f+f+f+f+f+f+f+f+f+f+f",
        ] {
            assert!(parse_id(bad).is_err(), "{bad}");
        }
    }
}
