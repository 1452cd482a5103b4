//! Everyday patterns that must keep mutual exclusion and FIFO: dropping a guard and locking again
//! at once, relock loops, `timeout()` retry loops, shutdown racing a call, reentrant holds with
//! different leases, a key of the wrong type among held locks, and leftover keys. Several run on
//! a current-thread runtime, where a background release used to lose the race against the same
//! task's next call.

use fairlock_testkit as support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fairlock::{Client, LockGuard, LostReason};
use redis::Commands;
use support::{info_field, queue_len, wait_until, wait_until_async, EventCount, RedisServer};

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.unwrap()
}

/// A client with the given command timeout whose scripts are loaded (so the paused server is only
/// asked to run them), then writes paused on the server for `pause_ms`: scripts wait while the
/// pause lasts, so an attempt sent now stays in flight until then.
async fn client_with_writes_paused(
    server: &RedisServer,
    fair: bool,
    command_timeout: Duration,
    pause_ms: u64,
) -> Client {
    let c = Client::builder()
        .standalone(server.url())
        .command_timeout(command_timeout)
        .build()
        .await
        .unwrap();
    try_now(&c, fair, "warm")
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(pause_ms)
        .arg("WRITE")
        .query(&mut server.conn())
        .unwrap();
    c
}

/// Takes `name` with a zero wait through a fair or plain handle.
async fn try_now(c: &Client, fair: bool, name: &str) -> Option<LockGuard> {
    if fair {
        c.fair_lock(name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
    } else {
        c.non_fair_lock(name)
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
    }
}

/// The work overruns a 200 ms lease, the guard is dropped, and the same task locks again at once.
/// The dropped guard's release must reach Redis before the new acquisition: sent after it, it
/// would take the new hold away (same owner field) and let another client in.
async fn drop_then_relock(fair: bool) {
    let name = if fair { "relock-fair" } else { "relock-plain" };
    let released = EventCount::watch("unlocked", name);
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = client(&server).await;
    let b = client(&server).await;
    let lease = |ms| Duration::from_millis(ms);
    let g = if fair {
        a.fair_lock(name).lock_with_lease(lease(200)).await.unwrap()
    } else {
        a.non_fair_lock(name)
            .lock_with_lease(lease(200))
            .await
            .unwrap()
    };
    wait_until_async(Duration::from_secs(5), "the lease ran out", || {
        let gone = !raw.exists::<_, bool>(name).unwrap();
        async move { gone }
    })
    .await;
    drop(g);
    let g2 = if fair {
        a.fair_lock(name)
            .lock_with_lease(lease(10_000))
            .await
            .unwrap()
    } else {
        a.non_fair_lock(name)
            .lock_with_lease(lease(10_000))
            .await
            .unwrap()
    };
    // Whenever the background release ran, it has run now.
    wait_until_async(
        Duration::from_secs(5),
        "the dropped guard's release",
        || {
            let done = released.get() >= 1;
            async move { done }
        },
    )
    .await;
    let hash: Vec<(String, i64)> = raw.hgetall(name).unwrap();
    assert_eq!(
        hash,
        vec![(g2.owner_field().to_owned(), 1)],
        "the new hold is intact"
    );
    assert!(
        try_now(&b, fair, name).await.is_none(),
        "another client took the lock while the new guard holds it"
    );
    assert!(!g2.is_lost());
    g2.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>(name).unwrap());
}

