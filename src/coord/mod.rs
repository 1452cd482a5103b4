//! Coordination primitives other than locks, in Redisson's layouts: the
//! [`Semaphore`](crate::Semaphore) (`RSemaphore`), the
//! [`ExpirableSemaphore`](crate::ExpirableSemaphore) (`RPermitExpirableSemaphore`) and the
//! [`CountDownLatch`](crate::CountDownLatch) (`RCountDownLatch`).
//!
//! What they share lives here:
//! * **The handle** ([`Named`]): client, name, channel, the name check, and the one way a marked
//!   count change is sent and resent.
//! * **Call marks** (`{NAME}:fairlock_call:<call id>`, PROTOCOL 11): a write that is not
//!   idempotent (take permits, give them back, add permits, count down) records its call id in a
//!   short-lived string in the name's slot, so the outcome of a call whose reply was lost can be
//!   learnt, and a resend is applied at most once. A mark lives [`mark_ms`]; every retry of a
//!   call stops well within that ([`settle_window`]).
//! * **Waiting** ([`wait_on`]): a latch's waiter re-checks after every message on its channel
//!   (the subscriber's broadcast side: all waiters of this client wake); a semaphore's waiter
//!   sleeps in line with the permits it needs and is woken only when a message's count can serve
//!   it (`conn/subscriber/sleepers.rs`); otherwise they sleep. A message can only be lost with
//!   the connection, whose reconnect wakes every waiter, and as a last resort a waiter looks
//!   again every [`RECHECK`].
//!
//! This module must never resend a write without its mark.

pub(crate) mod latch;
pub(crate) mod permits;
pub(crate) mod semaphore;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::inner::Inner;
use crate::error::{Error, Result};
use crate::wire;

/// How often a waiter looks again when no message came: a bound on the latency a lost message
/// could cost (messages are lost only with the connection, whose reconnect wakes everyone).
pub(crate) const RECHECK: Duration = Duration::from_secs(5);

/// A new call id, unique across clients: `<client uuid>:<n>`.
pub(crate) fn call_id(inner: &Inner) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{}:{}", inner.uuid, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// How long a call mark lives (ms): [`Inner::mark_ms`].
pub(crate) fn mark_ms(inner: &Inner) -> i64 {
    inner.mark_ms()
}

/// How long a call's resends may go on after its first send: [`Inner::settle_window`].
pub(crate) fn settle_window(inner: &Inner) -> Duration {
    inner.settle_window()
}

