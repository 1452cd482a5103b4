//! The semaphore (`RSemaphore` layout) and the count-down latch (`RCountDownLatch` layout) on one
//! server: layout and messages, typed errors, waiters woken by releases, cancel safety, replies
//! lost after the script ran (through the test proxy), and a seeded randomized run that checks
//! that permits in use never exceed the limit and that every permit comes back.

use fairlock_testkit as support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{Client, Error};
use redis::Commands;
use support::{wait_until, wait_until_async, Direction, Proxy, RedisServer};

/// Keys of `name` other than call marks (which expire by themselves), and the call marks
/// without a TTL (there must be none).
fn leftovers(raw: &mut redis::Connection, name: &str) -> (Vec<String>, Vec<String>) {
    let keys: Vec<String> = raw.keys(format!("*{name}*")).unwrap();
    let (marks, others): (Vec<String>, Vec<String>) = keys
        .into_iter()
        .partition(|k| k.contains(":fairlock_call:"));
    let eternal = marks
        .into_iter()
        .filter(|k| raw.pttl::<_, i64>(k).unwrap() < 0)
        .collect();
    (others, eternal)
}

/// A client through `proxy` with a 300 ms command timeout (a lost reply fails fast), and the
/// given watchdog timeout.
async fn proxied(proxy: &Proxy, watchdog: Option<Duration>) -> Client {
    let mut builder = Client::builder()
        .standalone(proxy.url())
        .command_timeout(Duration::from_millis(300));
    if let Some(watchdog) = watchdog {
        builder = builder.watchdog_timeout(watchdog);
    }
    builder.build().await.unwrap()
}

fn subscribe(server: &RedisServer, channel: &str) -> redis::PubSub<'static> {
    let conn = Box::leak(Box::new(server.conn()));
    let mut pubsub = conn.as_pubsub();
    pubsub.subscribe(channel).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    pubsub
}

