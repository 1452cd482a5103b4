//! Replica sync with `WAIT` against a real replica (`redis-server --replicaof`).

use fairlock_testkit as support;

use std::time::Duration;

use fairlock::{Client, Error, SyncFailure};
use redis::Commands;
use support::RedisServer;

async fn synced_client(master: &RedisServer, on_failure: SyncFailure) -> Client {
    Client::builder()
        .standalone(master.url())
        .replica_sync(Duration::from_millis(300), on_failure)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledging_replica_lets_the_lock_through_and_has_it() {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let c = synced_client(&master, SyncFailure::Error).await;
    let g = c.fair_lock("synced").lock().await.unwrap();
    // WAIT returned only after the replica had the write, so the replica has it now.
    let mut on_replica = replica.conn();
    let count: Option<i64> = on_replica.hget("synced", g.owner_field()).unwrap();
    assert_eq!(count, Some(1));
    g.unlock().await.unwrap();
    let g = c.non_fair_lock("synced-plain").lock().await.unwrap();
    let count: Option<i64> = on_replica.hget("synced-plain", g.owner_field()).unwrap();
    assert_eq!(count, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_fails_the_acquisition_and_releases_the_lock() {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let mut raw = master.conn();
    let c = synced_client(&master, SyncFailure::Error).await;
    replica.pause();
    let result = c
        .fair_lock("unsynced")
        .try_lock(Duration::from_secs(2), None)
        .await;
    let plain = c
        .non_fair_lock("unsynced-plain")
        .try_lock(Duration::from_secs(2), None)
        .await;
    replica.resume();
    assert!(
        matches!(result, Err(Error::ReplicasNotSynced { replicas: 1, .. })),
        "{result:?}"
    );
    assert!(
        matches!(plain, Err(Error::ReplicasNotSynced { .. })),
        "{plain:?}"
    );
    assert!(
        !raw.exists::<_, bool>("unsynced").unwrap(),
        "the unsynced hold was released"
    );
    assert!(!raw.exists::<_, bool>("unsynced-plain").unwrap());
    assert_eq!(
        raw.llen::<_, i64>("redisson_lock_queue:{unsynced}")
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_mode_keeps_trying_within_the_wait() {
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let mut raw = master.conn();
    let c = synced_client(&master, SyncFailure::Retry).await;
    replica.pause();
    let result = c
        .fair_lock("retrying")
        .try_lock(Duration::from_millis(800), None)
        .await;
    assert!(matches!(result, Ok(None)), "{result:?}");
    assert!(!raw.exists::<_, bool>("retrying").unwrap());
    replica.resume();
    let g = c
        .fair_lock("retrying")
        .try_lock(Duration::from_secs(5), None)
        .await
        .unwrap();
    assert!(g.is_some(), "acquires once the replica acknowledges again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replicas_sync_is_a_no_op() {
    let master = RedisServer::start();
    let c = synced_client(&master, SyncFailure::Error).await;
    let g = c
        .fair_lock("alone")
        .try_lock(Duration::from_secs(1), None)
        .await
        .unwrap();
    assert!(g.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_errors_after_the_grant_gives_the_lock_back() {
    let master = RedisServer::start();
    let _replica = RedisServer::start_replica_of(&master);
    let mut raw = master.conn();
    // A user that may run the lock scripts but not WAIT: the sync step fails after every grant.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nowait")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-wait")
        .query(&mut raw)
        .unwrap();
    let c = Client::builder()
        .standalone(format!("redis://nowait:pw@127.0.0.1:{}", master.port()))
        .replica_sync(Duration::from_millis(300), SyncFailure::Error)
        .build()
        .await
        .unwrap();
    for name in ["sync-error", "sync-error-plain"] {
        let err = if name.ends_with("plain") {
            c.non_fair_lock(name).lock().await.unwrap_err()
        } else {
            c.fair_lock(name).lock().await.unwrap_err()
        };
        assert!(err.is_redis() && !err.is_transient(), "{err:?}");
        // Nothing is left held for a guard nobody has.
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} left held");
    }
}
