//! Interoperability with the real Redisson client under Redis Sentinel: hand-overs both ways
//! (timed), a failover under a Java holder with a fairlock waiter queued, and a failover whose
//! promoted replica never got the Java hold (two holders until Java's next renewal). Redisson runs
//! in a child JVM (`interop/redisson/RedissonPeer.java`); the helpers shared with the other
//! interop tests are in `tests/interop/`. Java or Redisson missing fails the run; nothing is
//! skipped.

mod interop;

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::Client;
use interop::{timed_hand_overs, Probe};
use redis::Commands;
use support::{joined, wait_until, JavaOptions, JavaPeer, JavaTopology, Monitor, SentinelGroup};

// ---------------------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_hand_overs_and_a_failover_under_a_java_holder() {
    support::init_tracing();
    let mut group = SentinelGroup::start();
    let java_watchdog = Duration::from_secs(6);
    let peer = JavaPeer::start(
        &JavaOptions::new(JavaTopology::Sentinel {
            master: group.master_name.clone(),
            sentinels: group.sentinel_urls(),
        })
        .watchdog_ms(java_watchdog.as_millis() as u64),
    );
    let client = Client::builder()
        .sentinel(group.master_name.clone(), group.sentinel_urls())
        .build()
        .await
        .unwrap();
    timed_hand_overs(
        &peer,
        &client,
        |_| Probe::new(&group.master, false),
        "sentinel",
        Duration::from_millis(100),
    )
    .await;

    // A failover under a Java holder with a fairlock waiter queued: the replicas have both
    // (WAIT 2 before the kill), so the promoted one keeps the hold and the queue.
    let name = "failover";
    let f1 = peer.field(1);
    let mut probe = Probe::new(&group.master, false);
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let lock = client
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(2).unwrap());
    let rust_field = format!("{}:2", client.id().hyphenated());
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (Instant::now(), g)
    });
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter queued",
        || probe.queue(name) == [rust_field.clone()],
    );
    let mut new_master = group.kill_synced_master();
    // Java follows the promotion: its renewals land on the new master.
    support::wait_for_renewal(&mut new_master, name, java_watchdog * 2);
    let owners: Vec<(String, i64)> = new_master.hgetall(name).unwrap();
    assert_eq!(
        owners,
        vec![(f1.clone(), 1)],
        "the promoted replica has the Java hold"
    );
    assert_eq!(
        peer.call(&format!("held fair {name} 1")).await.ok("held"),
        "true"
    );
    // Nobody hangs, and nobody overtakes the holder.
    assert!(
        !waiter.is_finished(),
        "the fairlock waiter took a lock Java still holds"
    );
    let released = Instant::now();
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("Java unlock on the new master");
    let (at, g) = joined(
        waiter,
        Duration::from_secs(15),
        "the fairlock waiter served",
    )
    .await;
    eprintln!(
        "after the failover, Java→Rust hand-over: {:?}",
        at - released
    );
    // The sentinels may have failed over a second time by now (a promoted replica that missed
    // their pings on a loaded machine): the checks ask whichever master they agree on.
    let owners: Vec<(String, i64)> = group.current_master().hgetall(name).unwrap();
    let g_field = g.owner_field().to_owned();
    assert_eq!(owners, vec![(g_field.clone(), 1)]);
    g.unlock().await.unwrap();
    assert!(!client.fair_lock(name).is_locked().await.unwrap());
    let mut master = group.current_master();
    let left: Vec<(String, i64)> = master.hgetall(name).unwrap();
    let pttl: i64 = master.pttl(name).unwrap();
    assert!(
        left.is_empty(),
        "after the unlock {name} still holds {left:?} (PTTL {pttl} ms; Java's field {f1}, ours {g_field})"
    );
}

/// The asynchronous-replication window: the replica promoted never got the Java hold (it was cut
/// off while the other replica acknowledged Redisson's `WAIT 1`, and that one died with the
/// master). The fairlock waiter then takes the free lock on the new master while the Java thread
/// still believes it holds: two holders, until Java's next renewal finds its field gone and stops
/// (Redisson tells the Java thread nothing; its unlock fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_that_lost_the_java_hold_gives_two_holders_until_the_next_renewal() {
    let mut group = SentinelGroup::start();
    let java_watchdog = Duration::from_secs(6);
    let peer = JavaPeer::start(
        &JavaOptions::new(JavaTopology::Sentinel {
            master: group.master_name.clone(),
            sentinels: group.sentinel_urls(),
        })
        .watchdog_ms(java_watchdog.as_millis() as u64),
    );
    let client = Client::builder()
        .sentinel(group.master_name.clone(), group.sentinel_urls())
        .build()
        .await
        .unwrap();
    let name = "lost-in-failover";
    let f1 = peer.field(1);

    // Replica 1 cut off (its link closed, and a wrong master password keeps it from coming back):
    // Redisson's WAIT 1 after the lock script is acknowledged by replica 0 only.
    let mut cut_off = group.replicas[1].conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("masterauth")
        .arg("not-the-password")
        .query(&mut cut_off)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("master")
        .query(&mut cut_off)
        .unwrap();
    wait_until(Duration::from_secs(10), "replica 1 disconnected", || {
        support::info_field(&group.master.info("replication"), "connected_slaves") == Some("1")
    });
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let lock = client
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(2).unwrap());
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (Instant::now(), g)
    });
    let mut probe = Probe::new(&group.master, false);
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter queued",
        || probe.queue(name).len() == 1,
    );
    // The replica that has the hold dies with the master; the cut-off one is promoted.
    group.replicas[0].kill();
    let old = group.master.port();
    group.master.kill();
    let new_port = group.wait_for_failover(old, Duration::from_secs(30));
    assert_eq!(new_port, group.replicas[1].port());
    let monitor = Monitor::start(new_port);
    let watching = Instant::now();
    let mut new_master = group.replicas[1].conn();

    let (at, g) = joined(
        waiter,
        Duration::from_secs(30),
        "the fairlock waiter served",
    )
    .await;
    eprintln!(
        "the promoted replica lacked the Java hold: fairlock served {:?} after the failover was reported",
        at.saturating_duration_since(watching)
    );
    let owners: Vec<(String, i64)> = new_master.hgetall(name).unwrap();
    assert_eq!(owners, vec![(g.owner_field().to_owned(), 1)]);
    // Java's renewals reach the new master and stop once one finds the field gone. The first
    // may not count: Redisson follows it with `WAIT 1`, the new master has no replica left, and
    // a renewal whose sync fails is an error (NoSyncedSlavesException) that is retried at the
    // next period. Watching 1.5 watchdog timeouts (4.5 renewal periods) IS the scenario.
    tokio::time::sleep(java_watchdog + java_watchdog / 2).await;
    let renewals = monitor.lines_since(
        watching,
        &[
            "lua] \"hexists\"",
            &format!("\"{name}\""),
            &format!("\"{f1}\""),
        ],
    );
    eprintln!(
        "Java renewals of the lost hold on the new master: {}",
        renewals.len()
    );
    assert!(
        renewals.len() <= 2,
        "Java kept renewing a hold the new master never had: {renewals:#?}"
    );
    assert!(
        !g.is_lost(),
        "Java's renewals must not disturb the new holder"
    );
    assert_eq!(
        peer.call(&format!("held fair {name} 1")).await.ok("held"),
        "false"
    );
    let err = peer.call(&format!("unlock fair {name} 1")).await;
    assert!(err
        .err("Java unlock of the lost hold")
        .starts_with("IllegalMonitorStateException"));
    g.unlock().await.unwrap();
}