fn next_message(pubsub: &mut redis::PubSub<'_>) -> String {
    pubsub.get_message().unwrap().get_payload().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_keeps_redissons_layout_and_publishes_every_release() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let sem = c.semaphore("sem:layout");
    let mut messages = subscribe(&server, "redisson_sc:{sem:layout}");

    assert_eq!(
        sem.available().await.unwrap(),
        0,
        "a missing key holds none"
    );
    assert!(sem.try_set_permits(3).await.unwrap());
    assert_eq!(next_message(&mut messages), "3");
    assert!(
        !sem.try_set_permits(9).await.unwrap(),
        "only the first set counts"
    );
    let value: String = raw.get("sem:layout").unwrap();
    assert_eq!(value, "3");

    let two = sem.acquire(2).await.unwrap();
    assert_eq!(two.count(), 2);
    assert_eq!(sem.available().await.unwrap(), 1);
    assert!(sem.try_acquire(2, Duration::ZERO).await.unwrap().is_none());
    let one = sem.try_acquire(1, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(raw.get::<_, i64>("sem:layout").unwrap(), 0);
    assert_eq!(two.release().await.unwrap(), 2);
    assert_eq!(next_message(&mut messages), "2");
    drop(one); // released in the background
    assert_eq!(next_message(&mut messages), "3");
    assert_eq!(sem.available().await.unwrap(), 3);

    assert_eq!(sem.add_permits(-1).await.unwrap(), 2);
    assert_eq!(next_message(&mut messages), "2");
    assert_eq!(sem.add_permits(5).await.unwrap(), 7);
    assert_eq!(next_message(&mut messages), "7");
    let kept = sem.acquire(4).await.unwrap();
    kept.forget();
    assert_eq!(
        sem.available().await.unwrap(),
        3,
        "forgotten permits stay taken"
    );
    assert_eq!(sem.release(4).await.unwrap(), 7);
    assert_eq!(next_message(&mut messages), "7");
    assert_eq!(sem.drain().await.unwrap(), 7);
    assert_eq!(sem.available().await.unwrap(), 0);
    assert!(sem.delete().await.unwrap());
    let (others, eternal) = leftovers(&mut raw, "sem:layout");
    assert!(others.is_empty(), "left behind: {others:?}");
    assert!(eternal.is_empty(), "marks without a TTL: {eternal:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_before_any_io() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let sem = c.semaphore("sem:bad");
    let invalid = |e: Error| matches!(e, Error::InvalidArgument { .. });
    assert!(invalid(sem.acquire(0).await.unwrap_err()));
    assert!(invalid(
        sem.try_acquire(0, Duration::ZERO).await.unwrap_err()
    ));
    assert!(invalid(sem.release(0).await.unwrap_err()));
    assert!(invalid(sem.add_permits(0).await.unwrap_err()));
    assert!(matches!(
        c.semaphore("").available().await.unwrap_err(),
        Error::InvalidName { .. }
    ));
    // Counts Redis cannot hold.
    assert!(sem.try_set_permits(1).await.unwrap());
    sem.add_permits(i64::MAX - 1).await.unwrap();
    assert!(invalid(sem.release(5).await.unwrap_err()));
    assert!(invalid(sem.add_permits(5).await.unwrap_err()));
    assert_eq!(sem.available().await.unwrap(), i64::MAX, "nothing changed");

    let latch = c.count_down_latch("latch:bad");
    assert!(invalid(latch.try_set_count(0).await.unwrap_err()));
    assert!(invalid(latch.try_set_count(u64::MAX).await.unwrap_err()));
    assert!(matches!(
        c.count_down_latch("").count().await.unwrap_err(),
        Error::InvalidName { .. }
    ));
    // Hash-tagged latch names are fine on one server (the rule is a cluster one).
    let tagged = c.count_down_latch("{t}latch");
    assert!(tagged.try_set_count(1).await.unwrap());
    assert_eq!(tagged.count_down().await.unwrap(), 0);
}

/// Expirable permits at the edges of the count: `u32::MAX` and anything over `MAX_PERMITS` are
/// refused before anything is allocated or sent (`u32::MAX` used to abort the process on a 64 GB
/// allocation), and every count up to the limit can be taken, released, given back by a drop,
/// reclaimed after its lease and given back at shutdown (8,000 or more used to fail in Lua's
/// `unpack`: the permits stayed taken until their lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expirable_permits_at_the_limits_of_the_count() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = "pes:limits";
    let sem = c.expirable_semaphore(name);
    let max = fairlock::ExpirableSemaphore::MAX_PERMITS;
    for too_many in [u32::MAX, max + 1] {
        let e = sem
            .try_acquire(too_many, Duration::ZERO, None)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    argument: "permits",
                    ..
                }
            ),
            "{too_many}: {e:?}"
        );
    }
    assert!(!raw.exists::<_, bool>(name).unwrap(), "nothing was sent");
    assert!(sem.try_set_permits(max).await.unwrap());
    let available = |raw: &mut redis::Connection| raw.get::<_, i64>(name).unwrap();

    // Released by the guard.
    let started = Instant::now();
    let all = sem.acquire(max, None).await.unwrap();
    let one_acquire = started.elapsed();
    assert_eq!(all.count(), max as usize);
    assert_eq!(available(&mut raw), 0);
    assert_eq!(all.release().await.unwrap(), max as usize);
    assert_eq!(available(&mut raw), i64::from(max));

    // Given back by a drop, in the background.
    let many = 10_000;
    drop(sem.acquire(many, None).await.unwrap());
    wait_until(
        Duration::from_secs(10),
        "a dropped guard's permits back",
        || available(&mut raw) == i64::from(max),
    );

    // Reclaimed by the next acquire once their lease ran out (one script, chunked removal).
    // The lease is ten times what taking every permit took above: a grant whose lease runs out
    // before its reply arrives is given back and asked for again (a debug build under load can
    // need more than a second for one call with 65,536 ids), which would only slow this down.
    let lease = (one_acquire * 10).max(Duration::from_millis(500));
    let leased = sem.acquire(max, Some(lease)).await.unwrap();
    leased.forget();
    let again = sem
        .try_acquire(
            max,
            lease + Duration::from_secs(10),
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .expect("reclaimed after the lease");
    assert_eq!(again.release().await.unwrap(), max as usize);
    assert_eq!(available(&mut raw), i64::from(max));

    // Given back at shutdown.
    let kept = sem.acquire(many, None).await.unwrap();
    c.shutdown().await;
    assert!(kept.is_lost());
    assert_eq!(available(&mut raw), i64::from(max));
    let keys: Vec<String> = raw.keys(format!("*{name}*")).unwrap();
    let timeouts: Vec<&String> = keys.iter().filter(|k| k.ends_with(":timeout")).collect();
    for key in timeouts {
        assert_eq!(raw.zcard::<_, i64>(key).unwrap(), 0, "{key}");
    }
}