#[tokio::test(flavor = "current_thread")]
async fn drop_then_relock_on_a_plain_lock_never_makes_two_holders() {
    drop_then_relock(false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn drop_then_relock_on_a_fair_lock_never_makes_two_holders() {
    drop_then_relock(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_then_relock_on_a_multi_thread_runtime_never_makes_two_holders() {
    drop_then_relock(false).await;
}

/// `loop { let _g = fair.lock().await?; work().await; }` on a current-thread runtime: each new
/// acquisition used to re-enter (count 2) before the dropped guard's release landed (count 1), so
/// the lock never became free and a queued waiter waited for the whole loop. The waiter must be
/// served at the loop's next release: the loop does not acquire again before it.
#[tokio::test(flavor = "current_thread")]
async fn a_relock_loop_serves_the_queued_waiter_at_its_next_release() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = client(&server).await;
    let w = client(&server).await;
    let lock = a.fair_lock("relock-loop");
    let first = lock.lock().await.unwrap();
    let served = Arc::new(AtomicBool::new(false));
    let waiter = {
        let lock = w.fair_lock("relock-loop");
        let served = served.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            served.store(true, Ordering::SeqCst);
            g.unlock().await.unwrap();
        })
    };
    wait_until_async(Duration::from_secs(10), "the waiter queued", || {
        let queued = queue_len(&mut raw, "relock-loop") == 1;
        async move { queued }
    })
    .await;
    drop(first);
    let mut overtook = 0;
    for _ in 0..50 {
        let g = lock.lock().await.unwrap();
        if served.load(Ordering::SeqCst) {
            drop(g);
            break;
        }
        overtook += 1;
        tokio::task::yield_now().await;
        drop(g);
    }
    assert_eq!(
        overtook, 0,
        "the loop took the lock {overtook} times ahead of the waiter"
    );
    support::joined(waiter, Duration::from_secs(10), "the waiter").await;
}

/// A `timeout(d, lock.lock())` retry loop: every timeout leaves the queue (in the background),
/// and the retry queues again behind everyone who arrived meanwhile. The retry used to find the
/// old entry (the give-up had not run yet), only refresh it, then lose it to the give-up, and
/// come back at the HEAD of the queue, ahead of earlier arrivals.
#[tokio::test(flavor = "current_thread")]
async fn a_timeout_retry_loop_never_jumps_the_queue() {
    let gave_up = EventCount::watch("gave up waiting", "retry-loop");
    let server = RedisServer::start();
    let mut raw = server.conn();
    let build = || {
        Client::builder()
            .standalone(server.url())
            .waiter_liveness(Duration::from_millis(300))
            .timer_tick(Duration::from_millis(10))
            .build()
    };
    let h = build().await.unwrap();
    let a = build().await.unwrap();
    let b = build().await.unwrap();
    let held = h.fair_lock("retry-loop").lock().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first = {
        let lock = b.fair_lock("retry-loop");
        let order = order.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            order.lock().unwrap().push("first arrival");
            g.unlock().await.unwrap();
        })
    };
    wait_until_async(Duration::from_secs(10), "the first arrival queued", || {
        let queued = queue_len(&mut raw, "retry-loop") == 1;
        async move { queued }
    })
    .await;
    let retrier = {
        let lock = a.fair_lock("retry-loop");
        let order = order.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(g) = tokio::time::timeout(Duration::from_millis(250), lock.lock()).await {
                    order.lock().unwrap().push("retry loop");
                    g.unwrap().unlock().await.unwrap();
                    return;
                }
            }
        })
    };
    // While the retry loop times out and retries, the first arrival stays at the head: a retry
    // that jumps the queue shows up here as soon as it happens.
    let head: String = raw.lindex("redisson_lock_queue:{retry-loop}", 0).unwrap();
    wait_until_async(
        Duration::from_secs(10),
        "the retry loop timing out four times",
        || {
            let now_head: Option<String> =
                raw.lindex("redisson_lock_queue:{retry-loop}", 0).unwrap();
            assert_eq!(
                now_head.as_deref(),
                Some(head.as_str()),
                "the retry loop overtook the first arrival"
            );
            let done = gave_up.get() >= 4;
            async move { done }
        },
    )
    .await;
    held.unlock().await.unwrap();
    support::joined(first, Duration::from_secs(10), "the first arrival").await;
    support::joined(retrier, Duration::from_secs(10), "the retry loop").await;
    assert_eq!(*order.lock().unwrap(), vec!["first arrival", "retry loop"]);
}

