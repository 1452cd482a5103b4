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
use support::{wait_until, JavaOptions, JavaPeer, JavaTopology, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_takes_all_or_nothing_in_one_order() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let multi = MultiLock::new([
        c.non_fair_lock("ml:b").into(),
        c.fair_lock("ml:a").into(),
        c.non_fair_lock("ml:c").into(),
    ]);
    let order: Vec<&str> = multi.members().iter().map(MultiMember::name).collect();
    let mut expected = vec!["ml:a", "ml:b", "ml:c"];
    expected.sort_by_key(|n| (fairlock::keys::slot(n), n.to_string()));
    assert_eq!(order, expected, "by slot, then name");

    // One member busy: nothing is held when the call returns.
    let busy = other.non_fair_lock("ml:c").lock().await.unwrap();
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
    let twice = MultiLock::new([c.non_fair_lock("ml:x").into(), c.fair_lock("ml:x").into()]);
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
    let guard = MultiLock::new([
        c.non_fair_lock("lost:a").into(),
        c.fair_lock("lost:b").into(),
    ])
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

/// The members of `multi` in the order it takes them.
fn order(multi: &MultiLock) -> Vec<String> {
    multi
        .members()
        .iter()
        .map(|m| m.name().to_owned())
        .collect()
}

/// A fixed lease shorter than the wait for a later member: the members already taken must not
/// run out meanwhile (a rival waiting for the first one would take it), and the guard that comes
/// back holds every member, each for the whole lease from then. Before, the first member expired
/// at 0.5 s, the rival took it, and the guard still came back at 1.5 s (already lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_runs_from_the_last_member_and_no_rival_holds_one_on_return() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let rival = Client::connect(&server.url()).await.unwrap();
    let multi = MultiLock::new([c.fair_lock("fl:a").into(), c.non_fair_lock("fl:b").into()]);
    let members = order(&multi);
    let (first, second) = (members[0].clone(), members[1].clone());
    let lease = Duration::from_millis(500);
    // The second member is held by a rival for 1.5 s; a second rival waits for the first (each
    // with the member's own kind: fl:a is fair, fl:b is not).
    let take = |name: &str, lease: Option<Duration>| {
        let (fair, plain) = (rival.fair_lock(name), rival.non_fair_lock(name));
        let is_fair = name == "fl:a";
        async move {
            match (is_fair, lease) {
                (true, Some(l)) => fair.lock_with_lease(l).await,
                (true, None) => fair.lock().await,
                (false, Some(l)) => plain.lock_with_lease(l).await,
                (false, None) => plain.lock().await,
            }
            .unwrap()
        }
    };
    let blocker = take(&second, Some(Duration::from_millis(1500))).await;
    let started = Instant::now();
    let m = multi.clone();
    let call = tokio::spawn(async move { m.try_lock(Duration::from_secs(10), Some(lease)).await });
    wait_until(Duration::from_secs(5), "the first member taken", || {
        raw.exists::<_, bool>(&first).unwrap()
    });
    let taker = {
        let taking = take(&first, None);
        tokio::spawn(async move {
            let g = taking.await;
            let at = Instant::now();
            g.unlock().await.unwrap();
            at
        })
    };
    let guard = support::joined(call, Duration::from_secs(10), "the multi-lock")
        .await
        .unwrap()
        .expect("every member within the wait");
    let returned = Instant::now();
    assert!(
        returned - started >= Duration::from_millis(1200),
        "waited for the blocker"
    );
    assert!(!guard.is_lost(), "returned lost");
    for (g, name) in guard.guards().iter().zip(&members) {
        let owners: Vec<(String, i64)> = raw.hgetall(name).unwrap();
        assert_eq!(owners, vec![(g.owner_field().to_owned(), 1)], "{name}");
        let pttl: i64 = raw.pttl(name).unwrap();
        assert!(
            pttl > 0 && pttl <= 500,
            "{name}: the lease, not a watchdog TTL: {pttl}"
        );
        assert!(
            g.valid_until() > returned + Duration::from_millis(300),
            "{name}: valid for the lease from the last member"
        );
    }
    let taken_at = support::joined(taker, Duration::from_secs(10), "the rival").await;
    assert!(
        taken_at >= returned,
        "the rival held the first member before the guard came back"
    );
    drop(guard);
    drop(blocker);
}

