//! Replies lost after the command ran, resends, and slow connections, through the test proxy
//! (`tests/support/proxy.rs`) and by sending a script twice as a resend does: an acquisition is
//! never counted twice, calls sharing a holder id never take each other's grants, and a
//! `try_lock` never overruns its wait because its subscription is slow.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::Client;
use redis::Commands;
use support::{derived_key, wait_until, wait_until_async, Proxy, RedisCluster, RedisServer};

/// A client whose connections go through `proxy`, with a short command timeout.
async fn proxied(proxy: &Proxy) -> Client {
    Client::builder()
        .standalone(proxy.url())
        .command_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap()
}

/// The subscription a waiter needs after its first attempt is made on a connection that is slow
/// to open (here: 1.5 s each way); `try_lock` still returns within its wait plus the one round
/// trip it may be in, not after the subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscription_never_stretches_a_try_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let holder = Client::connect(&server.url()).await.unwrap();
    let c = proxied(&proxy).await;
    for fair in [true, false] {
        let name = if fair {
            "slow-sub-fair"
        } else {
            "slow-sub-plain"
        };
        let held = if fair {
            holder.fair_lock(name).lock().await.unwrap()
        } else {
            holder.non_fair_lock(name).lock().await.unwrap()
        };
        // The command connection is open already; the pub/sub one is opened on first use.
        proxy.set_new_connection_latency(Duration::from_millis(1_500));
        let started = Instant::now();
        let got = if fair {
            c.fair_lock(name)
                .try_lock(Duration::from_millis(300), None)
                .await
        } else {
            c.non_fair_lock(name)
                .try_lock(Duration::from_millis(300), None)
                .await
        };
        let took = started.elapsed();
        assert!(got.unwrap().is_none(), "{name}: still held");
        assert!(
            took < Duration::from_secs(1),
            "{name}: took {took:?} for a 300 ms wait"
        );
        proxy.set_new_connection_latency(Duration::ZERO);
        held.unlock().await.unwrap();
    }
}

/// The acquire script runs, its reply is lost (the proxy drops it) and the client sends the same
/// compare-and-set again once the connection is back: the grant is taken up, not added to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_whose_reply_was_lost_is_taken_up_not_added_to() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy).await;
    for fair in [true, false] {
        let name = if fair { "lost-fair" } else { "lost-plain" };
        // Load the scripts first, so the blackholed attempt is the script itself.
        let warm = if fair {
            c.fair_lock(name).lock().await.unwrap()
        } else {
            c.non_fair_lock(name).lock().await.unwrap()
        };
        warm.unlock().await.unwrap();
        proxy.set_blackhole_replies(true);
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
        wait_until_async(Duration::from_secs(5), "the attempt ran in Redis", || {
            let ran = raw.exists::<_, bool>(name).unwrap();
            async move { ran }
        })
        .await;
        // The reply is gone; the connection is reset and the client tries again.
        proxy.set_blackhole_replies(false);
        let guard = support::joined(call, Duration::from_secs(10), "the lock call")
            .await
            .unwrap();
        let hash: Vec<(String, i64)> = raw.hgetall(name).unwrap();
        assert_eq!(hash, vec![(guard.owner_field().to_owned(), 1)], "{name}");
        guard.unlock().await.unwrap();
        assert!(
            !raw.exists::<_, bool>(name).unwrap(),
            "{name}: nothing left"
        );
    }
}

/// A release whose first send ran but whose reply was lost, after which somebody else took the
/// freed lock: the resend finds the lock owned by another holder. That release was ours, so
/// `unlock()` is `Ok` for every kind (it answered `NotHeld`: the torture test saw it after a
/// release timed out behind a long script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_release_that_finds_the_lock_taken_since_was_ours() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy).await;
    let other = Client::connect(&server.url()).await.unwrap();
    for kind in ["fair", "plain", "read", "write"] {
        let name = format!("resent:{kind}");
        let take = |client: &Client| {
            let (client, name) = (client.clone(), name.clone());
            async move {
                match kind {
                    "fair" => client.fair_lock(&name).lock().await,
                    "plain" => client.non_fair_lock(&name).lock().await,
                    "read" => client.read_write_lock(&name).read_lock().lock().await,
                    _ => client.read_write_lock(&name).write_lock().lock().await,
                }
                .unwrap()
            }
        };
        // Scripts loaded first, so the blackholed send is the release script itself.
        take(&c).await.unlock().await.unwrap();
        let guard = take(&c).await;
        proxy.set_blackhole_replies(true);
        let unlock = tokio::spawn(guard.unlock());
        wait_until(Duration::from_secs(5), "the release ran in Redis", || {
            !raw.exists::<_, bool>(&name).unwrap()
        });
        let theirs = take(&other).await;
        proxy.set_blackhole_replies(false);
        let released = support::joined(unlock, Duration::from_secs(10), "the unlock").await;
        assert!(released.is_ok(), "{kind}: {released:?}");
        theirs.unlock().await.unwrap();
    }
}