/// `shutdown()` while an acquisition is in flight: a grant that arrives after shutdown began is
/// given back, and the call returns `Error::Shutdown` instead of a guard nobody renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_racing_an_attempt_gives_the_grant_back() {
    for fair in [true, false] {
        let name = if fair {
            "shutdown-fair"
        } else {
            "shutdown-plain"
        };
        let server = RedisServer::start();
        let mut raw = server.conn();
        let c = client_with_writes_paused(&server, fair, Duration::from_secs(10), 3_000).await;
        let call = {
            let c = c.clone();
            tokio::spawn(async move {
                if fair {
                    c.fair_lock(name).lock().await
                } else {
                    c.non_fair_lock(name).lock().await
                }
            })
        };
        wait_until_the_pause_holds_an_attempt(&server);
        let shutdown = {
            let c = c.clone();
            tokio::spawn(async move { c.shutdown().await })
        };
        wait_until_async(Duration::from_secs(5), "shutdown began", || {
            let closed = c.is_shutdown();
            async move { closed }
        })
        .await;
        let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut raw).unwrap();
        let outcome = support::joined(call, Duration::from_secs(10), "the call").await;
        match outcome {
            Err(e) => assert!(e.is_shutdown(), "{e}"),
            Ok(guard) => panic!(
                "a guard came back after shutdown (lost: {:?})",
                guard.is_lost()
            ),
        }
        support::joined(shutdown, Duration::from_secs(10), "shutdown").await;
        assert!(
            !raw.exists::<_, bool>(name).unwrap(),
            "the late grant was given back"
        );
    }
}

/// Reentrant holds with different leases share one key: a short fixed lease taken while a
/// watchdog hold lives must not shorten the key below what the watchdog hold needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_reentry_never_shortens_a_watchdog_hold() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = client(&server).await;
    let b = client(&server).await;
    let lock = a.fair_lock("mixed-1").with_holder(a.holder());
    let w = lock.lock().await.unwrap();
    let f = lock
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    assert!(raw.pttl::<_, i64>("mixed-1").unwrap() > 20_000);
    // The fixed lease runs out; the watchdog hold keeps the lock, and both guards with it. (The
    // passing of time past the 300 ms lease is the scenario: nothing is awaited.)
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(try_now(&b, true, "mixed-1").await.is_none());
    assert!(!w.is_lost() && !f.is_lost());
    // Without the watchdog hold, the remaining hold's lease is over: it is lost at once, and the
    // lock expires with it.
    drop(w);
    assert_eq!(f.lost().await, LostReason::LeaseExpired);
    wait_until(Duration::from_secs(5), "the lock expired", || {
        !raw.exists::<_, bool>("mixed-1").unwrap()
    });
    assert!(try_now(&b, true, "mixed-1").await.is_some());
}

/// A long fixed lease, then a watchdog re-entry with a short watchdog timeout: neither the
/// re-entry nor the renewals shorten the key below the fixed lease, and when the watchdog hold is
/// released the key keeps what the fixed hold needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_reentry_never_shortens_a_long_fixed_lease() {
    let renewed = EventCount::watch("renewed", "mixed-2");
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::builder()
        .standalone(server.url())
        .watchdog_timeout(Duration::from_millis(600))
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let b = client(&server).await;
    let lock = a.non_fair_lock("mixed-2").with_holder(a.holder());
    let f = lock.lock_with_lease(Duration::from_secs(4)).await.unwrap();
    let w = lock.lock().await.unwrap();
    assert!(raw.pttl::<_, i64>("mixed-2").unwrap() > 3_000);
    // Three renewals of the watchdog hold reach Redis (each renews to 600 ms only if that is
    // longer) and none of them shortens the key below the fixed lease.
    wait_until_async(Duration::from_secs(5), "three renewals", || {
        let done = renewed.get() >= 3;
        async move { done }
    })
    .await;
    assert!(raw.pttl::<_, i64>("mixed-2").unwrap() > 2_000);
    w.unlock().await.unwrap();
    // The fixed hold still has about 2.8 s: the key keeps it, another client cannot take it.
    let pttl: i64 = raw.pttl("mixed-2").unwrap();
    assert!(pttl > 2_000 && pttl <= 4_000, "{pttl}");
    // Past the 600 ms a watchdog renewal gives (the scenario is time passing, not an event).
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(try_now(&b, false, "mixed-2").await.is_none());
    assert!(!f.is_lost());
    f.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("mixed-2").unwrap());
}

