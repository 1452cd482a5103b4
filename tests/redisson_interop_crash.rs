//! Interoperability with the real Redisson client when a process dies: a Java or fairlock holder
//! killed while holding (the lock goes to the other side's waiters once its watchdog lease runs
//! out) and a dead fairlock waiter ahead of a Java waiter (purged while a fairlock client is
//! active). The fairlock side that dies is this test binary started again as a child process
//! (`spawn_role`: the binary itself, filtered to the spawning test's exact name, with its role in
//! `ROLE_ENV`), so the role code lives here, next to the tests that spawn it, and those tests stay
//! at the crate root. Redisson runs in a child JVM (`interop/redisson/RedissonPeer.java`); the
//! helpers shared with the other interop tests are in `tests/interop/`. Java or Redisson missing
//! fails the run; nothing is skipped.

mod interop;

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::Client;
use interop::{single, standalone_client, Probe};
use redis::Commands;
use support::{
    joined, queue_key, release_channel, sigkill, timeout_key, wait_until, waiter_channel, JavaPeer,
    RedisServer,
};

// ---------------------------------------------------------------------------------------------
// Killed processes
// ---------------------------------------------------------------------------------------------

const ROLE_ENV: &str = "FAIRLOCK_INTEROP_ROLE";

/// Starts this test binary again as a child that runs `test` in `role` (the test checks
/// `ROLE_ENV` first) against `url`, and waits until it prints `READY`.
fn spawn_role(test: &str, role: &str, url: &str) -> std::process::Child {
    support::spawn_role(test, &[(ROLE_ENV, role), ("FAIRLOCK_INTEROP_URL", url)])
}

/// In a child process: its role and the server URL.
fn child_role() -> Option<(String, String)> {
    let role = std::env::var(ROLE_ENV).ok()?;
    Some((role, std::env::var("FAIRLOCK_INTEROP_URL").unwrap()))
}

/// The child roles: a fairlock holder of `killed-rust-fair` and `killed-rust-plain` (watchdog
/// 2 s), or a fairlock waiter queued on `dead-waiter` (liveness 1.5 s). Never returns.
async fn play_child_role(role: &str, url: &str) -> ! {
    let client = Client::builder()
        .standalone(url)
        .watchdog_timeout(Duration::from_secs(2))
        .waiter_liveness(Duration::from_millis(1500))
        .build()
        .await
        .unwrap();
    match role {
        "holder" => {
            let _fair = client.fair_lock("killed-rust-fair").lock().await.unwrap();
            let _plain = client
                .non_fair_lock("killed-rust-plain")
                .lock()
                .await
                .unwrap();
            println!("READY");
            std::future::pending::<()>().await;
        }
        "waiter" => {
            let lock = client.fair_lock("dead-waiter");
            let _task = tokio::spawn(async move { lock.lock().await });
            let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
            let prefix = client.id().hyphenated().to_string();
            wait_until(Duration::from_secs(10), "the child queued", || {
                raw.lrange::<_, Vec<String>>(queue_key("dead-waiter"), 0, -1)
                    .unwrap()
                    .iter()
                    .any(|f| f.starts_with(&prefix))
            });
            println!("READY");
            std::future::pending::<()>().await;
        }
        other => panic!("unknown role {other}"),
    }
    unreachable!()
}