/// Waiters sleep until a release message, which wakes the waiters of this client its count can
/// serve: a release of two permits serves two waiters, each within far less than the re-check
/// period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_releases_and_never_take_more_than_there_is() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let owner = Client::connect(&server.url()).await.unwrap();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = "sem:wake";
    assert!(owner.semaphore(name).try_set_permits(0).await.unwrap());
    let in_use = Arc::new(AtomicI64::new(0));
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let sem = c.semaphore(name);
        let in_use = in_use.clone();
        waiters.push(tokio::spawn(async move {
            let p = sem.acquire(1).await.unwrap();
            in_use.fetch_add(1, Ordering::SeqCst);
            (p, Instant::now())
        }));
    }
    support::wait_subscribed(&mut raw, "redisson_sc:{sem:wake}");
    let released = Instant::now();
    owner.semaphore(name).add_permits(2).await.unwrap();
    // (Counted by the tasks that ended: a task counts itself just before it ends.)
    wait_until_async(Duration::from_secs(3), "two waiters served", || {
        let n = waiters.iter().filter(|w| w.is_finished()).count();
        async move { n == 2 }
    })
    .await;
    assert_eq!(in_use.load(Ordering::SeqCst), 2);
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the message, not the re-check: {:?}",
        released.elapsed()
    );
    let mut served = Vec::new();
    let mut pending = Vec::new();
    for w in waiters {
        if w.is_finished() {
            served.push(w.await.unwrap().0);
        } else {
            pending.push(w);
        }
    }
    assert_eq!((served.len(), pending.len()), (2, 1));
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 0);
    // The third is served by the next release.
    served.pop().unwrap().release().await.unwrap();
    let (p, _) = tokio::time::timeout(Duration::from_secs(3), pending.pop().unwrap())
        .await
        .unwrap()
        .unwrap();
    drop(p);
    served.pop().unwrap().release().await.unwrap();
    wait_until(Duration::from_secs(5), "every permit back", || {
        raw.get::<_, i64>(name).unwrap() == 2
    });
}

/// Dropped futures take nothing: `try_acquire` cut off by `timeout` at every stage, aborted
/// tasks, guards dropped without a release; every permit is back at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_and_dropped_guards_leave_every_permit_behind() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let name = "sem:cancel";
    let sem = c.semaphore(name);
    assert!(sem.try_set_permits(2).await.unwrap());
    let mut got = 0;
    for i in 0..200u64 {
        // From 0 to ~2 ms: some futures are dropped before the send, some with the script in
        // flight, some after it answered.
        let cut = Duration::from_micros((i * 37) % 2_000);
        let s = c.semaphore(name);
        if let Ok(Ok(Some(p))) = tokio::time::timeout(cut, s.try_acquire(1, Duration::ZERO)).await {
            got += 1;
            if i % 2 == 0 {
                drop(p);
            } else {
                p.release().await.unwrap();
            }
        }
        // Another client keeps the permits moving meanwhile.
        if let Some(p) = other
            .semaphore(name)
            .try_acquire(1, Duration::ZERO)
            .await
            .unwrap()
        {
            let cut = Duration::from_micros((i * 53) % 1_500);
            let _ = tokio::time::timeout(cut, p.release()).await;
        }
    }
    // Waiting calls aborted while they wait.
    let held = sem.acquire(2).await.unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let s = c.semaphore(name);
            tokio::spawn(async move { s.acquire(1).await })
        })
        .collect();
    tokio::task::yield_now().await;
    for w in &waiters {
        w.abort();
    }
    held.release().await.unwrap();
    wait_until(Duration::from_secs(10), "every permit back", || {
        raw.get::<_, i64>(name).unwrap() == 2
    });
    assert!(got > 0, "some attempts got through");
    // And stays so (no late arrival takes one).
    let two = sem.try_acquire(2, Duration::ZERO).await.unwrap().unwrap();
    two.release().await.unwrap();
    let (others, eternal) = leftovers(&mut raw, name);
    assert_eq!(others, vec![name.to_owned()]);
    assert!(eternal.is_empty(), "{eternal:?}");
}

/// One permit and twelve waiting calls of one client, each taking it three times: a release
/// wakes the one waiter its count can serve, not all eleven (counted: acquire attempts per
/// acquisition), and no wake-up is lost on the way (every call is served well within the 5 s
/// re-check a lost wake-up would cost), whatever the waiters do: some are cancelled while they
/// wait (their wake-up is handed on), some need two permits (never woken by a count of one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiters_it_can_serve_and_no_wake_up_is_lost() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = "sem:line";
    assert!(c.semaphore(name).try_set_permits(1).await.unwrap());
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut raw)
        .unwrap();
    const WAITERS: usize = 12;
    const ROUNDS: usize = 3;
    let mut tasks = Vec::new();
    for w in 0..WAITERS {
        let sem = c.semaphore(name);
        tasks.push(tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            for round in 0..ROUNDS {
                // Every fourth waiter gives up a first call after a moment (cancelled while it
                // waits, perhaps just woken), then calls again.
                if (w + round) % 4 == 0 {
                    let _ = tokio::time::timeout(Duration::from_millis(3), sem.acquire(1))
                        .await
                        .map(|p| p.map(drop));
                }
                let asked = Instant::now();
                let p = tokio::time::timeout(Duration::from_secs(30), sem.acquire(1))
                    .await
                    .expect("an acquire hung")
                    .unwrap();
                slowest = slowest.max(asked.elapsed());
                tokio::time::sleep(Duration::from_millis(1)).await;
                p.release().await.unwrap();
            }
            slowest
        }));
    }
    // Two calls that need both permits: never served while one permit exists, and never woken
    // by a count of one (they stay behind, out of the way).
    let mut greedy: Vec<_> = (0..2)
        .map(|_| {
            let sem = c.semaphore(name);
            tokio::spawn(async move { sem.try_acquire(2, Duration::from_secs(60)).await })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for t in tasks {
        slowest = slowest.max(t.await.unwrap());
    }
    assert!(
        slowest < Duration::from_secs(4),
        "a call waited {slowest:?}: a wake-up was lost (the re-check is 5 s)"
    );
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    let scripts = support::command_calls(&info, "evalsha") + support::command_calls(&info, "eval");
    let acquisitions = (WAITERS * ROUNDS) as u64;
    eprintln!("{scripts} script calls for {acquisitions} acquisitions; slowest call {slowest:?}");
    // Per acquisition: its release, its successful attempt, the first attempt of each call
    // (made before it sleeps), one attempt that lost the race to the releaser's next call, a
    // greedy call woken to look when it is ahead in line, and the cancelled calls' attempts and
    // give-backs: 4.5-6.5 measured; waking every waiter on each release made it about 12.
    assert!(
        scripts <= 9 * acquisitions,
        "{scripts} script calls for {acquisitions} acquisitions"
    );
    // Both permits for one greedy call once a second permit is added; then for the other.
    c.semaphore(name).add_permits(1).await.unwrap();
    let (mut g1, mut g2) = (greedy.pop().unwrap(), greedy.pop().unwrap());
    let (first, second_first) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            r = &mut g1 => (r, false),
            r = &mut g2 => (r, true),
        }
    })
    .await
    .expect("a greedy call served");
    let p = first.unwrap().unwrap().expect("both permits");
    assert_eq!(p.count(), 2);
    p.release().await.unwrap();
    let other = if second_first { g1 } else { g2 };
    let last = tokio::time::timeout(Duration::from_secs(10), other)
        .await
        .expect("the other greedy call served")
        .unwrap()
        .unwrap()
        .expect("both permits");
    last.release().await.unwrap();
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 2);
}

