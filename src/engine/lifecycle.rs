//! Starting a client's engine (its connections, subscriber and driver) and shutting it down.

use std::sync::Arc;

use tokio::sync::oneshot;
use uuid::Uuid;

use crate::config::Config;
use crate::conn::subscriber::Subscriber;
use crate::conn::Conn;
use crate::engine::driver::{self, Work};
use crate::engine::field::What;
use crate::engine::inner::Inner;
use crate::engine::lane::Lane;
use crate::engine::release::release_logged;
use crate::engine::validity::LostReason;
use crate::error::{Error, Result};
use crate::util::join_all;

/// With `tls-rustls-ring`: makes ring rustls's process-wide crypto provider unless the
/// application installed one (rustls cannot choose by itself when the build has more than one,
/// and would fail the first handshake).
#[cfg(feature = "tls-rustls-ring")]
fn install_ring() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one between the check and here: then that one is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Connects, starts the subscriber and the driver, and returns the state they share.
pub(crate) async fn start(config: Config) -> Result<Arc<Inner>> {
    crate::metrics::describe();
    #[cfg(feature = "tls-rustls-ring")]
    install_ring();
    let id = Uuid::new_v4();
    let (conn, link) = Conn::connect(&config, id).await.map_err(|e| match e {
        Error::Redis(e) => Error::authentication(e.into_redis_error()),
        other => other,
    })?;
    check_credentials(&mut conn.clone(), config.command_timeout).await?;
    let subscriber = Subscriber::start(
        link,
        crate::conn::names::subscriber_name(id),
        config.connect_timeout,
        config.command_timeout,
    );
    let driver = driver::start(conn.clone(), &config);
    check_eviction_policy(&mut conn.clone()).await;
    let inner = Arc::new(Inner::new(id, config, conn, subscriber, driver));
    tracing::debug!(client = %id, "fairlock client started");
    Ok(inner)
}

/// What `Client::shutdown` does (see its documentation).
pub(crate) async fn shutdown(inner: &Inner) {
    if inner.helds.closed.send_replace(true) {
        return;
    }
    inner.subscriber.wake_all();
    // Every field at once, each in its own line: an operation in flight (an attempt whose grant
    // this call may then give back itself) ends first, and what comes after finds the client
    // closed. The wait for a field's turn is bounded: a call whose caller stopped polling it (a
    // pinned `lock()` future in a `select!` that went elsewhere) keeps its turn for as long as it
    // is not polled, and shutdown used to wait for it for ever. After one command timeout the
    // field is left to that call: polled again, it finds the client closed and gives a grant
    // back itself; dropped, the driver (which keeps running cleanup after shutdown) settles it;
    // neither, and the hold expires with its lease (nothing renews it any more).
    let bound = inner.config.command_timeout;
    join_all(inner.helds.all().into_iter().map(|held| async move {
        match tokio::time::timeout(bound, Lane::enter(&held)).await {
            Ok(turn) => {
                // The guards are told first: once the release below reaches Redis, another
                // client may take the lock, and no guard of ours may still be trusted then.
                // (The account keeps the count the release needs: losing the holds changes the
                // generation and the guards' bookkeeping, not what Redis has.)
                turn.holds_vanished(LostReason::Shutdown);
                let _ = release_logged(&held, &turn, What::All).await;
            }
            Err(_) => {
                tracing::warn!(
                    lock = held.name(),
                    field = &*held.field,
                    "shutdown: a call of this holder keeps the lock's line and is not being \
                     polled; its holds expire with their lease"
                );
                held.mark_lost(LostReason::Shutdown);
            }
        }
    }))
    .await;
    // Expirable-semaphore permits: lost to their guards, given back (each one send, bounded).
    join_all(inner.permits_in_use().into_iter().map(|lease| async move {
        let mut conn = inner.conn.clone();
        let _ = tokio::time::timeout(bound, lease.shut_down(&mut conn)).await;
    }))
    .await;
    // Semaphore work handed to the background (dropped permits, settling dropped acquires):
    // a plain semaphore's permits not given back now never come back, so wait for it, within
    // its resend window and one more command timeout.
    let window = inner.settle_window() + bound;
    if tokio::time::timeout(window, inner.background_done())
        .await
        .is_err()
    {
        tracing::warn!("shutdown: semaphore releases still running in the background");
    }
    let (tx, rx) = oneshot::channel();
    inner.driver.send(Work::Shutdown(tx));
    let _ = rx.await;
    tracing::debug!(client = %inner.id, "fairlock client shut down");
}

/// Asks the server once (`PING`) whether it takes the client's credentials: redis-rs connects
/// without a password to a server that needs one (and some topologies connect lazily), and the
/// first lock would fail with `NOAUTH` (or a protocol error on a long command). Any other failure
/// is left to the first real command, as before.
async fn check_credentials(conn: &mut Conn, timeout: std::time::Duration) -> Result<()> {
    match crate::wire::server::ping(conn, timeout).await {
        Err(Error::Redis(e)) => match Error::authentication(e.into_redis_error()) {
            refused @ Error::Authentication(_) => Err(refused),
            other => {
                tracing::debug!(error = %crate::error::chain(&other), "PING after connecting failed");
                Ok(())
            }
        },
        _ => Ok(()),
    }
}

/// Every lock key carries a TTL, so any eviction policy but `noeviction` may evict a held lock.
async fn check_eviction_policy(conn: &mut Conn) {
    match crate::wire::server::maxmemory_policy(conn).await.as_ref() {
        Ok(Some(policy)) if policy != "noeviction" => tracing::warn!(
            policy = policy.as_str(),
            "Redis maxmemory-policy is not noeviction: under memory pressure Redis may evict \
             held locks (an evicted lock is a lost lock)"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(error = %e, "could not read maxmemory-policy (CONFIG may be disabled)")
        }
    }
}