/// Two calls of one holder (`with_holder`), the first of which lost its reply: the second waits
/// for the first to be settled and re-enters; neither takes the other's grant, and releasing
/// both leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sharing_a_holder_id_never_take_each_others_grants() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy).await;
    let lock = c
        .fair_lock("shared-77")
        .with_holder(fairlock::Holder::from_raw(77).unwrap());
    lock.lock().await.unwrap().unlock().await.unwrap();
    proxy.set_blackhole_replies(true);
    let first = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until_async(Duration::from_secs(5), "the first attempt ran", || {
        let ran = raw.exists::<_, bool>("shared-77").unwrap();
        async move { ran }
    })
    .await;
    // The second call is polled once here, so it has taken its place in the field's line
    // (behind the first call's attempt, still waiting for its reply) before the reply flows.
    let mut second = {
        let lock = lock.clone();
        Box::pin(async move { lock.lock().await })
    };
    tokio::select! {
        biased;
        _ = &mut second => panic!("the second call cannot finish before the first's reply"),
        _ = std::future::ready(()) => {}
    }
    let second = tokio::spawn(second);
    proxy.set_blackhole_replies(false);
    let g1 = support::joined(first, Duration::from_secs(10), "the first call")
        .await
        .unwrap();
    let g2 = support::joined(second, Duration::from_secs(10), "the second call")
        .await
        .unwrap();
    assert_eq!(g1.owner_field(), g2.owner_field());
    assert_eq!(lock.hold_count().await.unwrap(), 2, "one hold per call");
    drop(g1);
    g2.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    let keys: Vec<String> = raw.keys("*shared-77*").unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

/// Sends the acquire script of `kind` twice with the same arguments, as a connection that
/// resends a command after a timeout does (redis-rs's cluster client may). Returns both replies
/// and the hold count after them.
fn send_twice(
    conn: &mut impl redis::ConnectionLike,
    fair: bool,
    name: &str,
) -> (Vec<i64>, Vec<i64>, i64) {
    let field = "resend-client:1";
    let (first, second): (Vec<i64>, Vec<i64>) = if fair {
        let script = redis::Script::new(concat!(
            include_str!("../lua/count_prologue.lua"),
            "\n",
            include_str!("../lua/fair_prologue.lua"),
            "\n",
            include_str!("../lua/fair_acquire.lua")
        ));
        let run = |conn: &mut dyn redis::ConnectionLike| -> Vec<i64> {
            script
                .key(name)
                .key(derived_key("redisson_lock_queue", name))
                .key(derived_key("redisson_lock_timeout", name))
                .key(derived_key("fairlock_liveness", name))
                .key(derived_key("redisson_lock_token", name))
                .arg(30_000)
                .arg(field)
                .arg(0)
                .arg("queue")
                .arg("1")
                .arg("PUBLISH")
                .arg(derived_key("redisson_lock__channel", name))
                .arg(5_000)
                .arg(300_000)
                .invoke(conn)
                .unwrap()
        };
        (run(conn), run(conn))
    } else {
        let script = redis::Script::new(concat!(
            include_str!("../lua/count_prologue.lua"),
            "\n",
            include_str!("../lua/lock_acquire.lua")
        ));
        let run = |conn: &mut dyn redis::ConnectionLike| -> Vec<i64> {
            script
                .key(name)
                .key(derived_key("redisson_lock_token", name))
                .arg(30_000)
                .arg(field)
                .arg(0)
                .arg("1")
                .invoke(conn)
                .unwrap()
        };
        (run(conn), run(conn))
    };
    let count: i64 = redis::cmd("HGET").arg(name).arg(field).query(conn).unwrap();
    (first, second, count)
}

