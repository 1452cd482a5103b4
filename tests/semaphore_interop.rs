//! The semaphore and the count-down latch shared with the real Redisson (`RSemaphore`,
//! `RCountDownLatch` in a JVM driven by `interop/redisson/RedissonPeer.java`), on one server and
//! on a cluster: both sides draw from the same permits and wake each other's waiters; latches
//! are set, counted down and awaited from both sides; on a cluster a hash-tagged latch name is
//! refused (Redisson's channel for it would be in another slot).

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, Error, LostReason};
use support::{JavaOptions, JavaPeer, JavaTopology, RedisCluster, RedisServer};

const ANSWER: Duration = Duration::from_secs(10);

/// A client whose watchdog renews every 300 ms (a permit released elsewhere is noticed fast).
async fn watchdog_client(url: &str, cluster: Option<Vec<String>>) -> Client {
    let builder = Client::builder()
        .watchdog_timeout(Duration::from_millis(900))
        .timer_tick(Duration::from_millis(10));
    match cluster {
        Some(urls) => builder.cluster(urls),
        None => builder.standalone(url),
    }
    .build()
    .await
    .unwrap()
}
/// Far below the waiters' 5 s re-check: a waiter served within it was woken by a message.
const WOKEN: Duration = Duration::from_secs(2);

async fn permits_shared_with_java(peer: &JavaPeer, c: &Client, name: &str) {
    let sem = c.semaphore(name);
    let r = peer.call(&format!("sem trysetpermits {name} 2")).await;
    assert_eq!(r.ok("java trySetPermits"), "true");
    assert!(!sem.try_set_permits(5).await.unwrap(), "Java set it first");
    let ours = sem.acquire(1).await.unwrap();
    peer.call(&format!("sem acquire {name} 1"))
        .await
        .ok("java acquire");
    assert_eq!(sem.available().await.unwrap(), 0);
    assert!(sem.try_acquire(1, Duration::ZERO).await.unwrap().is_none());
    let r = peer.call(&format!("sem tryacquire {name} 1 0")).await;
    assert_eq!(r.ok("java tryAcquire"), "false");

    // A Rust waiter is woken by Java's release.
    let s = sem.clone();
    let waiter = tokio::spawn(async move { s.acquire(1).await });
    let released = Instant::now();
    peer.call(&format!("sem release {name} 1"))
        .await
        .ok("java release");
    let theirs = tokio::time::timeout(ANSWER, waiter)
        .await
        .expect("the Rust waiter is served after Java's release")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < WOKEN, "{:?}", released.elapsed());

    // A Java waiter for two permits is woken by our releases.
    let java = peer.send(&format!("sem acquire {name} 2"));
    ours.release().await.unwrap();
    let released = Instant::now();
    theirs.release().await.unwrap();
    java.wait(ANSWER)
        .await
        .ok("java acquire of two after our releases");
    assert!(released.elapsed() < WOKEN, "{:?}", released.elapsed());
    let r = peer.call(&format!("sem available {name}")).await;
    assert_eq!(r.ok("java availablePermits"), "0");

    // Java's release of two serves two Rust waiters of two clients... of one client here.
    let (s1, s2) = (sem.clone(), sem.clone());
    let w1 = tokio::spawn(async move { s1.acquire(1).await });
    let w2 = tokio::spawn(async move { s2.acquire(1).await });
    let released = Instant::now();
    peer.call(&format!("sem release {name} 2"))
        .await
        .ok("java release of two");
    for w in [w1, w2] {
        let p = tokio::time::timeout(ANSWER, w)
            .await
            .expect("both Rust waiters are served")
            .unwrap()
            .unwrap();
        p.release().await.unwrap();
    }
    assert!(released.elapsed() < WOKEN, "{:?}", released.elapsed());
    assert_eq!(sem.available().await.unwrap(), 2);
    peer.call(&format!("sem add {name} 3")).await.ok("java add");
    assert_eq!(sem.available().await.unwrap(), 5);
    assert!(sem.delete().await.unwrap());
}

