//! The non-fair lock (RLock layout), fencing tokens on both lock kinds, and the unlock latch.

use fairlock_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fairlock::Client;
use redis::Commands;
use support::{wait_until, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_uses_the_rlock_layout_and_reenters() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let lock = c.non_fair_lock("plain-lock").with_holder(c.holder());
    let g1 = lock.lock().await.unwrap();
    let g2 = lock.lock_with_lease(Duration::from_secs(9)).await.unwrap();
    let hash: Vec<(String, i64)> = raw.hgetall("plain-lock").unwrap();
    assert_eq!(hash, vec![(g1.owner_field().to_owned(), 2)]);
    // The shorter lease of the re-entry never shortens what the watchdog hold needs.
    let pttl: i64 = raw.pttl("plain-lock").unwrap();
    assert!((9_000..=30_000).contains(&pttl), "{pttl}");
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    let keys: Vec<String> = raw.keys("*").unwrap();
    assert_eq!(
        keys,
        vec!["plain-lock".to_string()],
        "no queue keys for a non-fair lock"
    );
    g2.unlock().await.unwrap();
    g1.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlocking_an_expired_rlock_is_not_held() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let g = c
        .non_fair_lock("expires")
        .lock_with_lease(Duration::from_millis(50))
        .await
        .unwrap();
    wait_until(Duration::from_secs(5), "expiry", || {
        !raw.exists::<_, bool>("expires").unwrap()
    });
    assert!(g.unlock().await.unwrap_err().is_not_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_client_share_one_subscription_and_each_release_wakes_one() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let holder = Client::connect(&server.url()).await.unwrap();
    let waiters_client = Client::connect(&server.url()).await.unwrap();
    let held = holder.non_fair_lock("shared-channel").lock().await.unwrap();
    // Counted from before the waiters start: their attempts before the release (a first one and
    // a re-check once subscribed, each) may still be running when the release is sent.
    let before: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    let acquired = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let lock = waiters_client.non_fair_lock("shared-channel");
        let acquired = acquired.clone();
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            acquired.fetch_add(1, Ordering::SeqCst);
            g.unlock().await.unwrap();
        }));
    }
    let channel = "redisson_lock__channel:{shared-channel}";
    wait_until(
        Duration::from_secs(10),
        "one subscription for all local waiters",
        || {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query(&mut raw)
                .unwrap();
            n == 1
        },
    );
    held.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(acquired.load(Ordering::SeqCst), 8);
    let after: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    // Each hand-over wakes one waiter: per waiter a first attempt and a re-check before the
    // release, one acquire and one release after it, the holder's release, and a few extra
    // attempts overall; not every waiter per release (another 8 + 7 + ... + 1 = 36).
    let attempts =
        support::command_calls(&after, "evalsha") - support::command_calls(&before, "evalsha");
    assert!(
        attempts <= 8 * 2 + 1 + 8 * 2 + 16,
        "acquire+release script calls for 8 hand-overs: {attempts}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_style_holder_on_the_plain_channel_interoperates() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    // Hearing only the release message within the wait proves the pub/sub path (the lock's TTL
    // is 60 s).
    let c = Client::connect(&server.url()).await.unwrap();
    let java = "0f6a1a9e-5f7e-4ec9-8b7e-2f1b6f7e9c11:1";
    let _: () = raw.hset("rlock", java, 1).unwrap();
    let _: () = raw.pexpire("rlock", 60_000).unwrap();
    let lock = c.non_fair_lock("rlock");
    assert!(lock
        .try_lock(Duration::from_millis(50), None)
        .await
        .unwrap()
        .is_none());
    let l = lock.clone();
    let waiter = tokio::spawn(async move { l.try_lock(Duration::from_secs(10), None).await });
    wait_until(Duration::from_secs(10), "subscribed", || {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redisson_lock__channel:{rlock}")
            .query(&mut raw)
            .unwrap();
        n == 1
    });
    let _: () = raw.del("rlock").unwrap();
    let _: () = raw.publish("redisson_lock__channel:{rlock}", "0").unwrap();
    let g = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("woken by the Java release message");

    // And our release is heard by a Java listener, payload "0".
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("redisson_lock__channel:{rlock}").unwrap();
    g.unlock().await.unwrap();
    let msg = pubsub.get_message().unwrap();
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_across_holders_clients_and_kinds() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let mut last = 0;
    for round in 0..6 {
        let client = if round % 2 == 0 { &a } else { &b };
        let g = client.fair_lock("fenced").fenced().lock().await.unwrap();
        let t = g.fencing_token().unwrap();
        assert!(t > last, "{t} after {last}");
        // A re-entry is an acquisition too.
        let again = g.reenter(None).await.unwrap();
        assert!(again.fencing_token().unwrap() > t);
        last = again.fencing_token().unwrap();
        drop(again);
        g.unlock().await.unwrap();
    }
    let stored: u64 = raw.get("redisson_lock_token:{fenced}").unwrap();
    assert_eq!(stored, last);
    // Unfenced handles neither report nor bump the counter.
    let plain = a.fair_lock("fenced").lock().await.unwrap();
    assert_eq!(plain.fencing_token(), None);
    plain.unlock().await.unwrap();
    assert_eq!(
        raw.get::<_, u64>("redisson_lock_token:{fenced}").unwrap(),
        last
    );

    let mut last = 0;
    for client in [&a, &b, &a] {
        let g = client
            .non_fair_lock("fenced-rlock")
            .fenced()
            .lock()
            .await
            .unwrap();
        let t = g.fencing_token().unwrap();
        assert!(t > last);
        last = t;
        g.unlock().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_unlock_never_decrements_twice() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::builder()
        .standalone(server.url())
        .command_timeout(Duration::from_millis(150))
        .build()
        .await
        .unwrap();
    // Load the unlock scripts first: a frozen server cannot answer the NOSCRIPT fallback in time.
    c.fair_lock("warm")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    c.non_fair_lock("warm")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    for (kind, name) in [("fair", "resent-fair"), ("plain", "resent-plain")] {
        let (g1, g2, g3) = if kind == "fair" {
            let l = c.fair_lock(name).with_holder(c.holder());
            (
                l.lock().await.unwrap(),
                l.lock().await.unwrap(),
                l.lock().await.unwrap(),
            )
        } else {
            let l = c.non_fair_lock(name).with_holder(c.holder());
            (
                l.lock().await.unwrap(),
                l.lock().await.unwrap(),
                l.lock().await.unwrap(),
            )
        };
        let field = g1.owner_field().to_owned();
        // Freeze Redis: the release times out and is sent again (the same compare-and-set on the
        // hold count) while the first copy still sits unanswered in the socket. When Redis thaws
        // it runs every copy.
        server.pause();
        let result = g1.unlock().await;
        server.resume();
        assert!(
            result
                .as_ref()
                .is_err_and(|e| e.is_timeout() || e.is_redis()),
            "{result:?}"
        );
        // A read on the same multiplexed connection runs after every queued copy.
        let holds = if kind == "fair" {
            c.fair_lock(name).hold_count().await
        } else {
            c.non_fair_lock(name).hold_count().await
        };
        assert_eq!(holds.unwrap(), 2, "{kind}");
        let count: i64 = raw.hget(name, &field).unwrap();
        assert_eq!(count, 2, "{kind}: exactly one hold released");
        let latches: Vec<String> = raw.keys("redisson_unlock_latch:*").unwrap();
        assert!(
            latches.is_empty(),
            "no latch key is ever written: {latches:?}"
        );
        g2.unlock().await.unwrap();
        g3.unlock().await.unwrap();
        assert!(!raw.exists::<_, bool>(name).unwrap());
    }
}
