//! Redis Cluster: every lock kind on a real 6-node cluster (3 masters, 3 replicas), sharded and
//! classic pub/sub, a slot migrated under waiting waiters, and a master killed while a lock is
//! held with waiters queued.
//!
//! `PubSubMode::Auto` is sharded pub/sub on Redis 7+ and Valkey, classic on Redis 6.2, which has
//! no sharded pub/sub: the subscription checks count the kind of subscriber the server under test
//! should see ([`auto_sharded`]), and explicit `PubSubMode::Sharded` is refused on 6.2.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, PubSubMode, SyncFailure};
use redis::Commands;
use support::{
    assert_lost_and_taken_over, joined, kill_replica_links, subscribed_channels, wait_for,
    wait_for_renewal, wait_until, wait_until_async, wait_until_or, RedisCluster,
};

async fn cluster_client(cluster: &RedisCluster, mode: PubSubMode) -> Client {
    cluster_client_with(cluster, mode, |b| b).await
}

async fn cluster_client_with(
    cluster: &RedisCluster,
    mode: PubSubMode,
    tweak: impl FnOnce(fairlock::Builder) -> fairlock::Builder,
) -> Client {
    tweak(
        Client::builder()
            .cluster(cluster.urls())
            .pubsub_mode(mode)
            // Long enough that a heartbeat never stands in for a lost message in these tests.
            .waiter_liveness(Duration::from_secs(30)),
    )
    .build()
    .await
    .unwrap()
}

/// Whether `PubSubMode::Auto` means sharded pub/sub on the server under test (Redis 7+, Valkey)
/// rather than classic (Redis 6.2).
fn auto_sharded() -> bool {
    support::test_server().kind.auto_is_sharded()
}

/// Raw commands on the master that owns `key`.
fn master_conn(cluster: &RedisCluster, key: &str) -> redis::Connection {
    cluster.nodes[cluster.master_for_key(key)].conn()
}

/// Names whose slots live on `n` different masters.
fn names_on_different_masters(cluster: &RedisCluster, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut names = Vec::new();
    for i in 0.. {
        let name = format!("cl-lock-{i}");
        let master = cluster.master_for_key(&name);
        if !seen.contains(&master) {
            seen.push(master);
            names.push(name);
            if names.len() == n {
                break;
            }
        }
    }
    names
}

