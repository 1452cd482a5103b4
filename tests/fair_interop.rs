//! Interoperability with a Redisson-style peer written here with raw Redis commands: it holds the
//! hash under its own field, queues with its own deadline, listens on its per-waiter channel and
//! publishes `0` on ours, exactly as PROTOCOL 1-4 describe.

use fairlock_testkit as support;

use std::time::Duration;

use fairlock::Client;
use redis::Commands;
use support::{server_now_ms, wait_until, RedisServer};

const JAVA: &str = "6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:57";

async fn patient_client(server: &RedisServer) -> Client {
    // A 60 s liveness window puts the first heartbeat 20 s away: within these tests only pub/sub
    // messages can wake a waiter early.
    Client::builder()
        .standalone(server.url())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_holder_releasing_wakes_our_waiter_by_message() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = patient_client(&server).await;
    let lock = c.fair_lock("shared");

    // The Java side holds the lock with a 30 s watchdog lease.
    let _: () = raw.hset("shared", JAVA, 1).unwrap();
    let _: () = raw.pexpire("shared", 30_000).unwrap();
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    let state = lock.state().await.unwrap();
    assert_eq!(state.owners[0].field, JAVA);
    assert_eq!(state.owners[0].holder_id(), Some(57));

    let l = lock.clone();
    let waiter = tokio::spawn(async move { l.try_lock(Duration::from_secs(15), None).await });
    wait_until(Duration::from_secs(10), "our waiter queued", || {
        raw.llen::<_, i64>("redisson_lock_queue:{shared}").unwrap() == 1
    });
    let head: String = raw.lindex("redisson_lock_queue:{shared}", 0).unwrap();
    let channel = support::waiter_channel("shared", &head);
    support::wait_subscribed(&mut raw, &channel);

    // Redisson's fair unlock: delete the hash, publish "0" to the head's channel.
    let started = std::time::Instant::now();
    let _: () = raw.del("shared").unwrap();
    let receivers: i64 = raw.publish(&channel, "0").unwrap();
    assert_eq!(receivers, 1);
    let guard = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("woken by the Java release");
    assert!(started.elapsed() < Duration::from_secs(15));
    let hash: Vec<(String, i64)> = raw.hgetall("shared").unwrap();
    assert_eq!(hash, vec![(head.clone(), 1)]);
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_waiter_keeps_its_place_and_hears_our_release() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = patient_client(&server).await;
    let d = patient_client(&server).await;
    let lock = c.fair_lock("mixed");
    let guard = lock.lock().await.unwrap();

    // The Java waiter listens on its per-waiter channel, then queues as RFairLock does:
    // deadline = (PTTL of the lock) + wait (300 s) + its own clock.
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut pubsub = sub.as_pubsub();
    let java_channel = format!("redisson_lock__channel:{{mixed}}:{JAVA}");
    pubsub.subscribe(&java_channel).unwrap();
    let now = server_now_ms(&mut raw);
    let pttl: i64 = raw.pttl("mixed").unwrap();
    let _: () = raw
        .zadd("redisson_lock_timeout:{mixed}", JAVA, now + pttl + 300_000)
        .unwrap();
    let _: () = raw.rpush("redisson_lock_queue:{mixed}", JAVA).unwrap();

    // One of ours queues behind the Java waiter.
    let behind = d.fair_lock("mixed");
    let behind_task =
        tokio::spawn(async move { behind.try_lock(Duration::from_secs(20), None).await });
    wait_until(Duration::from_secs(10), "our second waiter queued", || {
        raw.llen::<_, i64>("redisson_lock_queue:{mixed}").unwrap() == 2
    });

    // Our release tells the Java head, with the payload Java parses as a number.
    guard.unlock().await.unwrap();
    let msg = pubsub.get_message().unwrap();
    assert_eq!(msg.get_channel_name(), java_channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");

    // The Java head takes the lock as RFairLock does (it is the head of a free lock).
    let head: String = raw.lindex("redisson_lock_queue:{mixed}", 0).unwrap();
    assert_eq!(head, JAVA, "our waiter did not overtake the Java head");
    assert!(!raw.exists::<_, bool>("mixed").unwrap());
    // Atomically, as Redisson's script does: our waiter, head once the Java one leaves the queue,
    // may re-check at any moment (its post-subscribe re-check can land here).
    let _: () = redis::pipe()
        .atomic()
        .lpop("redisson_lock_queue:{mixed}", None)
        .ignore()
        .zrem("redisson_lock_timeout:{mixed}", JAVA)
        .ignore()
        .hset("mixed", JAVA, 1)
        .ignore()
        .pexpire("mixed", 30_000)
        .ignore()
        .query(&mut raw)
        .unwrap();

    // Our waiter is the head now, and cannot take the lock while the Java holder has it.
    let next: String = raw.lindex("redisson_lock_queue:{mixed}", 0).unwrap();
    assert!(next.starts_with(&d.id().hyphenated().to_string()));
    // ... which releases it the Redisson way: our waiter is woken by the message.
    let _: () = raw.del("mixed").unwrap();
    let _: () = raw
        .publish(format!("redisson_lock__channel:{{mixed}}:{next}"), "0")
        .unwrap();
    let g = behind_task
        .await
        .unwrap()
        .unwrap()
        .expect("our waiter gets it after the Java holder");
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_java_head_is_purged_by_our_scripts() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = patient_client(&server).await;
    // A Java waiter whose deadline has passed sits at the head (its JVM died).
    let now = server_now_ms(&mut raw);
    let _: () = raw
        .zadd("redisson_lock_timeout:{stale}", JAVA, now - 1)
        .unwrap();
    let _: () = raw.rpush("redisson_lock_queue:{stale}", JAVA).unwrap();
    let g = c
        .fair_lock("stale")
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap();
    assert!(
        g.is_some(),
        "the stale head is purged and the free lock taken at once"
    );
    assert_eq!(
        raw.llen::<_, i64>("redisson_lock_queue:{stale}").unwrap(),
        0
    );
    assert_eq!(
        raw.zcard::<_, i64>("redisson_lock_timeout:{stale}")
            .unwrap(),
        0
    );
}

/// A mark in fairlock's liveness set whose waiter is no longer queued (Redisson's purge removes
/// waiters from the queue and the deadline set, never from the liveness set) must not lower the
/// protection of a waiter that joins behind a Java waiter: that Java waiter's acquisition shifts
/// our score by a whole Redisson wait, and Redisson's next purge must still find it alive. (The
/// torture test found this: the stale mark made the count of Redisson waiters ahead zero.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_liveness_mark_never_leaves_our_waiter_exposed_to_a_java_shift() {
    const HOLDER: &str = "6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:56";
    let (queue, deadlines) = (
        "redisson_lock_queue:{shifted}",
        "redisson_lock_timeout:{shifted}",
    );
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = patient_client(&server).await;

    // A Java holder, a mark left by a fairlock waiter that Redisson's purge removed, and a Java
    // waiter queued as RFairLock's lock() does (deadline = PTTL + 300 s + its clock).
    let _: () = raw.hset("shifted", HOLDER, 1).unwrap();
    let _: () = raw.pexpire("shifted", 30_000).unwrap();
    let now = server_now_ms(&mut raw);
    let _: () = raw
        .zadd(
            "fairlock_liveness:{shifted}",
            "0f0f0f0f-0000-4000-8000-000000000000:9",
            now + 60_000,
        )
        .unwrap();
    let _: () = raw.pexpire("fairlock_liveness:{shifted}", 60_000).unwrap();
    let _: () = raw.zadd(deadlines, JAVA, now + 30_000 + 300_000).unwrap();
    let _: () = raw.rpush(queue, JAVA).unwrap();

    let lock = c.fair_lock("shifted");
    let waiter = tokio::spawn(async move { lock.try_lock(Duration::from_secs(30), None).await });
    wait_until(Duration::from_secs(10), "our waiter queued", || {
        raw.llen::<_, i64>(queue).unwrap() == 2
    });
    let ours: String = raw.lindex(queue, 1).unwrap();
    assert!(ours.starts_with(&c.id().hyphenated().to_string()));

    // The Java holder lets go and the Java waiter takes the lock as RFairLock does: it leaves
    // the queue and subtracts its wait (300 s) from every deadline left, ours included.
    let _: () = redis::pipe()
        .atomic()
        .del("shifted")
        .ignore()
        .lpop(queue, None)
        .ignore()
        .zrem(deadlines, JAVA)
        .ignore()
        .zincr(deadlines, &ours, -300_000)
        .ignore()
        .hset("shifted", JAVA, 1)
        .ignore()
        .pexpire("shifted", 30_000)
        .ignore()
        .query(&mut raw)
        .unwrap();

    // Redisson's next script purges the head if its deadline has passed by the Java clock: ours
    // must still be ahead of it.
    let score: f64 = raw.zscore(deadlines, &ours).unwrap();
    let now = server_now_ms(&mut raw);
    assert!(
        score as i64 > now,
        "our live waiter looks expired to Redisson after one shift ({} ms)",
        score as i64 - now
    );

    // Redisson's unlock: our waiter, the head, is told and takes the lock.
    let _: () = raw.del("shifted").unwrap();
    let _: () = raw
        .publish(format!("redisson_lock__channel:{{shifted}}:{ours}"), "0")
        .unwrap();
    let g = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("our waiter is served after the Java one");
    g.unlock().await.unwrap();
}

