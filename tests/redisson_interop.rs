//! Interoperability with the real Redisson client on one redis-server:
//! `interop/redisson/RedissonPeer.java` runs Redisson (found and compiled by
//! `scripts/redisson-classpath.sh`) in a child JVM, and these tests share lock names between it
//! and fairlock: hand-overs both ways (timed), a mixed fair queue served in arrival order,
//! reentry refused across the boundary, force unlock both ways, inspection of Java holds and
//! shared fencing tokens. Killed processes, Redis Cluster and Sentinel have their own files
//! (`tests/redisson_interop_crash.rs`, `_cluster.rs`, `_sentinel.rs`); the helpers they share are
//! in `tests/interop/`. Java or Redisson missing fails the run; nothing is skipped.

mod interop;

use fairlock_testkit as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{Client, LostReason};
use interop::{
    mixed_arrivals, run_mixed_queue, single, standalone_client, timed_hand_overs, Probe,
    MIXED_ORDER,
};
use redis::Commands;
use support::{
    joined, release_channel, timeout_key, wait_until, waiter_channel, JavaPeer, Monitor,
    RedisServer,
};

// ---------------------------------------------------------------------------------------------
// Hand-overs
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_hand_overs_both_ways_are_fast_once_warm() {
    let server = RedisServer::start();
    let peer = JavaPeer::start(&single(&server));
    let client = standalone_client(&server, Duration::from_secs(5)).await;
    timed_hand_overs(
        &peer,
        &client,
        |_| Probe::new(&server, false),
        "standalone",
        Duration::from_millis(100),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Mixed fair queues
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mixed_fair_queue_is_served_in_arrival_order() {
    let server = RedisServer::start();
    let peer = Arc::new(JavaPeer::start(&single(&server)));
    // Heartbeats every 500 ms: the queue below waits through many of them.
    let client = standalone_client(&server, Duration::from_millis(1500)).await;
    let mut probe = Probe::new(&server, false);
    let order = run_mixed_queue(
        &peer,
        &client,
        &mut probe,
        "mixed",
        mixed_arrivals(),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(order, MIXED_ORDER, "served out of arrival order");
}

// ---------------------------------------------------------------------------------------------
// Reentry, force unlock, inspection, fencing (one JVM)
// ---------------------------------------------------------------------------------------------

/// A Java holder and a fairlock holder never share a hold, even with the same numeric holder id.
async fn reentry_is_refused_across_the_boundary(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
) {
    for kind in ["fair", "plain"] {
        let name = format!("reentry-{kind}");
        let java7 = peer.field(7);
        let rust7 = format!("{}:7", client.id().hyphenated());
        let (fair, plain) = (
            client
                .fair_lock(name.clone())
                .with_holder(fairlock::Holder::from_raw(7).unwrap()),
            client
                .non_fair_lock(name.clone())
                .with_holder(fairlock::Holder::from_raw(7).unwrap()),
        );
        let try_rust = |wait: Duration| {
            let (fair, plain) = (fair.clone(), plain.clone());
            async move {
                if kind == "fair" {
                    fair.try_lock(wait, None).await.unwrap()
                } else {
                    plain.try_lock(wait, None).await.unwrap()
                }
            }
        };

        // Java thread 7 holds twice (its own reentry); fairlock holder 7 is someone else.
        peer.call(&format!("lock {kind} {name} 7 -1"))
            .await
            .ok("Java lock");
        peer.call(&format!("lock {kind} {name} 7 -1"))
            .await
            .ok("Java reentry");
        assert!(
            try_rust(Duration::ZERO).await.is_none(),
            "{kind}: Rust entered a Java hold"
        );
        assert!(
            try_rust(Duration::from_millis(300)).await.is_none(),
            "{kind}: Rust entered a Java hold after waiting"
        );
        let count = if kind == "fair" {
            fair.hold_count().await
        } else {
            plain.hold_count().await
        };
        assert_eq!(count.unwrap(), 0);
        assert_eq!(probe.owners(&name), vec![(java7.clone(), 2)]);
        // The Rust waiter's give-up runs in the background once its call returned.
        wait_until(
            Duration::from_secs(5),
            "the Rust give-up left the queue",
            || probe.queue(&name).is_empty(),
        );
        peer.call(&format!("unlock {kind} {name} 7"))
            .await
            .ok("Java unlock");
        peer.call(&format!("unlock {kind} {name} 7"))
            .await
            .ok("Java unlock");

        // fairlock holder 7 holds; Java thread 7 can neither enter nor release it.
        let guard = try_rust(Duration::ZERO).await.expect("free lock");
        assert_eq!(
            peer.call(&format!("trylock {kind} {name} 7 0 -1"))
                .await
                .ok("Java try"),
            "false",
            "{kind}: Java entered a Rust hold"
        );
        assert_eq!(
            peer.call(&format!("trylock {kind} {name} 7 300 -1"))
                .await
                .ok("Java try"),
            "false",
            "{kind}: Java entered a Rust hold after waiting"
        );
        assert_eq!(
            peer.call(&format!("held {kind} {name} 7")).await.ok("held"),
            "false"
        );
        let err = peer.call(&format!("unlock {kind} {name} 7")).await;
        assert!(
            err.err("Java unlock of a Rust hold")
                .starts_with("IllegalMonitorStateException"),
            "{err:?}"
        );
        assert_eq!(probe.owners(&name), vec![(rust7.clone(), 1)]);
        assert!(
            probe.queue(&name).is_empty(),
            "the Java give-up left the queue"
        );
        guard.unlock().await.unwrap();
        assert!(probe.owners(&name).is_empty());
    }
}

/// Java's forceUnlock of a fairlock hold: the guard's `lost()` fires, the waiter behind is served.
async fn java_force_unlock_of_a_rust_hold(peer: &JavaPeer, client: &Client, probe: &mut Probe) {
    for kind in ["fair", "plain"] {
        let name = format!("forced-by-java-{kind}");
        let (held, waiting) = if kind == "fair" {
            let fair = client.fair_lock(name.clone());
            let g = fair
                .clone()
                .with_holder(fairlock::Holder::from_raw(1).unwrap())
                .lock()
                .await
                .unwrap();
            let w = fair.with_holder(fairlock::Holder::from_raw(2).unwrap());
            (g, tokio::spawn(async move { w.lock().await.unwrap() }))
        } else {
            let plain = client.non_fair_lock(name.clone());
            let g = plain
                .clone()
                .with_holder(fairlock::Holder::from_raw(1).unwrap())
                .lock()
                .await
                .unwrap();
            let w = plain.with_holder(fairlock::Holder::from_raw(2).unwrap());
            (g, tokio::spawn(async move { w.lock().await.unwrap() }))
        };
        let waiter_field = format!("{}:2", client.id().hyphenated());
        if kind == "fair" {
            wait_until(Duration::from_secs(10), "the waiter queued", || {
                probe.queue(&name) == [waiter_field.clone()]
                    && probe.subscribers(&waiter_channel(&name, &waiter_field)) == 1
            });
        } else {
            wait_until(Duration::from_secs(10), "the waiter subscribed", || {
                probe.subscribers(&release_channel(&name)) == 1
            });
        }
        let forced = Instant::now();
        assert_eq!(
            peer.call(&format!("force {kind} {name}"))
                .await
                .ok("forceUnlock"),
            "true"
        );
        let next = joined(
            waiting,
            Duration::from_secs(5),
            "the waiter behind is served",
        )
        .await;
        eprintln!(
            "{kind}: served {:?} after Java's forceUnlock",
            forced.elapsed()
        );
        let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
            .await
            .expect("lost() fires after Java's forceUnlock");
        assert_eq!(reason, LostReason::Gone);
        assert_eq!(probe.owners(&name), vec![(waiter_field.clone(), 1)]);
        assert!(held.unlock().await.unwrap_err().is_not_held());
        next.unlock().await.unwrap();
    }
}

/// fairlock's force_unlock of a Java hold: Java's renewals of it stop at the next one, and the
/// Java waiter behind it is served.
async fn rust_force_unlock_of_a_java_hold(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
    monitor: &Monitor,
    renewal_period: Duration,
) {
    let name = "forced-by-rust";
    let (f1, f2) = (peer.field(1), peer.field(2));
    let quoted = |s: &str| format!("\"{s}\"");
    let (qname, qf1, qf2) = (quoted(name), quoted(&f1), quoted(&f2));
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let behind = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "the Java waiter queued", || {
        probe.queue(name) == [f2.clone()] && probe.subscribers(&waiter_channel(name, &f2)) == 1
    });
    // Java renews its hold (inside the renewal script, HEXISTS checks the field first).
    let start = Instant::now();
    monitor.wait_for(
        start,
        &["lua] \"hexists\"", &qname, &qf1],
        renewal_period * 3,
    );

    let forced = Instant::now();
    assert!(client.fair_lock(name).force_unlock().await.unwrap());
    behind
        .wait(Duration::from_secs(5))
        .await
        .ok("the Java waiter behind is served");
    eprintln!(
        "served {:?} after fairlock's force_unlock",
        forced.elapsed()
    );
    assert_eq!(probe.owners(name), vec![(f2.clone(), 1)]);
    assert_eq!(
        peer.call(&format!("held fair {name} 1")).await.ok("held"),
        "false"
    );

    // Watching three renewal periods IS the scenario: the forced hold is renewed at most once
    // more (the renewal that finds it gone), while the new holder's renewals go on.
    tokio::time::sleep(renewal_period * 3 + renewal_period / 2).await;
    let old = monitor.count_since(forced, &["lua] \"hexists\"", &qname, &qf1]);
    let new = monitor.count_since(forced, &["lua] \"hexists\"", &qname, &qf2]);
    eprintln!("renewals after the force: forced hold {old}, new holder {new}");
    assert!(
        old <= 1,
        "Java kept renewing the forced hold: {old} renewals"
    );
    assert!(new >= 2, "the new Java holder was renewed {new} times");
    let err = peer.call(&format!("unlock fair {name} 1")).await;
    assert!(err
        .err("unlock of the forced hold")
        .starts_with("IllegalMonitorStateException"));
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    assert!(probe.owners(name).is_empty());
}

/// `state()` of a Java-held fair lock with Java waiters, and of a Java-held plain lock.
async fn inspection_of_java_holds(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
    java_watchdog: Duration,
) {
    let name = "inspected";
    let (f1, f2, f3) = (peer.field(1), peer.field(2), peer.field(3));
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("lock");
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("reentry");
    let w2 = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "thread 2 queued", || {
        probe.queue(name) == [f2.clone()]
    });
    let w3 = peer.send(&format!("lock fair {name} 3 -1"));
    wait_until(Duration::from_secs(10), "thread 3 queued", || {
        probe.queue(name) == [f2.clone(), f3.clone()]
    });
    let lock = client.fair_lock(name);
    let state = lock.state().await.unwrap();
    let java_ttl: i64 = peer
        .call(&format!("ttl fair {name}"))
        .await
        .ok("ttl")
        .parse()
        .unwrap();
    assert!(state.is_locked());
    assert_eq!(state.owners.len(), 1);
    assert_eq!(state.owners[0].field, f1);
    assert_eq!(state.owners[0].holds, 2);
    assert_eq!(state.owners[0].client_id(), peer.uuid());
    assert_eq!(state.owners[0].holder_id(), Some(1));
    let ttl = state.ttl.expect("a Java hold has a TTL");
    assert!(ttl > Duration::ZERO && ttl <= java_watchdog, "{ttl:?}");
    assert!(
        (ttl.as_millis() as i64 - java_ttl).abs() < java_watchdog.as_millis() as i64 / 2,
        "fairlock sees {ttl:?}, Java {java_ttl} ms"
    );
    let fields: Vec<&str> = state.queue.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(fields, [f2.as_str(), f3.as_str()]);
    for waiter in &state.queue {
        let score: f64 = probe.conn.zscore(timeout_key(name), &waiter.field).unwrap();
        assert_eq!(
            waiter.deadline,
            Some(std::time::UNIX_EPOCH + Duration::from_millis(score as u64)),
            "{waiter:?}"
        );
        // Redisson's deadlines: the holder's TTL plus its 5-minute wait, chained per waiter.
        assert!(
            waiter.expires_in.unwrap() > Duration::from_secs(290),
            "{waiter:?}"
        );
        // A Java waiter has no fairlock liveness mark; it is judged by its deadline.
        assert_eq!(waiter.alive_until, None, "{waiter:?}");
        assert!(waiter.alive, "{waiter:?}");
    }
    assert!(
        state.queue[1]
            .deadline
            .unwrap()
            .duration_since(state.queue[0].deadline.unwrap())
            .unwrap()
            >= Duration::from_secs(290),
        "Java chains its deadlines one wait apart: {:?}",
        state.queue
    );
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(lock.hold_count().await.unwrap(), 0);

    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    assert_eq!(lock.state().await.unwrap().owners[0].holds, 1);
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    w2.wait(Duration::from_secs(5)).await.ok("thread 2 served");
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    w3.wait(Duration::from_secs(5)).await.ok("thread 3 served");
    let state = lock.state().await.unwrap();
    assert_eq!(state.owners[0].field, f3);
    assert!(state.queue.is_empty());
    peer.call(&format!("unlock fair {name} 3"))
        .await
        .ok("unlock");
    assert!(!lock.state().await.unwrap().is_locked());

    // A plain Java hold with a fixed lease of 20 s (not the 3 s watchdog).
    let plain = client.non_fair_lock("inspected-plain");
    peer.call("lock plain inspected-plain 4 20000")
        .await
        .ok("lock");
    let state = plain.state().await.unwrap();
    assert_eq!(state.owners.len(), 1);
    assert_eq!(state.owners[0].field, peer.field(4));
    assert_eq!(state.owners[0].holds, 1);
    assert!(
        state
            .ttl
            .is_some_and(|t| t > Duration::from_secs(15) && t <= Duration::from_secs(20)),
        "{state:?}"
    );
    assert!(state.queue.is_empty());
    peer.call("unlock plain inspected-plain 4")
        .await
        .ok("unlock");
}

/// A Java `tryLockAsync(wait, lease, unit, threadId)` that times out in the queue subtracts the
/// fair wait timeout (300 s), not its own wait, from every waiter behind it: the asynchronous form
/// gives up with `acquireFailedAsync(-1, …)`.
async fn java_async_give_up_shifts_by_the_fair_wait_timeout(peer: &JavaPeer, probe: &mut Probe) {
    let name = "give-up-shift";
    let (f2, f9, f3) = (peer.field(2), peer.field(9), peer.field(3));
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("holder");
    let w2 = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "thread 2 queued", || {
        probe.queue(name) == [f2.clone()]
    });
    let gives_up = peer.send(&format!("trylock fair {name} 9 1000 -1"));
    wait_until(Duration::from_secs(10), "thread 9 queued", || {
        probe.queue(name) == [f2.clone(), f9.clone()]
    });
    let w3 = peer.send(&format!("lock fair {name} 3 -1"));
    wait_until(Duration::from_secs(10), "thread 3 queued", || {
        probe.queue(name) == [f2.clone(), f9.clone(), f3.clone()]
    });
    let score = |probe: &mut Probe, field: &str| -> i64 {
        let s: f64 = probe.conn.zscore(timeout_key(name), field).unwrap();
        s as i64
    };
    let (ahead, behind) = (score(probe, &f2), score(probe, &f3));
    assert_eq!(
        gives_up.wait(Duration::from_secs(10)).await.ok("tryLock"),
        "false"
    );
    wait_until(Duration::from_secs(10), "thread 9 left the queue", || {
        probe.queue(name) == [f2.clone(), f3.clone()]
    });
    assert_eq!(score(probe, &f2), ahead, "the waiter ahead is untouched");
    assert_eq!(
        behind - score(probe, &f3),
        300_000,
        "the waiter behind lost the fair wait timeout, not the 1 s wait"
    );
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    w2.wait(Duration::from_secs(5)).await.ok("thread 2 served");
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    w3.wait(Duration::from_secs(5)).await.ok("thread 3 served");
    peer.call(&format!("unlock fair {name} 3"))
        .await
        .ok("unlock");
}

