//! Direct hand-off (PROTOCOL 8): the script that frees a fair lock grants it to a fairlock head
//! that asked for it, and the head holds the lock when the message arrives. What must hold: the
//! grant is in Redis before the releaser's unlock returns; the head's hold is extended to its lease
//! once taken up; a grant crossing a give-up is given back and passed on; a grant whose message is
//! lost is taken up (never doubled) by the waiter's next attempt; a waiting call does not pay a
//! subscription per call.

use fairlock_testkit as support;

use std::time::Duration;

use fairlock::Client;
use redis::Commands;
use support::{wait_until, EventCount, RedisServer};

fn queue(name: &str) -> String {
    format!("redisson_lock_queue:{{{name}}}")
}

fn grants(name: &str) -> String {
    format!("fairlock_grants:{{{name}}}")
}

fn liveness(name: &str) -> String {
    format!("fairlock_liveness:{{{name}}}")
}

/// The head's field once `n` waiters are queued.
fn wait_queued(raw: &mut redis::Connection, name: &str, n: i64) -> String {
    wait_until(Duration::from_secs(10), "queued", || {
        raw.llen::<_, i64>(queue(name)).unwrap() == n
    });
    raw.lindex(queue(name), 0).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_grants_the_lock_to_a_fairlock_head_before_unlock_returns() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let name = "direct";
    let taken_up = EventCount::watch("took up a direct grant", name);
    let held = a.fair_lock(name).fenced().lock().await.unwrap();
    let first = held.fencing_token().expect("fenced");
    let lb = b.fair_lock(name).fenced();
    let waiter = tokio::spawn(async move { lb.lock().await });
    let head = wait_queued(&mut raw, name, 1);
    // The head asked for a direct grant: TTL (at most the liveness window), fencing, its nonce.
    let request: String = raw.hget(grants(name), &head).unwrap();
    let parts: Vec<&str> = request.split(':').collect();
    assert_eq!(parts.len(), 3, "{request}");
    assert_eq!(
        parts[0], "5000",
        "the default liveness window caps the grant's TTL"
    );
    assert_eq!(parts[1], "1", "fenced");
    assert!(parts[2].parse::<u64>().unwrap() > 0);

    held.unlock().await.unwrap();
    let released = std::time::Instant::now();
    // Granted inside the release script: the head owns the lock already, and nothing of the
    // queue is left.
    let owners: Vec<(String, i64)> = raw.hgetall(name).unwrap();
    assert_eq!(owners, vec![(head.clone(), 1)]);
    assert_eq!(raw.llen::<_, i64>(queue(name)).unwrap(), 0);
    assert!(!raw.exists::<_, bool>(grants(name)).unwrap());
    assert!(!raw.exists::<_, bool>(liveness(name)).unwrap());
    let pttl: i64 = raw.pttl(name).unwrap();
    // The waiter extends it a third of the TTL after the grant; read well before that, the TTL
    // is the grant's (at most the liveness window), or the full lease (30 s) when the waiter's
    // re-check attempt (sent right after it subscribed) crossed the grant and took the hold up
    // from Redis, which sets the lease at once.
    if released.elapsed() < Duration::from_secs(1) {
        assert!(
            (pttl > 0 && pttl <= 5000) || (pttl > 29_000 && pttl <= 30_000),
            "grant TTL {pttl}"
        );
    }

    let guard = waiter.await.unwrap().unwrap();
    assert_eq!(guard.owner_field(), head);
    if taken_up.get() == 1 {
        assert_eq!(
            guard.fencing_token(),
            Some(first + 1),
            "the grant took the next token, and its message handed it over"
        );
    } else {
        // The re-check attempt crossed the grant and took the hold up from Redis: that draws a
        // token of its own (lua/fair_acquire.lua), and the grant's, which nobody saw, is skipped.
        assert_eq!(taken_up.get(), 0);
        assert_eq!(
            guard.fencing_token(),
            Some(first + 2),
            "a hold taken up by an attempt gets the token after the grant's"
        );
    }
    // Taken up: the watchdog lease (30 s) replaces the grant's short TTL.
    wait_until(Duration::from_secs(10), "extended to the lease", || {
        raw.pttl::<_, i64>(name).unwrap() > 6000
    });
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
    let left: Vec<String> = raw.keys("*direct*").unwrap();
    assert_eq!(
        left,
        vec!["redisson_lock_token:{direct}".to_string()],
        "only the fencing counter stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_granted_directly_gets_its_whole_lease() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let name = "direct-lease";
    let held = a.fair_lock(name).lock().await.unwrap();
    let lb = b.fair_lock(name);
    let waiter = tokio::spawn(async move {
        lb.try_lock(Duration::from_secs(20), Some(Duration::from_secs(60)))
            .await
    });
    let head = wait_queued(&mut raw, name, 1);
    held.unlock().await.unwrap();
    let owners: Vec<(String, i64)> = raw.hgetall(name).unwrap();
    assert_eq!(owners, vec![(head, 1)]);
    let guard = waiter.await.unwrap().unwrap().expect("granted");
    // At first trusted for the grant's TTL (5 s) only; once the extension's reply is in, for the
    // lease. (Waiting on the client's own view: Redis has the new TTL a moment before the client
    // reads the reply.)
    wait_until(
        Duration::from_secs(10),
        "trusted for the 60 s lease",
        || guard.valid_until() > std::time::Instant::now() + Duration::from_secs(50),
    );
    assert!(
        raw.pttl::<_, i64>(name).unwrap() > 50_000,
        "Redis has the lease"
    );
    guard.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>(name).unwrap());
}