/// The same acquire sent twice (a resend after a lost reply) holds once, on a single server and
/// on every shard of a cluster. The resend gets a new fencing token: a hold taken up may be one
/// whose guard was handed the first (see `a_hold_an_ended_call_left_is_never_taken_up_with_its_token`).
#[test]
fn the_same_acquire_sent_twice_holds_once() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    for fair in [true, false] {
        let name = if fair { "twice-fair" } else { "twice-plain" };
        let (first, second, count) = send_twice(&mut conn, fair, name);
        assert_eq!(first, vec![1, 1, 1], "{name}: granted, count 1, token 1");
        assert_eq!(
            second,
            vec![2, 1, 2],
            "{name}: taken up, not added to; a new token"
        );
        assert_eq!(count, 1, "{name}");
    }
    let cluster = RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_connection().unwrap();
    for fair in [true, false] {
        for shard in ["a", "b", "c", "d", "e", "f"] {
            let name = format!("{{{shard}}}:twice-{fair}");
            let (first, second, count) = send_twice(&mut conn, fair, &name);
            assert_eq!(first, vec![1, 1, 1], "{name}");
            assert_eq!(second, vec![2, 1, 2], "{name}");
            assert_eq!(count, 1, "{name}");
        }
    }
}

/// A waiter's give-up is lost (its client is cut off while it leaves the queue), so its entry
/// stays where it stood. The same holder's next call must join at the tail, behind a waiter that
/// arrived in between, instead of taking up the old entry's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_a_failed_give_up_joins_at_the_tail() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut raw = server.conn();
    let queue = "redisson_lock_queue:{after-give-up}";
    let holder_client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let cut_off = proxied(&proxy).await;
    let holder = holder_client
        .fair_lock("after-give-up")
        .lock()
        .await
        .unwrap();

    // Our waiter queues first...
    let lock = cut_off
        .fair_lock("after-give-up")
        .with_holder(fairlock::Holder::from_raw(5).unwrap());
    let first = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock(Duration::from_millis(1500), None).await })
    };
    wait_until(Duration::from_secs(10), "our waiter queued", || {
        raw.llen::<_, i64>(queue).unwrap() == 1
    });
    let ours: String = raw.lindex(queue, 0).unwrap();
    // ... and its give-up never arrives.
    proxy.set_blackhole_requests(true);
    let outcome = support::joined(first, Duration::from_secs(10), "the first call").await;
    // Timed out, or the Redis error of a re-check that could not get through.
    assert!(
        !matches!(outcome, Ok(Some(_))),
        "the first call was not granted"
    );
    // Another waiter arrives meanwhile.
    let theirs = {
        let lock = other.fair_lock("after-give-up");
        tokio::spawn(async move { lock.try_lock(Duration::from_secs(10), None).await })
    };
    wait_until(Duration::from_secs(10), "their waiter queued", || {
        raw.llen::<_, i64>(queue).unwrap() == 2
    });
    assert_eq!(raw.lindex::<_, String>(queue, 0).unwrap(), ours);
    proxy.set_blackhole_requests(false);
    proxy.reset_all();

    // Our next call is a newcomer: it joins behind them.
    behind_theirs(&mut raw, queue, &ours, lock, holder, theirs).await;
}

type Call = tokio::task::JoinHandle<fairlock::Result<Option<fairlock::LockGuard>>>;

/// Starts a call of `ours` (the owner field of `lock`) while `theirs` waits as the only other
/// waiter, and checks that it queues behind them and is served after them once `holder` unlocks.
async fn behind_theirs(
    raw: &mut redis::Connection,
    queue: &str,
    ours: &str,
    lock: fairlock::FairLock,
    holder: fairlock::LockGuard,
    theirs: Call,
) {
    let second = tokio::spawn(async move { lock.try_lock(Duration::from_secs(10), None).await });
    wait_until(
        Duration::from_secs(10),
        "our new call queued behind theirs",
        || {
            let q: Vec<String> = raw.lrange(queue, 0, -1).unwrap();
            q.len() == 2 && q[1] == ours
        },
    );
    holder.unlock().await.unwrap();
    let theirs = support::joined(theirs, Duration::from_secs(10), "their call")
        .await
        .unwrap()
        .expect("they queued before our call began");
    assert!(!second.is_finished(), "our new call waits behind theirs");
    theirs.unlock().await.unwrap();
    let ours = support::joined(second, Duration::from_secs(10), "our new call")
        .await
        .unwrap()
        .expect("served next");
    ours.unlock().await.unwrap();
}