/// Redisson's RFencedLock and fairlock's fenced handles draw from one counter,
/// `redisson_lock_token:{NAME}`: tokens strictly increase across both, hand-overs included.
async fn fencing_tokens_are_shared(peer: &JavaPeer, client: &Client, probe: &mut Probe) {
    let name = "fenced";
    let token = |reply: &str| -> u64 { reply.rsplit(' ').next().unwrap().parse().unwrap() };
    let mut tokens: Vec<(String, u64)> = Vec::new();

    let t = token(
        peer.call(&format!("lock fenced {name} 1 -1"))
            .await
            .ok("Java fenced lock"),
    );
    tokens.push(("Java lock".into(), t));
    // Contended both ways on the non-fair layout RFencedLock uses.
    let plain = client.non_fair_lock(name).fenced();
    let waiter = tokio::spawn(async move { plain.lock().await.unwrap() });
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter subscribed",
        || probe.subscribers(&release_channel(name)) >= 1,
    );
    peer.call(&format!("unlock fenced {name} 1"))
        .await
        .ok("Java unlock");
    let g = joined(waiter, Duration::from_secs(5), "the fenced fairlock waiter").await;
    tokens.push(("Rust lock after Java".into(), g.fencing_token().unwrap()));
    let java_wait = peer.send(&format!("lock fenced {name} 2 -1"));
    let calls = probe.script_calls();
    wait_until(
        Duration::from_secs(10),
        "the Java waiter attempted twice",
        || probe.script_calls() >= calls + 2,
    );
    g.unlock().await.unwrap();
    let t = token(
        java_wait
            .wait(Duration::from_secs(5))
            .await
            .ok("Java after Rust"),
    );
    tokens.push(("Java lock after Rust".into(), t));
    // Java's reentry takes a new token too.
    let t = token(
        peer.call(&format!("lock fenced {name} 2 -1"))
            .await
            .ok("Java reentry"),
    );
    tokens.push(("Java reentry".into(), t));
    peer.call(&format!("unlock fenced {name} 2"))
        .await
        .ok("unlock");
    peer.call(&format!("unlock fenced {name} 2"))
        .await
        .ok("unlock");
    // A fenced fair handle on the same name shares the counter.
    let fair = client.fair_lock(name).fenced();
    let g = fair.lock().await.unwrap();
    tokens.push(("Rust fair lock".into(), g.fencing_token().unwrap()));
    let g2 = g.reenter(None).await.unwrap();
    tokens.push(("Rust fair reentry".into(), g2.fencing_token().unwrap()));
    drop(g2);
    g.unlock().await.unwrap();
    let reply = peer.call(&format!("trylock fenced {name} 3 0 -1")).await;
    assert!(reply.ok("Java tryLock").starts_with("true "), "{reply:?}");
    tokens.push(("Java tryLock".into(), token(reply.ok(""))));
    peer.call(&format!("unlock fenced {name} 3"))
        .await
        .ok("unlock");
    let g = client
        .non_fair_lock(name)
        .fenced()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .unwrap();
    tokens.push(("Rust tryLock".into(), g.fencing_token().unwrap()));
    g.unlock().await.unwrap();

    eprintln!("FENCING TOKENS: {tokens:?}");
    for pair in tokens.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "tokens must strictly increase: {tokens:?}"
        );
    }
    let counter: u64 = probe
        .conn
        .get(format!("redisson_lock_token:{{{name}}}"))
        .unwrap();
    assert_eq!(counter, tokens.last().unwrap().1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_reentry_force_unlock_inspection_and_fencing() {
    let server = RedisServer::start();
    // Short watchdogs on both sides: renewals every second (Java) and every 500 ms (fairlock).
    let java_watchdog = Duration::from_secs(3);
    let peer = JavaPeer::start(&single(&server).watchdog_ms(java_watchdog.as_millis() as u64));
    let client = Client::builder()
        .standalone(server.url())
        .watchdog_timeout(Duration::from_millis(1500))
        .build()
        .await
        .unwrap();
    let mut probe = Probe::new(&server, false);
    let monitor = Monitor::start(server.port());

    reentry_is_refused_across_the_boundary(&peer, &client, &mut probe).await;
    java_force_unlock_of_a_rust_hold(&peer, &client, &mut probe).await;
    rust_force_unlock_of_a_java_hold(&peer, &client, &mut probe, &monitor, java_watchdog / 3).await;
    inspection_of_java_holds(&peer, &client, &mut probe, java_watchdog).await;
    java_async_give_up_shifts_by_the_fair_wait_timeout(&peer, &mut probe).await;
    fencing_tokens_are_shared(&peer, &client, &mut probe).await;
}