/// The queue length of `name` on the master of its slot.
fn queue_len(cluster: &RedisCluster, name: &str) -> i64 {
    support::queue_len(&mut master_conn(cluster, name), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_served_in_order_on_every_master_with_auto_pubsub() {
    support::init_tracing();
    let cluster = RedisCluster::start();
    let clients = [
        cluster_client(&cluster, PubSubMode::Auto).await,
        cluster_client(&cluster, PubSubMode::Auto).await,
        cluster_client(&cluster, PubSubMode::Auto).await,
    ];
    for name in names_on_different_masters(&cluster, 3) {
        let held = clients[0].fair_lock(name.as_str()).lock().await.unwrap();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..6usize {
            let lock = clients[1 + i % 2].fair_lock(name.as_str());
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                order.lock().unwrap().push(i);
                g.unlock().await.unwrap();
            }));
            wait_until(Duration::from_secs(10), "waiter queued", || {
                queue_len(&cluster, &name) == i as i64 + 1
            });
        }
        // Every waiter listens on its own channel: a shard channel on the master that owns the
        // name (Redis 7+), a classic one on some node (6.2).
        let mut raw = master_conn(&cluster, &name);
        let head: String = raw
            .lindex(format!("redisson_lock_queue:{{{name}}}"), 0)
            .unwrap();
        let channel = format!("redisson_lock__channel:{{{name}}}:{head}");
        // (The head subscribes after it joined: wait for it, then check where it listens.)
        wait_until(Duration::from_secs(10), "the head subscribed", || {
            cluster.channel_subscribers(&channel) != (0, 0)
        });
        assert_eq!(
            cluster.channel_subscribers(&channel),
            RedisCluster::one_auto_subscriber(),
            "(classic, sharded) subscribers of {channel}"
        );
        if auto_sharded() {
            let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(&channel)
                .query(&mut raw)
                .unwrap();
            assert_eq!(counts.get(1), Some(&redis::Value::Int(1)), "{counts:?}");
        }

        held.unlock().await.unwrap();
        for t in tasks {
            joined(t, Duration::from_secs(10), "every waiter is served").await;
        }
        assert_eq!(*order.lock().unwrap(), (0..6).collect::<Vec<_>>(), "{name}");
        assert_eq!(queue_len(&cluster, &name), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_style_peer_wakes_our_waiter_in_either_pubsub_mode() {
    let cluster = RedisCluster::start();
    // Sharded only where the server has it (Redis 7+); 6.2 refuses it (the next test).
    let mut modes = vec![(PubSubMode::Classic, "PUBLISH")];
    if support::test_server().kind.has_sharded_pubsub() {
        modes.insert(0, (PubSubMode::Sharded, "SPUBLISH"));
    }
    for (mode, publish) in modes {
        let client = cluster_client(&cluster, mode).await;
        let name = format!("peer-{publish}");
        let mut raw = master_conn(&cluster, &name);
        // The Java holder: its field in the hash, a long TTL, so only a message can wake us.
        let java = "8f1d0c52-1b7e-4c47-a7e3-9e1d1a1f0b11:1";
        let _: () = raw.hset(&name, java, 1).unwrap();
        let _: () = raw.pexpire(&name, 60_000).unwrap();

        let lock = client.fair_lock(name.as_str());
        let waiter =
            tokio::spawn(async move { lock.try_lock(Duration::from_secs(20), None).await });
        wait_until(Duration::from_secs(10), "our waiter queued", || {
            queue_len(&cluster, &name) == 1
        });
        let field: String = raw
            .lindex(format!("redisson_lock_queue:{{{name}}}"), 0)
            .unwrap();
        assert!(field.starts_with(&client.id().hyphenated().to_string()));
        let channel = format!("redisson_lock__channel:{{{name}}}:{field}");
        // Wait until our subscription is in place (a message before it would be lost).
        wait_until(Duration::from_secs(10), "our waiter subscribed", || {
            let counts: Vec<redis::Value> = if publish == "SPUBLISH" {
                redis::cmd("PUBSUB")
                    .arg("SHARDNUMSUB")
                    .arg(&channel)
                    .query(&mut raw)
                    .unwrap()
            } else {
                // Classic subscriptions may sit on any node; NUMSUB answers per node.
                cluster
                    .nodes
                    .iter()
                    .filter(|n| n.is_running())
                    .map(|n| {
                        let v: Vec<redis::Value> = redis::cmd("PUBSUB")
                            .arg("NUMSUB")
                            .arg(&channel)
                            .query(&mut n.conn())
                            .unwrap();
                        v
                    })
                    .find(|v| v.get(1) == Some(&redis::Value::Int(1)))
                    .unwrap_or_default()
            };
            counts.get(1) == Some(&redis::Value::Int(1))
        });

        // Redisson's fair unlock, in the same pub/sub mode.
        let released = Instant::now();
        let _: () = raw.del(&name).unwrap();
        let _: i64 = redis::cmd(publish)
            .arg(&channel)
            .arg("0")
            .query(&mut raw)
            .unwrap();
        let guard = waiter
            .await
            .unwrap()
            .unwrap()
            .expect("woken by the peer's release");
        assert!(
            released.elapsed() < Duration::from_secs(5),
            "{publish}: woken after {:?}",
            released.elapsed()
        );
        let hash: Vec<(String, i64)> = raw.hgetall(&name).unwrap();
        assert_eq!(hash, vec![(field.clone(), 1)]);
        guard.unlock().await.unwrap();
        assert!(!raw.exists::<_, bool>(&name).unwrap());
    }
}

/// Explicit `PubSubMode::Sharded` where the servers have no sharded pub/sub (Redis 6.2) is refused
/// when the client is built: its scripts would fail on `SPUBLISH` after they changed the lock (a
/// release deleting the hash, then erroring). On Redis 7+ it builds and waiters subscribe sharded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_sharded_pubsub_needs_a_server_with_sharded_pubsub() {
    let cluster = RedisCluster::start();
    let built = Client::builder()
        .cluster(cluster.urls())
        .pubsub_mode(PubSubMode::Sharded)
        .waiter_liveness(Duration::from_secs(30))
        .build()
        .await;
    if !support::test_server().kind.has_sharded_pubsub() {
        let err = built.expect_err("PubSubMode::Sharded on a Redis 6.2 cluster");
        assert!(err.is_invalid_input(), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("Sharded") && text.contains("7"),
            "the error names the mode and the version it needs: {text}"
        );
        // Nothing was written, and Auto and Classic clients work on the same cluster.
        for mode in [PubSubMode::Auto, PubSubMode::Classic] {
            let client = cluster_client(&cluster, mode).await;
            let g = client.fair_lock("sharded-refused").lock().await.unwrap();
            g.unlock().await.unwrap();
        }
        assert!(!master_conn(&cluster, "sharded-refused")
            .exists::<_, bool>("sharded-refused")
            .unwrap());
        return;
    }
    let client = built.expect("PubSubMode::Sharded on a Redis 7+ cluster");
    let name = "sharded-explicit".to_owned();
    let held = cluster_client(&cluster, PubSubMode::Sharded)
        .await
        .fair_lock(name.as_str())
        .lock()
        .await
        .unwrap();
    let lock = client.fair_lock(name.as_str());
    let waiter = tokio::spawn(async move { lock.lock().await });
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&cluster, &name) == 1
    });
    let pattern = format!("redisson_lock__channel:{{{name}}}:*");
    wait_until(
        Duration::from_secs(10),
        "the waiter subscribed sharded",
        || cluster.subscribed_channels(&pattern) == (0, 1),
    );
    let released = Instant::now();
    held.unlock().await.unwrap();
    let g = joined(waiter, Duration::from_secs(10), "the waiter is served")
        .await
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken by the SPUBLISH, not a heartbeat: {:?}",
        released.elapsed()
    );
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_cannot_share_a_slot_are_rejected_and_watchdog_renews_across_slots() {
    let cluster = RedisCluster::start();
    let client = cluster_client_with(&cluster, PubSubMode::Auto, |b| {
        b.watchdog_timeout(Duration::from_millis(900))
    })
    .await;
    for bad in ["a{b", "x{}y"] {
        let err = client.fair_lock(bad).lock().await.unwrap_err();
        assert!(err.is_invalid_input(), "{bad}: {err:?}");
        let err = client.non_fair_lock(bad).lock().await.unwrap_err();
        assert!(err.is_invalid_input(), "{bad}: {err:?}");
    }
    // Locks on many slots over all three masters, renewed for several periods.
    let mut guards = Vec::new();
    for i in 0..40 {
        let name = format!("wd-{i}");
        guards.push(client.fair_lock(name.as_str()).lock().await.unwrap());
        guards.push(
            client
                .non_fair_lock(format!("{{tag{i}}}:plain"))
                .lock()
                .await
                .unwrap(),
        );
    }
    // Every node forgets the scripts (as a promoted replica that never ran them would): the
    // renewal pipelines and the calls below are answered NOSCRIPT and sent again as EVAL, on the
    // node that owns the keys.
    for node in &cluster.nodes {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut node.conn())
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut node.conn())
            .unwrap();
    }
    let start = Instant::now();
    wait_until_async(Duration::from_secs(10), "three renewal periods", || async {
        start.elapsed() >= Duration::from_millis(2700)
    })
    .await;
    assert!(guards.iter().all(|g| !g.is_lost()));
    for g in &guards {
        let pttl: i64 = master_conn(&cluster, g.name()).pttl(g.name()).unwrap();
        assert!(pttl > 0, "{} expired", g.name());
    }
    for g in guards {
        g.unlock().await.unwrap();
    }
    let mut evals = 0;
    for node in &cluster.nodes {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut node.conn())
            .unwrap();
        assert_eq!(support::command_calls(&info, "script|load"), 0, "{info}");
        evals += support::command_calls(&info, "eval");
    }
    // At least one EVAL per master (each holds some of the locks); after that, EVALSHA.
    assert!(evals >= 3, "{evals} EVAL calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stalled_shard_costs_only_its_own_locks() {
    let cluster = RedisCluster::start();
    let client = cluster_client_with(&cluster, PubSubMode::Auto, |b| {
        b.watchdog_timeout(Duration::from_secs(3))
            .command_timeout(Duration::from_millis(200))
    })
    .await;
    let names = names_on_different_masters(&cluster, 3);
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.fair_lock(name.as_str()).lock().await.unwrap());
        guards.push(
            client
                .non_fair_lock(format!("{{{name}}}:plain"))
                .lock()
                .await
                .unwrap(),
        );
    }
    // Writes stall on one master (scripts wait, as during a manual failover) for longer than two
    // renewals take to fail; the cluster itself stays healthy.
    let stalled = cluster.master_for_key(&names[0]);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(20_000)
        .arg("WRITE")
        .query(&mut cluster.nodes[stalled].conn())
        .unwrap();
    let (on_stalled, healthy): (Vec<_>, Vec<_>) = guards
        .into_iter()
        .partition(|g| cluster.master_for_key(g.name()) == stalled);
    for g in &on_stalled {
        let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
            .await
            .expect("the stalled shard's locks are reported lost");
        assert_eq!(reason, fairlock::LostReason::RenewalFailed);
    }
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut cluster.nodes[stalled].conn())
        .unwrap();
    // The other shards' locks were renewed all along and still are.
    for g in &healthy {
        assert!(!g.is_lost(), "{} lost with the other shard", g.name());
        wait_for_renewal(
            &mut master_conn(&cluster, g.name()),
            g.name(),
            Duration::from_secs(5),
        );
    }
    for g in healthy {
        g.unlock().await.unwrap();
    }
    for g in on_stalled {
        assert!(g.unlock().await.unwrap_err().is_not_held());
    }
}