/// Two fixed leases: the key lives for the longer; releasing the longer leaves what the shorter
/// needs, and the shorter is then lost when its own lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fixed_leases_keep_the_longer_then_the_remaining_one() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = client(&server).await;
    let lock = a.fair_lock("mixed-3").with_holder(a.holder());
    let short = lock
        .lock_with_lease(Duration::from_millis(800))
        .await
        .unwrap();
    let long = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    assert!(raw.pttl::<_, i64>("mixed-3").unwrap() > 8_000);
    assert!(short.valid_until() == long.valid_until());
    long.unlock().await.unwrap();
    let pttl: i64 = raw.pttl("mixed-3").unwrap();
    assert!(pttl > 0 && pttl <= 800, "{pttl}");
    assert_eq!(short.lost().await, LostReason::LeaseExpired);
    wait_until(Duration::from_secs(5), "the lock expired", || {
        !raw.exists::<_, bool>("mixed-3").unwrap()
    });
}

/// A re-entry cancelled while its attempt is in flight: the driver releases that grant, and the
/// holder's watchdog hold keeps the lock and its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_reentry_gives_back_only_its_own_grant() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = client(&server).await;
    let b = client(&server).await;
    let lock = a
        .fair_lock("mixed-4")
        .with_holder(fairlock::Holder::from_raw(7).unwrap());
    let w = lock.lock().await.unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("WRITE")
        .query(&mut raw)
        .unwrap();
    let reentry = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock_with_lease(Duration::from_millis(200)).await })
    };
    wait_until_the_pause_holds_an_attempt(&server);
    reentry.abort();
    // The pause ends; the re-entry runs (count 2) and its grant is given back (count 1).
    wait_until(
        Duration::from_secs(5),
        "the cancelled grant given back",
        || {
            raw.hget::<_, _, Option<i64>>("mixed-4", w.owner_field())
                .unwrap()
                == Some(1)
                && raw
                    .hgetall::<_, Vec<(String, i64)>>("mixed-4")
                    .unwrap()
                    .len()
                    == 1
        },
    );
    // Well past the cancelled re-entry's 200 ms lease (the scenario is time passing, not an
    // event): the watchdog hold still has the lock.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(raw.pttl::<_, i64>("mixed-4").unwrap() > 20_000);
    assert!(try_now(&b, true, "mixed-4").await.is_none());
    assert!(!w.is_lost());
    w.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("mixed-4").unwrap());
}

/// A key of the wrong type where one held lock was: only that lock is lost; every other lock of
/// the client is still renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_wrong_type_costs_only_its_own_lock() {
    let renewed_a = EventCount::watch("renewed", "bad-a");
    let renewed_c = EventCount::watch("renewed", "bad-c");
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::builder()
        .standalone(server.url())
        .watchdog_timeout(Duration::from_millis(600))
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let a = c.fair_lock("bad-a").lock().await.unwrap();
    let bad = c.non_fair_lock("bad-b").lock().await.unwrap();
    let d = c.non_fair_lock("bad-c").lock().await.unwrap();
    let _: () = raw.del("bad-b").unwrap();
    let _: () = raw.set("bad-b", "not a hash").unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), bad.lost())
        .await
        .expect("the broken lock is reported");
    assert_eq!(reason, LostReason::Gone);
    // Three more renewals of each of the others reach Redis; they are still held.
    let (a_before, d_before) = (renewed_a.get(), renewed_c.get());
    wait_until_async(Duration::from_secs(5), "three more renewals", || {
        let done = renewed_a.get() >= a_before + 3 && renewed_c.get() >= d_before + 3;
        async move { done }
    })
    .await;
    for g in [&a, &d] {
        assert!(!g.is_lost(), "{} lost with the broken one", g.name());
        support::wait_for_renewal(&mut raw, g.name(), Duration::from_secs(5));
    }
    drop(bad);
    a.unlock().await.unwrap();
    d.unlock().await.unwrap();
    let _: () = raw.del("bad-b").unwrap();
}