/// Subscribers of `channel` on every node given (classic and sharded).
fn subscribers(nodes: &[&RedisServer], channel: &str) -> i64 {
    let mut n = 0;
    for node in nodes {
        let mut conn = node.conn();
        for cmd in ["NUMSUB", "SHARDNUMSUB"] {
            let counted: redis::RedisResult<Vec<(String, i64)>> =
                redis::cmd("PUBSUB").arg(cmd).arg(channel).query(&mut conn);
            n += counted.map_or(0, |v| v.iter().map(|(_, k)| k).sum::<i64>());
        }
    }
    n
}

async fn latches_shared_with_java(peer: &JavaPeer, c: &Client, name: &str, nodes: &[&RedisServer]) {
    let latch = c.count_down_latch(name);
    let r = peer.call(&format!("latch trysetcount {name} 2")).await;
    assert_eq!(r.ok("java trySetCount"), "true");
    assert!(!latch.try_set_count(7).await.unwrap());
    assert_eq!(latch.count().await.unwrap(), 2);
    // Redisson's await reads the count, subscribes, reads it again, then listens: a `0` before
    // it listens is lost to it (its listeners are run and dropped by the message). So the `0`
    // below waits until the server has answered its second read, and one more round trip
    // through the JVM after that.
    let monitors: Vec<support::Monitor> = nodes
        .iter()
        .map(|n| support::Monitor::start(n.port()))
        .collect();
    let since = Instant::now();
    let java = peer.send(&format!("latch await {name} -1"));
    let channel = fairlock::keys::count_down_channel(name);
    support::wait_until(ANSWER, "the Java await subscribed", || {
        subscribers(nodes, &channel) >= 1
    });
    wait_for_reads(&monitors, since, name, 2);
    let r = peer.call(&format!("latch count {name}")).await;
    assert_eq!(r.ok("java getCount"), "2");
    let l = latch.clone();
    let ours = tokio::spawn(async move { l.wait().await });
    peer.call(&format!("latch countdown {name}"))
        .await
        .ok("java countDown");
    assert_eq!(latch.count().await.unwrap(), 1);
    assert!(!ours.is_finished());
    let opened = Instant::now();
    assert_eq!(latch.count_down().await.unwrap(), 0);
    java.wait(ANSWER)
        .await
        .ok("java await after our count-down");
    tokio::time::timeout(ANSWER, ours)
        .await
        .expect("our waiter opens")
        .unwrap()
        .unwrap();
    assert!(opened.elapsed() < WOKEN, "{:?}", opened.elapsed());

    // Set by us, counted down by Java, awaited by us (woken by Java's `0`); Java then sees it
    // open. (Not a Java await sent together with the Java count-down: Redisson's await reads
    // the count before it registers its listener, and a `0` in between is lost to it until its
    // timeout; `latches_shared_with_java` above has Java wait long before the count-down.)
    assert!(latch.try_set_count(1).await.unwrap());
    let r = peer.call(&format!("latch count {name}")).await;
    assert_eq!(r.ok("java getCount"), "1");
    let l = latch.clone();
    let ours = tokio::spawn(async move { l.wait_timeout(ANSWER).await });
    let opened = Instant::now();
    peer.call(&format!("latch countdown {name}"))
        .await
        .ok("java countDown");
    assert!(
        ours.await.unwrap().unwrap(),
        "ours opened by Java's count-down"
    );
    assert!(opened.elapsed() < WOKEN, "{:?}", opened.elapsed());
    let r = peer.call(&format!("latch await {name} 10000")).await;
    assert_eq!(r.ok("java await of an open latch"), "true");

    // Deleted by Java: our waiter sees no latch, i.e. open.
    assert!(latch.try_set_count(3).await.unwrap());
    let l = latch.clone();
    let ours = tokio::spawn(async move { l.wait_timeout(ANSWER).await });
    let r = peer.call(&format!("latch delete {name}")).await;
    assert_eq!(r.ok("java delete"), "true");
    assert!(ours.await.unwrap().unwrap());
    assert_eq!(latch.count().await.unwrap(), 0);

    // Deleted by us: Java's waiters return too, with and without a timeout (Redisson's own
    // delete publishes `1`, on which they keep waiting; ours publishes `0`). One await at a time,
    // each on a latch of its own. Redisson's await reads the count and only then, on whichever
    // of its threads completed that read, registers the listener the message runs: a `0`
    // published in between is lost to it, and no round trip through the JVM is ordered after
    // that registration. Here that happened to the timed await in about 1 of 40 runs (CI:
    // valkey-8 twice, redis-6.2 once), with the reads and the round trip below done. So an await
    // our delete did not wake within `WOKEN` is tried again on a fresh latch, up to 3 times in
    // all: what must hold is that the delete wakes an await that listens.
    for (bound, what) in [(-1i64, "java await()"), (60_000, "java await(60 s)")] {
        let mut woken = None;
        for attempt in 0..3 {
            let name = &format!("{name}:{}:{attempt}", bound.max(0));
            let latch = c.count_down_latch(name.as_str());
            let channel = fairlock::keys::count_down_channel(name);
            assert!(latch.try_set_count(2).await.unwrap());
            let since = Instant::now();
            let mut java = peer.send(&format!("latch await {name} {bound}"));
            support::wait_until(ANSWER, "the Java await subscribed", || {
                subscribers(nodes, &channel) >= 1
            });
            // It listens once the server answered its second read of the count (and its
            // thread registered the listener), then one more round trip through the JVM.
            wait_for_reads(&monitors, since, name, 2);
            let r = peer.call(&format!("latch count {name}")).await;
            assert_eq!(r.ok("java getCount"), "2");
            let deleted = Instant::now();
            assert!(latch.delete().await.unwrap());
            let mut reply = None;
            if support::wait_until_or(WOKEN, || {
                reply = java.try_take();
                reply.is_some()
            }) {
                woken = Some((reply.expect("taken"), deleted.elapsed()));
                break;
            }
        }
        let (reply, after) = woken.unwrap_or_else(|| panic!("{what}: not woken in 3 attempts"));
        assert_eq!(reply.ok(&format!("{what} after our delete")), "true");
        assert!(after < WOKEN, "{what}: {after:?}");
    }
}

