//! The read-write lock shared with the real Redisson (`RReadWriteLock` in a JVM, driven by
//! `interop/redisson/RedissonPeer.java`), on one server and on a cluster: Java and Rust readers
//! together, writers of either side waiting behind readers of the other and woken by their
//! messages, downgrades on both sides, Redisson's `forceUnlock` seen by our guards as lost (all of
//! these on both), and a killed JVM reader and a killed Rust reader that stop counting when their
//! lease keys expire (one server).

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, LostReason, RwMode};
use redis::Commands;
use support::{
    sigkill, spawn_role, wait_until, JavaOptions, JavaPeer, JavaTopology, RedisCluster, RedisServer,
};

const ROLE_ENV: &str = "FAIRLOCK_RW_ROLE";
const ANSWER: Duration = Duration::from_secs(10);

fn single(server: &RedisServer) -> JavaOptions {
    JavaOptions::new(JavaTopology::Single(server.url()))
}

async fn client(url: &str, watchdog: Duration) -> Client {
    Client::builder()
        .standalone(url)
        .watchdog_timeout(watchdog)
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap()
}

fn lease_key(name: &str, field: &str, k: u32) -> String {
    format!("{{{name}}}:{field}:rwlock_timeout:{k}")
}

/// Java and Rust readers hold together; a writer of either side waits behind the other side's
/// readers and enters when the last of them leaves (woken by the `0` message, long before any
/// TTL); a reader of either side waits behind the other side's writer (woken by `1`).
async fn readers_and_writers_across_sides(peer: &JavaPeer, c: &Client, name: &str) {
    let rw = c.read_write_lock(name);
    // Readers of both sides at once; no writer of either side meanwhile.
    peer.call(&format!("lock read {name} 1 -1"))
        .await
        .ok("java read");
    let ours = rw.read_lock().lock().await.unwrap();
    assert!(rw
        .write_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    let no = peer.call(&format!("trylock write {name} 2 0 -1")).await;
    assert_eq!(no.ok("java write try"), "false");
    let state = rw.state().await.unwrap();
    assert_eq!(state.mode, Some(RwMode::Read));
    assert_eq!(state.readers.len(), 2);
    assert!(
        state.readers.iter().all(|r| r.alive()),
        "both sides keep lease keys"
    );

    // A Rust writer waits behind both; it enters when the Java reader, the last, leaves.
    let w = rw.write_lock();
    let writer = tokio::spawn(async move { w.lock().await });
    ours.unlock().await.unwrap();
    assert!(!writer.is_finished());
    let left = Instant::now();
    peer.call(&format!("unlock read {name} 1"))
        .await
        .ok("java read unlock");
    let w = tokio::time::timeout(ANSWER, writer)
        .await
        .expect("the Rust writer is woken by Java's last reader")
        .unwrap()
        .unwrap();
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );

    // A Java reader waits behind the Rust writer, and is let in by its `1`.
    let java_reader = peer.send(&format!("lock read {name} 3 -1"));
    tokio::task::yield_now().await;
    let left = Instant::now();
    w.unlock().await.unwrap();
    java_reader
        .wait(ANSWER)
        .await
        .ok("java read after the Rust writer");
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );

    // A Java writer waits behind that Java reader and a Rust reader; the Rust reader leaves last.
    let ours = rw.read_lock().lock().await.unwrap();
    let java_writer = peer.send(&format!("lock write {name} 4 -1"));
    peer.call(&format!("unlock read {name} 3"))
        .await
        .ok("java read unlock");
    let left = Instant::now();
    ours.unlock().await.unwrap();
    java_writer
        .wait(ANSWER)
        .await
        .ok("java writer after the Rust reader");
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );

    // A Rust reader waits behind the Java writer, let in by Java's `1`.
    let r = rw.read_lock();
    let reader = tokio::spawn(async move { r.lock().await });
    let left = Instant::now();
    peer.call(&format!("unlock write {name} 4"))
        .await
        .ok("java write unlock");
    let ours = tokio::time::timeout(ANSWER, reader)
        .await
        .expect("the Rust reader is woken by Java's writer")
        .unwrap()
        .unwrap();
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );
    ours.unlock().await.unwrap();
    assert!(!rw.is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_and_rust_share_one_read_write_lock() {
    let server = RedisServer::start();
    let peer = JavaPeer::start(&single(&server));
    let c = client(&server.url(), Duration::from_secs(30)).await;
    readers_and_writers_across_sides(&peer, &c, "rw:java").await;
    let mut raw = server.conn();
    let left: Vec<String> = raw.keys("*rw:java*").unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_and_rust_share_one_read_write_lock_on_a_cluster() {
    let cluster = RedisCluster::start();
    let peer = JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())));
    let c = cluster.client().await;
    // A plain name (braces added to the lease keys) and a hash-tagged one.
    readers_and_writers_across_sides(&peer, &c, "rw:cluster").await;
    readers_and_writers_across_sides(&peer, &c, "{tag}rw").await;
    downgrades(&peer, &c, "rw:cluster:downgrade").await;
    let short = Client::builder()
        .cluster(cluster.urls())
        .watchdog_timeout(Duration::from_millis(900))
        .build()
        .await
        .unwrap();
    forced_by_redisson(&peer, &short, "rw:cluster:forced").await;
}