/// After a lock is released and nobody waits, no key of it remains: no unlock latch, no queue,
/// no deadline set, no liveness marks (the fencing counter is the lock's history and stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_left_behind_after_the_last_release() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server).await;
    let d = client(&server).await;
    for round in 0..20 {
        c.fair_lock("leftover-fair")
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        c.non_fair_lock("leftover-plain")
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
        let g = c.fair_lock("leftover-fair").fenced().lock().await.unwrap();
        drop(g);
        let _ = round;
    }
    // A contended round: a waiter is served, then everyone leaves.
    let g = c.fair_lock("leftover-fair").lock().await.unwrap();
    let waiter = {
        let lock = d.fair_lock("leftover-fair");
        tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
    };
    wait_until(Duration::from_secs(5), "the waiter queued", || {
        queue_len(&mut raw, "leftover-fair") == 1
    });
    g.unlock().await.unwrap();
    support::joined(waiter, Duration::from_secs(5), "the waiter").await;
    // The background releases of the dropped guards ran on the same connection before this read.
    assert!(!c.fair_lock("leftover-fair").is_locked().await.unwrap());
    let mut keys: Vec<String> = raw.keys("*").unwrap();
    keys.sort();
    assert_eq!(
        keys,
        vec!["redisson_lock_token:{leftover-fair}".to_string()]
    );
}

/// `lost()` and `is_lost()` see the validity deadline exactly, even for a lease shorter than the
/// timer tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_shorter_than_a_tick_is_lost_at_its_deadline_not_a_tick_later() {
    let server = RedisServer::start();
    let c = Client::builder()
        .standalone(server.url())
        .timer_tick(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let lost = Arc::new(AtomicUsize::new(0));
    for round in 0..5 {
        let g = c
            .non_fair_lock(format!("short-{round}"))
            .lock_with_lease(Duration::from_millis(30))
            .await
            .unwrap();
        tokio::time::sleep_until(g.valid_until().into()).await;
        if g.is_lost() {
            lost.fetch_add(1, Ordering::SeqCst);
        }
        assert_eq!(
            tokio::time::timeout(Duration::from_millis(100), g.lost()).await,
            Ok(LostReason::LeaseExpired)
        );
    }
    assert_eq!(lost.load(Ordering::SeqCst), 5, "is_lost() at the deadline");
}