/// An entry of our field that no call of ours owns (left by a call whose give-up failed, in
/// client state that is gone since) is not the place of a new call: the call takes it out and
/// joins at the tail, behind a waiter that queued after the entry was left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_call_never_takes_the_place_its_field_left_in_the_queue() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let name = "left-behind";
    let queue = "redisson_lock_queue:{left-behind}";
    let holder_client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let ours_client = Client::connect(&server.url()).await.unwrap();
    let holder = holder_client.fair_lock(name).lock().await.unwrap();

    // The entry an ended call of ours left: at the head, with a live mark and a far deadline.
    let ours = format!("{}:7", ours_client.id());
    let now: i64 = {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut raw).unwrap();
        secs * 1000 + micros / 1000
    };
    let _: () = raw.rpush(queue, &ours).unwrap();
    let _: () = raw
        .zadd("redisson_lock_timeout:{left-behind}", &ours, now + 60_000)
        .unwrap();
    let _: () = raw
        .zadd("fairlock_liveness:{left-behind}", &ours, now + 60_000)
        .unwrap();
    let theirs = {
        let lock = other.fair_lock(name);
        tokio::spawn(async move { lock.try_lock(Duration::from_secs(10), None).await })
    };
    wait_until(Duration::from_secs(10), "their waiter queued", || {
        raw.llen::<_, i64>(queue).unwrap() == 2
    });

    let lock = ours_client
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(7).unwrap());
    behind_theirs(&mut raw, queue, &ours, lock, holder, theirs).await;
    let left: i64 = raw.exists(queue).unwrap();
    assert_eq!(left, 0, "nothing queued at the end");
}

/// A grant whose reply arrives after the lease it was granted with has run out (counted from
/// when the attempt was sent) is never turned into a guard: another client may hold the lock by
/// then. The call gives it back and tries again; here every reply is that slow, so the call ends
/// without the lock when its wait runs out. With replies faster than the lease, it is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_lease_ran_out_is_given_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut raw = server.conn();
    let slow = Client::builder()
        .standalone(proxy.url())
        .command_timeout(Duration::from_secs(3))
        .watchdog_timeout(Duration::from_millis(240))
        .timer_tick(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    proxy.set_latency(Duration::ZERO, Duration::from_millis(400));
    for fair in [true, false] {
        for lease in [None, Some(Duration::from_millis(150))] {
            let name = format!("late-grant-{fair}-{}", lease.is_some());
            let got = if fair {
                slow.fair_lock(name.as_str())
                    .try_lock(Duration::from_millis(900), lease)
                    .await
            } else {
                slow.non_fair_lock(name.as_str())
                    .try_lock(Duration::from_millis(900), lease)
                    .await
            };
            let got = got.unwrap();
            assert!(
                got.is_none(),
                "{name}: a guard from a grant whose lease had run out: valid until {:?} from now",
                got.as_ref()
                    .map(|g| g.valid_until().saturating_duration_since(Instant::now()))
            );
            let exists: bool = raw.exists(&name).unwrap();
            assert!(!exists, "{name}: the late grant was given back");
        }
    }
    // The same client on a fast enough link is granted as usual.
    proxy.set_latency(Duration::ZERO, Duration::from_millis(20));
    let guard = slow
        .fair_lock("late-grant-fast")
        .try_lock(Duration::from_millis(900), None)
        .await
        .unwrap()
        .expect("granted");
    assert!(guard.valid_until() > Instant::now());
    guard.unlock().await.unwrap();
}