/// A fairlock waiter whose client died behind a Java waiter keeps a score minutes away (Redisson's
/// chain), so it must stay judged by its liveness mark: the liveness set has to outlive the
/// window of the last mark, or the dead waiter would look like a Redisson waiter with minutes
/// left and block the queue. Here its client is cut off (every request blackholed), the mark
/// lapses by more than a window, the Java waiter gives up and the Java holder lets go: another
/// fairlock client takes the lock at once, purging the dead waiter, and nothing is left after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_with_a_long_score_is_judged_by_its_lapsed_mark() {
    const HOLDER: &str = "6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:56";
    let (queue, deadlines, liveness) = (
        "redisson_lock_queue:{lapsed}",
        "redisson_lock_timeout:{lapsed}",
        "fairlock_liveness:{lapsed}",
    );
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let mut raw = server.conn();
    let _: () = raw.hset("lapsed", HOLDER, 1).unwrap();
    let _: () = raw.pexpire("lapsed", 60_000).unwrap();
    let now = server_now_ms(&mut raw);
    let _: () = raw.zadd(deadlines, JAVA, now + 60_000 + 300_000).unwrap();
    let _: () = raw.rpush(queue, JAVA).unwrap();

    let window = Duration::from_millis(600);
    let doomed = Client::builder()
        .standalone(proxy.url())
        .waiter_liveness(window)
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let lock = doomed.fair_lock("lapsed");
    let waiter = tokio::spawn(async move { lock.lock().await });
    wait_until(Duration::from_secs(10), "the doomed waiter queued", || {
        raw.llen::<_, i64>(queue).unwrap() == 2
    });
    let dead: String = raw.lindex(queue, 1).unwrap();
    let score: f64 = raw.zscore(deadlines, &dead).unwrap();
    assert!(
        score as i64 - server_now_ms(&mut raw) > 300_000,
        "a waiter behind a Java waiter carries Redisson's margin"
    );

    // Its client is cut off: no heartbeat, no give-up reaches Redis from now on.
    proxy.set_blackhole_requests(true);
    let mark =
        |raw: &mut redis::Connection| -> Option<f64> { raw.zscore(liveness, &dead).unwrap() };
    let last = mark(&mut raw).expect("the waiter's mark") as i64;
    // The scenario is a mark lapsed by more than a whole window (when a liveness set that
    // lived only a window would have expired with it).
    wait_until(
        Duration::from_secs(10),
        "the mark lapsed by a window",
        || server_now_ms(&mut raw) > last + 2 * window.as_millis() as i64,
    );
    assert_eq!(mark(&mut raw).map(|m| m as i64), Some(last));

    // The Java waiter gives up as Redisson does (shifting those behind it by its wait), and the
    // Java holder lets go.
    let _: () = redis::pipe()
        .atomic()
        .zrem(deadlines, JAVA)
        .ignore()
        .lrem(queue, 0, JAVA)
        .ignore()
        .zincr(deadlines, &dead, -300_000)
        .ignore()
        .del("lapsed")
        .ignore()
        .query(&mut raw)
        .unwrap();

    let alive = patient_client(&server).await;
    let g = alive
        .fair_lock("lapsed")
        .try_lock(Duration::from_secs(2), None)
        .await
        .unwrap()
        .expect("the dead waiter is purged by its lapsed mark, not kept by its score");
    g.unlock().await.unwrap();
    for key in [queue, deadlines, liveness, "lapsed"] {
        assert!(!raw.exists::<_, bool>(key).unwrap(), "{key} left behind");
    }
    waiter.abort();
    drop(doomed);
}