/// Downgrades on both sides: a Java writer that also reads and then releases the write leaves
/// the lock in read mode, and a fairlock reader enters; the same by fairlock, whose `1` wakes a
/// waiting Java reader at once (Redisson itself publishes nothing there).
async fn downgrades(peer: &JavaPeer, c: &Client, name: &str) {
    let rw = c.read_write_lock(name);
    let mode = || async { rw.state().await.unwrap().mode };
    peer.call(&format!("lock write {name} 1 -1"))
        .await
        .ok("java write");
    peer.call(&format!("lock read {name} 1 -1"))
        .await
        .ok("java read while writing");
    assert!(rw
        .read_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    peer.call(&format!("unlock write {name} 1"))
        .await
        .ok("java write unlock");
    assert_eq!(mode().await, Some(RwMode::Read));
    let ours = rw
        .read_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("read mode after Java's downgrade");
    ours.unlock().await.unwrap();
    peer.call(&format!("unlock read {name} 1"))
        .await
        .ok("java read unlock");
    assert_eq!(mode().await, None);

    let me = c.holder();
    let w = rw.write_lock().with_holder(me).lock().await.unwrap();
    let r = rw.read_lock().with_holder(me).lock().await.unwrap();
    let java_reader = peer.send(&format!("lock read {name} 2 -1"));
    tokio::task::yield_now().await;
    let left = Instant::now();
    w.unlock().await.unwrap();
    java_reader
        .wait(ANSWER)
        .await
        .ok("java read after our downgrade");
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );
    assert_eq!(mode().await, Some(RwMode::Read));
    r.unlock().await.unwrap();
    peer.call(&format!("unlock read {name} 2"))
        .await
        .ok("java read unlock");
    assert_eq!(mode().await, None);
}

