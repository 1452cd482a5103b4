//! `RedLock` over several independent masters: the majority rule, minority failures, the
//! watchdog over a majority, validity and cancel safety, against real local servers.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, Error, LostReason, RedLock, RedLockGuard};
use redis::Commands;
use support::{wait_until, wait_until_async, RedisServer};

const NAME: &str = "red";
const LEASE: Duration = Duration::from_secs(10);

/// `n` fresh masters and one client connected to each.
async fn masters(n: usize) -> (Vec<RedisServer>, Vec<Client>) {
    let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
    let clients = clients_for(&servers).await;
    (servers, clients)
}

/// One more client per server (another process, as far as the lock can tell).
async fn clients_for(servers: &[RedisServer]) -> Vec<Client> {
    let mut clients = Vec::new();
    for s in servers {
        clients.push(Client::connect(&s.url()).await.unwrap());
    }
    clients
}

/// The owner hash of `NAME` on one server.
fn hash(server: &RedisServer) -> Vec<(String, i64)> {
    server.conn().hgetall(NAME).unwrap()
}

fn exists(server: &RedisServer) -> bool {
    server.conn().exists(NAME).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_on_every_master_excludes_others_and_unlocks_everywhere() {
    let (servers, clients) = masters(3).await;
    let red =
        RedLock::new(clients.clone(), NAME).with_holder(fairlock::Holder::from_raw(1).unwrap());
    assert_eq!((red.masters(), red.quorum()), (3, 2));
    let guard = red
        .try_lock(Duration::from_secs(2), Some(LEASE))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.masters_held(), 3);
    assert!(!guard.is_lost());
    let validity = guard
        .valid_until()
        .saturating_duration_since(Instant::now());
    assert!(
        validity > Duration::from_secs(9) && validity <= LEASE - LEASE / 100,
        "{validity:?}"
    );
    for (server, client) in servers.iter().zip(&clients) {
        assert_eq!(hash(server), vec![(format!("{}:1", client.id()), 1)]);
        let pttl: i64 = server.conn().pttl(NAME).unwrap();
        assert!((9_000..=10_000).contains(&pttl), "{pttl}");
    }

    let other = RedLock::new(clients_for(&servers).await, NAME)
        .with_holder(fairlock::Holder::from_raw(1).unwrap());
    assert!(other
        .try_lock(Duration::from_millis(200), Some(LEASE))
        .await
        .unwrap()
        .is_none());
    assert!(other.is_locked().await.unwrap());

    guard.unlock().await.unwrap();
    for server in &servers {
        assert!(!exists(server), "released on every master");
    }
    assert!(!other.is_locked().await.unwrap());
    let g = other.try_lock(Duration::ZERO, Some(LEASE)).await.unwrap();
    assert!(g.is_some(), "free again for the other clients");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_three_masters_down_still_acquires() {
    let (mut servers, clients) = masters(3).await;
    servers[2].kill();
    let red = RedLock::new(clients, NAME);
    let guard = red
        .try_lock(Duration::from_secs(2), Some(LEASE))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.masters_held(), 2);
    assert!(exists(&servers[0]) && exists(&servers[1]));
    guard.unlock().await.unwrap();
    assert!(!exists(&servers[0]) && !exists(&servers[1]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_masters_down_still_acquires() {
    let (mut servers, clients) = masters(5).await;
    servers[1].kill();
    servers[3].kill();
    let red = RedLock::new(clients, NAME);
    assert_eq!(red.quorum(), 3);
    let guard = red
        .try_lock(Duration::from_secs(2), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.masters_held(), 3);
    for i in [0, 2, 4] {
        assert!(exists(&servers[i]), "master {i}");
    }
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_masters_down_is_quorum_not_reached_within_the_wait() {
    let (mut servers, clients) = masters(3).await;
    servers[0].kill();
    servers[1].kill();
    let red = RedLock::new(clients, NAME);
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let err = red.try_lock(wait, Some(LEASE)).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took >= wait && took < wait + Duration::from_secs(2),
        "{took:?}"
    );
    match err {
        Error::QuorumNotReached { acquired, needed } => {
            assert_eq!(needed, 2);
            assert!(acquired <= 1, "{acquired}");
        }
        other => panic!("expected QuorumNotReached, got {other:?}"),
    }
    // The live master's grants of every round were released again.
    wait_until(
        Duration::from_secs(5),
        "no lock left on the live master",
        || !exists(&servers[2]),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_held_elsewhere_blocks_and_partial_grants_are_released() {
    let (servers, clients) = masters(3).await;
    let first =
        RedLock::new(clients.clone(), NAME).with_holder(fairlock::Holder::from_raw(1).unwrap());
    let held = first
        .try_lock(Duration::from_secs(2), Some(LEASE))
        .await
        .unwrap()
        .unwrap();
    // The first holder keeps only a majority: master 2 forgets it.
    let _: () = servers[2].conn().del(NAME).unwrap();
    assert!(!held.is_lost(), "a majority is still held");
    assert!(first.is_locked().await.unwrap());

    let second = RedLock::new(clients_for(&servers).await, NAME)
        .with_holder(fairlock::Holder::from_raw(1).unwrap());
    let started = Instant::now();
    let got = second
        .try_lock(Duration::from_millis(300), Some(LEASE))
        .await
        .unwrap();
    assert!(got.is_none());
    assert!(started.elapsed() < Duration::from_millis(300) + Duration::from_secs(2));
    // Its grant on master 2 (a minority) was released; the first holder's keys are untouched.
    wait_until(Duration::from_secs(5), "partial grant released", || {
        !exists(&servers[2])
    });
    for (server, client) in servers.iter().zip(&clients).take(2) {
        assert_eq!(hash(server), vec![(format!("{}:1", client.id()), 1)]);
    }
    held.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_majority_and_reports_losing_it() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let watchdog = Duration::from_millis(900);
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(
            Client::builder()
                .standalone(s.url())
                .watchdog_timeout(watchdog)
                .timer_tick(Duration::from_millis(10))
                .command_timeout(Duration::from_millis(300))
                .build()
                .await
                .unwrap(),
        );
    }
    let red = RedLock::new(clients, NAME);
    let guard = red.lock().await.unwrap();
    assert_eq!(guard.masters_held(), 3);
    let initial = guard
        .valid_until()
        .saturating_duration_since(Instant::now());
    assert!(
        initial > Duration::ZERO && initial < watchdog,
        "{initial:?}"
    );

    servers[0].kill();
    // The scenario itself: hold across more than a whole watchdog timeout (3+ renewal periods), so
    // an unrenewed key would be gone by now.
    tokio::time::sleep(watchdog + Duration::from_millis(300)).await;
    assert!(!guard.is_lost(), "two of three masters still renewed");
    assert!(
        guard.valid_until() > Instant::now(),
        "valid_until follows the renewals of the majority"
    );
    for server in &servers[1..] {
        let pttl: i64 = server.conn().pttl(NAME).unwrap();
        assert!(pttl > 0, "renewed key on a live master, pttl {pttl}");
    }

    servers[1].kill();
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss of the majority is reported within a few seconds");
    assert!(
        matches!(
            reason,
            LostReason::RenewalFailed | LostReason::ValidityExpired
        ),
        "{reason:?}"
    );
    assert!(guard.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_has_a_validity_and_expires() {
    let (servers, clients) = masters(3).await;
    let lease = Duration::from_millis(400);
    let red = RedLock::new(clients, NAME);
    let guard = red.lock_with_lease(lease).await.unwrap();
    let validity = guard
        .valid_until()
        .saturating_duration_since(Instant::now());
    assert!(
        validity > Duration::ZERO && validity <= lease - lease / 100 - Duration::from_millis(2),
        "{validity:?}"
    );
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lease expiry reported");
    assert_eq!(reason, LostReason::LeaseExpired);
    assert!(guard.is_lost());
    assert!(guard.valid_until() <= Instant::now());
    wait_until(Duration::from_secs(5), "keys expired", || {
        servers.iter().all(|s| !exists(s))
    });
    assert!(guard.unlock().await.unwrap_err().is_not_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_holder_reenters_on_every_master() {
    let (servers, clients) = masters(3).await;
    let red =
        RedLock::new(clients.clone(), NAME).with_holder(fairlock::Holder::from_raw(7).unwrap());
    let outer = red.lock_with_lease(LEASE).await.unwrap();
    let inner = red
        .try_lock(Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .unwrap();
    for (server, client) in servers.iter().zip(&clients) {
        assert_eq!(hash(server), vec![(format!("{}:7", client.id()), 2)]);
    }
    inner.unlock().await.unwrap();
    assert!(servers.iter().all(exists), "one hold left");
    outer.unlock().await.unwrap();
    assert!(!servers.iter().any(exists));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_locked_and_force_unlock_follow_the_majority() {
    let (servers, clients) = masters(3).await;
    let red = RedLock::new(clients, NAME);
    let observer = RedLock::new(clients_for(&servers).await, NAME);
    let guard = red.lock_with_lease(LEASE).await.unwrap();
    let _: () = servers[0].conn().del(NAME).unwrap();
    assert!(observer.is_locked().await.unwrap(), "held on 2 of 3");
    let _: () = servers[1].conn().del(NAME).unwrap();
    assert!(!observer.is_locked().await.unwrap(), "held on 1 of 3");
    assert!(observer.force_unlock().await.unwrap(), "master 2 had it");
    assert!(!servers.iter().any(exists));
    assert!(!observer.force_unlock().await.unwrap());
    assert!(guard.unlock().await.unwrap_err().is_not_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_are_rejected_before_any_io() {
    let (servers, clients) = masters(2).await;
    let none = RedLock::new(Vec::<Client>::new(), NAME);
    assert!(matches!(
        none.try_lock(Duration::ZERO, None).await.unwrap_err(),
        Error::InvalidArgument {
            argument: "clients",
            ..
        }
    ));
    assert!(none.is_locked().await.unwrap_err().is_invalid_input());
    let twice = RedLock::new([clients[0].clone(), clients[0].clone()], NAME);
    assert!(matches!(
        twice.lock().await.unwrap_err(),
        Error::InvalidArgument {
            argument: "clients",
            ..
        }
    ));
    let same_server = Client::connect(&servers[0].url()).await.unwrap();
    let aliased = RedLock::new([clients[0].clone(), same_server], NAME);
    assert!(aliased.force_unlock().await.unwrap_err().is_invalid_input());
    let red = RedLock::new(clients.clone(), NAME);
    let tiny = red.try_lock(Duration::ZERO, Some(Duration::from_millis(2)));
    assert!(tiny.await.unwrap_err().is_invalid_input());
    let zero = red.clone().node_timeout(Duration::ZERO);
    assert!(zero
        .try_lock(Duration::ZERO, Some(LEASE))
        .await
        .unwrap_err()
        .is_invalid_input());
    let empty_name = RedLock::new(clients, "");
    assert!(matches!(
        empty_name
            .try_lock(Duration::ZERO, Some(LEASE))
            .await
            .unwrap_err(),
        Error::InvalidName { .. }
    ));
    assert!(!servers.iter().any(exists));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_acquisition_releases_grants_that_arrive_late() {
    let (servers, clients) = masters(3).await;
    // Master 2 is frozen: its attempt is in flight when the caller gives up.
    servers[2].pause();
    let red = RedLock::new(clients, NAME).node_timeout(Duration::from_secs(2));
    let attempt = red.try_lock(Duration::from_secs(5), Some(Duration::from_secs(30)));
    assert!(tokio::time::timeout(Duration::from_millis(200), attempt)
        .await
        .is_err());
    // The two answered grants were released when the future was dropped.
    wait_until(Duration::from_secs(5), "answered grants released", || {
        !exists(&servers[0]) && !exists(&servers[1])
    });
    // The frozen master executes the attempt once it thaws; the client releases that grant.
    servers[2].resume();
    wait_until(Duration::from_secs(5), "late grant released", || {
        !exists(&servers[2])
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_take_turns_and_never_overlap() {
    let (servers, _clients) = masters(3).await;
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let red = RedLock::new(clients_for(&servers).await, NAME);
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let g = red.lock_with_lease(LEASE).await.unwrap();
                assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                g.unlock().await.unwrap();
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("every contender got its turns");
    wait_until_async(Duration::from_secs(5), "all released", || async {
        !servers.iter().any(exists)
    })
    .await;
}

/// Guards and futures can cross tasks (compile-time check).
#[allow(dead_code)]
fn bounds(red: RedLock, guard: RedLockGuard) {
    fn send<T: Send>(_: T) {}
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<RedLock>();
    send_sync_static::<RedLockGuard>();
    send(red.lock());
    send(red.lock_with_lease(LEASE));
    send(red.try_lock(LEASE, None));
    send(red.force_unlock());
    send(red.is_locked());
    send(guard.lost());
    send(guard.unlock());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_is_extended_on_a_majority() {
    let (mut servers, clients) = masters(3).await;
    let lease = Duration::from_millis(600);
    let red = RedLock::new(clients, NAME);
    let mut guard = red.lock_with_lease(lease).await.unwrap();
    let first = guard.valid_until();
    // One master goes away: two of three still extend.
    servers[2].kill();
    guard.extend(Duration::from_secs(10)).await.unwrap();
    assert!(guard.valid_until() > first + Duration::from_secs(5));
    for server in &servers[..2] {
        let pttl: i64 = server.conn().pttl(NAME).unwrap();
        assert!(pttl > 8_000, "{pttl}");
    }
    // Past the first lease, still held and trusted.
    tokio::time::sleep_until((first + lease).into()).await;
    assert!(!guard.is_lost());
    // A second master gone: no majority extends any more, and the validity stays.
    servers[1].kill();
    let before = guard.valid_until();
    let err = guard.extend(Duration::from_secs(20)).await.unwrap_err();
    assert!(err.is_quorum_not_reached(), "{err:?}");
    assert!(guard.valid_until() <= before);
    // A watchdog Redlock is not extended.
    let red = RedLock::new(
        [Client::connect(&servers[0].url()).await.unwrap()],
        "red-watchdog",
    );
    let mut watchdog = red.lock().await.unwrap();
    assert!(watchdog
        .extend(Duration::from_secs(1))
        .await
        .unwrap_err()
        .is_invalid_argument());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_read_lost_is_not_extended_back_to_life() {
    // A sibling of the permit defect that torture seed 13690576949177988948 drew: once the
    // validity of a leased Redlock has passed, `is_lost()` says so, and an extension must not
    // move the validity on (the masters may still hold it, but it was not to be trusted for a
    // moment).
    let (_servers, clients) = masters(3).await;
    let red = RedLock::new(clients, NAME);
    let mut guard = red
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep_until(guard.valid_until().into()).await;
    assert!(guard.is_lost());
    let err = guard.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert!(guard.is_lost());
    assert!(guard.valid_until() <= std::time::Instant::now());
}