/// A reply lost after the script ran: the acquire fails (its outcome unknown to the caller) and
/// its permits come back; a release whose reply is lost returns its permits once; a count-down
/// whose reply is lost counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_after_the_script_ran_are_settled_exactly_once() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy, None).await;
    let name = "sem:lost";
    let sem = c.semaphore(name);
    assert!(sem.try_set_permits(3).await.unwrap());
    // Scripts cached first (a lost NOSCRIPT reply would keep the script from running at all).
    sem.acquire(1).await.unwrap().release().await.unwrap();
    let warm = c.count_down_latch("latch:warm");
    assert!(warm.try_set_count(1).await.unwrap());
    warm.count_down().await.unwrap();

    // The acquire runs, its reply is lost.
    proxy.set_blackhole_replies(true);
    let s = sem.clone();
    let attempt = tokio::spawn(async move { s.try_acquire(2, Duration::ZERO).await });
    wait_until(Duration::from_secs(5), "the acquire ran", || {
        raw.get::<_, i64>(name).unwrap() == 1
    });
    // Switching the blackhole off resets the connection that lost the reply (the call fails);
    // the give-back goes through on the next one.
    proxy.set_blackhole_replies(false);
    let outcome = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.unwrap_err().is_transient());
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 3, "the permits came back");

    // A release whose reply is lost: resent under its mark, counted once.
    let p = sem.acquire(2).await.unwrap();
    proxy.set_blackhole_replies(true);
    let release = tokio::spawn(p.release());
    wait_until(Duration::from_secs(5), "the release ran", || {
        raw.get::<_, i64>(name).unwrap() == 3
    });
    proxy.set_blackhole_replies(false);
    tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 3, "released once");

    // A count-down whose reply is lost.
    let latch = c.count_down_latch("latch:lost");
    assert!(latch.try_set_count(3).await.unwrap());
    proxy.set_blackhole_replies(true);
    let l = latch.clone();
    let down = tokio::spawn(async move { l.count_down().await });
    wait_until(Duration::from_secs(5), "the count-down ran", || {
        raw.get::<_, i64>("latch:lost").unwrap() == 2
    });
    proxy.set_blackhole_replies(false);
    tokio::time::timeout(Duration::from_secs(10), down)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        raw.get::<_, i64>("latch:lost").unwrap(),
        2,
        "counted down once"
    );
}

