//! Waiting through Redis outages: transient errors are retried until the caller's deadline (or,
//! for `lock()`, the watchdog timeout), and an attempt whose reply was lost is checked before the
//! next one, so a grant made in the dark is taken up once, never counted twice.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::Client;
use redis::Commands;
use support::{joined, wait_until, wait_until_async, EventCount, RedisServer};

const RETRY: &str = "transient redis error while waiting";

/// A client whose commands time out after `command_timeout`.
async fn client(server: &RedisServer, command_timeout: Duration) -> Client {
    Client::builder()
        .standalone(server.url())
        .command_timeout(command_timeout)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_through_a_redis_restart() {
    let retries = EventCount::watch(RETRY, "restart");
    let mut server = RedisServer::start();
    let c = client(&server, Duration::from_millis(300)).await;
    let lock = c.fair_lock("restart");
    server.kill();
    let waiter = tokio::spawn(async move { lock.lock().await });
    wait_until(Duration::from_secs(10), "a retried error", || {
        retries.get() >= 2
    });
    assert!(!waiter.is_finished(), "lock() returned during the outage");
    server.restart();
    let guard = joined(
        waiter,
        Duration::from_secs(10),
        "lock() succeeds once Redis is back",
    )
    .await
    .unwrap();
    let mut raw = server.conn();
    assert_eq!(raw.hvals::<_, Vec<i64>>("restart").unwrap(), vec![1]);
    guard.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("restart").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_reply_was_lost_is_taken_up_once() {
    let retries = EventCount::watch(RETRY, "lost-reply");
    let server = RedisServer::start();
    let command_timeout = Duration::from_millis(300);
    let c = client(&server, command_timeout).await;
    let lock = c.fair_lock("lost-reply");
    // Load the scripts first: a frozen EVALSHA of an unknown script would only fail later.
    lock.lock().await.unwrap().unlock().await.unwrap();
    // Frozen: the attempt reaches the socket, times out here, and runs when Redis thaws; so do
    // the retries queued behind it. Without the check for a lost grant, those retries would
    // re-enter the lock and leave it held after our one unlock.
    server.pause();
    let waiter = tokio::spawn({
        let lock = c.fair_lock("lost-reply");
        async move { lock.lock().await }
    });
    wait_until(
        Duration::from_secs(10),
        "a timed-out attempt and a retry",
        || retries.get() >= 3,
    );
    server.resume();
    let guard = joined(
        waiter,
        Duration::from_secs(10),
        "lock() succeeds once Redis thaws",
    )
    .await
    .unwrap();
    let mut raw = server.conn();
    assert_eq!(
        raw.hgetall::<_, Vec<(String, i64)>>("lost-reply").unwrap(),
        vec![(guard.owner_field().to_owned(), 1)]
    );
    guard.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("lost-reply").unwrap());
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_gives_up_when_the_outage_outlasts_the_watchdog_timeout() {
    let mut server = RedisServer::start();
    let command_timeout = Duration::from_millis(300);
    let watchdog = Duration::from_secs(2);
    let c = Client::builder()
        .standalone(server.url())
        .command_timeout(command_timeout)
        .watchdog_timeout(watchdog)
        .waiter_liveness(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let lock = c.fair_lock("outlasted");
    server.kill();
    let started = Instant::now();
    let err = lock.lock().await.unwrap_err();
    let took = started.elapsed();
    assert!(err.is_redis() && err.is_transient(), "{err:?}");
    assert!(took >= watchdog, "gave up after {took:?}");
    assert!(
        took < watchdog + command_timeout + Duration::from_secs(2),
        "{took:?}"
    );
}

/// A `lock()` already waiting (asleep until its next timer, up to the watchdog timeout away)
/// when Redis dies: its client's pub/sub connection drops at once, which sends every waiter to
/// look, so the call's outage clock starts with the outage and the error comes one watchdog
/// timeout (here the longer waiter liveness) after it. Before, the waiter slept out its timer
/// first and the error came after about twice that (60.8 s with the 30 s defaults).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lock_gives_up_one_watchdog_timeout_after_the_outage_began() {
    let mut server = RedisServer::start();
    let holder = Client::connect(&server.url()).await.unwrap();
    let limit = Duration::from_secs(4);
    let c = Client::builder()
        .standalone(server.url())
        .command_timeout(Duration::from_millis(300))
        .watchdog_timeout(Duration::from_secs(2))
        .waiter_liveness(limit)
        .build()
        .await
        .unwrap();
    let name = "outage-clock";
    let held = holder.fair_lock(name).lock().await.unwrap();
    let lock = c.fair_lock(name);
    let waiter = tokio::spawn(async move { lock.lock().await });
    let mut raw = server.conn();
    let queue = format!("redisson_lock_queue:{{{name}}}");
    wait_until(Duration::from_secs(10), "queued", || {
        raw.llen::<_, i64>(&queue).unwrap() == 1
    });
    let head: String = raw.lindex(&queue, 0).unwrap();
    let channel = format!("redisson_lock__channel:{{{name}}}:{head}");
    wait_until(Duration::from_secs(10), "subscribed", || {
        let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut raw)
            .unwrap();
        subscribers == 1
    });
    std::mem::forget(held);
    server.kill();
    let killed = Instant::now();
    let err = joined(waiter, Duration::from_secs(30), "lock() gives up")
        .await
        .unwrap_err();
    let took = killed.elapsed();
    assert!(err.is_redis() && err.is_transient(), "{err:?}");
    assert!(
        took >= limit - Duration::from_millis(500),
        "gave up after {took:?}"
    );
    assert!(
        took < limit + Duration::from_millis(1500),
        "gave up {took:?} after the outage began (limit {limit:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_that_are_not_transient_are_returned_at_once() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.conn();
    // A string under the lock's name: the script fails with WRONGTYPE, which no retry can cure.
    let _: () = raw.set("wrongtype", "x").unwrap();
    let started = Instant::now();
    let err = c
        .fair_lock("wrongtype")
        .try_lock(Duration::from_secs(30), None)
        .await
        .unwrap_err();
    assert!(err.is_redis() && !err.is_transient(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Nothing was left in the queue.
    assert_eq!(
        raw.llen::<_, i64>("redisson_lock_queue:{wrongtype}")
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_ended_after_a_lost_reply_leaves_its_grant_to_the_holders_next_call() {
    let retries = EventCount::watch(RETRY, "lost-then-retry");
    let server = RedisServer::start();
    let command_timeout = Duration::from_millis(300);
    let c = client(&server, command_timeout).await;
    let lock = c.fair_lock("lost-then-retry").with_holder(c.holder());
    lock.lock().await.unwrap().unlock().await.unwrap();
    server.pause();
    // Frozen for the whole wait: the call fails, but its first attempt runs once Redis thaws.
    let err = lock
        .try_lock(Duration::from_secs(1), None)
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(retries.get() >= 1);
    server.resume();
    let mut raw = server.conn();
    // The same holder asks again: it takes up that grant instead of re-entering it, and the
    // grant gets this call's lease (2 min) instead of keeping what is left of the first one's
    // (the 30 s watchdog timeout, running since Redis thawed).
    let guard = lock
        .try_lock(Duration::from_secs(5), Some(Duration::from_secs(120)))
        .await
        .unwrap()
        .expect("the grant made in the dark is ours");
    assert_eq!(
        raw.hgetall::<_, Vec<(String, i64)>>("lost-then-retry")
            .unwrap(),
        vec![(guard.owner_field().to_owned(), 1)]
    );
    let pttl: i64 = raw.pttl("lost-then-retry").unwrap();
    assert!(
        pttl > 60_000,
        "the lease was not applied again: PTTL {pttl} ms"
    );
    guard.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("lost-then-retry").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_retries_through_a_short_freeze_and_releases_once() {
    let retries = EventCount::watch("retrying release", "frozen-unlock");
    let server = RedisServer::start();
    let c = client(&server, Duration::from_millis(500)).await;
    let lock = c.fair_lock("frozen-unlock").with_holder(c.holder());
    // Held twice: releasing one hold twice (the timed-out send and its retry both run once Redis
    // thaws) would free the lock; the request latch must make the retry a no-op.
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    server.pause();
    let unlocking = tokio::spawn(inner.unlock());
    wait_until(Duration::from_secs(10), "a retried release", || {
        retries.get() >= 1
    });
    server.resume();
    tokio::time::timeout(Duration::from_secs(10), unlocking)
        .await
        .expect("the release completes once Redis thaws")
        .unwrap()
        .unwrap();
    let mut raw = server.conn();
    assert_eq!(
        raw.hgetall::<_, Vec<(String, i64)>>("frozen-unlock")
            .unwrap(),
        vec![(outer.owner_field().to_owned(), 1)]
    );
    outer.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("frozen-unlock").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_whose_attempt_lost_its_reply_leaves_nothing_behind() {
    let gave_up = EventCount::watch("give-up failed", "abandoned-dark");
    let server = RedisServer::start();
    let c = client(&server, Duration::from_millis(300)).await;
    let lock = c.fair_lock("abandoned-dark");
    lock.lock().await.unwrap().unlock().await.unwrap();
    server.pause();
    // The caller stops waiting while its attempt is in flight; the client settles the attempt,
    // which times out (its reply is lost), so the settle sends a release of whatever that attempt
    // may have taken, and then leaves the queue; both time out too, and stay queued in Redis.
    let cancelled = tokio::time::timeout(Duration::from_millis(100), lock.lock()).await;
    assert!(cancelled.is_err());
    wait_until_async(Duration::from_secs(10), "the give-up failed", || async {
        gave_up.get() >= 1
    })
    .await;
    server.resume();
    let mut raw = server.conn();
    // Once Redis thaws it runs the attempt (a grant to nobody who knows it), then the settle's
    // release of exactly that grant: a read on the client's own connection comes after both.
    assert!(
        !lock.is_locked().await.unwrap(),
        "the grant made in the dark is given back"
    );
    let state = lock.state().await.unwrap();
    assert!(state.queue.is_empty(), "{state:?}");
    // The holder's next call starts from a clean slate: one hold, not two.
    let guard = lock
        .try_lock(Duration::from_secs(5), None)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(
        raw.hgetall::<_, Vec<(String, i64)>>("abandoned-dark")
            .unwrap(),
        vec![(guard.owner_field().to_owned(), 1)]
    );
    guard.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("abandoned-dark").unwrap());
}