/// Redisson's `forceUnlock` of each side is seen by our guards as lost (at their next renewal).
async fn forced_by_redisson(peer: &JavaPeer, c: &Client, name: &str) {
    let rw = c.read_write_lock(name);
    let r = rw.read_lock().lock().await.unwrap();
    let forced = peer.call(&format!("force read {name}")).await;
    assert_eq!(forced.ok("java force read"), "true");
    let reason = tokio::time::timeout(ANSWER, r.lost()).await.unwrap();
    assert_eq!(reason, LostReason::Gone);
    let w = rw.write_lock().lock().await.unwrap();
    let forced = peer.call(&format!("force write {name}")).await;
    assert_eq!(forced.ok("java force write"), "true");
    let reason = tokio::time::timeout(ANSWER, w.lost()).await.unwrap();
    assert_eq!(reason, LostReason::Gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrades_on_either_side_let_the_other_side_read() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let peer = JavaPeer::start(&single(&server));
    let c = client(&server.url(), Duration::from_secs(30)).await;
    downgrades(&peer, &c, "rw:downgrade").await;
    assert!(!raw.exists::<_, bool>("rw:downgrade").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_force_unlock_is_seen_as_lost() {
    let server = RedisServer::start();
    let peer = JavaPeer::start(&single(&server));
    let c = client(&server.url(), Duration::from_millis(900)).await;
    forced_by_redisson(&peer, &c, "rw:forced").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_jvm_reader_stops_counting_at_its_lease() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let mut peer = JavaPeer::start(&single(&server).watchdog_ms(1_500));
    let c = client(&server.url(), Duration::from_secs(30)).await;
    let name = "rw:jvm-dies";
    let rw = c.read_write_lock(name);
    peer.call(&format!("lock read {name} 1 -1"))
        .await
        .ok("java read");
    let java_key = lease_key(name, &peer.field(1), 1);
    assert!(raw.exists::<_, bool>(&java_key).unwrap());
    let ours = rw.read_lock().lock().await.unwrap();
    peer.kill();
    let killed = Instant::now();
    let w = rw.write_lock();
    let writer = tokio::spawn(async move { w.lock().await });
    ours.unlock().await.unwrap();
    // The dead JVM's lease key still counts until it expires (≤ 1.5 s), then the writer enters:
    // our unlock set the lock's TTL to that key's.
    let w = tokio::time::timeout(ANSWER, writer)
        .await
        .expect("the writer enters once the dead reader's lease ran out")
        .unwrap()
        .unwrap();
    assert!(!raw.exists::<_, bool>(&java_key).unwrap());
    assert!(killed.elapsed() < Duration::from_secs(5));
    w.unlock().await.unwrap();
}

/// A Java reader whose watchdog timeout (3 s) is shorter than ours (30 s, renewed every 10 s):
/// its renewals keep setting the lock's TTL to 3 s. Our renewals see that and come every third
/// of what they found, so when the JVM dies our read hold keeps the lock: it is neither lost nor
/// open to a writer. Before, the hash expired 3 s after the JVM died, long before our next
/// renewal; a writer could enter while our guard still looked valid, and the guard learned it
/// only at that renewal. (The JVM is killed just after one of its renewals that followed one of
/// ours, so the old renewal period could not have saved the lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_java_watchdog_does_not_leave_our_read_hold_exposed() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let mut peer = JavaPeer::start(&single(&server).watchdog_ms(3_000));
    let c = client(&server.url(), Duration::from_secs(30)).await;
    let other = client(&server.url(), Duration::from_secs(30)).await;
    let name = "rw:short-java";
    let rw = c.read_write_lock(name);
    let ours = rw.read_lock().lock().await.unwrap();
    peer.call(&format!("lock read {name} 1 -1"))
        .await
        .ok("java read");
    // A renewal of Java's (the TTL down to its 3 s), one of ours after it (back above: it found
    // the short TTL), then one of Java's again.
    wait_until(Duration::from_secs(5), "a renewal of Java's", || {
        raw.pttl::<_, i64>(name).unwrap() <= 3_000
    });
    wait_until(
        Duration::from_secs(25),
        "a renewal of ours after it",
        || raw.pttl::<_, i64>(name).unwrap() > 3_500,
    );
    wait_until(
        Duration::from_secs(5),
        "a renewal of Java's after that",
        || raw.pttl::<_, i64>(name).unwrap() <= 3_000,
    );
    peer.kill();
    // The scenario: more than Java's TTL passes after the JVM died (the wait is the point).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!ours.is_lost(), "our read hold was lost with the JVM");
    let fields: Vec<String> = raw.hkeys(name).unwrap();
    assert!(
        fields.iter().any(|f| f == ours.owner_field()),
        "the lock is gone: {fields:?}"
    );
    assert!(other
        .read_write_lock(name)
        .write_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    ours.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_rust_reader_stops_counting_at_its_lease() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        // The child: read-lock with a 1.5 s watchdog, say READY, and hang until killed.
        let url = std::env::var("FAIRLOCK_RW_URL").unwrap();
        let c = client(&url, Duration::from_millis(1_500)).await;
        let guard = c.read_write_lock(role).read_lock().lock().await.unwrap();
        println!("READY");
        std::future::pending::<()>().await;
        drop(guard);
        return;
    }
    let server = RedisServer::start();
    let mut raw = server.conn();
    let peer = JavaPeer::start(&single(&server));
    let name = "rw:rust-dies";
    let url = server.url();
    let mut child = spawn_role(
        "a_killed_rust_reader_stops_counting_at_its_lease",
        &[(ROLE_ENV, name), ("FAIRLOCK_RW_URL", &url)],
    );
    peer.call(&format!("lock read {name} 1 -1"))
        .await
        .ok("java read");
    sigkill(&mut child);
    let killed = Instant::now();
    // The Java reader leaves while the dead Rust reader's lease key still lives, so Redisson keeps
    // the lock for it (its unlock sets the lock's TTL to what that key has left); a Java writer
    // that asks then is told to wait that long, and enters once the key expired. (Had the writer
    // asked before the reader left, it would have been told the reader's 30 s watchdog TTL and,
    // with no message coming when a lease key expires, waited all of it: Redisson's behaviour,
    // not the one under test.)
    peer.call(&format!("unlock read {name} 1"))
        .await
        .ok("java read unlock");
    let mode: String = raw.hget(name, "mode").unwrap_or_default();
    assert!(
        mode == "read" || killed.elapsed() > Duration::from_millis(1_000),
        "the dead Rust reader still counted: mode {mode:?}"
    );
    let entered = peer
        .send(&format!("lock write {name} 2 -1"))
        .wait(Duration::from_secs(40))
        .await;
    entered.ok("java writer after the Rust reader's lease");
    // The dead reader's lease key had at least 1 s left when it was killed (1.5 s, renewed every
    // 0.5 s): Redisson's writer could not enter before most of that.
    assert!(
        entered.at >= killed + Duration::from_millis(500),
        "the Java writer entered {:?} after the kill",
        entered.at - killed
    );
    // ...and nothing kept the lock for the dead reader much beyond its 1.5 s lease.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "the Java writer entered {:?} after the kill",
        killed.elapsed()
    );
    peer.call(&format!("unlock write {name} 2"))
        .await
        .ok("java write unlock");
    wait_until(Duration::from_secs(5), "lock gone", || {
        !raw.exists::<_, bool>(name).unwrap()
    });
}
