//! Interoperability with the real Redisson client on a Redis Cluster: hand-overs both ways
//! (timed) with both sides on their default pub/sub (sharded on Redis 7+, classic on 6.2), a
//! mixed fair queue served in arrival order, and a Redisson on classic pub/sub, which needs
//! `PubSubMode::Classic`. Redisson runs in a child JVM (`interop/redisson/RedissonPeer.java`); the
//! helpers shared with the other interop tests are in `tests/interop/`. Java or Redisson missing
//! fails the run; nothing is skipped.

mod interop;

use fairlock_testkit as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{Client, PubSubMode};
use interop::{
    auto_sharded, mixed_arrivals, run_mixed_queue, subscribers, timed_hand_overs, Probe,
    MIXED_ORDER,
};
use redis::Commands;
use support::{
    joined, queue_key, release_channel, wait_for, wait_until, waiter_channel, JavaOptions,
    JavaPeer, JavaTopology, RedisCluster,
};

// ---------------------------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------------------------

/// Waits until every master's `WAIT 1` is acknowledged at once (a fresh cluster answers WAIT
/// only after about a second at first, and Redisson sends WAIT after each lock script there).
fn settle(cluster: &RedisCluster) {
    for node in &cluster.nodes {
        let info = node.info("replication");
        if support::info_field(&info, "role") != Some("master") {
            continue;
        }
        let mut conn = node.conn();
        let mut fast_in_a_row = 0;
        wait_until(
            Duration::from_secs(30),
            &format!("master {} acknowledges WAIT 1 at once", node.url()),
            || {
                let started = Instant::now();
                let acked: i64 = redis::cmd("WAIT")
                    .arg(1)
                    .arg(1000)
                    .query(&mut conn)
                    .unwrap();
                if acked >= 1 && started.elapsed() < Duration::from_millis(50) {
                    fast_in_a_row += 1;
                } else {
                    fast_in_a_row = 0;
                }
                fast_in_a_row >= 3
            },
        );
    }
}

/// Classic and sharded subscribers of `channel` summed over every node of the cluster (sharded
/// ones are 0 on a server without sharded pub/sub, Redis 6.2).
fn cluster_subscribers(cluster: &RedisCluster, channel: &str) -> (i64, i64) {
    cluster.channel_subscribers(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_hand_overs_with_redisson_default_pubsub() {
    let cluster = RedisCluster::start();
    settle(&cluster);
    let peer = JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())));
    // PubSubMode::Auto, the default.
    let client = cluster.client().await;

    // Which pub/sub flavour does Redisson use by default here? Park Java waiters and look.
    for kind in ["fair", "plain"] {
        let name = format!("flavour-{kind}");
        let holder = if kind == "fair" {
            client.fair_lock(name.clone()).lock().await.unwrap()
        } else {
            client.non_fair_lock(name.clone()).lock().await.unwrap()
        };
        let java_wait = peer.send(&format!("lock {kind} {name} 1 -1"));
        let channel = if kind == "fair" {
            waiter_channel(&name, &peer.field(1))
        } else {
            release_channel(&name)
        };
        let (classic, sharded) = wait_for(
            Duration::from_secs(15),
            "the Java waiter subscribed (classic or sharded)",
            || {
                let (c, s) = cluster_subscribers(&cluster, &channel);
                (c + s > 0).then_some((c, s))
            },
            || peer.log_tail(20),
        );
        eprintln!("REDISSON CLUSTER PUBSUB ({kind}): classic {classic}, sharded {sharded}");
        assert_eq!(
            (classic, sharded),
            RedisCluster::one_auto_subscriber(),
            "Redisson's default on a Redis 7+ cluster: sharded pub/sub; on 6.2: classic"
        );
        if auto_sharded() {
            let mut master = cluster.nodes[cluster.master_for_key(&name)].conn();
            assert_eq!(
                subscribers(&mut master, true, &channel),
                1,
                "on the lock's master"
            );
        }
        holder.unlock().await.unwrap();
        java_wait
            .wait(Duration::from_secs(10))
            .await
            .ok("Java waiter served");
        peer.call(&format!("unlock {kind} {name} 1"))
            .await
            .ok("unlock");
    }

    timed_hand_overs(
        &peer,
        &client,
        |name| Probe::cluster(&cluster, name),
        "cluster",
        Duration::from_millis(100),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mixed_fair_queue_is_served_in_arrival_order() {
    let cluster = RedisCluster::start();
    settle(&cluster);
    let default_peer = Arc::new(JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(
        cluster.urls(),
    ))));
    let client = Client::builder()
        .cluster(cluster.urls())
        .waiter_liveness(Duration::from_millis(1500))
        .build()
        .await
        .unwrap();
    let name = "mixed-cluster";
    let mut probe = Probe::cluster(&cluster, name);
    let order = run_mixed_queue(
        &default_peer,
        &client,
        &mut probe,
        name,
        mixed_arrivals(),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(order, MIXED_ORDER, "served out of arrival order");
}

