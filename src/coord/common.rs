//! What the counting kinds share: the handle ([`Named`]), call marks and their resends, and the
//! checks of their arguments (see the module documentation of `coord/`).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::inner::Inner;
use crate::error::{Error, Result};
use crate::wire;

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
        self.inner.helds.check_open()?;
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