/// The watchdog path's end check: a member lost while a later one is awaited (here force-
/// unlocked and taken by a rival) sends the call round again; it never returns a guard whose
/// member another client holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lost_while_a_later_one_is_awaited_is_taken_again() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::builder()
        .standalone(server.url())
        .watchdog_timeout(Duration::from_millis(600))
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let rival = Client::connect(&server.url()).await.unwrap();
    let multi = MultiLock::new([c.non_fair_lock("wl:a").into(), c.fair_lock("wl:b").into()]);
    let members = order(&multi);
    let (first, second) = (members[0].clone(), members[1].clone());
    let blocker = rival.non_fair_lock(&second).lock().await.unwrap();
    let m = multi.clone();
    let call = tokio::spawn(async move { m.lock().await });
    wait_until(Duration::from_secs(5), "the first member taken", || {
        raw.exists::<_, bool>(&first).unwrap()
    });
    // An operator takes the first member away and a rival takes it. The scenario: the second
    // member comes 800 ms later, longer than the first member's validity (600 ms less the
    // margin, counted from its last renewal, which came before the force unlock): by then the
    // member is known lost, by a renewal that found it gone or at its validity deadline.
    assert!(rival.non_fair_lock(&first).force_unlock().await.unwrap());
    let stolen = rival
        .non_fair_lock(&first)
        .lock_with_lease(Duration::from_millis(1500))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    blocker.unlock().await.unwrap();
    let guard = support::joined(call, Duration::from_secs(10), "the multi-lock")
        .await
        .unwrap();
    assert!(!guard.is_lost());
    for (g, name) in guard.guards().iter().zip(&members) {
        let owners: Vec<(String, i64)> = raw.hgetall(name).unwrap();
        assert_eq!(
            owners,
            vec![(g.owner_field().to_owned(), 1)],
            "{name} on return"
        );
    }
    guard.unlock().await.unwrap();
    drop(stolen);
}

/// Redlock-style use: one name as a member twice, on clients of two independent servers. Allowed
/// (each member is a different lock); the same name twice for one client is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_name_on_clients_of_different_servers_is_two_members() {
    let (s1, s2) = (RedisServer::start(), RedisServer::start());
    let c1 = Client::connect(&s1.url()).await.unwrap();
    let c2 = Client::connect(&s2.url()).await.unwrap();
    let both = MultiLock::new([c2.non_fair_lock("same").into(), c1.fair_lock("same").into()]);
    let again = MultiLock::new([c1.fair_lock("same").into(), c2.non_fair_lock("same").into()]);
    // (c1's member is the fair one: the kind tells the clients apart.)
    let kinds = |m: &MultiLock| -> Vec<bool> {
        m.members()
            .iter()
            .map(|m| matches!(m, MultiMember::Fair(_)))
            .collect()
    };
    assert_eq!(
        kinds(&both),
        kinds(&again),
        "one order whatever the listing"
    );
    let guard = both
        .try_lock(Duration::from_secs(2), Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("both free");
    assert_eq!(guard.guards().len(), 2);
    for server in [&s1, &s2] {
        assert!(server.conn().exists::<_, bool>("same").unwrap());
    }
    assert!(again
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    guard.unlock().await.unwrap();
    let twice = MultiLock::new([c1.non_fair_lock("same").into(), c1.fair_lock("same").into()]);
    assert!(twice.lock().await.unwrap_err().is_invalid_argument());
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
                            client.non_fair_lock(NAMES[i]).into()
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
    let multi = MultiLock::new([c.non_fair_lock(a).into(), c.non_fair_lock(b).into()]);
    for _ in 0..ROUNDS {
        let guard = tokio::time::timeout(Duration::from_secs(60), multi.lock())
            .await
            .expect("our multi-lock is never stuck behind Redisson's")
            .unwrap();
        for name in [a, b] {
            let owners = c.non_fair_lock(name).state().await.unwrap().owners;
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
        assert!(
            !c.non_fair_lock(name).is_locked().await.unwrap(),
            "{name} left held"
        );
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