/// A guard's release is still queued when everything the holder had is released at once (the
/// settle of a cancelled re-entry, after the guard detached, gives back every hold). A new grant
/// to the same holder then comes before the queued release: that release must not take the new
/// hold away (found by the torture test, seed 1592590337).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_release_never_takes_a_later_grant_of_the_same_holder() {
    let in_line = EventCount::watch("waits for its turn", "stale-release");
    let unlocked = EventCount::watch("unlocked", "stale-release");
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = client(&server).await;
    let b = client(&server).await;
    let lock = a
        .fair_lock("stale-release")
        .with_holder(fairlock::Holder::from_raw(7).unwrap());
    let first = lock.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("WRITE")
        .query(&mut raw)
        .unwrap();
    // A re-entry, cancelled while its attempt waits for Redis: its settle holds the line.
    let reentry = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock_with_lease(Duration::from_secs(10)).await })
    };
    wait_until_the_pause_holds_an_attempt(&server);
    reentry.abort();
    // A new watchdog acquisition by the same holder, queued behind the settle.
    let waiting_before = in_line.get();
    let later = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until_async(
        Duration::from_secs(5),
        "the later acquisition in line",
        || {
            let queued = in_line.get() > waiting_before;
            async move { queued }
        },
    )
    .await;
    // The first guard goes; its release queues behind the new acquisition.
    drop(first);
    let later = support::joined(later, Duration::from_secs(10), "the later acquisition")
        .await
        .unwrap();
    // The first guard's release comes after the later grant in the line, and the driver sends it
    // in the background: wait until it has run (the settle's release was the first "unlocked").
    wait_until_async(Duration::from_secs(5), "the first guard's release", || {
        let done = unlocked.get() >= 2;
        async move { done }
    })
    .await;
    assert!(lock.is_locked().await.unwrap());
    let hash: Vec<(String, i64)> = raw.hgetall("stale-release").unwrap();
    assert_eq!(hash, vec![(later.owner_field().to_owned(), 1)]);
    assert!(try_now(&b, true, "stale-release").await.is_none());
    assert!(!later.is_lost());
    later.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("stale-release").unwrap());
}

/// Two guards of one holder id (shared through `with_holder`), one taken by the watchdog and one
/// with a lease: the first is dropped and the second unlocked at once. The drop's release runs
/// first and must give back only its own hold; the unlock then releases the last one, reports
/// success, and the lock is free. (The torture test found the drop's release taking both holds,
/// so that the unlock of a hold that was never lost answered `NotHeld`.)
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_guard_never_releases_the_hold_of_a_guard_unlocked_after_it() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = client(&server).await;
    for fair in [false, true] {
        let name = if fair { "shared-fair" } else { "shared-plain" };
        let (first, second) = if fair {
            let lock = a
                .fair_lock(name)
                .with_holder(fairlock::Holder::from_raw(77).unwrap());
            let first = lock.lock().await.unwrap();
            (
                first,
                lock.lock_with_lease(Duration::from_secs(10)).await.unwrap(),
            )
        } else {
            let lock = a
                .non_fair_lock(name)
                .with_holder(fairlock::Holder::from_raw(77).unwrap());
            let first = lock.lock().await.unwrap();
            (
                first,
                lock.lock_with_lease(Duration::from_secs(10)).await.unwrap(),
            )
        };
        let count: i64 = raw.hget(name, first.owner_field()).unwrap();
        assert_eq!(count, 2);
        drop(first);
        second
            .unlock()
            .await
            .expect("the second guard's hold was never lost");
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} left locked");
    }
}

/// Waits until an attempt sent during a `CLIENT PAUSE WRITE` has reached Redis and is held by the
/// pause (Redis counts it among its blocked clients).
fn wait_until_the_pause_holds_an_attempt(server: &RedisServer) {
    wait_until(
        Duration::from_secs(5),
        "the attempt held by the pause",
        || {
            info_field(&server.info("clients"), "blocked_clients")
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n >= 1)
        },
    );
}

/// Review defect 3: `shutdown()` of a client that holds nothing while one of its fair calls
/// waits. The waiting call's give-up used to reach a driver that had already stopped, so the
/// entry stayed queued for a liveness window (60 s here; with only Redisson peers left, until its
/// score lapsed). Now it leaves at once, on a current-thread runtime too.
#[tokio::test(flavor = "current_thread")]
async fn shutdown_of_a_client_that_holds_nothing_takes_its_waiters_out_of_the_queue() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let holder = client(&server).await;
    let c = Client::builder()
        .standalone(server.url())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let held = holder.fair_lock("bye-queue").lock().await.unwrap();
    let waiter = {
        let lock = c.fair_lock("bye-queue");
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until_async(Duration::from_secs(10), "the waiter queued", || {
        let n = queue_len(&mut raw, "bye-queue");
        async move { n == 1 }
    })
    .await;
    c.shutdown().await;
    assert!(waiter.await.unwrap().unwrap_err().is_shutdown());
    wait_until_async(Duration::from_secs(5), "the waiter left the queue", || {
        let n = queue_len(&mut raw, "bye-queue");
        let z: i64 = raw.zcard(support::timeout_key("bye-queue")).unwrap();
        async move { n == 0 && z == 0 }
    })
    .await;
    held.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("bye-queue").unwrap());
}