/// Fairlock's hand-overs and give-ups do not shift the scores behind them, so chaining each
/// joining waiter on the tail's score would let the tail's score grow by a Redisson wait with
/// every join while a Java waiter stays queued. Joining scores are capped at what a queue of that
/// length could give a Redisson waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_scores_stay_within_a_redisson_chain_of_the_queue_length() {
    let (queue, deadlines) = (
        "redisson_lock_queue:{churn}",
        "redisson_lock_timeout:{churn}",
    );
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = patient_client(&server).await;
    let holder = c.fair_lock("churn").lock().await.unwrap();
    let now = server_now_ms(&mut raw);
    let pttl: i64 = raw.pttl("churn").unwrap();
    let _: () = raw.zadd(deadlines, JAVA, now + pttl + 300_000).unwrap();
    let _: () = raw.rpush(queue, JAVA).unwrap();

    // Two of ours queued behind the Java waiter at any time; the older one leaves, a new one
    // joins, twelve times over.
    let join = |id: i64| {
        let lock = c
            .fair_lock("churn")
            .with_holder(fairlock::Holder::from_raw(id).unwrap());
        tokio::spawn(async move { lock.lock().await })
    };
    let field = |id: i64| format!("{}:{id}", c.id().hyphenated());
    let mut queued = std::collections::VecDeque::new();
    for id in 1..=14 {
        queued.push_back((id, join(id)));
        wait_until(Duration::from_secs(10), "the new waiter queued", || {
            raw.lpos::<_, _, Option<i64>>(queue, field(id), redis::LposOptions::default())
                .unwrap()
                .is_some()
        });
        if queued.len() > 2 {
            let (old, task) = queued.pop_front().unwrap();
            task.abort();
            wait_until(Duration::from_secs(10), "the old waiter left", || {
                raw.lpos::<_, _, Option<i64>>(queue, field(old), redis::LposOptions::default())
                    .unwrap()
                    .is_none()
            });
        }
    }
    let len: i64 = raw.llen(queue).unwrap();
    assert_eq!(len, 3);
    let tail: String = raw.lindex(queue, -1).unwrap();
    let score: f64 = raw.zscore(deadlines, &tail).unwrap();
    let now = server_now_ms(&mut raw);
    let pttl: i64 = raw.pttl("churn").unwrap();
    // The cap the script applies, plus 1 s of slack: the script adds the TIME it reads to a PTTL
    // measured against the clock Redis cached when the script started, and both are whole
    // milliseconds, so the score may sit a millisecond or two past the exact cap. Growth by one
    // Redisson wait per join (the bug this catches) is 300 s.
    let bound = pttl + (len + 1) * 300_000 + 60_000 + 1_000;
    assert!(
        (score as i64 - now) <= bound,
        "the tail's score grew past a Redisson chain: {} ms > {bound} ms",
        score as i64 - now
    );
    for (_, task) in queued {
        task.abort();
    }
    holder.unlock().await.unwrap();
}