/// An acquire that ran but whose reply was lost is settled before its call returns; a caller that
/// stops waiting while that settle cannot reach Redis (a `timeout()`, an abort) leaves it to the
/// background, which gives the permits back once Redis answers again. (The settle used to be
/// dropped with the call, leaving the permits taken for good: a torture run lost one so.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_while_its_lost_reply_is_settled_still_gives_its_permits_back() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy, None).await;
    let name = "sem:settle-cancelled";
    let sem = c.semaphore(name);
    assert!(sem.try_set_permits(3).await.unwrap());
    // Scripts cached first (a lost NOSCRIPT reply would keep the script from running at all).
    sem.acquire(1).await.unwrap().release().await.unwrap();

    // The acquire runs; its reply is lost, and so is every request after it.
    proxy.set_blackhole_replies(true);
    let s = sem.clone();
    let call = tokio::spawn(async move { s.acquire(2).await });
    wait_until(Duration::from_secs(5), "the acquire ran", || {
        raw.get::<_, i64>(name).unwrap() == 1
    });
    let before = proxy.dropped(Direction::Up);
    proxy.set_blackhole_requests(true);
    // The reply times out and the call sends its settle, which never arrives: the call is
    // cancelled then.
    wait_until(Duration::from_secs(5), "the settle was sent", || {
        proxy.dropped(Direction::Up) > before
    });
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 1, "nothing settled yet");
    proxy.clear();
    wait_until(Duration::from_secs(10), "the permits came back", || {
        raw.get::<_, i64>(name).unwrap() == 3
    });
    // And only once: a later release and acquire see the full count.
    let p = sem
        .try_acquire(3, Duration::ZERO)
        .await
        .unwrap()
        .expect("all 3 back");
    assert_eq!(p.release().await.unwrap(), 3);
    c.shutdown().await;
}

/// A latch: set, counted down by several clients, awaited by several; opens for all at zero
/// with `0` published, refuses a second set, and leaves no key when open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_opens_for_every_waiter_when_counted_down_to_zero() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let name = "latch:open";
    let mut messages = subscribe(&server, "redisson_countdownlatch__channel__{latch:open}");
    let latch = a.count_down_latch(name);
    assert!(
        latch.wait_timeout(Duration::ZERO).await.unwrap(),
        "none: open"
    );
    assert!(latch.try_set_count(3).await.unwrap());
    assert_eq!(next_message(&mut messages), "1");
    assert!(!latch.try_set_count(5).await.unwrap());
    assert_eq!(latch.count().await.unwrap(), 3);
    assert!(!latch.wait_timeout(Duration::from_millis(50)).await.unwrap());

    let waiters: Vec<_> = [&a, &b, &a]
        .iter()
        .map(|c| {
            let l = c.count_down_latch(name);
            tokio::spawn(async move { l.wait().await })
        })
        .collect();
    assert_eq!(latch.count_down().await.unwrap(), 2);
    assert_eq!(b.count_down_latch(name).count_down().await.unwrap(), 1);
    assert!(waiters.iter().all(|w| !w.is_finished()));
    let opened = Instant::now();
    assert_eq!(b.count_down_latch(name).count_down().await.unwrap(), 0);
    assert_eq!(next_message(&mut messages), "0");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(3), w)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert!(opened.elapsed() < Duration::from_secs(2), "woken by `0`");
    assert!(
        !raw.exists::<_, bool>(name).unwrap(),
        "an open latch has no key"
    );
    // Counting down an open latch changes nothing (Redisson's rule).
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert!(!raw.exists::<_, bool>(name).unwrap());

    // Deleting a set latch publishes `0` (opened: what makes Redisson's waiters look again too)
    // and lets waiters through.
    assert!(latch.try_set_count(2).await.unwrap());
    assert_eq!(next_message(&mut messages), "1");
    let l = b.count_down_latch(name);
    let waiter = tokio::spawn(async move { l.wait_timeout(Duration::from_secs(10)).await });
    assert!(latch.delete().await.unwrap());
    assert_eq!(next_message(&mut messages), "0");
    assert!(tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap());
    assert!(!latch.delete().await.unwrap());
    let (others, eternal) = leftovers(&mut raw, name);
    assert!(
        others.is_empty() && eternal.is_empty(),
        "{others:?} {eternal:?}"
    );
}

