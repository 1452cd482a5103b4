//! Leases at their edges, and what `unlock()` answers once a hold was taken away: a lease that
//! could never be trusted is refused before any I/O, for every primitive; a lease the round trip
//! eats is retried with a backoff, never in a tight loop; and `unlock()` is `Ok` only when it
//! released a hold Redis still had, the same for every kind of lock.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, Error, MultiLock, MIN_LEASE};
use redis::Commands;
use support::{command_calls, wait_until, Proxy, RedisServer};

fn is_lease_error(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidArgument {
            argument: "lease",
            ..
        }
    )
}

/// Every call that takes a lease refuses one that leaves no validity after the drift margin
/// (1 % + 2 ms) with `InvalidArgument` before sending anything: before, `lock_with_lease(2 ms)`
/// never returned and sent about 20,000 commands a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_that_could_never_be_trusted_are_refused_before_any_io() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    // The scripts loaded first (a first EVALSHA answered NOSCRIPT is sent again as EVAL).
    let fair = c.fair_lock("edge:fair");
    fair.lock().await.unwrap().unlock().await.unwrap();
    let calls_before = command_calls(&server.info("commandstats"), "evalsha")
        + command_calls(&server.info("commandstats"), "eval");
    assert_eq!(MIN_LEASE, Duration::from_millis(3));
    let too_short = [
        Duration::from_millis(1),
        Duration::from_millis(2),
        MIN_LEASE - Duration::from_micros(1),
    ];
    let plain = c.non_fair_lock("edge:plain");
    let rw = c.read_write_lock("edge:rw");
    let sem = c.expirable_semaphore("edge:sem");
    for lease in too_short {
        let wait = Duration::from_millis(200);
        let outcomes = [
            fair.try_lock(wait, Some(lease)).await.map(|_| ()),
            fair.lock_with_lease(lease).await.map(|_| ()),
            plain.try_lock(wait, Some(lease)).await.map(|_| ()),
            plain.lock_with_lease(lease).await.map(|_| ()),
            rw.read_lock().try_lock(wait, Some(lease)).await.map(|_| ()),
            rw.write_lock().lock_with_lease(lease).await.map(|_| ()),
            sem.try_acquire(1, wait, Some(lease)).await.map(|_| ()),
            MultiLock::new([
                c.fair_lock("edge:m1").into(),
                c.non_fair_lock("edge:m2").into(),
            ])
            .try_lock(wait, Some(lease))
            .await
            .map(|_| ()),
            fairlock::RedLock::new([c.clone()], "edge:red")
                .try_lock(wait, Some(lease))
                .await
                .map(|_| ()),
        ];
        for (i, outcome) in outcomes.into_iter().enumerate() {
            let e = outcome.expect_err("a lease under MIN_LEASE is refused");
            assert!(is_lease_error(&e), "call {i}, {lease:?}: {e:?}");
        }
    }
    // Re-entry and extension of a real hold refuse it too, and leave the hold as it was.
    let guard = fair.lock_with_lease(Duration::from_secs(10)).await.unwrap();
    let e = guard
        .reenter(Some(Duration::from_millis(2)))
        .await
        .unwrap_err();
    assert!(is_lease_error(&e), "{e:?}");
    let e = guard.extend(Duration::from_millis(2)).await.unwrap_err();
    assert!(is_lease_error(&e), "{e:?}");
    assert_eq!(guard.hold_count(), 1);
    guard.unlock().await.unwrap();
    // Only the one lock and unlock above reached Redis as scripts.
    let calls = command_calls(&server.info("commandstats"), "evalsha")
        + command_calls(&server.info("commandstats"), "eval")
        - calls_before;
    assert_eq!(calls, 2, "scripts sent by refused calls");
    // The shortest lease accepted works.
    let g = plain
        .try_lock(Duration::from_secs(1), Some(MIN_LEASE))
        .await
        .unwrap();
    drop(g);
}

