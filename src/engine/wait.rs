//! Waiting for a count (a semaphore's permits, a latch's zero): the core that
//! [`Semaphore`](crate::Semaphore), [`ExpirableSemaphore`](crate::ExpirableSemaphore) and
//! [`CountDownLatch`](crate::CountDownLatch) wait through. A latch's waiter re-checks after every
//! message on its channel (the subscriber's broadcast side: all waiters of this client wake); a
//! semaphore's waiter sleeps in line with the permits it needs and is woken only when a
//! message's count can serve it (`conn/subscriber/sleepers.rs`); otherwise they sleep. A message
//! can only be lost with the connection, whose reconnect wakes every waiter, and as a last resort
//! a waiter looks again every [`RECHECK`]. Transient errors are ridden out by the rule lock calls
//! follow (`engine/outage.rs`).
//!
//! Lock calls wait differently (`engine/acquire/`): a fair waiter holds a place in a queue in
//! Redis, with heartbeats and direct grants, which a count has no use for.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::inner::Inner;
use crate::engine::outage::Outage;
use crate::error::{Error, Result};

/// How often a waiter looks again when no message came: a bound on the latency a lost message
/// could cost (messages are lost only with the connection, whose reconnect wakes everyone).
pub(crate) const RECHECK: Duration = Duration::from_secs(5);

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
    let mut closed = inner.helds.closed.subscribe();
    let mut outage: Option<Outage> = None;
    loop {
        inner.helds.check_open()?;
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
                outage = None;
                hint.map_or(RECHECK, |h| h.clamp(Duration::from_millis(1), RECHECK))
            }
            Ok(Look::Backoff(pause)) => {
                outage = None;
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
            // As a lock call does (`engine/outage.rs`): ride out an outage until the deadline,
            // or for one watchdog timeout without one; the attempt settled its own writes.
            Err(e) => crate::engine::outage::pause(
                &mut outage,
                e,
                deadline.map(Instant::into_std),
                inner.config.watchdog_timeout,
            )?,
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
