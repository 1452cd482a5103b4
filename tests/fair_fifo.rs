//! FIFO order across clients, and cancellation (dropped futures) never blocking the queue.

use fairlock_testkit as support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fairlock::Client;
use redis::Commands;
use support::{queue_len, wait_until, wait_until_async, RedisServer};

/// A client whose waiters heartbeat every third of `liveness` (300 ms: every 100 ms; ten
/// minutes: never within a test).
async fn waiting_client(server: &RedisServer, liveness: Duration) -> Client {
    Client::builder()
        .standalone(server.url())
        .waiter_liveness(liveness)
        .timer_tick(Duration::from_millis(10))
        .build()
        .await
        .unwrap()
}

/// A client whose waiters heartbeat every 100 ms (a 300 ms liveness window).
async fn beating_client(server: &RedisServer) -> Client {
    waiting_client(server, Duration::from_millis(300)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_waiters_over_three_clients_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let holder = Client::connect(&server.url()).await.unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Client::connect(&server.url()).await.unwrap());
    }
    let first = holder.fair_lock("fifo").lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..12usize {
        let lock = clients[i % 3].fair_lock("fifo");
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            order.lock().unwrap().push(i);
            guard.unlock().await.unwrap();
        }));
        // Each waiter arrives only after the previous one is queued.
        wait_until(Duration::from_secs(10), "waiter queued", || {
            queue_len(&mut raw, "fifo") == i as i64 + 1
        });
    }
    first.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..12).collect::<Vec<_>>());
    assert_eq!(queue_len(&mut raw, "fifo"), 0);
    let zcard: i64 = raw.zcard("redisson_lock_timeout:{fifo}").unwrap();
    assert_eq!(zcard, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_head_waiter_passes_the_lock_to_the_next() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    // Long liveness: only the give-up of the cancelled head can move the queue quickly.
    let build = || {
        Client::builder()
            .standalone(server.url())
            .waiter_liveness(Duration::from_secs(60))
            .build()
    };
    let a = build().await.unwrap();
    let b = build().await.unwrap();
    let c = build().await.unwrap();

    let held = a.fair_lock("cancel").lock().await.unwrap();
    let head_lock = b.fair_lock("cancel");
    let head = tokio::spawn(async move { head_lock.lock().await });
    wait_until(Duration::from_secs(10), "head queued", || {
        queue_len(&mut raw, "cancel") == 1
    });
    let next_lock = c.fair_lock("cancel");
    let next = tokio::spawn(async move { next_lock.try_lock(Duration::from_secs(20), None).await });
    wait_until(Duration::from_secs(10), "second queued", || {
        queue_len(&mut raw, "cancel") == 2
    });

    head.abort(); // drops the pending lock() future
    assert!(head.await.unwrap_err().is_cancelled());
    wait_until(
        Duration::from_secs(10),
        "cancelled head left the queue",
        || queue_len(&mut raw, "cancel") == 1,
    );
    let remaining: Vec<String> = raw.lrange("redisson_lock_queue:{cancel}", 0, -1).unwrap();
    assert!(remaining[0].starts_with(&c.id().hyphenated().to_string()));

    held.unlock().await.unwrap();
    let guard = next
        .await
        .unwrap()
        .unwrap()
        .expect("the next waiter gets the lock");
    guard.unlock().await.unwrap();
    assert_eq!(queue_len(&mut raw, "cancel"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_head_of_a_free_lock_wakes_the_next_waiter() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    // Long liveness windows: no heartbeat can move the queue within the test; only the give-up's
    // wake-up message can.
    let build = || {
        Client::builder()
            .standalone(server.url())
            .waiter_liveness(Duration::from_secs(60))
            .build()
    };
    let a = build().await.unwrap();
    let b = build().await.unwrap();
    let monitor = support::Monitor::start(server.port());
    // A foreign (Redisson-style) head that is alive but slow sits in front of a free lock...
    let foreign = "11111111-2222-3333-4444-555555555555:9";
    let (secs, _): (i64, i64) = redis::cmd("TIME").query(&mut raw).unwrap();
    let _: () = raw
        .zadd("redisson_lock_timeout:{gap}", foreign, (secs + 600) * 1000)
        .unwrap();
    let _: () = raw.rpush("redisson_lock_queue:{gap}", foreign).unwrap();
    // ... then waiter A, then waiter B.
    let la = a.fair_lock("gap");
    let wa = tokio::spawn(async move { la.lock().await });
    wait_until(Duration::from_secs(10), "A queued", || {
        queue_len(&mut raw, "gap") == 2
    });
    // A sleeps once the attempt it sends after subscribing has run (still behind the foreign
    // head); the head must not leave before that, or that attempt would take the free lock.
    let a_field: String = raw.lindex("redisson_lock_queue:{gap}", 1).unwrap();
    monitor.wait_for_after(
        0,
        &[&format!("\"{a_field}\""), "\"requeue\""],
        Duration::from_secs(10),
    );
    let lb = b.fair_lock("gap");
    let wb = tokio::spawn(async move { lb.try_lock(Duration::from_secs(30), None).await });
    wait_until(Duration::from_secs(10), "B queued", || {
        queue_len(&mut raw, "gap") == 3
    });

    // The foreign head leaves without a word (Redisson publishes nothing on give-up) ...
    let _: () = raw.lrem("redisson_lock_queue:{gap}", 0, foreign).unwrap();
    let _: () = raw.zrem("redisson_lock_timeout:{gap}", foreign).unwrap();
    // ... so A is now the head of a free lock, asleep. Cancelling A must wake B.
    wa.abort();
    assert!(wa.await.unwrap_err().is_cancelled());
    let guard = wb
        .await
        .unwrap()
        .unwrap()
        .expect("B is woken by A's give-up");
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stress_leaves_no_waiter_and_no_lock_behind() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let clients = [
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
    ];
    let acquired = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let lock = clients[(i % 2) as usize].fair_lock("stress");
        let acquired = acquired.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..5u64 {
                // Cancel after a varying delay: some futures are dropped while queued, some
                // while an attempt is in flight, some right after the grant.
                let budget = Duration::from_micros(((i * 7 + round * 13) % 40) * 150);
                // Every tenth task's last round waits without a timeout, so the run includes
                // grants whatever the machine's speed (on a busy host every budget can run out).
                let budget = if i % 10 == 0 && round == 4 {
                    Duration::from_secs(60)
                } else {
                    budget
                };
                match tokio::time::timeout(budget, lock.lock()).await {
                    Ok(Ok(guard)) => {
                        acquired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        drop(guard);
                    }
                    Ok(Err(e)) => panic!("{e:?}"),
                    Err(_) => {}
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Everything cancelled or dropped is cleaned up by the background tasks.
    wait_until(
        Duration::from_secs(15),
        "lock released and queue empty",
        || {
            !raw.exists::<_, bool>("stress").unwrap()
                && queue_len(&mut raw, "stress") == 0
                && raw
                    .zcard::<_, i64>("redisson_lock_timeout:{stress}")
                    .unwrap()
                    == 0
        },
    );
    // And the lock still works for a fresh holder at once.
    let g = clients[0]
        .fair_lock("stress")
        .try_lock(Duration::from_secs(5), None)
        .await
        .unwrap();
    assert!(g.is_some());
    assert!(
        acquired.load(std::sync::atomic::Ordering::Relaxed) >= 4,
        "the four untimed rounds (and maybe others) acquired"
    );
}

/// Issue 21, item 5: a heartbeat used to find its waiter's place (`LPOS`) and count the unmarked
/// waiters ahead of it (`LRANGE` + `ZMSCORE`) on every beat, O(queue position) each and O(n²) per
/// period. With no Redisson waiter in the queue every waiter's score equals its mark, so no
/// heartbeat or re-check may walk the queue at all: the server's own command counts show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_of_fairlock_waiters_never_walk_the_queue() {
    const WAITERS: usize = 60;
    let server = RedisServer::start();
    let mut raw = server.conn();
    let owner = Client::connect(&server.url()).await.unwrap();
    // A 1 s window: heartbeats every 333 ms, and a mark lapses only if a beat is two thirds of
    // a second late (a loaded machine must not purge a live waiter here).
    let waiters = waiting_client(&server, Duration::from_secs(1)).await;
    let held = owner.fair_lock("beats").lock().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let lock = waiters.fair_lock("beats");
        tasks.push(tokio::spawn(async move {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }));
    }
    wait_until(Duration::from_secs(10), "every waiter queued", || {
        queue_len(&mut raw, "beats") == WAITERS as i64
    });
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut raw)
        .unwrap();
    // Heartbeats run every 333 ms (a third of the window); each refreshes every waiter's mark
    // and score with ZADD. Wait for several whole periods of them.
    let mut info = String::new();
    wait_until(Duration::from_secs(20), "several heartbeat periods", || {
        info = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut raw)
            .unwrap();
        support::command_calls(&info, "zadd") >= 2 * 5 * WAITERS as u64
    });
    for walk in ["lpos", "lrange", "zmscore"] {
        assert_eq!(
            support::command_calls(&info, walk),
            0,
            "a heartbeat walked the queue with {walk}: {info}"
        );
    }
    assert_eq!(
        queue_len(&mut raw, "beats"),
        WAITERS as i64,
        "no live waiter was purged"
    );
    held.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(queue_len(&mut raw, "beats"), 0);
}