/// `CLUSTER MYID` of a node.
fn node_id(cluster: &RedisCluster, index: usize) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut cluster.nodes[index].conn())
        .unwrap()
}

/// Moves `slot` from master `from` to master `to` the way `redis-cli --cluster reshard` does.
fn migrate_slot(cluster: &RedisCluster, slot: u16, from: usize, to: usize) {
    let (from_id, to_id) = (node_id(cluster, from), node_id(cluster, to));
    let mut src = cluster.nodes[from].conn();
    let mut dst = cluster.nodes[to].conn();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&from_id)
        .query(&mut dst)
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&to_id)
        .query(&mut src)
        .unwrap();
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut src)
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(cluster.nodes[to].port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut src)
            .unwrap();
    }
    for node in [to, from] {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&to_id)
            .query(&mut cluster.nodes[node].conn())
            .unwrap();
    }
    wait_until(
        Duration::from_secs(20),
        "every node sees the new owner",
        || cluster.master_for_slot(slot) == to,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_a_slot_migrated_while_they_wait() {
    let cluster = RedisCluster::start();
    let a = cluster_client(&cluster, PubSubMode::Auto).await;
    let b = cluster_client(&cluster, PubSubMode::Auto).await;
    let name = "migrating".to_owned();
    let slot = RedisCluster::key_slot(&name);
    let from = cluster.master_for_slot(slot);
    let to = names_on_different_masters(&cluster, 3)
        .iter()
        .map(|n| cluster.master_for_key(n))
        .find(|&m| m != from)
        .unwrap();

    let held = a.fair_lock(name.as_str()).lock().await.unwrap();
    let fair_waiter = {
        let lock = b.fair_lock(name.as_str());
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "fair waiter queued", || {
        queue_len(&cluster, &name) == 1
    });
    // A non-fair lock in the same slot, with a waiter on its shared release channel.
    let plain = format!("{{{name}}}:plain");
    let plain_held = a.non_fair_lock(plain.as_str()).lock().await.unwrap();
    let plain_waiter = {
        let lock = b.non_fair_lock(plain.as_str());
        tokio::spawn(async move { lock.lock().await })
    };
    let plain_channel = format!("redisson_lock__channel:{plain}");
    let mut src = cluster.nodes[from].conn();
    wait_until(Duration::from_secs(10), "plain waiter subscribed", || {
        if auto_sharded() {
            let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(&plain_channel)
                .query(&mut src)
                .unwrap();
            counts.get(1) == Some(&redis::Value::Int(1))
        } else {
            // Classic (6.2): on whichever node the subscription connection sits.
            cluster.channel_subscribers(&plain_channel) == (1, 0)
        }
    });

    migrate_slot(&cluster, slot, from, to);
    // The lock, its queue and its deadlines moved with the slot.
    let mut dst = cluster.nodes[to].conn();
    assert!(dst.exists::<_, bool>(&name).unwrap());
    assert_eq!(
        dst.llen::<_, i64>(format!("redisson_lock_queue:{{{name}}}"))
            .unwrap(),
        1
    );
    // Sharded: the waiters re-subscribe on the new owner (the old one dropped their shard
    // channels). Classic (6.2): a slot move does not touch a classic subscription, which stays.
    wait_until(
        Duration::from_secs(15),
        "waiters subscribed on the new master",
        || {
            if auto_sharded() {
                let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
                    .arg("SHARDNUMSUB")
                    .arg(&plain_channel)
                    .query(&mut dst)
                    .unwrap();
                counts.get(1) == Some(&redis::Value::Int(1))
            } else {
                cluster.channel_subscribers(&plain_channel) == (1, 0)
            }
        },
    );

    let released = Instant::now();
    held.unlock().await.unwrap();
    plain_held.unlock().await.unwrap();
    let g = joined(
        fair_waiter,
        Duration::from_secs(10),
        "the fair waiter is served after the migration",
    )
    .await
    .unwrap();
    let p = joined(
        plain_waiter,
        Duration::from_secs(10),
        "the plain waiter is served after the migration",
    )
    .await
    .unwrap();
    // Woken by messages, not by the 10 s heartbeat or the lock's 30 s TTL.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "{:?}",
        released.elapsed()
    );
    g.unlock().await.unwrap();
    p.unlock().await.unwrap();
    assert!(!dst.exists::<_, bool>(&name).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_while_held_keeps_a_synced_lock_and_serves_the_queue() {
    let cluster = RedisCluster::start();
    // The holder waits for a replica to acknowledge every grant, so the promoted replica has it.
    let a = cluster_client_with(&cluster, PubSubMode::Auto, |b| {
        b.watchdog_timeout(Duration::from_secs(12))
            .replica_sync(Duration::from_secs(2), SyncFailure::Error)
    })
    .await;
    let b = cluster_client_with(&cluster, PubSubMode::Auto, |b| {
        b.watchdog_timeout(Duration::from_secs(12))
    })
    .await;
    let name = "failover".to_owned();
    let master = cluster.master_for_key(&name);
    let held = a.fair_lock(name.as_str()).lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock(name.as_str());
        tokio::spawn(async move {
            let g = lock
                .lock()
                .await
                .expect("the waiter keeps waiting through the failover");
            (Instant::now(), g)
        })
    };
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&cluster, &name) == 1
    });
    // The queue must have reached the replica too before we kill the master.
    let mut m = cluster.nodes[master].conn();
    let _: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut m).unwrap();

    let mut cluster = cluster;
    cluster.nodes[master].kill();
    let killed = Instant::now();
    let new_master = cluster.wait_for_new_master(
        RedisCluster::key_slot(&name),
        master,
        Duration::from_secs(30),
    );
    let mut nm = cluster.nodes[new_master].conn();
    // The promoted replica had the lock: the holder keeps it (renewals reach the new master,
    // which shows as the TTL going up again)...
    wait_for_renewal(&mut nm, &name, Duration::from_secs(20));
    assert!(!held.is_lost(), "{:?}", killed.elapsed());
    // ... and the waiter, still queued, is not let in while it is held.
    assert!(!waiter.is_finished(), "two holders after the failover");
    // Sharded: its subscription moved to the new master (the dead node's shard channel is
    // gone). Classic (6.2): it is on a live node, where every node hears every message. (redis-rs
    // re-subscribes a classic channel after a node dropped out, and the channel can then be found
    // on two live nodes: the waiter hears a release twice, which only wakes it twice.)
    let pattern = format!("redisson_lock__channel:{{{name}}}:*");
    let sharded = auto_sharded();
    wait_for(
        Duration::from_secs(10),
        "the waiter subscribed on the new master",
        || {
            let subscribed = if sharded {
                subscribed_channels(&mut nm, true, &pattern) == 1
            } else {
                let (classic, sharded) = cluster.subscribed_channels(&pattern);
                classic >= 1 && sharded == 0
            };
            subscribed.then_some(())
        },
        || {
            let all: Vec<(u16, usize)> = cluster
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .map(|n| {
                    (
                        n.port(),
                        subscribed_channels(&mut n.conn(), sharded, &pattern),
                    )
                })
                .collect();
            format!(
                "new master port {}; (port, subscribed channels) per node: {all:?}",
                cluster.nodes[new_master].port()
            )
        },
    );
    assert_eq!(
        nm.llen::<_, i64>(format!("redisson_lock_queue:{{{name}}}"))
            .unwrap(),
        1
    );

    let released = Instant::now();
    held.unlock().await.unwrap();
    let (granted, g) = joined(
        waiter,
        Duration::from_secs(15),
        "the queued waiter is served after the failover",
    )
    .await;
    assert!(granted >= released);
    assert!(!g.is_lost());
    g.unlock().await.unwrap();
    assert!(!nm.exists::<_, bool>(&name).unwrap());
}