/// Sends `call` until it gets a reply, pausing between sends after transient failures, for at
/// most the settle window from `started`; the last error when it never got one.
///
/// `call` must be idempotent (a marked call).
pub(crate) async fn resend<T, F, Fut>(inner: &Inner, started: Instant, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let until = started + settle_window(inner);
    let mut tries = 0u32;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() => {
                tries += 1;
                let pause = crate::retry::retry_backoff(tries);
                if Instant::now() + pause >= until {
                    return Err(e);
                }
                tokio::time::sleep(pause).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The handle of a counting kind (a semaphore, a latch): the client, the name (the key of the
/// count) and the channel its changes are published on.
#[derive(Clone, Debug)]
pub(crate) struct Named {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: Arc<str>,
    pub(crate) channel: Arc<str>,
}

impl Named {
    pub(crate) fn new(inner: Arc<Inner>, name: String, channel: String) -> Self {
        Named {
            inner,
            name: name.into(),
            channel: channel.into(),
        }
    }

    /// Refuses a call on a client that shut down, or on a name `validate` refuses (before any
    /// I/O).
    pub(crate) fn check(&self, validate: fn(&str, bool) -> Result<()>) -> Result<()> {
        self.inner.check_open()?;
        validate(&self.name, self.inner.conn.is_cluster())
    }

    /// Runs a marked write that changes the count and tells waiters, resent under `mark`
    /// within the settle window from `started`, so it is applied at most once (see
    /// [`wire::marked`]).
    pub(crate) async fn marked<T: redis::FromRedisValue>(
        &self,
        write: wire::Marked,
        mark: &str,
        lead: Option<i64>,
        started: Instant,
    ) -> Result<T> {
        resend(&self.inner, started, || {
            let mut conn = self.inner.conn.clone();
            async move {
                wire::marked(
                    &mut conn,
                    write,
                    &self.name,
                    mark,
                    lead,
                    mark_ms(&self.inner),
                    &self.channel,
                )
                .await
            }
        })
        .await
    }
}

/// What one look found: the value waited for, or not yet (with, perhaps, when something will
/// change unannounced: an expiring permit).
pub(crate) enum Look<T> {
    Ready(T),
    NotYet(Option<Duration>),
    /// Not yet, and do not look again before this pause is over, whatever messages come (the
    /// attempt gave back what it took, which publishes a count the waiter would answer at once).
    Backoff(Duration),
}

impl<T> From<Option<T>> for Look<T> {
    fn from(found: Option<T>) -> Self {
        match found {
            Some(v) => Look::Ready(v),
            None => Look::NotYet(None),
        }
    }
}

/// Runs `attempt` until it yields a value, waking on every message on `channel` (or when the
/// attempt said something changes unannounced); `None` once `deadline` passed (a final attempt
/// is made at it). With no deadline it waits for ever. One
/// attempt before subscribing (unless the channel is live already); after subscribing, every
/// attempt is preceded by reading the channel's message count, so a message that comes between
/// an attempt and the sleep is never missed.
///
/// A transient failure of an attempt is retried (with backoff) until the deadline, or without
/// one for one watchdog timeout, as a lock call does; then its error is returned.
///
/// Cancel safe as far as this loop goes: it holds nothing but the subscription, which a drop
/// gives back. (The attempts settle their own writes.)
pub(crate) async fn wait_on<T, F, Fut>(
    inner: &Inner,
    channel: &str,
    need: Option<u64>,
    deadline: Option<Instant>,
    mut attempt: F,
) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Look<T>>>,
{
    let passed = |deadline: Option<Instant>| deadline.is_some_and(|d| Instant::now() >= d);
    let subscription = match inner.subscriber.subscribe_if_live(channel) {
        Some(live) => live,
        None => {
            match attempt().await {
                Ok(Look::Ready(v)) => return Ok(Some(v)),
                // (The first subscribed attempt comes a subscription's round trip later.)
                Ok(Look::NotYet(_) | Look::Backoff(_)) => {}
                // Retried below, subscribed (within the deadline).
                Err(e) if e.is_transient() && !passed(deadline) => {}
                Err(e) => return Err(e),
            }
            if passed(deadline) {
                return Ok(None);
            }
            let subscribe = inner.subscriber.subscribe(channel.to_owned());
            match deadline {
                Some(d) => match tokio::time::timeout_at(d, subscribe).await {
                    Ok(s) => s?,
                    // Out of time before the subscription was confirmed: one last look.
                    Err(_) => {
                        return Ok(match attempt().await? {
                            Look::Ready(v) => Some(v),
                            Look::NotYet(_) | Look::Backoff(_) => None,
                        })
                    }
                },
                None => subscribe.await?,
            }
        }
    };
    let mail = subscription.mail().clone();
    // A semaphore's waiter takes its place in line before its first attempt here, so a count
    // published from then on either wakes it or is counted against a waiter that will look.
    let slot = need.and_then(|n| Some(mail.sleepers()?.join(n)));
    let mut closed = inner.closed.subscribe();
    // Since when attempts fail with transient errors, and how many in a row.
    let mut failing: Option<(Instant, u32)> = None;
    loop {
        inner.check_open()?;
        let seen = mail.seq();
        if let Some(slot) = &slot {
            slot.begin();
        }
        let looked = attempt().await;
        // A semaphore's waiter looks again at once when a count was charged to it while the
        // attempt ran (a message nobody charged it with woke the waiters that answer for it);
        // a latch's waiter when any message came meanwhile (checked below, once registered).
        let charged = slot.as_ref().is_some_and(|slot| slot.spent());
        let recheck = match looked {
            Ok(Look::Ready(v)) => {
                if let Some(slot) = slot {
                    slot.leave(charged);
                }
                return Ok(Some(v));
            }
            Ok(Look::NotYet(hint)) => {
                failing = None;
                hint.map_or(RECHECK, |h| h.clamp(Duration::from_millis(1), RECHECK))
            }
            Ok(Look::Backoff(pause)) => {
                failing = None;
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(None);
                }
                let nap = deadline.map_or(pause, |d| (d - now).min(pause));
                tokio::select! {
                    _ = tokio::time::sleep(nap) => {}
                    _ = closed.wait_for(|c| *c) => return Err(Error::Shutdown),
                }
                continue;
            }
            Err(e) if e.is_transient() => {
                // As a lock call does: ride out an outage until the deadline, or for one
                // watchdog timeout without one; the attempt settled its own writes.
                let (since, tries) = failing.get_or_insert((Instant::now(), 0));
                *tries += 1;
                let out_of_time = match deadline {
                    Some(d) => Instant::now() >= d,
                    None => since.elapsed() >= inner.config.watchdog_timeout,
                };
                if out_of_time {
                    return Err(e);
                }
                crate::retry::retry_backoff(*tries)
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        // A latch's waiter registers on the broadcast side before it compares; a semaphore's
        // sleeps on its slot (registered once, before its first attempt) and needs neither.
        let woken = slot.is_none().then(|| mail.readers().notified());
        tokio::pin!(woken);
        if let Some(w) = woken.as_mut().as_pin_mut() {
            w.enable();
        }
        if charged || (slot.is_none() && mail.seq() != seen) {
            continue;
        }
        let nap = deadline.map_or(recheck, |d| (d - now).min(recheck));
        let called = async {
            match (&slot, woken.as_mut().as_pin_mut()) {
                (Some(slot), _) => slot.woken().await,
                (None, Some(w)) => w.await,
                (None, None) => {
                    unreachable!("a waiter without a slot registers on the broadcast side")
                }
            }
        };
        tokio::select! {
            () = called => {}
            _ = tokio::time::sleep(nap) => {}
            _ = closed.wait_for(|c| *c) => return Err(Error::Shutdown),
        }
    }
}

/// Checks a permit or count argument: at least one, at most what Redis's integers hold.
pub(crate) fn positive(argument: &'static str, value: u64) -> Result<i64> {
    if value == 0 {
        return Err(Error::invalid_argument(argument, "must be at least 1"));
    }
    i64::try_from(value)
        .map_err(|_| Error::invalid_argument(argument, format!("{value} is beyond i64::MAX")))
}

/// A Redis error saying an integer would overflow, as the invalid argument it stems from.
pub(crate) fn overflow_as_argument(argument: &'static str, e: Error) -> Error {
    match &e {
        Error::Redis(re) if re.to_string().contains("overflow") => Error::invalid_argument(
            argument,
            "the count in Redis would go beyond what a Redis integer holds",
        ),
        _ => e,
    }
}