/// Review defect 9: after its last waiter left, a channel lingers (3 s) and is then
/// unsubscribed, also when the client stays idle from then on. The sweep used to mark the
/// channel for unsubscribing without acting on it until some later request came, so an idle
/// client listened on its last cancelled waiter's channel for ever.
#[tokio::test(flavor = "current_thread")]
async fn an_idle_client_drops_a_cancelled_waiters_channel_after_its_linger() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let owner = Client::connect(&server.url()).await.unwrap();
    let c = Client::connect(&server.url()).await.unwrap();
    for fair in [true, false] {
        let name = if fair { "linger-fair" } else { "linger-plain" };
        let held = if fair {
            owner.fair_lock(name).lock().await.unwrap()
        } else {
            owner.non_fair_lock(name).lock().await.unwrap()
        };
        let waiter = if fair {
            let lock = c.fair_lock(name);
            tokio::spawn(async move { lock.lock().await.map(drop) })
        } else {
            let lock = c.non_fair_lock(name);
            tokio::spawn(async move { lock.lock().await.map(drop) })
        };
        let pattern = format!("{}*", support::release_channel(name));
        let subscribed = |raw: &mut redis::Connection| -> Vec<String> {
            redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(&pattern)
                .query(raw)
                .unwrap()
        };
        wait_until_async(Duration::from_secs(10), "the waiter subscribed", || {
            let listening = !subscribed(&mut raw).is_empty();
            async move { listening }
        })
        .await;
        // Cancelled while it waits (the lock is held).
        waiter.abort();
        assert!(
            waiter.await.unwrap_err().is_cancelled(),
            "{name}: the lock is held"
        );
        // The client stays idle from here on: no call, no message. (An async wait: on this
        // current-thread runtime a blocking one would stop the client's own tasks.)
        wait_until_async(Duration::from_secs(10), "the channel unsubscribed", || {
            let empty = subscribed(&mut raw).is_empty();
            async move { empty }
        })
        .await;
        held.unlock().await.unwrap();
    }
}