/// Review defect 4: a `lock()` future that is alive but no longer polled (pinned in a
/// `select!` that went on with something else) while its attempt is in flight used to hold its
/// field's line, and `shutdown()` waited for that turn for ever. Shutdown is bounded (about five
/// command timeouts); the abandoned call gives its grant back once it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_never_waits_for_a_call_nobody_polls() {
    for fair in [true, false] {
        let name = if fair {
            "unpolled-fair"
        } else {
            "unpolled-plain"
        };
        let server = RedisServer::start();
        let mut raw = server.conn();
        let c = client_with_writes_paused(&server, fair, Duration::from_millis(400), 2_000).await;
        let fair_lock = c.fair_lock(name);
        let plain_lock = c.non_fair_lock(name);
        let mut call = Box::pin(async {
            if fair {
                fair_lock.lock().await
            } else {
                plain_lock.lock().await
            }
        });
        // Polled until its attempt is in flight, then left alone (still alive).
        tokio::select! {
            biased;
            _ = &mut call => panic!("{name}: the attempt cannot finish during the pause"),
            _ = wait_until_async(Duration::from_secs(5), "the attempt held by the pause", || {
                let blocked = info_field(&server.info("clients"), "blocked_clients")
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                async move { blocked >= 1 }
            }) => {}
        }
        tokio::time::timeout(Duration::from_secs(10), c.shutdown())
            .await
            .unwrap_or_else(|_| panic!("{name}: shutdown waited for a call nobody polls"));
        assert!(c.is_shutdown());
        let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut raw).unwrap();
        // Dropping the call hands its attempt to the background, which gives a grant back.
        drop(call);
        wait_until(Duration::from_secs(10), "the late grant given back", || {
            !raw.exists::<_, bool>(name).unwrap()
        });
    }
}

/// Review defect 6: a bounded call of a holder whose earlier work on the lock still holds the
/// field's line (here the release of a dropped guard, retrying while Redis is frozen, which
/// keeps the line for up to three command timeouts) used to wait for that work past its own
/// wait. Now the wait for the line is bounded by the call's deadline; nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_call_never_waits_past_its_deadline_behind_its_holders_release() {
    let server = RedisServer::start();
    let c = Client::builder()
        .standalone(server.url())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    for fair in [true, false] {
        let name = if fair { "behind-fair" } else { "behind-plain" };
        let me = c.holder();
        let (guard, again) = if fair {
            let lock = c.fair_lock(name).with_holder(me);
            (lock.lock().await.unwrap(), Err(lock))
        } else {
            let lock = c.non_fair_lock(name).with_holder(me);
            (lock.lock().await.unwrap(), Ok(lock))
        };
        server.pause();
        drop(guard); // its release now retries in the background, holding the field's line
        let started = std::time::Instant::now();
        let result = match &again {
            Err(fair) => fair.try_lock(Duration::from_millis(200), None).await,
            Ok(plain) => plain.try_lock(Duration::from_millis(200), None).await,
        };
        let took = started.elapsed();
        server.resume();
        assert!(result.unwrap().is_none(), "{name}");
        // The release alone keeps the line for at least six seconds here.
        assert!(
            took < Duration::from_secs(3),
            "{name}: returned after {took:?}"
        );
        let mut raw = server.conn();
        wait_until(Duration::from_secs(20), "the release ran", || {
            !raw.exists::<_, bool>(name).unwrap()
        });
    }
}