/// The holder re-enters with a short lease right after a direct grant, before the grant's short
/// TTL is extended. The re-entry's grant covers its own lease only: the first hold's extension to
/// its 60 s lease still runs and confirms it. (Before, the re-entry's grant counted as that
/// extension: the first guard stayed trusted for the grant's TTL only and reported its lease
/// expired at ~5 s while Redis kept the lock for the lease.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_right_after_a_direct_grant_keeps_its_whole_lease() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let name = "direct-reentry";
    let held = a.fair_lock(name).lock().await.unwrap();
    let lb = b.fair_lock(name);
    let waiter = tokio::spawn(async move {
        lb.try_lock(Duration::from_secs(20), Some(Duration::from_secs(60)))
            .await
    });
    wait_queued(&mut raw, name, 1);
    held.unlock().await.unwrap();
    let guard = waiter.await.unwrap().unwrap().expect("granted");
    // Re-entered and released at once: well before the extension, a third of the 5 s liveness
    // window after the grant.
    let again = guard.reenter(Some(Duration::from_secs(2))).await.unwrap();
    again.unlock().await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "trusted for the 60 s lease",
        || guard.valid_until() > std::time::Instant::now() + Duration::from_secs(50),
    );
    assert!(!guard.is_lost());
    assert!(
        raw.pttl::<_, i64>(name).unwrap() > 50_000,
        "Redis has the lease"
    );
    guard.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>(name).unwrap());
}

/// Writes stall (`CLIENT PAUSE WRITE`, 2.5 s) right after a direct hand-off, across the moment
/// the new holder extends the grant's short TTL (a third of the 5 s liveness window in) with a
/// 500 ms command timeout. The extension is retried as the watchdog retries a renewal, so the
/// hold is as safe as one acquired the ordinary way: still trusted, and held, after the grant's
/// TTL. Before, the one extension timed out, was never retried, and the guard reported the lock
/// lost at ~5 s while Redis still held it (or, in another run, the key was gone at 7 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_grant_rides_out_a_write_stall_over_its_extension() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::builder()
        .standalone(server.url())
        .command_timeout(Duration::from_millis(500))
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let name = "direct-stall";
    // A round whose waiter's own re-check attempt crossed the grant takes the hold up from Redis
    // with its whole lease (no extension to test): such rounds are run again.
    for round in 0..10 {
        let held = a.fair_lock(name).lock().await.unwrap();
        let lb = b.fair_lock(name);
        let waiter = tokio::spawn(async move { lb.lock().await });
        let head = wait_queued(&mut raw, name, 1);
        let channel = format!("redisson_lock__channel:{{{name}}}:{head}");
        wait_until(Duration::from_secs(10), "subscribed", || {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query(&mut raw)
                .unwrap();
            n == 1
        });
        held.unlock().await.unwrap();
        let granted = tokio::time::Instant::now();
        let pttl: i64 = raw.pttl(name).unwrap();
        let guard = waiter.await.unwrap().unwrap();
        if pttl > 5_000 {
            eprintln!("round {round}: the re-check crossed the grant; again");
            guard.unlock().await.unwrap();
            continue;
        }
        // The stall, from 100 ms after the grant to 2.6 s: over the extension at ~1.67 s.
        tokio::time::sleep_until(granted + Duration::from_millis(100)).await;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(2500)
            .arg("WRITE")
            .query(&mut raw)
            .unwrap();
        // Past the grant's TTL (5 s): an ordinary hold would still be held and trusted.
        tokio::time::sleep_until(granted + Duration::from_secs(6)).await;
        assert!(
            !guard.is_lost(),
            "reported lost after the stall (round {round})"
        );
        let owners: Vec<(String, i64)> = raw.hgetall(name).unwrap();
        assert_eq!(owners, vec![(head, 1)], "held in Redis");
        assert!(raw.pttl::<_, i64>(name).unwrap() > 20_000, "the lease");
        assert!(guard.valid_until() > std::time::Instant::now() + Duration::from_secs(20));
        guard.unlock().await.unwrap();
        return;
    }
    panic!("no round took the grant up from its message");
}

