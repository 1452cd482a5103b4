//! Sentinel: the client finds the master through the sentinels and follows it through a failover.
//! One master, two replicas, three sentinels (quorum 2), all real local processes.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, SyncFailure};
use redis::Commands;
use support::{
    assert_lost_and_taken_over, joined, kill_replica_links, subscribed_channels, wait_for_renewal,
    wait_until, RedisServer, SentinelGroup,
};

async fn sentinel_client(
    group: &SentinelGroup,
    configure: impl FnOnce(fairlock::Builder) -> fairlock::Builder,
) -> Client {
    configure(
        Client::builder()
            .sentinel(group.master_name.clone(), group.sentinel_urls())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(1))
            .watchdog_timeout(Duration::from_secs(12)),
    )
    .build()
    .await
    .unwrap()
}

/// The queue length of `name` on `server`, over a fresh connection.
fn queue_len(server: &RedisServer, name: &str) -> i64 {
    support::queue_len(&mut server.conn(), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_locks_work_on_the_master_sentinel_names() {
    let group = SentinelGroup::start();
    let a = sentinel_client(&group, |b| b).await;
    let b = sentinel_client(&group, |b| b).await;
    let held = a.fair_lock("s-fifo").lock().await.unwrap();
    // The keys are on the master (and reach the replicas).
    let mut m = group.master.conn();
    assert_eq!(
        m.hgetall::<_, Vec<(String, i64)>>("s-fifo").unwrap(),
        vec![(held.owner_field().to_owned(), 1)]
    );
    let mut waiters = Vec::new();
    for i in 0..4 {
        let lock = if i % 2 == 0 { &a } else { &b }.fair_lock("s-fifo");
        waiters.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            let at = Instant::now();
            g.unlock().await.unwrap();
            at
        }));
        wait_until(Duration::from_secs(10), "waiter queued", || {
            queue_len(&group.master, "s-fifo") == i + 1
        });
    }
    held.unlock().await.unwrap();
    let mut granted = Vec::new();
    for w in waiters {
        granted.push(joined(w, Duration::from_secs(10), "waiter served").await);
    }
    assert!(granted.windows(2).all(|w| w[0] <= w[1]), "{granted:?}");
    assert!(!m.exists::<_, bool>("s-fifo").unwrap());

    // The non-fair lock too: a waiter on the other client is woken by the release message.
    let plain = a.non_fair_lock("s-plain").lock().await.unwrap();
    let waiter = {
        let lock = b.non_fair_lock("s-plain");
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "the waiter subscribed", || {
        let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redisson_lock__channel:{s-plain}")
            .query(&mut m)
            .unwrap();
        n[0].1 == 1
    });
    plain.unlock().await.unwrap();
    let g = joined(waiter, Duration::from_secs(5), "the plain waiter is woken")
        .await
        .unwrap();
    g.unlock().await.unwrap();
    assert!(!m.exists::<_, bool>("s-plain").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synced_lock_survives_the_failover_and_its_waiter_is_served_after() {
    let mut group = SentinelGroup::start();
    let a = sentinel_client(&group, |b| {
        b.replica_sync(Duration::from_secs(2), SyncFailure::Error)
    })
    .await;
    let b = sentinel_client(&group, |b| b).await;
    let name = "s-synced";
    let held = a.fair_lock(name).lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock(name);
        tokio::spawn(async move {
            let g = lock
                .lock()
                .await
                .expect("the waiter keeps waiting through the failover");
            (Instant::now(), g)
        })
    };
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&group.master, name) == 1
    });
    // The queue must reach the replicas before the master dies (the grant already did: WAIT).
    let mut nm = group.kill_synced_master();
    // The new master had the lock, and the holder's renewals reach it (the TTL goes up again).
    wait_for_renewal(&mut nm, name, Duration::from_secs(20));
    assert!(!held.is_lost());
    assert!(!waiter.is_finished(), "two holders after the failover");
    // The waiter's client moved its pub/sub connection to the new master.
    wait_until(
        Duration::from_secs(10),
        "the waiter subscribed on the new master",
        || {
            subscribed_channels(
                &mut nm,
                false,
                &format!("redisson_lock__channel:{{{name}}}:*"),
            ) == 1
        },
    );

    let released = Instant::now();
    held.unlock().await.unwrap();
    let (granted, g) = joined(
        waiter,
        Duration::from_secs(15),
        "the queued waiter is served on the new master",
    )
    .await;
    assert!(granted >= released);
    assert!(!g.is_lost());
    assert_eq!(
        group
            .current_master()
            .hgetall::<_, Vec<(String, i64)>>(name)
            .unwrap(),
        vec![(g.owner_field().to_owned(), 1)]
    );
    g.unlock().await.unwrap();
    // Whichever master the sentinels agree on now (a loaded machine may fail over twice).
    assert!(!group.current_master().exists::<_, bool>(name).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_promoted_replica_never_saw_is_reported_lost_and_the_waiter_gets_it() {
    let mut group = SentinelGroup::start();
    let a = sentinel_client(&group, |b| b).await;
    let b = sentinel_client(&group, |b| b).await;
    let name = "s-unsynced";
    // Cut the replicas off before the grant: frozen, and their links closed by the master, so the
    // write below never reaches them. (Well within the sentinels' 1 s down-after window.)
    for r in &group.replicas {
        r.pause();
    }
    kill_replica_links(&mut group.master.conn());
    let held = a.fair_lock(name).lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock(name);
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&group.master, name) == 1
    });
    let old = group.master.port();
    group.master.kill();
    for r in &group.replicas {
        r.resume();
    }
    let new = group.wait_for_failover(old, Duration::from_secs(30));
    let mut nm = group.server_on(new).conn();

    assert_lost_and_taken_over(held, waiter, &mut nm, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_moves_commands_and_subscriptions_to_the_new_master() {
    let group = SentinelGroup::start();
    let a = sentinel_client(&group, |b| {
        b.replica_sync(Duration::from_secs(2), SyncFailure::Error)
    })
    .await;
    let b = sentinel_client(&group, |b| b).await;
    let name = "s-manual";
    let held = a.fair_lock(name).lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock(name);
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&group.master, name) == 1
    });
    let _: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(2000)
        .query(&mut group.master.conn())
        .unwrap();
    // The old master stays up and becomes a replica: nothing fails outright, the sentinels
    // reconfigure the servers and close their clients' connections.
    let old = group.master.port();
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(&group.master_name)
        .query(&mut group.sentinels[0].conn())
        .unwrap();
    let new = group.wait_for_failover(old, Duration::from_secs(30));
    let mut nm = group.server_on(new).conn();
    wait_for_renewal(&mut nm, name, Duration::from_secs(20));
    wait_until(
        Duration::from_secs(20),
        "the waiter subscribed on the new master",
        || {
            subscribed_channels(
                &mut nm,
                false,
                &format!("redisson_lock__channel:{{{name}}}:*"),
            ) == 1
        },
    );
    assert!(!held.is_lost());
    if waiter.is_finished() {
        panic!("the waiter ended during the failover: {:?}", waiter.await);
    }
    held.unlock().await.unwrap();
    let g = joined(
        waiter,
        Duration::from_secs(15),
        "the waiter is served on the new master",
    )
    .await
    .unwrap();
    g.unlock().await.unwrap();
    // Whichever master the sentinels agree on now (a loaded machine may fail over twice).
    assert!(!group.current_master().exists::<_, bool>(name).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_for_the_master_are_used_on_every_connection() {
    let group = SentinelGroup::start();
    // An ACL user for lock clients on every server of the group (ACLs do not replicate); the
    // default user, which the sentinels and the test harness use, may not run scripts.
    support::add_lock_user(
        std::iter::once(&group.master).chain(&group.replicas),
        "locker",
        "s3cret",
    );
    let anonymous = sentinel_client(&group, |b| b).await;
    let err = anonymous.fair_lock("s-auth").lock().await.unwrap_err();
    assert!(err.is_redis() && !err.is_transient(), "{err:?}");

    let a = sentinel_client(&group, |b| b.sentinel_master_auth(Some("locker"), "s3cret")).await;
    let b = sentinel_client(&group, |b| b.sentinel_master_auth(Some("locker"), "s3cret")).await;
    let held = a.fair_lock("s-auth").lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock("s-auth");
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&group.master, "s-auth") == 1
    });
    held.unlock().await.unwrap();
    let g = joined(
        waiter,
        Duration::from_secs(5),
        "the waiter is woken through its authenticated subscriber",
    )
    .await
    .unwrap();
    g.unlock().await.unwrap();
    // The command connections of both clients and the pub/sub connection of the one that waited
    // authenticated as `locker`.
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut group.master.conn())
        .unwrap();
    let locker = clients
        .lines()
        .filter(|l| l.contains(" user=locker "))
        .count();
    let pubsub = clients
        .lines()
        .filter(|l| l.contains(" user=locker ") && !l.contains(" sub=0 "))
        .count();
    assert!(locker >= 3 && pubsub >= 1, "{clients}");

    // The whole master connection (credentials and database) as redis-rs's type.
    use fairlock::redis::sentinel::SentinelNodeConnectionInfo;
    use fairlock::redis::RedisConnectionInfo;
    let master = || {
        SentinelNodeConnectionInfo::default().set_redis_connection_info(
            RedisConnectionInfo::default()
                .set_db(5)
                .set_username("locker")
                .set_password("s3cret"),
        )
    };
    let c = sentinel_client(&group, |b| b.sentinel_master_connection(master())).await;
    let guard = c.fair_lock("s-db").lock().await.unwrap();
    let mut raw = group.master.conn();
    assert!(!raw.exists::<_, bool>("s-db").unwrap(), "not in database 0");
    let _: () = redis::cmd("SELECT").arg(5).query(&mut raw).unwrap();
    assert!(raw.exists::<_, bool>("s-db").unwrap(), "in database 5");
    guard.unlock().await.unwrap();
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut raw).unwrap();
    let named = format!(" name=fairlock:{}:cmd ", c.id());
    let line = clients
        .lines()
        .find(|l| l.contains(&named))
        .unwrap_or_else(|| panic!("no connection{named}in {clients}"));
    assert!(
        line.contains(" db=5 ") && line.contains(" user=locker "),
        "{line}"
    );
    // Credentials are given once: both setters together are refused before any I/O.
    let err = Client::builder()
        .sentinel(group.master_name.clone(), group.sentinel_urls())
        .sentinel_master_connection(master())
        .sentinel_master_auth(Some("locker"), "s3cret")
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_a_sentinel_master_through_its_failover() {
    let mut group = SentinelGroup::start();
    let standalone = [RedisServer::start(), RedisServer::start()];
    let mut clients = vec![sentinel_client(&group, |b| b).await];
    for s in &standalone {
        clients.push(Client::connect(&s.url()).await.unwrap());
    }
    let name = "red-on-sentinel";
    let red = fairlock::RedLock::new(clients.clone(), name);
    let guard = red.lock().await.unwrap();
    assert_eq!(guard.masters_held(), 3);
    // The RLock hash is on the Sentinel-managed master (and, once the kill below has waited for
    // them, on its replicas) and on both standalone servers.
    assert_eq!(group.master.conn().hlen::<_, i64>(name).unwrap(), 1);
    for s in &standalone {
        assert_eq!(s.conn().hlen::<_, i64>(name).unwrap(), 1);
    }
    let mut nm = group.kill_synced_master();
    // That master's client followed the promotion: its watchdog renews the hash there.
    wait_for_renewal(&mut nm, name, Duration::from_secs(20));
    assert!(!guard.is_lost());
    assert_eq!(guard.masters_held(), 3);
    // Another task (another holder) does not get it meanwhile.
    let other = fairlock::RedLock::new(clients.clone(), name);
    let refused = {
        let other = other.clone();
        tokio::spawn(async move { other.try_lock(Duration::from_millis(200), None).await })
    };
    let refused = joined(
        refused,
        Duration::from_secs(10),
        "the other task's try_lock",
    )
    .await;
    assert!(refused.unwrap().is_none(), "taken while held");

    guard.unlock().await.unwrap();
    // Whichever master the sentinels agree on now (a loaded machine may fail over twice).
    assert!(!group.current_master().exists::<_, bool>(name).unwrap());
    for s in &standalone {
        assert!(!s.conn().exists::<_, bool>(name).unwrap());
    }
    let g = joined(
        tokio::spawn(async move { other.lock().await }),
        Duration::from_secs(10),
        "the other task's lock",
    )
    .await
    .unwrap();
    assert_eq!(g.masters_held(), 3);
    g.unlock().await.unwrap();
}