/// Seeded randomized run (`FAIRLOCK_SEM_SEED` replays one): workers on three clients take 1-3
/// permits with random waits, hold them a random while, and end in every way a caller can:
/// release, drop, a `timeout` around the acquire or the release, an aborted task. Every holder
/// counts its permits in and out of a shared meter; the meter never exceeds the limit, and at the
/// end every permit is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_random_use_never_exceeds_the_limit_and_loses_no_permit() {
    let seed = support::seed("FAIRLOCK_SEM_SEED");
    let server = RedisServer::start();
    let mut raw = server.conn();
    let clients = [
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
    ];
    const LIMIT: i64 = 4;
    let name = "sem:random";
    assert!(clients[0].semaphore(name).try_set_permits(4).await.unwrap());
    let meter = Arc::new(AtomicI64::new(0));
    let peak = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for w in 0..9u64 {
        let sem = clients[(w % 3) as usize].semaphore(name);
        let (meter, peak) = (meter.clone(), peak.clone());
        let mut rng = support::Rng::for_worker(seed, w);
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(6);
            let mut taken = 0u64;
            while Instant::now() < until {
                let n = 1 + rng.below(3) as u32;
                let wait = Duration::from_millis(rng.below(40));
                let acquire = sem.try_acquire(n, wait);
                let got = if rng.below(4) == 0 {
                    let cut = Duration::from_micros(rng.below(3_000));
                    match tokio::time::timeout(cut, acquire).await {
                        Ok(r) => r.unwrap(),
                        Err(_) => None,
                    }
                } else {
                    acquire.await.unwrap()
                };
                let Some(p) = got else { continue };
                taken += 1;
                let now = meter.fetch_add(n as i64, Ordering::SeqCst) + n as i64;
                peak.fetch_max(now, Ordering::SeqCst);
                assert!(now <= LIMIT, "seed {seed}: {now} permits in use");
                tokio::time::sleep(Duration::from_micros(rng.below(2_000))).await;
                // Out of the meter before the permits can be seen free again.
                meter.fetch_sub(n as i64, Ordering::SeqCst);
                match rng.below(3) {
                    0 => {
                        p.release().await.unwrap();
                    }
                    1 => drop(p),
                    _ => {
                        let cut = Duration::from_micros(rng.below(1_500));
                        let _ = tokio::time::timeout(cut, p.release()).await;
                    }
                }
            }
            taken
        }));
    }
    // One more task is aborted at random points while it waits.
    let sem = clients[1].semaphore(name);
    let mut rng = support::Rng::new(seed);
    for _ in 0..20 {
        let s = sem.clone();
        let t = tokio::spawn(async move { s.acquire(4).await.map(drop) });
        tokio::time::sleep(Duration::from_micros(rng.below(20_000))).await;
        t.abort();
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    wait_until(Duration::from_secs(15), "every permit back", || {
        raw.get::<_, i64>(name).unwrap() == LIMIT
    });
    eprintln!(
        "seed {seed}: {total} acquisitions, peak {} of {LIMIT}",
        peak.load(Ordering::SeqCst)
    );
    assert!(total > 50, "seed {seed}: only {total} acquisitions");
    assert!(
        peak.load(Ordering::SeqCst) >= 2,
        "seed {seed}: never contended"
    );
    let (others, eternal) = leftovers(&mut raw, name);
    assert_eq!(others, vec![name.to_owned()], "seed {seed}");
    assert!(eternal.is_empty(), "seed {seed}: {eternal:?}");
}

fn hex(raw: &[u8]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

async fn short_watchdog(url: &str, watchdog: Duration) -> Client {
    Client::builder()
        .standalone(url)
        .watchdog_timeout(watchdog)
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap()
}

/// Expirable permits: Redisson's layout (raw 16-byte ids scored by their expiry on the server's
/// clock), watchdog renewals that move the expiry on while the guard lives, a release that
/// returns the permit; a fixed lease that runs out is reported lost, and a waiter takes the
/// expired permit at its expiry although no message is ever sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expirable_permits_keep_redissons_layout_and_are_renewed_while_held() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = short_watchdog(&server.url(), Duration::from_millis(900)).await;
    let name = "pes:layout";
    let zset = "{pes:layout}:timeout";
    let sem = c.expirable_semaphore(name);
    assert!(sem.try_set_permits(2).await.unwrap());
    let p = sem.acquire(1, None).await.unwrap();
    let ids = p.ids();
    assert_eq!(ids.len(), 1);
    let members: Vec<(Vec<u8>, f64)> = raw.zrange_withscores(zset, 0, -1).unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(
        members[0].0.len(),
        16,
        "raw 16-byte ids, as Redisson stores them"
    );
    assert_eq!(hex(&members[0].0), ids[0]);
    let first = members[0].1 as i64;
    let now = support::server_now_ms(&mut raw);
    assert!(
        first > now && first <= now + 900,
        "expiry {first} vs now {now}"
    );
    wait_until(
        Duration::from_secs(5),
        "renewed past its first lease",
        || {
            let score: f64 = raw.zscore(zset, &members[0].0).unwrap();
            score as i64 > first + 900
        },
    );
    assert!(!p.is_lost());
    assert_eq!(sem.available().await.unwrap(), 1);
    assert_eq!(sem.acquired().await.unwrap(), 1);
    assert_eq!(p.release().await.unwrap(), 1);
    assert!(!raw.exists::<_, bool>(zset).unwrap());
    assert_eq!(sem.available().await.unwrap(), 2);

    // A fixed lease runs out: lost; a waiter takes the expired permit at its expiry.
    let fixed = sem
        .acquire(2, Some(Duration::from_millis(300)))
        .await
        .unwrap();
    let s = sem.clone();
    let waiter = tokio::spawn(async move { s.acquire(1, Some(Duration::from_secs(5))).await });
    let reason = tokio::time::timeout(Duration::from_secs(3), fixed.lost())
        .await
        .expect("a fixed lease is reported lost when it runs out");
    assert_eq!(reason, fairlock::LostReason::LeaseExpired);
    let got = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter looks again at the expiry")
        .unwrap()
        .unwrap();
    assert!(
        fixed.release().await.unwrap() <= 1,
        "the reclaimed one is not ours"
    );
    got.release().await.unwrap();
    assert_eq!(sem.available().await.unwrap(), 2);
    let (others, eternal) = leftovers(&mut raw, name);
    assert_eq!(others, vec![name.to_owned()]);
    assert!(eternal.is_empty());
}