/// A lease the round trip always eats (3 ms through a proxy that adds 5 ms each way): every grant
/// arrives already expired and is given back. The call retries with a growing backoff and
/// returns when its wait runs out; before, it retried at once, about a hundred script calls in
/// a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_round_trip_eats_is_retried_with_a_backoff() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let c = Client::builder()
        .standalone(proxy.url())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    for (name, fair) in [("eaten:plain", false), ("eaten:fair", true)] {
        // Scripts loaded first, so the count below is of attempts and give-backs only.
        let warm = if fair {
            c.fair_lock(name).lock().await.unwrap()
        } else {
            c.non_fair_lock(name).lock().await.unwrap()
        };
        warm.unlock().await.unwrap();
        proxy.set_latency(Duration::from_millis(5), Duration::from_millis(5));
        let before = command_calls(&server.info("commandstats"), "evalsha");
        let started = Instant::now();
        let wait = Duration::from_secs(1);
        let got = if fair {
            c.fair_lock(name).try_lock(wait, Some(MIN_LEASE)).await
        } else {
            c.non_fair_lock(name).try_lock(wait, Some(MIN_LEASE)).await
        };
        let took = started.elapsed();
        proxy.set_latency(Duration::ZERO, Duration::ZERO);
        let scripts = command_calls(&server.info("commandstats"), "evalsha") - before;
        assert!(
            got.as_ref().is_ok_and(Option::is_none),
            "{name}: every grant came too late to trust: {got:?}"
        );
        assert!(
            took < wait + Duration::from_millis(500),
            "{name}: took {took:?}"
        );
        assert!(
            scripts <= 30,
            "{name}: {scripts} scripts in {took:?}: retried without a backoff"
        );
        let mut raw = server.conn();
        wait_until(Duration::from_secs(5), "nothing left held", || {
            !raw.exists::<_, bool>(name).unwrap()
        });
    }
    // Permits of an expirable semaphore the same way: never handed out already run out (they
    // were, before); given back by id, looked for again after a backoff.
    let sem = c.expirable_semaphore("eaten:sem");
    assert!(sem.try_set_permits(2).await.unwrap());
    sem.acquire(1, None).await.unwrap().release().await.unwrap();
    proxy.set_latency(Duration::from_millis(5), Duration::from_millis(5));
    let before = command_calls(&server.info("commandstats"), "evalsha");
    let started = Instant::now();
    let got = sem
        .try_acquire(1, Duration::from_secs(1), Some(MIN_LEASE))
        .await;
    let took = started.elapsed();
    proxy.set_latency(Duration::ZERO, Duration::ZERO);
    let scripts = command_calls(&server.info("commandstats"), "evalsha") - before;
    assert!(
        got.as_ref().is_ok_and(Option::is_none),
        "permits that ran out before their reply came were handed out: {:?}",
        got.map(|p| p.map(|p| (p.count(), p.is_lost())))
    );
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    assert!(scripts <= 30, "{scripts} scripts in {took:?}");
    assert_eq!(sem.available().await.unwrap(), 2, "given back");
}

