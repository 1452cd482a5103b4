//! Redis Cluster: a send that times out is sent again, and may run twice on the server. Writes are
//! paused on the key's master for longer than one command timeout and shorter than two: the first
//! send times out, it is sent again, and both run when writes resume. A second run never releases
//! or takes more than the first did. (redis-rs's cluster client also sends a command again by
//! itself after a dropped connection; the library reads every cluster reply as it reads a
//! resend's, `Conn::may_run_twice`. A drop between a command's run and its reply is not something
//! these tests can bring about on demand; the resends here are the library's own.)

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, PubSubMode};
use redis::Commands;
use support::{joined, wait_until, wait_until_async, Monitor, RedisCluster};

/// The command timeout of the client whose sends run twice.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long writes pause: between one and two command timeouts.
const PAUSE_MS: u64 = 1500;

async fn client(cluster: &RedisCluster, timeout: Option<Duration>) -> Client {
    let mut b = Client::builder()
        .cluster(cluster.urls())
        .pubsub_mode(PubSubMode::Auto)
        // No renewal or heartbeat falls into the paused window.
        .watchdog_timeout(Duration::from_secs(60))
        .waiter_liveness(Duration::from_secs(60));
    if let Some(t) = timeout {
        b = b.command_timeout(t);
    }
    b.build().await.unwrap()
}

/// Pauses writes (scripts included) on `node` for [`PAUSE_MS`].
fn pause_writes(cluster: &RedisCluster, node: usize) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE_MS)
        .arg("WRITE")
        .query(&mut cluster.nodes[node].conn())
        .unwrap();
}

/// A holder with two holds releases one while writes pause: the release runs twice. The second
/// run finds the count already lowered, and that is read as the first run's work: the other
/// hold stays, and a waiter of another client is not handed the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_run_twice_releases_one_hold() {
    let cluster = RedisCluster::start();
    let ours = client(&cluster, Some(TIMEOUT)).await;
    let other = client(&cluster, None).await;
    let name = "twice-release";
    let node = cluster.master_for_key(name);
    let mut raw = cluster.nodes[node].conn();
    let monitor = Monitor::start(cluster.nodes[node].port());

    // Once first, so the release's script is loaded on the node (a NOSCRIPT would not run twice).
    ours.fair_lock(name)
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    let g1 = ours.fair_lock(name).lock().await.unwrap();
    let g2 = g1.reenter(None).await.unwrap();
    let field = g1.owner_field().to_owned();
    let waiter = {
        let lock = other.fair_lock(name);
        tokio::spawn(async move { lock.try_lock(Duration::from_secs(30), None).await })
    };
    wait_until(
        Duration::from_secs(10),
        "the other client's waiter queued",
        || {
            raw.llen::<_, i64>("redisson_lock_queue:{twice-release}")
                .unwrap()
                == 1
        },
    );

    let since = Instant::now();
    pause_writes(&cluster, node);
    g1.unlock().await.unwrap();
    // Each run of the release reads our count first. (The monitor's lines arrive on their own
    // connection: waited for, not read at once.)
    wait_until(Duration::from_secs(5), "the release run twice", || {
        monitor.count_since(since, &["lua]", "\"HGET\"", &field]) >= 2
    });
    let count: Option<i64> = raw.hget(name, &field).unwrap();
    assert_eq!(count, Some(1), "one hold released, one left");
    assert!(!g2.is_lost(), "the other hold is still ours");
    assert!(!waiter.is_finished(), "the waiter still waits");

    g2.unlock().await.unwrap();
    let theirs = joined(waiter, Duration::from_secs(20), "the waiter")
        .await
        .unwrap()
        .expect("served once the lock is free");
    theirs.unlock().await.unwrap();
}

/// An expirable semaphore's acquire runs twice: the second run finds the first run's id and takes
/// nothing more, so no permit goes missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_acquire_run_twice_takes_its_permits_once() {
    let cluster = RedisCluster::start();
    let ours = client(&cluster, Some(TIMEOUT)).await;
    let name = "twice-permits";
    let node = cluster.master_for_key(name);
    let mut raw = cluster.nodes[node].conn();
    let monitor = Monitor::start(cluster.nodes[node].port());
    let semaphore = ours.expirable_semaphore(name);
    assert!(semaphore.try_set_permits(3).await.unwrap());
    // Once first, so the acquire's script is loaded on the node (a NOSCRIPT would not run twice).
    let warm = semaphore.acquire(1, None).await.unwrap();
    assert_eq!(warm.release().await.unwrap(), 1);

    let since = Instant::now();
    pause_writes(&cluster, node);
    let permits = semaphore
        .acquire(1, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    // (The monitor's lines arrive on their own connection: waited for, not read at once.)
    wait_until(Duration::from_secs(5), "the acquire sent twice", || {
        monitor.count_since(since, &["EVALSHA", "{twice-permits}:timeout"]) >= 2
    });
    let available: i64 = raw.get(name).unwrap();
    assert_eq!(available, 2, "one permit taken");
    let in_use: i64 = raw.zcard("{twice-permits}:timeout").unwrap();
    assert_eq!(in_use, 1);

    assert_eq!(permits.release().await.unwrap(), 1);
    wait_until_async(Duration::from_secs(5), "all 3 back", || async {
        semaphore.available().await.unwrap() == 3
    })
    .await;
}