/// An expirable acquire whose reply is lost is resent with the same ids and takes its permit
/// once; futures cut at every stage leave every permit available again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expirable_acquires_resent_or_cancelled_take_each_permit_once() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy, Some(Duration::from_millis(900))).await;
    let name = "pes:resend";
    let sem = c.expirable_semaphore(name);
    assert!(sem.try_set_permits(3).await.unwrap());
    sem.acquire(1, None).await.unwrap().release().await.unwrap();

    proxy.set_blackhole_replies(true);
    let s = sem.clone();
    let attempt = tokio::spawn(async move { s.try_acquire(1, Duration::ZERO, None).await });
    wait_until(Duration::from_secs(5), "the acquire ran", || {
        raw.get::<_, i64>(name).unwrap() == 2
    });
    proxy.set_blackhole_replies(false);
    let p = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("the resend found its permit taken by the first send");
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 2, "taken once");
    assert_eq!(raw.zcard::<_, i64>("{pes:resend}:timeout").unwrap(), 1);
    p.release().await.unwrap();

    for i in 0..150u64 {
        let cut = Duration::from_micros((i * 41) % 2_500);
        let s = sem.clone();
        if let Ok(Ok(Some(p))) =
            tokio::time::timeout(cut, s.try_acquire(1 + (i % 2) as u32, Duration::ZERO, None)).await
        {
            if i % 3 == 0 {
                drop(p);
            } else {
                let _ = tokio::time::timeout(cut, p.release()).await;
            }
        }
    }
    // Everything released (in the background) or, for a send that arrived after its release,
    // back at its 900 ms lease.
    let mut conn = server.conn();
    let check = c.expirable_semaphore(name);
    wait_until_async(Duration::from_secs(10), "every permit back", || {
        let check = check.clone();
        async move { check.available().await.unwrap() == 3 }
    })
    .await;
    assert_eq!(conn.zcard::<_, i64>("{pes:resend}:timeout").unwrap(), 0);
}

/// A process killed while it holds an expirable permit under the watchdog: the permit comes
/// back one watchdog timeout later, and a waiter takes it without any message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_expirable_permit_comes_back_at_its_lease() {
    const ROLE: &str = "FAIRLOCK_PES_ROLE";
    if let Ok(name) = std::env::var(ROLE) {
        let url = std::env::var("FAIRLOCK_PES_URL").unwrap();
        let c = short_watchdog(&url, Duration::from_millis(1_500)).await;
        let permit = c.expirable_semaphore(name).acquire(1, None).await.unwrap();
        println!("READY");
        std::future::pending::<()>().await;
        drop(permit);
        return;
    }
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = "pes:killed";
    let sem = c.expirable_semaphore(name);
    assert!(sem.try_set_permits(1).await.unwrap());
    let url = server.url();
    let mut child = support::spawn_role(
        "a_killed_holders_expirable_permit_comes_back_at_its_lease",
        &[(ROLE, name), ("FAIRLOCK_PES_URL", &url)],
    );
    assert_eq!(sem.available().await.unwrap(), 0);
    support::sigkill(&mut child);
    let killed = Instant::now();
    let p = sem
        .try_acquire(1, Duration::from_secs(10), None)
        .await
        .unwrap()
        .expect("the dead holder's permit comes back");
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    p.release().await.unwrap();
}

/// An acquire that finds an expired permit reclaims it even when what is then available is still
/// too little (the script reads the earliest expiry first and reclaims only when it has passed),
/// and a later acquire that finds nothing expired takes what is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_fails_still_reclaims_what_expired() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = "pes:reclaim";
    let zset = "{pes:reclaim}:timeout";
    let sem = c.expirable_semaphore(name);
    assert!(sem.try_set_permits(3).await.unwrap());
    let short = sem
        .acquire(1, Some(Duration::from_millis(300)))
        .await
        .unwrap();
    let long = sem.acquire(2, Some(Duration::from_secs(60))).await.unwrap();
    let expiry: Vec<(Vec<u8>, f64)> = raw.zrange_withscores(zset, 0, 0).unwrap();
    let expiry = expiry[0].1 as i64;
    wait_until(Duration::from_secs(5), "the short lease ran out", || {
        support::server_now_ms(&mut raw) > expiry
    });
    assert_eq!(
        raw.get::<_, i64>(name).unwrap(),
        0,
        "not reclaimed before a call"
    );
    assert!(sem
        .try_acquire(2, Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        raw.get::<_, i64>(name).unwrap(),
        1,
        "reclaimed by the failed acquire"
    );
    assert_eq!(
        raw.zcard::<_, i64>(zset).unwrap(),
        2,
        "the long lease's two permits"
    );
    let one = sem
        .try_acquire(1, Duration::ZERO, None)
        .await
        .unwrap()
        .expect("the reclaimed permit");
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 0);
    assert_eq!(one.release().await.unwrap(), 1);
    assert_eq!(long.release().await.unwrap(), 2);
    assert_eq!(
        short.release().await.unwrap(),
        0,
        "reclaimed: no longer its own"
    );
    assert_eq!(sem.available().await.unwrap(), 3);
}

