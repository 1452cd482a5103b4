//! The multi-lock: all or nothing (nothing held after a member could not be had), one global
//! order so overlapping multi-locks listed in opposite orders never deadlock (a seeded run with
//! exclusion checked per member), a lost member losing the whole guard, and a Redisson
//! `MultiLock` taking overlapping names in its own order beside ours without a deadlock.

use fairlock_testkit as support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{Client, Error, LostReason, MultiLock, MultiMember};
use redis::Commands;
use support::{JavaOptions, JavaPeer, JavaTopology, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_takes_all_or_nothing_in_one_order() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let multi = MultiLock::new([
        c.lock("ml:b").into(),
        c.fair_lock("ml:a").into(),
        c.lock("ml:c").into(),
    ]);
    let order: Vec<&str> = multi.members().iter().map(MultiMember::name).collect();
    let mut expected = vec!["ml:a", "ml:b", "ml:c"];
    expected.sort_by_key(|n| (fairlock::keys::slot(n), n.to_string()));
    assert_eq!(order, expected, "by slot, then name");

    // One member busy: nothing is held when the call returns.
    let busy = other.lock("ml:c").lock().await.unwrap();
    assert!(multi
        .try_lock(Duration::from_millis(200), None)
        .await
        .unwrap()
        .is_none());
    for name in ["ml:a", "ml:b"] {
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} left held");
    }
    let m = multi.clone();
    let waiting = tokio::spawn(async move { m.lock().await });
    busy.unlock().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("taken once the busy member was released")
        .unwrap()
        .unwrap();
    assert_eq!(guard.guards().len(), 3);
    for name in ["ml:a", "ml:b", "ml:c"] {
        assert!(raw.exists::<_, bool>(name).unwrap(), "{name} held");
    }
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
    let left: Vec<String> = raw.keys("*ml:*").unwrap();
    assert!(left.is_empty(), "{left:?}");

    // Bad input.
    let invalid = |e: Error| matches!(e, Error::InvalidArgument { .. });
    assert!(invalid(MultiLock::new([]).lock().await.unwrap_err()));
    let twice = MultiLock::new([c.lock("ml:x").into(), c.fair_lock("ml:x").into()]);
    assert!(invalid(
        twice.try_lock(Duration::ZERO, None).await.unwrap_err()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_member_loses_the_multi_guard() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::builder()
        .standalone(server.url())
        .watchdog_timeout(Duration::from_millis(900))
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let guard = MultiLock::new([c.lock("lost:a").into(), c.fair_lock("lost:b").into()])
        .lock()
        .await
        .unwrap();
    assert!(other.fair_lock("lost:b").force_unlock().await.unwrap());
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the multi-guard is told");
    assert_eq!(reason, LostReason::Gone);
    assert!(guard.is_lost());
    assert!(guard.unlock().await.unwrap_err().is_not_held());
    assert!(
        !raw.exists::<_, bool>("lost:a").unwrap(),
        "the kept member was released"
    );
}

/// Seeded (`FAIRLOCK_MULTI_SEED` replays): six tasks over three clients take random sets of
/// two or three of four names, listed in random order, fair and non-fair members mixed; every
/// member is checked exclusive while held, and every `lock()` must end within 10 s (a deadlock
/// would hang it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_multi_locks_in_any_order_never_deadlock() {
    let seed = support::seed("FAIRLOCK_MULTI_SEED");
    let server = RedisServer::start();
    let mut raw = server.conn();
    let clients = [
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
    ];
    const NAMES: [&str; 4] = ["dl:0", "dl:1", "dl:2", "dl:3"];
    let held: Arc<Vec<AtomicBool>> =
        Arc::new(NAMES.iter().map(|_| AtomicBool::new(false)).collect());
    let rounds = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..6u64 {
        let client = clients[(t % 3) as usize].clone();
        let (held, rounds) = (held.clone(), rounds.clone());
        let mut rng = support::Rng::for_worker(seed, t);
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                let mut picked: Vec<usize> = (0..4).collect();
                for i in (1..4).rev() {
                    picked.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                }
                picked.truncate(2 + (rng.next_u64() % 2) as usize);
                let members: Vec<MultiMember> = picked
                    .iter()
                    .map(|&i| {
                        if i % 2 == 0 {
                            client.fair_lock(NAMES[i]).into()
                        } else {
                            client.lock(NAMES[i]).into()
                        }
                    })
                    .collect();
                let guard =
                    tokio::time::timeout(Duration::from_secs(10), MultiLock::new(members).lock())
                        .await
                        .unwrap_or_else(|_| {
                            panic!("seed {seed}: a multi-lock over {picked:?} hung")
                        })
                        .unwrap();
                for &i in &picked {
                    assert!(
                        !held[i].swap(true, Ordering::SeqCst),
                        "seed {seed}: {} held twice",
                        NAMES[i]
                    );
                }
                tokio::time::sleep(Duration::from_micros(rng.next_u64() % 1_000)).await;
                for &i in &picked {
                    held[i].store(false, Ordering::SeqCst);
                }
                guard.unlock().await.unwrap();
                rounds.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rounds = rounds.load(Ordering::SeqCst);
    eprintln!("seed {seed}: {rounds} multi-lock rounds");
    assert!(rounds > 30, "seed {seed}: only {rounds} rounds");
    let left: Vec<String> = raw.keys("*dl:*").unwrap();
    assert!(left.is_empty(), "seed {seed}: {left:?}");
}

/// A Redisson `MultiLock` listing two names in one order and ours listing them in the other,
/// each taking and releasing them again and again at once: both finish (Redisson backs off
/// when it cannot get a member; ours waits in its fixed order), and whenever our guard is held
/// no member has a Java owner. Each time both hold one member, the wait ends when Redisson's
/// wait for its second member (1.5 s per member) runs out: slow, never stuck.
async fn redisson_and_ours_overlap(peer: Arc<JavaPeer>, c: &Client, a: &str, b: &str) {
    const ROUNDS: usize = 3;
    let java = {
        let peer = peer.clone();
        let lock = format!("multi lock plain 1 -1 {b} {a}");
        let request = format!("plain 1 {b} {a}");
        tokio::spawn(async move {
            for _ in 0..ROUNDS {
                // Each conflict costs Redisson one wait (1.5 s per member) before it backs off.
                peer.send(&lock)
                    .wait(Duration::from_secs(60))
                    .await
                    .ok("java multi lock");
                peer.call(&format!("multi unlock {request}"))
                    .await
                    .ok("java multi unlock");
            }
        })
    };
    let java_prefix = format!("{}:", peer.uuid());
    let multi = MultiLock::new([c.lock(a).into(), c.lock(b).into()]);
    for _ in 0..ROUNDS {
        let guard = tokio::time::timeout(Duration::from_secs(60), multi.lock())
            .await
            .expect("our multi-lock is never stuck behind Redisson's")
            .unwrap();
        for name in [a, b] {
            let owners = c.lock(name).state().await.unwrap().owners;
            assert!(
                owners.iter().all(|o| !o.field.starts_with(&java_prefix)),
                "{name} held by Java too: {owners:?}"
            );
        }
        guard.unlock().await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(120), java)
        .await
        .expect("Redisson's multi-lock finished its rounds")
        .unwrap();
    for name in [a, b] {
        assert!(!c.lock(name).is_locked().await.unwrap(), "{name} left held");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_multi_lock_and_ours_on_overlapping_names_never_deadlock() {
    let server = RedisServer::start();
    let peer = Arc::new(JavaPeer::start(&JavaOptions::new(JavaTopology::Single(
        server.url(),
    ))));
    let c = Client::connect(&server.url()).await.unwrap();
    redisson_and_ours_overlap(peer, &c, "ov:a", "ov:b").await;
    let mut raw = server.conn();
    // Redisson's own unlock latches (PROTOCOL 1) stay for their PX; nothing else may.
    let left: Vec<String> = raw.keys("*ov:*").unwrap();
    for key in &left {
        let pttl: i64 = raw.pttl(key).unwrap();
        assert!(
            key.starts_with("redisson_unlock_latch:") && pttl > 0,
            "left behind: {key} (pttl {pttl}) of {left:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_multi_lock_and_ours_never_deadlock_on_a_cluster() {
    let cluster = support::RedisCluster::start();
    let peer = Arc::new(JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(
        cluster.urls(),
    ))));
    let c = cluster.client().await;
    // Members on different shards (plain names hash apart) and in one slot (one hash tag).
    redisson_and_ours_overlap(peer.clone(), &c, "ov:a", "ov:b").await;
    redisson_and_ours_overlap(peer, &c, "{ov}a", "{ov}b").await;
}