/// Review defect 2: an attempt that finds its waiter no longer queued used to put it back at the
/// head, assuming a purge had taken it as a dead head. Here two calls of one holder share an
/// entry among other waiters (`w1 w0 H w2`); the first call is dropped and gives the entry up
/// while the second still waits. The second must rejoin at the tail (`w1 w0 w2 H`), not jump to
/// the head ahead of everyone: only a waiter purged as a dead head while alive (it leaves a
/// tombstone) goes back to the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_shared_entry_was_given_up_rejoins_at_the_tail() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let monitor = support::Monitor::start(server.port());
    let owner = Client::connect(&server.url()).await.unwrap();
    let c1 = Client::connect(&server.url()).await.unwrap();
    let c2 = Client::connect(&server.url()).await.unwrap();
    // Heartbeats every 100 ms: the second call learns at once that its entry is gone.
    let c = beating_client(&server).await;
    let held = owner.fair_lock("sib").lock().await.unwrap();
    let spawn_waiter = |client: &Client| {
        let lock = client.fair_lock("sib");
        tokio::spawn(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
    };
    // Two waiters ahead, so H is never second in line (the second is woken to re-check).
    let w1 = spawn_waiter(&c1);
    wait_until(Duration::from_secs(10), "w1 queued", || {
        queue_len(&mut raw, "sib") == 1
    });
    let w0 = spawn_waiter(&c2);
    wait_until(Duration::from_secs(10), "w0 queued", || {
        queue_len(&mut raw, "sib") == 2
    });
    let shared = c.fair_lock("sib").with_holder(c.holder());
    let first = {
        let lock = shared.clone();
        tokio::spawn(async move { lock.lock().await })
    };
    wait_until(Duration::from_secs(10), "H queued", || {
        queue_len(&mut raw, "sib") == 3
    });
    let queue: Vec<String> = raw.lrange(support::queue_key("sib"), 0, -1).unwrap();
    let h = queue[2].clone();
    let w2 = spawn_waiter(&c1);
    wait_until(Duration::from_secs(10), "w2 queued", || {
        queue_len(&mut raw, "sib") == 4
    });
    let w1_field = queue[0].clone();
    let since = std::time::Instant::now();
    let second = {
        let lock = shared.clone();
        tokio::spawn(async move { lock.lock().await })
    };
    // The second call's first attempt found the shared entry (mode "queue", H's field).
    let first_attempt = [format!("\"{h}\""), "\"queue\"".to_owned()];
    let needles: Vec<&str> = first_attempt.iter().map(String::as_str).collect();
    wait_until(
        Duration::from_secs(10),
        "the second call's first attempt",
        || monitor.count_since(since, &needles) >= 1,
    );
    let before_abort = monitor.len();
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The give-up removes H (its script's LREM); the second call's next attempt after that puts
    // it back. (Attempts in "requeue" mode may also run before the give-up, finding H still
    // queued: only one after the LREM shows where H rejoined.)
    let quoted_h = format!("\"{h}\"");
    let removed = monitor.wait_for_after(
        before_abort,
        &["\"LREM\"", &quoted_h],
        Duration::from_secs(10),
    );
    monitor.wait_for_after(
        removed + 1,
        &[&quoted_h, "\"requeue\""],
        Duration::from_secs(10),
    );
    wait_until(Duration::from_secs(10), "H back in the queue", || {
        let q: Vec<String> = raw.lrange(support::queue_key("sib"), 0, -1).unwrap();
        q.len() == 4 && q.contains(&h)
    });
    let queue: Vec<String> = raw.lrange(support::queue_key("sib"), 0, -1).unwrap();
    assert_eq!(queue[0], w1_field, "nobody overtook w1: {queue:?}");
    assert_eq!(
        queue[3], h,
        "the second call rejoined at the tail: {queue:?}"
    );
    held.unlock().await.unwrap();
    w1.await.unwrap();
    w0.await.unwrap();
    w2.await.unwrap();
    second.await.unwrap().unwrap().unlock().await.unwrap();
    assert_eq!(queue_len(&mut raw, "sib"), 0);
}

/// Issue 36: a call's first attempt that finds the lock held and waiters queued cannot take the
/// lock, so it joins the tail without purging or reading the head (whoever frees the lock
/// purges it). Each such join reads one list element (the tail, for the deadline Redisson
/// waiters chain on) and three scores (is the field queued; the tail's score and mark), where it
/// used to read the head and its mark as well. `MONITOR` shows every command each join ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_behind_a_held_lock_never_reads_the_head() {
    const JOINS: usize = 20;
    let server = RedisServer::start();
    let mut raw = server.conn();
    let owner = Client::connect(&server.url()).await.unwrap();
    let waiters = waiting_client(&server, Duration::from_secs(600)).await;
    let monitor = support::Monitor::start(server.port());
    let held = owner.fair_lock("joins").lock().await.unwrap();
    let mut tasks = Vec::new();
    // The server feeds MONITOR in order: the lines between two markers sent from here are the
    // commands that ran between them.
    let mut marks = server.conn();
    let mut marker = |text: &str, from: usize| {
        let _: String = redis::cmd("ECHO").arg(text).query(&mut marks).unwrap();
        monitor.wait_for_after(from, &[&format!("\"{text}\"")], Duration::from_secs(10))
    };
    let mut start = 0;
    // The first two waiters are the head and the second; the joins behind them are looked at.
    for i in 0..2 + JOINS {
        if i == 2 {
            start = marker("joins-start", 0);
        }
        let lock = waiters.fair_lock("joins");
        tasks.push(tokio::spawn(async move {
            lock.lock().await.unwrap().unlock().await.unwrap();
        }));
        wait_until(Duration::from_secs(10), "waiter queued", || {
            queue_len(&mut raw, "joins") == i as i64 + 1
        });
    }
    // Each join: its EVALSHA line ("queue" mode), then the commands its script ran.
    let end = marker("joins-end", start);
    let lines = monitor.lines_between(start, end);
    let mut joins: Vec<Vec<&str>> = Vec::new();
    let mut inside = false;
    for line in &lines {
        if line.contains("\"EVALSHA\"") {
            inside = line.contains("\"queue\"");
            if inside {
                joins.push(Vec::new());
            }
        } else if inside && line.contains(" lua] ") {
            joins.last_mut().unwrap().push(line.as_str());
        } else {
            inside = false;
        }
    }
    assert_eq!(joins.len(), JOINS, "one first attempt per waiter");
    for ran in &joins {
        let count = |command: &str| ran.iter().filter(|l| l.contains(command)).count();
        assert_eq!(
            count("\"LINDEX\""),
            1,
            "a join reads the tail only: {ran:#?}"
        );
        assert!(
            ran.iter()
                .any(|l| l.contains("\"LINDEX\"") && l.ends_with("\"-1\"")),
            "{ran:#?}"
        );
        assert_eq!(count("\"ZSCORE\""), 3, "{ran:#?}");
        assert_eq!(count("\"RPUSH\""), 1, "{ran:#?}");
        // Behind fairlock waiters alone the tail answers everything: no length is read.
        assert_eq!(
            count("\"LLEN\""),
            0,
            "a join behind fairlock waiters reads no length: {ran:#?}"
        );
    }
    held.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(queue_len(&mut raw, "joins"), 0);
}