/// Review defect 7, the queue side: with the longest Redisson wait a client accepts and 100,000
/// Redisson waiters ahead, a joining fairlock waiter's deadline (one wait per waiter ahead) is
/// 10^17 ms. Redis hands such a number from Lua to `PEXPIRE` in exponent form (from 10^14 on
/// Redis 6.2), which it rejects after the waiter had been pushed: the call failed and the queue
/// kept an entry without a deadline (which breaks Redisson's own purge). The scripts cap what
/// they compute: the call just waits, and the queue and the deadline set hold the same waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_redisson_wait_behind_many_java_waiters_writes_whole_scripts() {
    const JAVA_WAITERS: usize = 100_000;
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = Client::builder()
        .standalone(server.url())
        .redisson_wait(fairlock::MAX_DURATION)
        .build()
        .await
        .unwrap();
    let far = server_now_ms(&mut raw) + 3_600_000;
    let _: () = raw.hset("huge", JAVA, 1).unwrap();
    let _: () = raw.pexpire("huge", 60_000).unwrap();
    for chunk in (0..JAVA_WAITERS).collect::<Vec<_>>().chunks(5_000) {
        let waiters: Vec<String> = chunk
            .iter()
            .map(|i| format!("6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11:{}", 1000 + i))
            .collect();
        let scored: Vec<(i64, &String)> = waiters.iter().map(|w| (far, w)).collect();
        let _: () = redis::pipe()
            .rpush(support::queue_key("huge"), &waiters)
            .zadd_multiple(support::timeout_key("huge"), &scored)
            .query(&mut raw)
            .unwrap();
    }
    let got = c
        .fair_lock("huge")
        .try_lock(Duration::from_millis(200), None)
        .await
        .expect("no script fails half way");
    assert!(got.is_none());
    // Our give-up runs in the background; then the Java waiters are left, each with a score.
    wait_until(Duration::from_secs(5), "our waiter left", || {
        support::queue_len(&mut raw, "huge") == JAVA_WAITERS as i64
    });
    assert_eq!(
        raw.zcard::<_, usize>(support::timeout_key("huge")).unwrap(),
        JAVA_WAITERS
    );
    let ours: Vec<String> = raw.lrange(support::queue_key("huge"), -1, -1).unwrap();
    assert!(ours[0].starts_with("6c1b4f5e"), "{ours:?}");
}