/// A Redisson client told to use classic pub/sub (`ShardedSubscriptionMode.OFF`) needs
/// `PubSubMode::Classic`; with `Auto` (sharded on Redis 7) neither side hears the other's release.
/// A Redisson left on its default whose start-up probe failed is on classic pub/sub too. On Redis
/// 6.2, which has no sharded pub/sub, `Auto` is classic and matches, and Redisson's probe always
/// fails (no `PUBSUB SHARDNUMSUB`), so its default is classic too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_classic_pubsub_needs_pubsub_mode_classic() {
    let cluster = RedisCluster::start();
    settle(&cluster);
    let peer =
        JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())).sharded("off"));
    let classic = Client::builder()
        .cluster(cluster.urls())
        .pubsub_mode(PubSubMode::Classic)
        .build()
        .await
        .unwrap();
    let auto = cluster.client().await;

    // Matching modes: hand-overs both ways by message.
    let name = "classic";
    let f1 = peer.field(1);
    let mut master = cluster.nodes[cluster.master_for_key(name)].conn();
    let guard = classic.fair_lock(name).lock().await.unwrap();
    let java_wait = peer.send(&format!("lock fair {name} 1 -1"));
    wait_until(
        Duration::from_secs(10),
        "the Java waiter subscribed",
        || cluster_subscribers(&cluster, &waiter_channel(name, &f1)) == (1, 0),
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let reply = java_wait.wait(Duration::from_secs(5)).await;
    reply.ok("Java served");
    eprintln!("classic Rust→Java: {:?}", reply.at - released);
    assert!(reply.at - released < Duration::from_secs(1));
    let lock = classic.fair_lock(name);
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (Instant::now(), g)
    });
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter subscribed",
        || {
            let q: Vec<String> = master.lrange(queue_key(name), 0, -1).unwrap();
            q.len() == 1 && cluster_subscribers(&cluster, &waiter_channel(name, &q[0])) == (1, 0)
        },
    );
    let released = Instant::now();
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("Java unlock");
    let (at, g) = joined(waiter, Duration::from_secs(5), "fairlock served").await;
    eprintln!("classic Java→Rust: {:?}", at - released);
    assert!(at - released < Duration::from_secs(1));
    g.unlock().await.unwrap();

    // Mismatched on Redis 7+: fairlock (Auto = sharded) releases, the classic Java waiter hears
    // nothing and only gets the lock when its own retry comes, at the end of the lease it was
    // told. On 6.2 Auto is classic: the same release wakes the Java waiter at once.
    let name = "mismatched";
    // Once uncontended first, so Redisson's scripts are loaded on this master (a NOSCRIPT
    // retry would count as an attempt below).
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("lock");
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    let guard = auto
        .fair_lock(name)
        .lock_with_lease(Duration::from_secs(3))
        .await
        .unwrap();
    let mut probe = Probe::new(&cluster.nodes[cluster.master_for_key(name)], false);
    let calls = probe.script_calls();
    let java_wait = peer.send(&format!("lock fair {name} 1 -1"));
    // Parked: subscribed, and both attempts (before and after subscribing) made.
    wait_until(
        Duration::from_secs(10),
        "the Java waiter subscribed and attempted twice",
        || {
            cluster_subscribers(&cluster, &waiter_channel(name, &f1)) == (1, 0)
                && probe.script_calls() >= calls + 2
        },
    );
    // What is left of the lease: a Java waiter that hears nothing retries when it runs out.
    let left = Duration::from_millis(
        redis::Commands::pttl::<_, u64>(
            &mut cluster.nodes[cluster.master_for_key(name)].conn(),
            name,
        )
        .unwrap(),
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let reply = java_wait.wait(Duration::from_secs(5)).await;
    reply.ok("Java served at last");
    let waited = reply.at - released;
    eprintln!("mismatched Rust→Java: {waited:?} ({left:?} of the lease left)");
    if auto_sharded() {
        assert!(
            left >= Duration::from_millis(500),
            "the check needs time left: {left:?}"
        );
        assert!(
            waited + Duration::from_millis(200) >= left,
            "the classic Java waiter heard a sharded release ({waited:?} of {left:?})"
        );
    } else {
        assert!(
            waited < Duration::from_secs(1),
            "Auto is classic on 6.2: the Java waiter hears the release ({waited:?})"
        );
    }
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");

    // Redisson's default (ShardedSubscriptionMode.AUTO) decides once, at start-up, by running
    // `PUBSUB SHARDNUMSUB` on the first seed node; when that fails it stays on classic pub/sub
    // for good, without a word. Here an ACL denies it on the first seed while the JVM starts
    // (Redis 7+; 6.2 has no such subcommand, and no subcommand deny rules: the probe fails there
    // as it is).
    let mut seed = cluster.nodes[0].conn();
    let acl = |rule: &str, conn: &mut redis::Connection| {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg(rule)
            .query(conn)
            .unwrap();
    };
    let deny_probe = support::test_server().kind.has_sharded_pubsub();
    if deny_probe {
        acl("-pubsub|shardnumsub", &mut seed);
    }
    let probed = JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())));
    if deny_probe {
        acl("+pubsub|shardnumsub", &mut seed);
    }
    let name = "failed-probe";
    let guard = classic.fair_lock(name).lock().await.unwrap();
    let java_wait = probed.send(&format!("lock fair {name} 1 -1"));
    let channel = waiter_channel(name, &probed.field(1));
    let seen = wait_for(
        Duration::from_secs(10),
        "the Java waiter subscribed",
        || {
            let (c, s) = cluster_subscribers(&cluster, &channel);
            (c + s > 0).then_some((c, s))
        },
        || probed.log_tail(20),
    );
    eprintln!("Redisson after a failed start-up probe: (classic, sharded) = {seen:?}");
    assert_eq!(seen, (1, 0), "classic pub/sub after a failed probe");
    guard.unlock().await.unwrap();
    java_wait
        .wait(Duration::from_secs(5))
        .await
        .ok("served (Classic on both sides)");
    probed
        .call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
}