/// Index of the replica that follows master `master`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_promoted_replica_never_saw_is_reported_lost_and_the_waiter_gets_it() {
    let cluster = RedisCluster::start();
    let a = cluster_client_with(&cluster, PubSubMode::Auto, |b| {
        b.watchdog_timeout(Duration::from_secs(12))
    })
    .await;
    let b = cluster_client_with(&cluster, PubSubMode::Auto, |b| {
        b.watchdog_timeout(Duration::from_secs(12))
    })
    .await;
    let name = "unsynced".to_owned();
    let master = cluster.master_for_key(&name);
    let replica = cluster
        .replica_of(master)
        .expect("every master has a replica");
    // Cut the replica off before the grant: frozen, and its link closed by the master, so the
    // write below never reaches it. (Well within the 2 s node timeout.)
    cluster.nodes[replica].pause();
    kill_replica_links(&mut cluster.nodes[master].conn());
    let held = a.fair_lock(name.as_str()).lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock(name.as_str());
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&cluster, &name) == 1
    });
    let mut cluster = cluster;
    cluster.nodes[master].kill();
    cluster.nodes[replica].resume();
    let slot = RedisCluster::key_slot(&name);
    assert_eq!(
        cluster.wait_for_new_master(slot, master, Duration::from_secs(30)),
        replica
    );
    let mut nm = cluster.nodes[replica].conn();

    assert_lost_and_taken_over(held, waiter, &mut nm, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_cluster_failover_keeps_the_lock_and_moves_the_waiters() {
    support::init_tracing();
    let cluster = RedisCluster::start();
    // A manual failover pauses writes on the old master for up to 5 s (longer when an attempt
    // times out and is asked for again): renewals every 4 s that may hang for 6 s ride it out.
    let a = cluster_client_with(&cluster, PubSubMode::Auto, |b| {
        b.watchdog_timeout(Duration::from_secs(12))
            .command_timeout(Duration::from_secs(6))
    })
    .await;
    let b = cluster_client(&cluster, PubSubMode::Auto).await;
    let name = "manual-failover".to_owned();
    let master = cluster.master_for_key(&name);
    let replica = cluster
        .replica_of(master)
        .expect("every master has a replica");
    let held = a.fair_lock(name.as_str()).lock().await.unwrap();
    let waiter = {
        let lock = b.fair_lock(name.as_str());
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "waiter queued", || {
        queue_len(&cluster, &name) == 1
    });
    // Coordinated: the replica catches up, takes over, and the old master turns replica. (A
    // manual failover asked for right after the cluster formed can time out while the nodes
    // still settle; it is then asked for again.)
    let slot = RedisCluster::key_slot(&name);
    let took_over = (0..6).any(|_| {
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut cluster.nodes[replica].conn())
            .unwrap();
        // The replica gives up on a manual failover after 5 s.
        wait_until_or(Duration::from_secs(6), || {
            cluster.try_master_for_slot(slot) == Some(replica)
        })
    });
    assert!(
        took_over,
        "the replica did not take over\nreplica log:\n{}",
        cluster.nodes[replica].log_tail(15)
    );
    let mut nm = cluster.nodes[replica].conn();
    wait_for_renewal(&mut nm, &name, Duration::from_secs(15));
    // The waiter's shard subscription is live: on the new master, or (if the old master kept it
    // when it turned replica) on that replica of the same shard, which receives the shard's
    // messages too; while redis-rs re-subscribes it can briefly be on both or on neither.
    // Classic (6.2): on any node, as every node hears every message.
    let mut om = cluster.nodes[master].conn();
    let pattern = format!("redisson_lock__channel:{{{name}}}:*");
    let sharded = auto_sharded();
    wait_for(
        Duration::from_secs(10),
        "the waiter subscribed in the shard",
        || {
            let n = if sharded {
                subscribed_channels(&mut nm, true, &pattern)
                    + subscribed_channels(&mut om, true, &pattern)
            } else {
                cluster.subscribed_channels(&pattern).0
            };
            (n > 0).then_some(())
        },
        || {
            // Where every node stands, to tell a lost subscription from a slow one.
            let all: Vec<(u16, usize)> = cluster
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .map(|n| {
                    (
                        n.port(),
                        subscribed_channels(&mut n.conn(), sharded, &pattern),
                    )
                })
                .collect();
            format!("(port, subscribed channels) per node: {all:?}")
        },
    );
    assert!(!held.is_lost());
    if waiter.is_finished() {
        panic!("the waiter ended during the failover: {:?}", waiter.await);
    }
    let released = Instant::now();
    held.unlock().await.unwrap();
    let g = joined(
        waiter,
        Duration::from_secs(10),
        "the waiter is served on the new master",
    )
    .await
    .unwrap();
    // Woken by the release message: the lock's TTL was at least 8 s and the waiter's heartbeat
    // is 10 s away.
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "{:?}",
        released.elapsed()
    );
    g.unlock().await.unwrap();
    assert!(!nm.exists::<_, bool>(&name).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_takes_a_cluster_as_one_of_its_masters() {
    let cluster = RedisCluster::start();
    let standalone = [support::RedisServer::start(), support::RedisServer::start()];
    let mut clients = vec![cluster_client(&cluster, PubSubMode::Auto).await];
    for s in &standalone {
        clients.push(Client::connect(&s.url()).await.unwrap());
    }
    let name = "red-on-cluster";
    let red = fairlock::RedLock::new(clients.clone(), name);
    let guard = red.lock().await.unwrap();
    assert_eq!(guard.masters_held(), 3);
    // The RLock hash is on the cluster master that owns the name's slot and on both servers.
    let mut owner = master_conn(&cluster, name);
    assert_eq!(owner.hlen::<_, i64>(name).unwrap(), 1);
    for s in &standalone {
        assert_eq!(s.conn().hlen::<_, i64>(name).unwrap(), 1);
    }
    // Another task (another holder) cannot take it while it is held, and gets it after the
    // unlock.
    let other = fairlock::RedLock::new(clients, name);
    let (refused_tx, refused) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn(async move {
        let early = other.try_lock(Duration::from_millis(200), None).await;
        let _ = refused_tx.send(early.unwrap().is_none());
        other.lock().await
    });
    let was_refused = tokio::time::timeout(Duration::from_secs(10), refused)
        .await
        .expect("the other holder's try_lock returns")
        .unwrap();
    assert!(was_refused, "taken while held");
    guard.unlock().await.unwrap();
    let g = joined(
        waiter,
        Duration::from_secs(10),
        "the second RedLock is served",
    )
    .await
    .unwrap();
    assert_eq!(g.masters_held(), 3);
    g.unlock().await.unwrap();
    assert!(!owner.exists::<_, bool>(name).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_builder_of_ones_own_is_used_and_every_connection_is_named() {
    let cluster = RedisCluster::start();
    // An ACL user for lock clients on every node (ACLs do not replicate); the default user, which
    // the cluster and the harness use, may not run scripts.
    support::add_lock_user(&cluster.nodes, "locker", "s3cret");
    let urls = cluster.urls();
    let make = move || {
        fairlock::redis::cluster::ClusterClientBuilder::new(urls.clone())
            .username("locker")
            .password("s3cret")
    };
    let (a, b) = (
        Client::builder()
            .cluster_client(make.clone())
            .build()
            .await
            .unwrap(),
        Client::builder()
            .cluster_client(make)
            .build()
            .await
            .unwrap(),
    );
    for name in names_on_different_masters(&cluster, 3) {
        let held = a.fair_lock(name.as_str()).lock().await.unwrap();
        let waiter = {
            let lock = b.fair_lock(name.as_str());
            tokio::spawn(async move { lock.lock().await })
        };
        wait_until(Duration::from_secs(10), "waiter queued", || {
            queue_len(&cluster, &name) == 1
        });
        held.unlock().await.unwrap();
        joined(waiter, Duration::from_secs(10), "the waiter is served")
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        // On the master of this name: b's command and subscription connections, named, as
        // the builder's user.
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut master_conn(&cluster, &name))
            .unwrap();
        for role in ["cmd", "sub"] {
            let named = format!(" name=fairlock:{}:{role} ", b.id());
            let line = clients
                .lines()
                .find(|l| l.contains(&named))
                .unwrap_or_else(|| panic!("no connection{named}in {clients}"));
            assert!(line.contains(" user=locker "), "{line}");
        }
    }
    // Without the builder's credentials, the default user may not run the scripts.
    let anonymous = cluster_client(&cluster, PubSubMode::Auto).await;
    let err = anonymous.fair_lock("x").lock().await.unwrap_err();
    assert!(err.is_redis() && !err.is_transient(), "{err:?}");
}