/// The join above leaves a dead head in place while the lock is held. A waiter that joins right
/// behind it (second in line) is told the head's lapsed deadline, so its next attempt, at once,
/// purges the dead head while the lock is still held; the release then hands the lock to it,
/// and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_ahead_of_a_join_behind_a_held_lock_is_purged_at_once() {
    const DEAD: &str = "0f0f0f0f-0000-4000-8000-000000000000:9";
    let server = RedisServer::start();
    let mut raw = server.conn();
    let owner = Client::connect(&server.url()).await.unwrap();
    let waiters = waiting_client(&server, Duration::from_secs(600)).await;
    let held = owner
        .fair_lock("dead-head")
        .lock_with_lease(Duration::from_secs(120))
        .await
        .unwrap();
    // A fairlock waiter whose client died: queued, a score minutes away, its mark lapsed.
    let now = support::server_now_ms(&mut raw);
    let liveness = "fairlock_liveness:{dead-head}";
    let _: () = raw.zadd(liveness, DEAD, now - 1).unwrap();
    let _: () = raw.pexpire(liveness, 60_000).unwrap();
    let _: () = raw
        .zadd("redisson_lock_timeout:{dead-head}", DEAD, now + 300_000)
        .unwrap();
    let _: () = raw.rpush(support::queue_key("dead-head"), DEAD).unwrap();

    let lock = waiters.fair_lock("dead-head");
    let waiter = tokio::spawn(async move { lock.lock().await });
    wait_until(Duration::from_secs(10), "the dead head purged", || {
        let q: Vec<String> = raw.lrange(support::queue_key("dead-head"), 0, -1).unwrap();
        q.len() == 1 && q[0] != DEAD
    });
    let score: Option<f64> = raw
        .zscore("redisson_lock_timeout:{dead-head}", DEAD)
        .unwrap();
    assert_eq!(score, None, "the dead head's score went with it");
    assert!(!waiter.is_finished(), "the lock is still held");
    held.unlock().await.unwrap();
    let guard = waiter.await.unwrap().unwrap();
    guard.unlock().await.unwrap();
    for key in [
        "dead-head".to_owned(),
        support::queue_key("dead-head"),
        "redisson_lock_timeout:{dead-head}".to_owned(),
        liveness.to_owned(),
        "fairlock_grants:{dead-head}".to_owned(),
    ] {
        assert!(!raw.exists::<_, bool>(&key).unwrap(), "{key} left behind");
    }
}