/// Waits until the servers behind `monitors` have executed `reads` commands on the key `name`
/// since `since` (Redisson's `getCount` is a `GET`; nothing else touches the key meanwhile).
fn wait_for_reads(monitors: &[support::Monitor], since: Instant, name: &str, reads: usize) {
    let key = format!("\"{name}\"");
    support::wait_until(ANSWER, &format!("{reads} reads of {name} by Java"), || {
        monitors
            .iter()
            .map(|m| m.count_since(since, &[&key]))
            .sum::<usize>()
            >= reads
    });
}

/// Expirable permits across sides: one pool, ids each side can release, our watchdog permit
/// reported lost when Java releases it by id, waiters woken by the other side's releases.
async fn expirable_permits_shared_with_java(peer: &JavaPeer, c: &Client, name: &str) {
    let sem = c.expirable_semaphore(name);
    let r = peer.call(&format!("pes trysetpermits {name} 3")).await;
    assert_eq!(r.ok("java trySetPermits"), "true");
    let ours = sem.acquire(1, None).await.unwrap();
    let java_id = peer
        .call(&format!("pes acquire {name} -1"))
        .await
        .ok("java acquire")
        .to_owned();
    assert_eq!(java_id.len(), 32, "{java_id}");
    let fixed_id = peer
        .call(&format!("pes acquire {name} 60000"))
        .await
        .ok("java acquire with a lease")
        .to_owned();
    assert_eq!(sem.available().await.unwrap(), 0);
    assert!(sem
        .try_acquire(1, Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    let r = peer.call(&format!("pes tryacquire {name} 0 -1")).await;
    assert_eq!(r.ok("java tryAcquire"), "null");

    // A Rust waiter is woken by Java's release of its own permit.
    let s = sem.clone();
    let waiter = tokio::spawn(async move { s.acquire(1, None).await });
    let released = Instant::now();
    peer.call(&format!("pes release {name} {java_id}"))
        .await
        .ok("java release");
    let theirs = tokio::time::timeout(ANSWER, waiter)
        .await
        .expect("the Rust waiter is served after Java's release")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < WOKEN, "{:?}", released.elapsed());

    // Java releases our permit by its id: our guard learns it at its next renewal.
    let our_id = ours.ids().remove(0);
    let r = peer.call(&format!("pes tryrelease {name} {our_id}")).await;
    assert_eq!(r.ok("java tryRelease of our permit"), "true");
    let reason = tokio::time::timeout(ANSWER, ours.lost())
        .await
        .expect("our guard is told");
    assert_eq!(reason, LostReason::Gone);
    assert_eq!(ours.release().await.unwrap(), 0, "nothing of ours was left");

    // We release Java's fixed-lease permit by its id; a waiting Java acquire is woken by it.
    assert_eq!(sem.available().await.unwrap(), 1);
    let extra = sem.acquire(1, None).await.unwrap();
    let java = peer.send(&format!("pes acquire {name} -1"));
    let released = Instant::now();
    assert!(sem.release_id(&fixed_id).await.unwrap());
    assert!(!sem.release_id(&fixed_id).await.unwrap(), "released once");
    let java_second = java
        .wait(ANSWER)
        .await
        .ok("java acquire after our release by id")
        .to_owned();
    assert!(released.elapsed() < WOKEN, "{:?}", released.elapsed());
    assert_eq!(java_second.len(), 32);
    theirs.release().await.unwrap();
    extra.release().await.unwrap();
    peer.call(&format!("pes release {name} {java_second}"))
        .await
        .ok("java release");
    let r = peer.call(&format!("pes available {name}")).await;
    assert_eq!(r.ok("java availablePermits"), "3");
    assert_eq!(sem.acquired().await.unwrap(), 0);
    assert!(sem.delete().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_jvm_holders_expirable_permit_comes_back_at_its_lease() {
    let server = RedisServer::start();
    let mut peer = JavaPeer::start(&JavaOptions::new(JavaTopology::Single(server.url())));
    let c = Client::connect(&server.url()).await.unwrap();
    let name = "pes:jvm-dies";
    let sem = c.expirable_semaphore(name);
    assert!(sem.try_set_permits(1).await.unwrap());
    peer.call(&format!("pes acquire {name} 1500"))
        .await
        .ok("java acquire with a 1.5 s lease");
    peer.kill();
    let killed = Instant::now();
    let p = sem
        .try_acquire(1, ANSWER, None)
        .await
        .unwrap()
        .expect("the dead JVM's permit comes back at its lease");
    assert!(
        killed.elapsed() < Duration::from_secs(4),
        "{:?}",
        killed.elapsed()
    );
    p.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_and_rust_share_semaphores_and_latches() {
    let server = RedisServer::start();
    let peer = JavaPeer::start(&JavaOptions::new(JavaTopology::Single(server.url())));
    let c = Client::connect(&server.url()).await.unwrap();
    permits_shared_with_java(&peer, &c, "sem:java").await;
    latches_shared_with_java(&peer, &c, "latch:java", &[&server]).await;
    let short = watchdog_client(&server.url(), None).await;
    expirable_permits_shared_with_java(&peer, &short, "pes:java").await;
    let mut raw = server.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut raw).unwrap();
    let left: Vec<&String> = keys
        .iter()
        .filter(|k| !k.contains(":fairlock_call:"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_and_rust_share_semaphores_and_latches_on_a_cluster() {
    let cluster = RedisCluster::start();
    let peer = JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())));
    let c = cluster.client().await;
    permits_shared_with_java(&peer, &c, "sem:cluster").await;
    permits_shared_with_java(&peer, &c, "{tag}sem").await;
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    latches_shared_with_java(&peer, &c, "latch:cluster", &nodes).await;
    let short = watchdog_client("", Some(cluster.urls())).await;
    expirable_permits_shared_with_java(&peer, &short, "pes:cluster").await;
    expirable_permits_shared_with_java(&peer, &short, "{tag}pes").await;
    // Redisson's channel for a hash-tagged latch name is in another slot: refused, typed.
    let err = c
        .count_down_latch("{user1}:latch")
        .try_set_count(1)
        .await
        .unwrap_err();
    match err {
        Error::InvalidName { name, reason } => {
            assert_eq!(name, "{user1}:latch");
            assert!(reason.contains("latch"), "{reason}");
        }
        other => panic!("expected InvalidName, got {other:?}"),
    }
}