/// Checks one hand-over to a waiter after the holder's process died: not before the holder's
/// lease (PTTL when killed) ran out, and soon after.
fn check_served_after_lease(what: &str, pttl_at_kill: i64, waited: Duration) {
    eprintln!("{what}: served {waited:?} after the kill (PTTL then {pttl_at_kill} ms)");
    let waited_ms = waited.as_millis() as i64;
    assert!(
        waited_ms >= pttl_at_kill - 50,
        "{what}: served after {waited_ms} ms, before the lease ({pttl_at_kill} ms) ran out"
    );
    assert!(
        waited_ms <= pttl_at_kill + 1500,
        "{what}: served {waited_ms} ms after the kill, lease was {pttl_at_kill} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holders_free_the_lock_when_their_watchdog_lease_runs_out() {
    if let Some((role, url)) = child_role() {
        play_child_role(&role, &url).await;
    }
    let server = RedisServer::start();
    let mut probe = Probe::new(&server, false);
    let client = standalone_client(&server, Duration::from_secs(5)).await;
    // Two JVMs: one is killed while holding, the other waits for a killed fairlock holder.
    let victim_options = single(&server).watchdog_ms(2000);
    let victim = tokio::task::spawn_blocking(move || JavaPeer::start(&victim_options));
    let survivor = JavaPeer::start(&single(&server).watchdog_ms(2000));
    let mut victim = victim.await.unwrap();

    // A Java holder dies: fairlock waiters get the locks once the watchdog lease runs out.
    victim
        .call("lock fair killed-java-fair 1 -1")
        .await
        .ok("lock");
    victim
        .call("lock plain killed-java-plain 1 -1")
        .await
        .ok("lock");
    let fair = client.fair_lock("killed-java-fair");
    let plain = client.non_fair_lock("killed-java-plain");
    let fair_waiter = tokio::spawn(async move {
        let g = fair.lock().await.unwrap();
        (Instant::now(), g)
    });
    let plain_waiter = tokio::spawn(async move {
        let g = plain.lock().await.unwrap();
        (Instant::now(), g)
    });
    wait_until(Duration::from_secs(10), "the fairlock waiters wait", || {
        probe.queue("killed-java-fair").len() == 1
            && probe.subscribers(&release_channel("killed-java-plain")) == 1
    });
    let (fair_pttl, plain_pttl) = (
        probe.pttl("killed-java-fair"),
        probe.pttl("killed-java-plain"),
    );
    let killed = Instant::now();
    victim.kill();
    let (at, fair_guard) = joined(fair_waiter, Duration::from_secs(10), "fair waiter").await;
    check_served_after_lease("Java holder killed, fair", fair_pttl, at - killed);
    let (at, plain_guard) = joined(plain_waiter, Duration::from_secs(10), "plain waiter").await;
    check_served_after_lease("Java holder killed, plain", plain_pttl, at - killed);
    fair_guard.unlock().await.unwrap();
    plain_guard.unlock().await.unwrap();

    // A fairlock holder dies: Java waiters get the locks likewise.
    let mut child = spawn_role(
        "killed_holders_free_the_lock_when_their_watchdog_lease_runs_out",
        "holder",
        &server.url(),
    );
    let f1 = survivor.field(1);
    let fair_wait = survivor.send("lock fair killed-rust-fair 1 -1");
    let plain_wait = survivor.send("lock plain killed-rust-plain 1 -1");
    wait_until(Duration::from_secs(10), "the Java waiters wait", || {
        probe.queue("killed-rust-fair") == [f1.clone()]
            && probe.subscribers(&waiter_channel("killed-rust-fair", &f1)) == 1
            && probe.subscribers(&release_channel("killed-rust-plain")) == 1
    });
    let (fair_pttl, plain_pttl) = (
        probe.pttl("killed-rust-fair"),
        probe.pttl("killed-rust-plain"),
    );
    let killed = Instant::now();
    sigkill(&mut child);
    let reply = fair_wait.wait(Duration::from_secs(10)).await;
    reply.ok("Java fair waiter");
    check_served_after_lease("fairlock holder killed, fair", fair_pttl, reply.at - killed);
    let reply = plain_wait.wait(Duration::from_secs(10)).await;
    reply.ok("Java plain waiter");
    check_served_after_lease(
        "fairlock holder killed, plain",
        plain_pttl,
        reply.at - killed,
    );
    assert_eq!(probe.owners("killed-rust-fair"), vec![(f1.clone(), 1)]);
    survivor
        .call("unlock fair killed-rust-fair 1")
        .await
        .ok("unlock");
    survivor
        .call("unlock plain killed-rust-plain 1")
        .await
        .ok("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_rust_waiter_ahead_of_a_java_waiter_is_purged_while_a_fairlock_client_is_active() {
    if let Some((role, url)) = child_role() {
        play_child_role(&role, &url).await;
    }
    let name = "dead-waiter";
    let server = RedisServer::start();
    let mut probe = Probe::new(&server, false);
    let peer = JavaPeer::start(&single(&server));
    // The active fairlock client: a live waiter behind the Java one, heartbeating every 500 ms.
    let liveness = Duration::from_millis(1500);
    let client = standalone_client(&server, liveness).await;

    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let mut child = spawn_role(
        "a_dead_rust_waiter_ahead_of_a_java_waiter_is_purged_while_a_fairlock_client_is_active",
        "waiter",
        &server.url(),
    );
    let dead = probe.queue(name)[0].clone();
    let f2 = peer.field(2);
    let java_wait = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "the Java waiter queued", || {
        probe.queue(name) == [dead.clone(), f2.clone()]
    });
    let live = client
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(3).unwrap());
    let live_field = format!("{}:3", client.id().hyphenated());
    let live_waiter = tokio::spawn(async move { live.lock().await.unwrap() });
    wait_until(
        Duration::from_secs(10),
        "the live fairlock waiter queued",
        || probe.queue(name) == [dead.clone(), f2.clone(), live_field.clone()],
    );

    let killed = Instant::now();
    sigkill(&mut child);
    // The Java holder's release wakes the dead head only.
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("Java release");
    let reply = java_wait.wait(Duration::from_secs(15)).await;
    reply.ok("the Java waiter behind the dead one");
    let waited = reply.at - killed;
    eprintln!("dead fairlock waiter purged: Java waiter served {waited:?} after the kill");
    // The dead head's deadline lapses at most one liveness window after the kill; the live
    // waiter's next heartbeat (every liveness / 3) purges it and tells the Java waiter.
    assert!(
        waited <= liveness * 2 + Duration::from_millis(500),
        "the Java waiter waited {waited:?} behind a dead fairlock waiter (liveness {liveness:?})"
    );
    assert_eq!(probe.owners(name), vec![(f2.clone(), 1)]);
    let queue = probe.queue(name);
    assert!(!queue.contains(&dead), "{queue:?}");
    let score: Option<f64> = probe.conn.zscore(timeout_key(name), &dead).unwrap();
    assert_eq!(score, None, "the dead waiter's deadline is gone too");
    // Its liveness mark goes too. When our heartbeat purged it, the mark went with it; but the
    // dead waiter's score in Z lapses with its mark, so Redisson's own retry may purge it first,
    // from Q and Z only (Redisson does not know L). Then the live waiter's next heartbeat sweeps
    // the lapsed mark of a waiter no longer queued.
    let liveness_key = format!("fairlock_liveness:{{{name}}}");
    wait_until(
        Duration::from_secs(10),
        "the dead waiter's liveness mark is gone",
        || {
            probe
                .conn
                .zscore::<_, _, Option<f64>>(&liveness_key, &dead)
                .unwrap()
                .is_none()
        },
    );
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    let g = joined(
        live_waiter,
        Duration::from_secs(10),
        "the live fairlock waiter",
    )
    .await;
    g.unlock().await.unwrap();
}
