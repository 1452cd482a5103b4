//! Retrying what is safe to repeat: the backoff after a transient failure, and a release that
//! is sent again under the same request id until it gets an answer.

use std::time::{Duration, Instant};

use crate::conn::Conn;
use crate::error::Result;
use crate::keys::LockSpec;
use crate::ops::{unlock, Unlocked};

/// Pause before retry `n` (1-based) after a transient failure: 25 ms doubling up to 1 s.
pub(crate) fn retry_backoff(n: u32) -> Duration {
    Duration::from_millis(25u64 << n.saturating_sub(1).min(6)).min(Duration::from_secs(1))
}

/// How many command timeouts a release keeps retrying transient failures for.
const RELEASE_ATTEMPTS: usize = 3;

/// Releases one hold, retrying transient failures ([`Error::is_transient`]: a timeout, a dropped
/// connection, a failover in progress) with a short backoff under the same request id, so the
/// latch turns a retry of a release that did reach Redis into a no-op. Retries stop once
/// `RELEASE_ATTEMPTS` command timeouts have passed (enough for a Sentinel or Cluster failover to
/// complete); the latch outlives every retry.
pub(crate) async fn release(
    conn: &mut Conn,
    spec: &LockSpec,
    field: &str,
    lease_ms: i64,
    command_timeout: Duration,
) -> Result<Unlocked> {
    let request = uuid::Uuid::new_v4().simple().to_string();
    let window = command_timeout * RELEASE_ATTEMPTS as u32;
    // Outlives the last send: the last attempt starts before `window` ends, and a cluster
    // connection may send it again `CLUSTER_RETRIES` times, each bounded by the command timeout.
    let resends = if conn.may_resend() {
        crate::conn::CLUSTER_RETRIES
    } else {
        0
    };
    let latch_ms = ((window + command_timeout * (2 + resends)).as_millis() as i64).max(1000);
    let started = Instant::now();
    let mut attempt: u32 = 1;
    loop {
        match unlock(conn, spec, field, lease_ms, &request, latch_ms, attempt > 1).await {
            Err(e) if e.is_transient() && started.elapsed() < window => {
                tracing::debug!(lock = spec.name(), field, error = ?e, attempt, "retrying release");
                let pause = retry_backoff(attempt).min(window.saturating_sub(started.elapsed()));
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}