/// `Client::shutdown` gives expirable permits back and tells their guards (`Shutdown`), as it
/// does for locks; waiting semaphore and latch calls end with `Error::Shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_permits_back_and_ends_waiting_calls() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let sem = c.expirable_semaphore("pes:shutdown");
    assert!(sem.try_set_permits(2).await.unwrap());
    let held = sem.acquire(2, None).await.unwrap();
    let s = sem.clone();
    let waiting = tokio::spawn(async move { s.acquire(1, None).await });
    let latch = c.count_down_latch("latch:shutdown");
    assert!(latch.try_set_count(1).await.unwrap());
    let l = latch.clone();
    let latch_waiting = tokio::spawn(async move { l.wait().await });
    tokio::task::yield_now().await;
    c.shutdown().await;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), held.lost())
            .await
            .unwrap(),
        fairlock::LostReason::Shutdown
    );
    assert!(tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err()
        .is_shutdown());
    assert!(tokio::time::timeout(Duration::from_secs(5), latch_waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err()
        .is_shutdown());
    assert_eq!(
        other
            .expirable_semaphore("pes:shutdown")
            .available()
            .await
            .unwrap(),
        2,
        "given back at shutdown, not at the lease"
    );
    assert_eq!(held.release().await.unwrap(), 0);
}

/// A waiting acquire rides out a connection that fails under it (transient errors are retried,
/// as `lock()` does) and takes the permits once Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_rides_out_a_failing_connection() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy, None).await;
    let name = "sem:outage";
    let sem = c.semaphore(name);
    assert!(sem.try_set_permits(0).await.unwrap());
    let s = sem.clone();
    let waiter = tokio::spawn(async move { s.acquire(1).await });
    support::wait_subscribed(&mut raw, "redisson_sc:{sem:outage}");
    // Requests are lost from now on; a message makes the waiter look again, and its attempt
    // is lost; its connection is then reset under it.
    proxy.set_blackhole_requests(true);
    let _: i64 = raw.publish("redisson_sc:{sem:outage}", "0").unwrap();
    wait_until(
        Duration::from_secs(10),
        "an attempt was lost and reset",
        || proxy.reset_tainted() >= 1,
    );
    let _: i64 = raw.incr(name, 1).unwrap();
    proxy.set_blackhole_requests(false);
    let permits = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is served once Redis answers again")
        .unwrap()
        .expect("transient errors are retried, not returned");
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 0);
    permits.release().await.unwrap();
    assert_eq!(raw.get::<_, i64>(name).unwrap(), 1);
}

/// An expirable acquire resent after its first send timed out: the first send may be the one that
/// ran (its script took the permits, its reply was lost), so the guard's validity counts from
/// that first send, never from a resend (found by torture run 10: a permit reclaimed on the
/// server while its guard still trusted it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_expirable_acquire_counts_its_validity_from_the_first_send() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let monitor = support::Monitor::start(server.port());
    let c = proxied(&proxy, None).await;
    let name = "pes:first-send";
    let sem = c.expirable_semaphore(name);
    assert!(sem.try_set_permits(1).await.unwrap());
    sem.acquire(1, None).await.unwrap().release().await.unwrap();
    // Replies are lost: the first send takes the permit, its reply never comes; the call is
    // resent (after the 300 ms command timeout) with the same ids.
    proxy.set_blackhole_replies(true);
    let lease = Duration::from_millis(5_000);
    let started = Instant::now();
    let since = Instant::now();
    // Past the warm-up's own lines (its release is the last).
    let from = 1 + monitor.wait_for_after(
        0,
        &["\"ZREM\"", "{pes:first-send}:timeout"],
        Duration::from_secs(10),
    );
    let s = sem.clone();
    let call = tokio::spawn(async move { s.try_acquire(1, Duration::ZERO, Some(lease)).await });
    let first = monitor.wait_for_after(
        from,
        &["\"ZADD\"", "{pes:first-send}:timeout"],
        Duration::from_secs(10),
    );
    monitor.wait_for_after(
        first + 1,
        &["\"ZSCORE\"", "{pes:first-send}:timeout"],
        Duration::from_secs(10),
    );
    eprintln!("resend seen {:?} after the call started", since.elapsed());
    proxy.set_blackhole_replies(false);
    let p = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("the resend finds the permit its first send took");
    assert!(
        p.valid_until() <= started + lease,
        "valid until {:?} after the call started, past its lease {lease:?}",
        p.valid_until() - started
    );
    p.release().await.unwrap();
}