/// A release that never reached Redis (its requests were lost until it gave up) leaves the
/// holder's hold in Redis, and the guard is gone; the next call of the same holder finds that
/// hold. It is not a grant this call's lost reply hid, so it is not taken up with the token the
/// ended guard was handed: the call asks again and gets a grant, and a token, of its own (the
/// torture test drew it: a server restart under a watchdog guard's unlock, seed
/// 446615330099019738, token 15241 handed out twice). Its release then frees the lock, the left
/// hold included. For every fenced kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_an_ended_call_left_is_never_taken_up_with_its_token() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let proxy = Proxy::start(server.port());
    let c = proxied(&proxy).await;
    for kind in ["fair", "plain", "write"] {
        let name = format!("left-{kind}");
        let holder = c.holder();
        let lock = || {
            let c = c.clone();
            let name = name.clone();
            async move {
                match kind {
                    "fair" => c.fair_lock(&name).fenced().with_holder(holder).lock().await,
                    "plain" => {
                        c.non_fair_lock(&name)
                            .fenced()
                            .with_holder(holder)
                            .lock()
                            .await
                    }
                    _ => {
                        c.read_write_lock(&name)
                            .write_lock()
                            .fenced()
                            .with_holder(holder)
                            .lock()
                            .await
                    }
                }
            }
        };
        let first = lock().await.unwrap();
        let field = first.owner_field().to_owned();
        let first_token = first.fencing_token().expect("fenced");
        proxy.set_blackhole_requests(true);
        assert!(
            first.unlock().await.is_err(),
            "{kind}: the release never reached Redis"
        );
        proxy.set_blackhole_requests(false);
        let left: Vec<(String, String)> = raw.hgetall(&name).unwrap();
        assert!(
            left.iter().any(|(f, n)| *f == field && n == "1"),
            "{kind}: the hold is left in Redis: {left:?}"
        );
        let second = lock().await.unwrap();
        assert_eq!(second.owner_field(), field, "{kind}");
        let second_token = second.fencing_token().expect("fenced");
        assert!(
            second_token > first_token,
            "{kind}: the new guard's token {second_token} must be above the ended guard's {first_token}"
        );
        second.unlock().await.unwrap();
        assert!(
            !raw.exists::<_, bool>(&name).unwrap(),
            "{kind}: the release frees the lock, the left hold included"
        );
    }
}

/// A call's first attempt joins the queue but its reply is lost; the call sends the attempt
/// again. That resend finds the entry the first send made, which names the first send's nonce:
/// it is the call's own place, kept, not an ended call's to be dropped, so a waiter that arrived
/// in between is still served after us. (redis-rs's cluster client runs one send twice the same
/// way, `tests/cluster_resends.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_whose_reply_was_lost_keeps_its_place() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let monitor = support::Monitor::start(server.port());
    let mut raw = server.conn();
    let name = "lost-join";
    let queue = "redisson_lock_queue:{lost-join}";
    let holder_client = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();
    let slow = proxied(&proxy).await;
    let holder = holder_client.fair_lock(name).lock().await.unwrap();

    // Our first attempt runs and joins, but its reply never comes back...
    let lock = slow
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(11).unwrap());
    let ours = format!("{}:11", slow.id());
    proxy.set_blackhole_replies(true);
    let since = Instant::now();
    let first = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock(Duration::from_secs(20), None).await })
    };
    wait_until(Duration::from_secs(10), "our waiter queued", || {
        raw.llen::<_, i64>(queue).unwrap() == 1
    });
    // ... another waiter arrives behind us meanwhile ...
    let theirs = {
        let lock = other.fair_lock(name);
        tokio::spawn(async move { lock.try_lock(Duration::from_secs(20), None).await })
    };
    wait_until(Duration::from_secs(10), "their waiter queued", || {
        raw.llen::<_, i64>(queue).unwrap() == 2
    });
    // ... and our call sends its attempt again once replies get through.
    proxy.set_blackhole_replies(false);
    proxy.reset_tainted();
    let attempts = |m: &support::Monitor| m.count_since(since, &["EVALSHA", &ours, "\"queue\""]);
    wait_until_async(Duration::from_secs(10), "our attempt resent", || async {
        attempts(&monitor) >= 2
    })
    .await;
    let q: Vec<String> = raw.lrange(queue, 0, -1).unwrap();
    assert_eq!(q.first(), Some(&ours), "we keep our place: {q:?}");
    assert_eq!(q.len(), 2, "{q:?}");

    holder.unlock().await.unwrap();
    let g = support::joined(first, Duration::from_secs(20), "our call")
        .await
        .unwrap()
        .expect("served first");
    assert!(!theirs.is_finished(), "they wait behind us");
    g.unlock().await.unwrap();
    let t = support::joined(theirs, Duration::from_secs(20), "their call")
        .await
        .unwrap()
        .expect("served next");
    t.unlock().await.unwrap();
}
