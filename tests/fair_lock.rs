//! Fair lock basics against a real Redis: acquire/release, reentrancy, leases, ownership errors,
//! and the exact Redis data (PROTOCOL 1-4) checked with raw commands.

use fairlock_testkit as support;

use std::time::Duration;

use fairlock::{Client, Error};
use redis::Commands;
use support::{wait_until, RedisServer};

async fn client(server: &RedisServer) -> Client {
    Client::connect(&server.url()).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_writes_redisson_layout_and_unlock_removes_it() {
    let server = RedisServer::start();
    let c = client(&server).await;
    let mut raw = server.conn();
    let lock = c.fair_lock("orders:42");

    let guard = lock.lock().await.unwrap();
    let field = guard.owner_field().to_owned();
    let (uuid, holder) = field.rsplit_once(':').unwrap();
    assert_eq!(uuid, c.id().hyphenated().to_string());
    assert!(
        holder.parse::<i64>().is_ok(),
        "holder id is a decimal integer: {field}"
    );

    let hash: Vec<(String, i64)> = raw.hgetall("orders:42").unwrap();
    assert_eq!(hash, vec![(field.clone(), 1)]);
    let pttl: i64 = raw.pttl("orders:42").unwrap();
    assert!(
        (29_000..=30_000).contains(&pttl),
        "watchdog lease is 30 s, got {pttl}"
    );
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    assert!(lock.is_locked().await.unwrap());
    let state = lock.state().await.unwrap();
    assert_eq!(state.owners.len(), 1);
    assert_eq!(state.owners[0].field, field);
    assert!(state.queue.is_empty());

    guard.unlock().await.unwrap();
    let exists: bool = raw.exists("orders:42").unwrap();
    assert!(!exists);
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(lock.hold_count().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_sets_pttl_and_queue_keys_follow_the_prefix_rule() {
    let server = RedisServer::start();
    let c = client(&server).await;
    let other = client(&server).await;
    let mut raw = server.conn();

    let guard = c
        .fair_lock("plain")
        .lock_with_lease(Duration::from_secs(7))
        .await
        .unwrap();
    let pttl: i64 = raw.pttl("plain").unwrap();
    assert!((6_000..=7_000).contains(&pttl), "lease 7 s, got {pttl}");

    // A waiter from another client joins the queue under the Redisson key names.
    let waiter_lock = other.fair_lock("plain");
    let waiter =
        tokio::spawn(async move { waiter_lock.try_lock(Duration::from_secs(20), None).await });
    wait_until(Duration::from_secs(10), "waiter queued", || {
        raw.llen::<_, i64>("redisson_lock_queue:{plain}").unwrap() == 1
    });
    let queued: Vec<String> = raw.lrange("redisson_lock_queue:{plain}", 0, -1).unwrap();
    assert!(queued[0].starts_with(&other.id().hyphenated().to_string()));
    let score: f64 = raw
        .zscore("redisson_lock_timeout:{plain}", &queued[0])
        .unwrap();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut raw).unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    assert!(
        score as i64 > now_ms,
        "waiter deadline is in the future (epoch ms)"
    );
    // Its per-waiter channel is subscribed on the client's subscriber connection.
    let channel = format!("redisson_lock__channel:{{plain}}:{}", queued[0]);
    // (The first attempt queues without a subscription; the waiter subscribes right after and
    // attempts again before it sleeps.)
    wait_until(
        Duration::from_secs(10),
        "waiter subscribed to its channel",
        || {
            let numsub: (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query(&mut raw)
                .unwrap();
            numsub.1 == 1
        },
    );

    guard.unlock().await.unwrap();
    let g2 = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("waiter acquires after release");
    assert_eq!(
        raw.llen::<_, i64>("redisson_lock_queue:{plain}").unwrap(),
        0
    );
    assert_eq!(
        raw.zcard::<_, i64>("redisson_lock_timeout:{plain}")
            .unwrap(),
        0
    );
    g2.unlock().await.unwrap();

    // A name with a hash tag is used as is.
    let g = c.fair_lock("{tag}x").lock().await.unwrap();
    let blocked = other
        .fair_lock("{tag}x")
        .try_lock(Duration::from_millis(1), None)
        .await
        .unwrap();
    assert!(blocked.is_none());
    // Every key of the lock follows the prefix rule: the name itself, or `prefix:{tag}x` with the
    // user's hash tag kept as is (the timed-out waiter may still be leaving the queue).
    let keys: Vec<String> = raw.keys("*{tag}x*").unwrap();
    assert!(
        keys.iter().all(|k| k == "{tag}x"
            || [
                "redisson_lock_queue",
                "redisson_lock_timeout",
                "fairlock_liveness",
                "fairlock_grants"
            ]
            .iter()
            .any(|p| *k == format!("{p}:{{tag}}x"))),
        "{keys:?}"
    );
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_counts_holds_and_releases_on_the_last() {
    let server = RedisServer::start();
    let c = client(&server).await;
    let mut raw = server.conn();
    let lock = c.fair_lock("re").with_holder(c.holder());

    let g1 = lock.lock().await.unwrap();
    let g2 = lock.lock().await.unwrap();
    let g3 = lock
        .try_lock(Duration::ZERO, Some(Duration::from_secs(5)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 3);
    let count: i64 = raw.hget("re", g1.owner_field()).unwrap();
    assert_eq!(count, 3);
    // A re-entry with a shorter lease never shortens the lock below what the watchdog holds
    // need (the key lives as long as its longest live hold).
    let pttl: i64 = raw.pttl("re").unwrap();
    assert!(pttl > 5_000, "{pttl}");

    g3.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    drop(g2); // released in the background
    wait_until(
        Duration::from_secs(5),
        "background release of one hold",
        || {
            raw.hget::<_, _, Option<i64>>("re", g1.owner_field())
                .unwrap()
                == Some(1)
        },
    );
    assert!(lock.is_locked().await.unwrap());
    g1.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());

    // A call without the holder, in another task, is another holder: it must wait, not
    // re-enter.
    let g = lock.lock().await.unwrap();
    let l2 = c.fair_lock("re");
    let other_task = tokio::spawn(async move {
        l2.try_lock(Duration::from_millis(50), None)
            .await
            .unwrap()
            .is_some()
    });
    assert!(
        !other_task.await.unwrap(),
        "a call without the holder is a different holder"
    );
    g.unlock().await.unwrap();
    // ... unless it uses an explicit shared holder id.
    let shared = lock
        .clone()
        .with_holder(fairlock::Holder::from_raw(77).unwrap());
    let a = shared.lock().await.unwrap();
    let shared2 = shared.clone();
    let b = tokio::spawn(async move { shared2.lock().await.unwrap() })
        .await
        .unwrap();
    assert_eq!(shared.hold_count().await.unwrap(), 2);
    assert!(a.owner_field().ends_with(":77"));
    a.unlock().await.unwrap();
    b.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_by_a_non_holder_is_not_held() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;

    let guard = a.fair_lock("owned").lock().await.unwrap();
    assert!(b.fair_lock("owned").force_unlock().await.unwrap());
    let taken = b.fair_lock("owned").lock().await.unwrap();
    let err = guard.unlock().await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    // The other holder is untouched. A handle without a holder counts its client's holds.
    assert_eq!(b.fair_lock("owned").hold_count().await.unwrap(), 1);
    assert_eq!(taken.hold_count(), 1);
    assert_eq!(a.fair_lock("owned").hold_count().await.unwrap(), 0);
    assert!(b.fair_lock("owned").is_locked().await.unwrap());
    let state = b.fair_lock("owned").state().await.unwrap();
    assert_eq!(state.owners[0].field, taken.owner_field());
    taken.unlock().await.unwrap();
    assert!(
        !b.fair_lock("owned").force_unlock().await.unwrap(),
        "nothing left to force"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_lets_the_head_in() {
    let server = RedisServer::start();
    // A long liveness window: the head is woken by its own TTL hint, not by a heartbeat.
    let a = client(&server).await;
    let b = Client::builder()
        .standalone(server.url())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    // (Taken before the call: the lease runs from the moment Redis ran it, which is later.)
    let started = std::time::Instant::now();
    let holder = a
        .fair_lock("expiring")
        .lock_with_lease(Duration::from_millis(300))
        .await
        .unwrap();
    let got = b
        .fair_lock("expiring")
        .try_lock(Duration::from_secs(10), None)
        .await
        .unwrap();
    assert!(
        got.is_some(),
        "the head takes the lock once the holder's lease runs out"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "not before the lease ran out"
    );
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_times_out_and_leaves_the_queue() {
    let server = RedisServer::start();
    let a = client(&server).await;
    let b = client(&server).await;
    let mut raw = server.conn();
    let guard = a.fair_lock("busy").lock().await.unwrap();
    let lock = b.fair_lock("busy").with_holder(b.holder());
    let got = lock
        .try_lock(Duration::from_millis(200), None)
        .await
        .unwrap();
    assert!(got.is_none());
    // The give-up runs in the background, before this holder's next call on the lock: a zero
    // wait (which never joins the queue) comes after it.
    assert!(lock.try_lock(Duration::ZERO, None).await.unwrap().is_none());
    assert_eq!(
        raw.llen::<_, i64>("redisson_lock_queue:{busy}").unwrap(),
        0,
        "gave up its place"
    );
    assert_eq!(
        raw.zcard::<_, i64>("redisson_lock_timeout:{busy}").unwrap(),
        0
    );
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let server = RedisServer::start();
    let c = client(&server).await;
    let empty = c.fair_lock("");
    assert!(matches!(empty.lock().await, Err(Error::InvalidName { .. })));
    assert!(matches!(
        empty.try_lock(Duration::ZERO, None).await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        empty.is_locked().await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        empty.force_unlock().await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        empty.state().await,
        Err(Error::InvalidName { .. })
    ));
    // Standalone: a '{' without a valid hash tag is fine (only cluster mode rejects it).
    let g = c.fair_lock("odd{name").lock().await.unwrap();
    g.unlock().await.unwrap();

    let lock = c.fair_lock("args");
    for lease in [
        Duration::ZERO,
        Duration::from_micros(10),
        Duration::MAX,
        Duration::from_millis(i64::MAX as u64 + 1),
    ] {
        let err = lock
            .try_lock(Duration::ZERO, Some(lease))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    argument: "lease",
                    ..
                }
            ),
            "{lease:?}: {err:?}"
        );
        assert!(lock
            .lock_with_lease(lease)
            .await
            .unwrap_err()
            .is_invalid_input());
    }
    let err = lock.try_lock(Duration::MAX, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                argument: "wait",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        !lock.is_locked().await.unwrap(),
        "nothing was taken by rejected calls"
    );

    for bad in [
        Client::builder().build().await.unwrap_err(),
        Client::builder()
            .standalone(server.url())
            .watchdog_timeout(Duration::ZERO)
            .build()
            .await
            .unwrap_err(),
        Client::builder()
            .standalone(server.url())
            .waiter_liveness(Duration::MAX)
            .build()
            .await
            .unwrap_err(),
    ] {
        assert!(bad.is_invalid_input(), "{bad:?}");
    }
    // A malformed URL is bad input, found before any I/O; so is one for a topology setter.
    let err = Client::connect("not a url").await.unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    let err = Client::builder()
        .cluster(["redis://127.0.0.1:1", "nonsense"])
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    let err = Client::builder()
        .sentinel("m", ["::"])
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    // A later valid setting replaces the bad one.
    let ok = Client::builder()
        .standalone("not a url")
        .standalone(server.url())
        .build()
        .await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn guards_and_futures_are_send_sync_static() {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    fn send<T: Send>(_: &T) {}
    send_sync_static::<fairlock::Client>();
    send_sync_static::<fairlock::FairLock>();
    send_sync_static::<fairlock::LockGuard>();
    send_sync_static::<fairlock::Error>();
    #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    fn futures(lock: fairlock::FairLock, guard: fairlock::LockGuard) {
        send(&lock.lock());
        send(&lock.try_lock(Duration::ZERO, None));
        send(&lock.state());
        send(&guard.lost());
        send(&guard.unlock());
    }
    let _ = futures;
}

/// Review defect 7, the lease side: a lease Redis cannot take (here ~3 million years, which Lua
/// would hand to `PEXPIRE` in exponent form after `HSET` ran) used to be refused by Redis half
/// way, leaving the key held with no TTL, for ever. Every duration is checked before any I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_redis_cannot_take_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let c = client(&server).await;
    let mut raw = server.conn();
    let too_long = Duration::from_millis(100_000_000_000_000_000);
    for fair in [true, false] {
        let name = if fair {
            "eternal-fair"
        } else {
            "eternal-plain"
        };
        let result = if fair {
            c.fair_lock(name)
                .try_lock(Duration::ZERO, Some(too_long))
                .await
        } else {
            c.non_fair_lock(name)
                .try_lock(Duration::ZERO, Some(too_long))
                .await
        };
        assert!(result.unwrap_err().is_invalid_input(), "{name}");
        assert!(!raw.exists::<_, bool>(name).unwrap(), "{name} was written");
        // The longest accepted lease works, and the key carries it as its TTL.
        let g = if fair {
            c.fair_lock(name)
                .lock_with_lease(fairlock::MAX_DURATION)
                .await
        } else {
            c.non_fair_lock(name)
                .lock_with_lease(fairlock::MAX_DURATION)
                .await
        }
        .unwrap();
        let pttl: i64 = raw.pttl(name).unwrap();
        assert!(pttl > 900_000_000_000, "{name}: {pttl}");
        g.unlock().await.unwrap();
    }
    for bad in [
        Client::builder()
            .standalone(server.url())
            .redisson_wait(fairlock::MAX_DURATION + Duration::from_millis(1))
            .build()
            .await,
        Client::builder()
            .standalone(server.url())
            .waiter_liveness(Duration::from_secs(u64::MAX / 2))
            .build()
            .await,
    ] {
        assert!(bad.unwrap_err().is_invalid_input());
    }
}