/// What took a hold away does not change the answer: `unlock()` is `NotHeld` for every kind of
/// lock, after an operator's force unlock and after the hold's own lease ran out (fair locks
/// included, which answered `Ok` for both before while a non-fair lock answered `NotHeld`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_is_not_held_for_every_kind_once_the_hold_was_taken_away() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let operator = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    let lease = Duration::from_millis(150);
    for kind in ["fair", "plain", "read", "write"] {
        // Force-unlocked by an operator while the guard lives.
        let name = format!("taken:{kind}");
        let guard = match kind {
            "fair" => c.fair_lock(&name).lock().await,
            "plain" => c.non_fair_lock(&name).lock().await,
            "read" => c.read_write_lock(&name).read_lock().lock().await,
            _ => c.read_write_lock(&name).write_lock().lock().await,
        }
        .unwrap();
        let forced = match kind {
            "fair" => operator.fair_lock(&name).force_unlock().await,
            "plain" => operator.non_fair_lock(&name).force_unlock().await,
            _ => operator.read_write_lock(&name).force_unlock().await,
        };
        assert!(forced.unwrap(), "{kind}: held before the force unlock");
        let e = guard.unlock().await.unwrap_err();
        assert!(e.is_not_held(), "{kind} after a force unlock: {e:?}");

        // Its own fixed lease ran out, nobody took it since.
        let name = format!("expired:{kind}");
        let guard = match kind {
            "fair" => c.fair_lock(&name).lock_with_lease(lease).await,
            "plain" => c.non_fair_lock(&name).lock_with_lease(lease).await,
            "read" => {
                c.read_write_lock(&name)
                    .read_lock()
                    .lock_with_lease(lease)
                    .await
            }
            _ => {
                c.read_write_lock(&name)
                    .write_lock()
                    .lock_with_lease(lease)
                    .await
            }
        }
        .unwrap();
        wait_until(Duration::from_secs(5), "the lease ran out", || {
            !raw.exists::<_, bool>(&name).unwrap()
        });
        assert_eq!(guard.lost().await, fairlock::LostReason::LeaseExpired);
        let e = guard.unlock().await.unwrap_err();
        assert!(e.is_not_held(), "{kind} after its lease ran out: {e:?}");
    }
}

/// A holder with a watchdog hold and a short fixed one releases the watchdog hold: the lock's
/// TTL drops from the watchdog timeout to what the fixed hold needs. The waiters, asleep until
/// the TTL their last attempt saw (30 s away), are told, so they take the lock when the short
/// lease ends rather than half a minute later (an expiry announces nothing). The multi-lock's
/// fixed lease is put on this way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_cut_by_a_release_wakes_the_waiters() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let waiter = Client::connect(&server.url()).await.unwrap();
    let short = Duration::from_millis(300);
    for kind in ["fair", "plain", "write"] {
        let name = format!("cut:{kind}");
        let first = match kind {
            "fair" => c.fair_lock(&name).lock().await,
            "plain" => c.non_fair_lock(&name).lock().await,
            _ => c.read_write_lock(&name).write_lock().lock().await,
        }
        .unwrap();
        let (fair, plain, write) = (
            waiter.fair_lock(&name),
            waiter.non_fair_lock(&name),
            waiter.read_write_lock(&name).write_lock(),
        );
        let k = kind;
        let mut raw = server.conn();
        let scripts = |raw: &mut redis::Connection| {
            let info: String = redis::cmd("INFO").arg("commandstats").query(raw).unwrap();
            command_calls(&info, "evalsha") + command_calls(&info, "eval")
        };
        let before = scripts(&mut raw);
        let waiting = tokio::spawn(async move {
            let got = match k {
                "fair" => fair.lock().await,
                "plain" => plain.lock().await,
                _ => write.lock().await,
            };
            (got.unwrap(), Instant::now())
        });
        // The waiter attempted, subscribed and attempted again (it saw the 30 s TTL); it
        // sleeps now.
        wait_until(Duration::from_secs(5), "two attempts", || {
            scripts(&mut raw) >= before + 2
        });
        let fixed = first.reenter(Some(short)).await.unwrap();
        first.unlock().await.unwrap();
        let cut = Instant::now();
        let pttl: i64 = raw.pttl(&name).unwrap();
        assert!(pttl <= 300, "{kind}: the TTL is the short lease's: {pttl}");
        let (got, at) = support::joined(waiting, Duration::from_secs(10), "the waiter").await;
        assert!(
            at - cut < Duration::from_secs(3),
            "{kind}: taken {:?} after the cut",
            at - cut
        );
        assert!(fixed.is_lost() || at - cut >= Duration::from_millis(250));
        got.unlock().await.unwrap();
        drop(fixed);
    }
}