/// The grant reaches Redis while the waiter is giving up (its message is still on the way): the
/// give-up finds the field granted and not queued, gives the hold back and passes the lock on to
/// the next waiter at once, instead of leaving it held until the grant's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_crossing_a_give_up_is_given_back_and_passed_on() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let c = Client::connect(&server.url()).await.unwrap();
    let name = "crossing";
    let held = a.fair_lock(name).lock().await.unwrap();
    let lb = b.fair_lock(name);
    let quitter = tokio::spawn(async move { lb.lock().await });
    let head = wait_queued(&mut raw, name, 1);
    let lc = c.fair_lock(name);
    let next = tokio::spawn(async move { lc.try_lock(Duration::from_secs(20), None).await });
    wait_queued(&mut raw, name, 2);
    // What a release's script does for the head, without the message (still in flight), and
    // with a TTL far longer than the test: only a give-back can free the lock in time.
    // `a` never hears of it (its guard is left alone; its renewal will find the lock gone).
    std::mem::forget(held);
    let _: () = redis::pipe()
        .atomic()
        .del(name)
        .lpop(queue(name), None)
        .zrem(format!("redisson_lock_timeout:{{{name}}}"), &head)
        .zrem(liveness(name), &head)
        .hdel(grants(name), &head)
        .hset(name, &head, 1)
        .pexpire(name, 600_000)
        .ignore()
        .query(&mut raw)
        .unwrap();
    // The waiter stops waiting: its give-up returns the grant and hands the lock to `c`.
    quitter.abort();
    let guard = next
        .await
        .unwrap()
        .unwrap()
        .expect("handed on by the give-up, long before the grant's TTL");
    let owners: Vec<(String, i64)> = raw.hgetall(name).unwrap();
    assert_eq!(owners, vec![(guard.owner_field().to_owned(), 1)]);
    guard.unlock().await.unwrap();
    let left: Vec<String> = raw.keys("*crossing*").unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// The grant's message is lost (every pub/sub connection killed just before the release): the
/// waiter's next attempt, after the resubscription's wake-up, finds the hold granted to it and
/// takes it up as its own, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_message_is_lost_is_taken_up_once() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::builder()
        .standalone(server.url())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let name = "lost-grant";
    let held = a.fair_lock(name).lock().await.unwrap();
    let lb = b.fair_lock(name);
    let waiter = tokio::spawn(async move { lb.try_lock(Duration::from_secs(30), None).await });
    let head = wait_queued(&mut raw, name, 1);
    let channel = format!("redisson_lock__channel:{{{name}}}:{head}");
    wait_until(Duration::from_secs(10), "subscribed", || {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut raw)
            .unwrap();
        n == 1
    });
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut raw)
        .unwrap();
    assert!(killed >= 1);
    held.unlock().await.unwrap();
    let guard = waiter.await.unwrap().unwrap().expect("taken up");
    assert_eq!(guard.owner_field(), head);
    assert_eq!(raw.hget::<_, _, i64>(name, &head).unwrap(), 1, "one hold");
    assert_eq!(guard.hold_count(), 1);
    guard.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>(name).unwrap());
}

/// Calls without a holder reuse the fields (and so the subscribed channels) of ended calls that
/// left nothing behind: a loop that waits for the lock every round subscribes once, not once per
/// round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_reuse_a_subscribed_channel() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let name = "reuse";
    let subscribes = |raw: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(raw).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_subscribe:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    let rounds = 20;
    let before = subscribes(&mut raw);
    for _ in 0..rounds {
        let held = a.fair_lock(name).lock().await.unwrap();
        let lb = b.fair_lock(name);
        let waiter = tokio::spawn(async move { lb.lock().await });
        wait_queued(&mut raw, name, 1);
        held.unlock().await.unwrap();
        let guard = waiter.await.unwrap().unwrap();
        guard.unlock().await.unwrap();
    }
    let paid = subscribes(&mut raw) - before;
    assert!(
        paid <= rounds / 4,
        "{paid} subscriptions for {rounds} waiting calls"
    );
}
