//! Checks shared by the failover tests on Cluster and Sentinel, on raw connections to one server.

use std::time::Duration;

use redis::Commands;

use super::wait::wait_until;

/// Waits until the TTL of `key` on this server goes up (a renewal landed here). Panics if the key
/// is not there to begin with, or after `deadline`.
pub fn wait_for_renewal(conn: &mut redis::Connection, key: &str, deadline: Duration) {
    let mut last: i64 = conn.pttl(key).unwrap();
    assert!(last > 0, "{key} is not on this server (PTTL {last})");
    wait_until(
        deadline,
        &format!("a renewal of {key} on this server"),
        || {
            let pttl: i64 = conn.pttl(key).unwrap();
            let renewed = pttl > last;
            last = pttl;
            renewed
        },
    );
}

/// Closes this master's links to its replicas (`CLIENT KILL TYPE replica`).
pub fn kill_replica_links(conn: &mut redis::Connection) {
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(conn)
        .unwrap();
}

/// How many channels matching `pattern` have subscribers on this server: classic ones, or
/// sharded ones when `sharded` (which panics on a server without sharded pub/sub, 6.2: a test
/// asks for sharded subscribers only where `PubSubMode::Auto` is sharded).
pub fn subscribed_channels(conn: &mut redis::Connection, sharded: bool, pattern: &str) -> usize {
    assert!(
        !sharded || crate::test_server().kind.has_sharded_pubsub(),
        "PUBSUB SHARDCHANNELS asked of {}, which has no sharded pub/sub",
        crate::test_server().version
    );
    redis::cmd("PUBSUB")
        .arg(if sharded { "SHARDCHANNELS" } else { "CHANNELS" })
        .arg(pattern)
        .query::<Vec<String>>(conn)
        .unwrap()
        .len()
}

/// The checks after a failover that lost `held`'s lock (the promoted replica never had it):
/// `lost()` fires (the lock is gone, or renewals failed while the master was away), the queued
/// `waiter` does not hang but takes the free lock on the new master (`new_master`), the old
/// guard's unlock is `NotHeld`, and the new holder's unlock leaves nothing behind.
pub async fn assert_lost_and_taken_over(
    held: fairlock::LockGuard,
    waiter: tokio::task::JoinHandle<fairlock::Result<fairlock::LockGuard>>,
    new_master: &mut redis::Connection,
    name: &str,
) {
    let reason = tokio::time::timeout(Duration::from_secs(20), held.lost())
        .await
        .expect("lost() fires after the failover");
    assert!(
        matches!(
            reason,
            fairlock::LostReason::Gone | fairlock::LostReason::RenewalFailed
        ),
        "{reason:?}"
    );
    let g = super::joined(
        waiter,
        Duration::from_secs(20),
        "the waiter is served on the new master",
    )
    .await
    .unwrap();
    assert_eq!(
        new_master.hgetall::<_, Vec<(String, i64)>>(name).unwrap(),
        vec![(g.owner_field().to_owned(), 1)]
    );
    assert!(held.unlock().await.unwrap_err().is_not_held());
    g.unlock().await.unwrap();
    assert!(!new_master.exists::<_, bool>(name).unwrap());
}
