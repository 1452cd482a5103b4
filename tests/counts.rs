//! The counts the semaphores and the latch answer with are the counts Redis holds, at every size
//! and sign the API accepts: negative counts (`add_permits` may take a semaphore below zero, as in
//! Redisson) and counts beyond 2^53, which a Lua number would round (and near 2^63 turn into
//! i64::MIN). What they publish on their channels is exact too (Java's waiters parse a `long`).
//! The same holds for fencing tokens on every path that grants: two counters beyond 2^53 can
//! round to the same number, and a token must never repeat.

use fairlock_testkit as support;

use std::time::Duration;

use fairlock::Client;
use redis::Commands;
use support::RedisServer;

/// 2^53: the first integer above which a Lua number (a double) cannot hold every integer.
const TWO_53: i64 = 1 << 53;

/// The count Redis holds in `key`.
fn held(raw: &mut redis::Connection, key: &str) -> i64 {
    raw.get(key).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_answers_a_negative_count() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let sem = c.semaphore("sem:negative");
    assert!(sem.try_set_permits(1).await.unwrap());
    let permits = sem.acquire(1).await.unwrap();
    assert_eq!(sem.add_permits(-5).await.unwrap(), -5);
    assert_eq!(sem.release(1).await.unwrap(), -4);
    assert_eq!(permits.release().await.unwrap(), -3);
    assert_eq!(sem.available().await.unwrap(), -3);
    assert_eq!(held(&mut raw, "sem:negative"), -3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_counts_beyond_two_to_the_53_are_exact() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();

    let sem = c.semaphore("sem:big");
    assert_eq!(sem.add_permits(TWO_53 + 1).await.unwrap(), TWO_53 + 1);
    assert_eq!(sem.release(1).await.unwrap(), TWO_53 + 2);
    let permits = sem.acquire(3).await.unwrap();
    assert_eq!(permits.release().await.unwrap(), TWO_53 + 2);
    assert_eq!(sem.available().await.unwrap(), TWO_53 + 2);
    assert_eq!(sem.drain().await.unwrap(), TWO_53 + 2);
    assert_eq!(held(&mut raw, "sem:big"), 0);

    let low = c.semaphore("sem:low");
    assert_eq!(low.add_permits(-TWO_53 - 1).await.unwrap(), -TWO_53 - 1);
    assert_eq!(low.release(1).await.unwrap(), -TWO_53);

    // At the top of the type: i64::MAX, not i64::MIN.
    let top = c.semaphore("sem:top");
    assert_eq!(top.add_permits(i64::MAX).await.unwrap(), i64::MAX);
    assert!(top.release(1).await.is_err(), "past i64::MAX is refused");
    assert_eq!(held(&mut raw, "sem:top"), i64::MAX);
    assert_eq!(top.drain().await.unwrap(), i64::MAX);

    let expirable = c.expirable_semaphore("sem:expirable");
    assert_eq!(
        expirable.add_permits(i64::MAX - 1).await.unwrap(),
        i64::MAX - 1
    );
    assert_eq!(expirable.available().await.unwrap(), i64::MAX - 1);
    let permits = expirable
        .acquire(2, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(expirable.available().await.unwrap(), i64::MAX - 3);
    permits.release().await.unwrap();
    assert_eq!(held(&mut raw, "sem:expirable"), i64::MAX - 1);
    assert_eq!(expirable.available().await.unwrap(), i64::MAX - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_counts_down_exactly_from_beyond_two_to_the_53() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::connect(&server.url()).await.unwrap();
    let latch = c.count_down_latch("latch:big");
    let from = u64::try_from(TWO_53).unwrap() + 3;
    assert!(latch.try_set_count(from).await.unwrap());
    assert_eq!(latch.count_down().await.unwrap(), from - 1);
    assert_eq!(latch.count_down().await.unwrap(), from - 2);
    assert_eq!(latch.count().await.unwrap(), from - 2);
    assert_eq!(held(&mut raw, "latch:big"), TWO_53 + 1);
}

/// What a release publishes is the exact new count: Redisson's waiters read it as a `long`, and
/// a Lua number beyond 2^53 would be printed rounded (or in exponent form).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_publishes_the_exact_count() {
    let server = RedisServer::start();
    let c = Client::connect(&server.url()).await.unwrap();
    let sem = c.semaphore("sem:told");
    assert_eq!(sem.add_permits(i64::MAX - 5).await.unwrap(), i64::MAX - 5);
    let mut listener = server.conn();
    let mut pubsub = listener.as_pubsub();
    pubsub
        .subscribe(fairlock::keys::semaphore_channel("sem:told"))
        .unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(sem.release(2).await.unwrap(), i64::MAX - 3);
    let told: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(told, (i64::MAX - 3).to_string());
    assert_eq!(sem.add_permits(1).await.unwrap(), i64::MAX - 2);
    let told: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(told, (i64::MAX - 2).to_string());
}

/// Fencing tokens beyond 2^53 (a counter Redisson's clients or an operator moved on) are exact
/// and strictly increasing on every path that grants: a fair lock taken at once, one handed to a
/// queued waiter by the release (the token travels in the grant message), a re-entry, a
/// non-fair lock and a write lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_beyond_two_to_the_53_are_exact_and_increase() {
    let taken_up = support::EventCount::watch("took up a direct grant", "fair");
    let server = RedisServer::start();
    let mut raw = server.conn();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    let start = u64::try_from(TWO_53).unwrap();
    for name in ["fair", "plain", "rw"] {
        let _: () = raw
            .set(format!("redisson_lock_token:{{{name}}}"), start)
            .unwrap();
    }

    let held = a.fair_lock("fair").fenced().lock().await.unwrap();
    assert_eq!(held.fencing_token(), Some(start + 1));
    let again = held.reenter(None).await.unwrap();
    assert_eq!(again.fencing_token(), Some(start + 2));
    drop(again);
    held.unlock().await.unwrap();

    // A queued waiter gets the token the release drew, from the grant's message. Its re-check
    // attempt (sent once it has subscribed) may cross the grant and take the hold up from Redis
    // instead, which draws a token of its own (the grant's is skipped): such rounds are run
    // again, and every token is still the counter's exact value, above the last one.
    let mut last = start + 2;
    let mut by_message = false;
    for round in 0..10 {
        let held = a.fair_lock("fair").fenced().lock().await.unwrap();
        let token = held.fencing_token().unwrap();
        assert!(token > last, "round {round}: {token} after {last}");
        let lock = b.fair_lock("fair").fenced();
        let waiter = tokio::spawn(async move { lock.lock().await });
        support::wait_until(Duration::from_secs(10), "the waiter queued", || {
            support::queue_len(&mut raw, "fair") == 1
        });
        let head: String = raw.lindex("redisson_lock_queue:{fair}", 0).unwrap();
        support::wait_subscribed(&mut raw, &format!("redisson_lock__channel:{{fair}}:{head}"));
        let before = taken_up.get();
        held.unlock().await.unwrap();
        let handed = waiter.await.unwrap().unwrap();
        let counter: u64 = raw.get("redisson_lock_token:{fair}").unwrap();
        assert_eq!(handed.fencing_token(), Some(counter), "round {round}");
        last = counter;
        handed.unlock().await.unwrap();
        if taken_up.get() > before {
            assert_eq!(counter, token + 1, "the grant's token, from its message");
            by_message = true;
            break;
        }
        assert_eq!(
            counter,
            token + 2,
            "round {round}: the re-check crossed the grant"
        );
    }
    assert!(by_message, "no round took a grant from its message");

    let plain = a.non_fair_lock("plain").fenced().lock().await.unwrap();
    assert_eq!(plain.fencing_token(), Some(start + 1));
    let again = plain.reenter(None).await.unwrap();
    assert_eq!(again.fencing_token(), Some(start + 2));
    drop(again);
    plain.unlock().await.unwrap();

    let write = a
        .read_write_lock("rw")
        .write_lock()
        .fenced()
        .lock()
        .await
        .unwrap();
    assert_eq!(write.fencing_token(), Some(start + 1));
    write.unlock().await.unwrap();
    let stored: u64 = raw.get("redisson_lock_token:{rw}").unwrap();
    assert_eq!(stored, start + 1);
}
