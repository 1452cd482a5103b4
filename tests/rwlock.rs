//! The read-write lock (PROTOCOL 10) against a real Redis: readers share, a writer excludes
//! everyone, a writer waits for the readers and readers for the writer (woken by the lock's
//! broadcast channel, not by a timer), downgrade and refused upgrade, the Redisson data exactly
//! (mode, fields, one lease key per read hold, renewed by the watchdog), a dead reader that stops
//! counting at its lease, force unlock seen as lost, and nothing left behind.

use fairlock_testkit as support;

use std::time::{Duration, Instant};

use fairlock::{Client, Error, LostReason, RwMode};
use redis::Commands;
use support::{wait_until, RedisServer};

async fn client(url: &str) -> Client {
    Client::builder()
        .standalone(url)
        .watchdog_timeout(Duration::from_millis(900))
        .timer_tick(Duration::from_millis(10))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

fn lease_key(name: &str, field: &str, k: u32) -> String {
    format!("{{{name}}}:{field}:rwlock_timeout:{k}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_waits_for_all_of_them() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:share");
    let r1 = rw.read_lock().lock().await.unwrap();
    let r2 = rw
        .read_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("a second reader enters at once");
    // Redisson's data: mode, one field per reader, one lease key per hold.
    let mode: String = raw.hget("rw:share", "mode").unwrap();
    assert_eq!(mode, "read");
    for g in [&r1, &r2] {
        let count: i64 = raw.hget("rw:share", g.owner_field()).unwrap();
        assert_eq!(count, 1);
        let pttl: i64 = raw.pttl(lease_key("rw:share", g.owner_field(), 1)).unwrap();
        assert!(pttl > 0 && pttl <= 900, "lease key TTL {pttl}");
    }
    assert!(
        rw.write_lock()
            .try_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none(),
        "no writer while readers hold it"
    );
    let w = rw.write_lock();
    let writer = tokio::spawn(async move { w.lock().await });
    r1.unlock().await.unwrap();
    assert!(!writer.is_finished(), "one reader is still inside");
    // The last reader leaving publishes `0`; the writer enters well before any TTL or renewal
    // could have let it.
    let released = Instant::now();
    r2.unlock().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer is woken")
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_millis(300));
    let state = rw.state().await.unwrap();
    assert_eq!(state.mode, Some(RwMode::Write));
    assert_eq!(
        state.writer.as_ref().map(|o| o.field.as_str()),
        Some(w.owner_field())
    );
    assert!(w.owner_field().ends_with(":write"));
    assert!(state.readers.is_empty());
    w.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("rw:share").unwrap());
    let left: Vec<String> = raw.keys("*rw:share*").unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_readers_all_enter_when_the_writer_leaves() {
    let server = RedisServer::start();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:herd");
    let w = rw.write_lock().lock().await.unwrap();
    let mut readers = Vec::new();
    for _ in 0..5 {
        let r = rw.read_lock();
        readers.push(tokio::spawn(async move { r.lock().await }));
    }
    // Let them all try and go to sleep on the channel (they wait at most the writer's TTL).
    let mut raw = server.conn();
    wait_until(Duration::from_secs(5), "readers subscribed", || {
        let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redisson_rwlock:{rw:herd}")
            .query(&mut raw)
            .unwrap();
        subs[0].1 >= 1
    });
    let released = Instant::now();
    w.unlock().await.unwrap();
    let mut guards = Vec::new();
    for r in readers {
        guards.push(
            tokio::time::timeout(Duration::from_secs(5), r)
                .await
                .expect("every reader is woken")
                .unwrap()
                .unwrap(),
        );
    }
    assert!(released.elapsed() < Duration::from_millis(500));
    let state = rw.state().await.unwrap();
    assert_eq!(state.mode, Some(RwMode::Read));
    assert_eq!(state.readers.len(), 5);
    assert!(state.readers.iter().all(|r| r.alive()));
    for g in guards {
        g.unlock().await.unwrap();
    }
    assert!(!rw.is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_downgrades_and_a_reader_cannot_upgrade() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:grade");
    let me = c.holder();
    let w = rw.write_lock().with_holder(me).lock().await.unwrap();
    let r = rw
        .read_lock()
        .with_holder(me)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("the writer's holder may read");
    // Others may not read yet.
    assert!(rw
        .read_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    assert!(rw.read_lock().is_locked().await.unwrap());
    w.unlock().await.unwrap();
    let mode: String = raw.hget("rw:grade", "mode").unwrap();
    assert_eq!(mode, "read", "the downgrade leaves the lock in read mode");
    let other = rw
        .read_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("now others read too");
    // Read → write by the same holder: refused, nothing taken.
    let refused = rw
        .write_lock()
        .with_holder(me)
        .try_lock(Duration::from_secs(1), None)
        .await;
    assert!(
        matches!(refused, Err(Error::UpgradeRefused { .. })),
        "{refused:?}"
    );
    let refused = rw.write_lock().with_holder(me).lock().await;
    assert!(matches!(refused, Err(Error::UpgradeRefused { .. })));
    assert_eq!(
        rw.write_lock().with_holder(me).hold_count().await.unwrap(),
        0
    );
    other.unlock().await.unwrap();
    r.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("rw:grade").unwrap());
}

/// One holder, both sides: a dropped guard of one side is released (in the background) before
/// the holder's next call on the other side reaches Redis, exactly as an awaited unlock would
/// be. Before, `drop(read_guard); write.lock()` was refused as an upgrade in 49 of 50 rounds: the
/// read release ran behind the write attempt. Also a write guard dropped before a read: the read
/// then finds the lock free, not a downgrade to make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_on_one_side_is_released_before_the_holders_call_on_the_other() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:sides");
    for round in 0..50 {
        let me = c.holder();
        let r = rw.read_lock().with_holder(me).lock().await.unwrap();
        drop(r);
        let w = rw
            .write_lock()
            .with_holder(me)
            .lock()
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        let mode: String = raw.hget("rw:sides", "mode").unwrap();
        assert_eq!(mode, "write", "round {round}");
        drop(w);
        let r = rw
            .read_lock()
            .with_holder(me)
            .try_lock(Duration::from_secs(5), None)
            .await
            .unwrap()
            .expect("free");
        let fields: Vec<(String, String)> = raw.hgetall("rw:sides").unwrap();
        assert!(
            fields.iter().all(|(f, _)| !f.ends_with(":write")),
            "round {round}: the write hold was released first: {fields:?}"
        );
        r.unlock().await.unwrap();
    }
    assert!(!raw.exists::<_, bool>("rw:sides").unwrap());
}

/// A write guard's owner field is Redisson's writer field, `<uuid>:<holder>:write`, as the
/// rustdoc of `owner_field` says; a read guard's is `<uuid>:<holder>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_fields_are_what_redis_holds_for_each_side() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:fields");
    let me = c.holder();
    let w = rw.write_lock().with_holder(me).lock().await.unwrap();
    let r = rw.read_lock().with_holder(me).lock().await.unwrap();
    let base = format!("{}:{}", c.id(), me.id());
    assert_eq!(w.owner_field(), format!("{base}:write"));
    assert_eq!(r.owner_field(), base);
    for g in [&w, &r] {
        let count: i64 = raw.hget("rw:fields", g.owner_field()).unwrap();
        assert_eq!(count, 1, "{}", g.owner_field());
    }
    w.unlock().await.unwrap();
    r.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_every_lease_key_and_reentry_numbers_them() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:renew");
    let me = c.holder();
    let g1 = rw.read_lock().with_holder(me).lock().await.unwrap();
    let g2 = g1.reenter(Some(Duration::from_secs(60))).await.unwrap();
    let field = g1.owner_field().to_owned();
    let count: i64 = raw.hget("rw:renew", &field).unwrap();
    assert_eq!(count, 2);
    // Every lease key of the field lives as long as its longest hold needs.
    for k in 1..=2 {
        let pttl: i64 = raw.pttl(lease_key("rw:renew", &field, k)).unwrap();
        assert!(pttl > 59_000, "key {k}: {pttl}");
    }
    drop(g2);
    wait_until(Duration::from_secs(5), "second hold released", || {
        raw.hget::<_, _, i64>("rw:renew", &field).unwrap() == 1
    });
    assert!(!raw
        .exists::<_, bool>(lease_key("rw:renew", &field, 2))
        .unwrap());
    g1.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("rw:renew").unwrap());
    assert!(!raw
        .exists::<_, bool>(lease_key("rw:renew", &field, 1))
        .unwrap());

    // The watchdog (0.9 s timeout) renews a watchdog hold's lease key: its TTL goes back up,
    // five times over, far past the 0.9 s it had.
    let g1 = rw.read_lock().lock().await.unwrap();
    let key = lease_key("rw:renew", g1.owner_field(), 1);
    let started = Instant::now();
    let (mut last, mut renewals) = (raw.pttl::<_, i64>(&key).unwrap(), 0);
    wait_until(Duration::from_secs(10), "five renewals", || {
        let pttl: i64 = raw.pttl(&key).unwrap();
        assert!(pttl > 0, "the lease key expired");
        if pttl > last {
            renewals += 1;
        }
        last = pttl;
        renewals >= 5
    });
    assert!(started.elapsed() > Duration::from_millis(900));
    assert!(!g1.is_lost());
    g1.unlock().await.unwrap();
    assert!(!raw.exists::<_, bool>("rw:renew").unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_reader_stops_counting_when_its_lease_key_expires() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let name = "rw:dead";
    // A reader of a client that died: its field and a lease key that runs out soon; the hash
    // itself lives on (another live reader keeps it).
    let dead = "00000000-0000-0000-0000-000000000000:1";
    let _: () = redis::pipe()
        .hset(name, "mode", "read")
        .hset(name, dead, 1)
        .set(lease_key(name, dead, 1), 1)
        .pexpire(lease_key(name, dead, 1), 300)
        .pexpire(name, 30_000)
        .query(&mut raw)
        .unwrap();
    let live = c.read_write_lock(name).read_lock().lock().await.unwrap();
    let w = c.read_write_lock(name).write_lock();
    let writer = tokio::spawn(async move { w.lock().await });
    wait_until(Duration::from_secs(5), "dead lease key expired", || {
        !raw.exists::<_, bool>(lease_key(name, dead, 1)).unwrap()
    });
    let state = c.read_write_lock(name).state().await.unwrap();
    let dead_reader = state
        .readers
        .iter()
        .find(|r| r.owner.field == dead)
        .unwrap();
    assert!(!dead_reader.alive());
    // The live reader leaves: the dead one does not count, the lock goes and the writer enters.
    live.unlock().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("writer woken")
        .unwrap()
        .unwrap();
    w.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_is_seen_as_lost_and_each_side_forces_only_its_mode() {
    let server = RedisServer::start();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:force");
    let r = rw.read_lock().lock().await.unwrap();
    assert!(
        !rw.write_lock().force_unlock().await.unwrap(),
        "not in write mode"
    );
    assert!(rw.read_lock().force_unlock().await.unwrap());
    let reason = tokio::time::timeout(Duration::from_secs(5), r.lost())
        .await
        .expect("loss noticed at the next renewal");
    assert_eq!(reason, LostReason::Gone);
    assert!(r.unlock().await.is_err());
    let w = rw.write_lock().fenced().lock().await.unwrap();
    let first = w.fencing_token().expect("fenced");
    assert!(rw.force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), w.lost())
        .await
        .unwrap();
    let w2 = rw.write_lock().fenced().lock().await.unwrap();
    assert!(w2.fencing_token().unwrap() > first);
    w2.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Writer-preferring mode
// ---------------------------------------------------------------------------------------------

async fn preferring_client(url: &str) -> Client {
    Client::builder()
        .standalone(url)
        .watchdog_timeout(Duration::from_secs(5))
        .waiter_liveness(Duration::from_millis(900))
        .timer_tick(Duration::from_millis(10))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

/// Waits until the writer-preferring queue of `rw` holds `n` waiters.
async fn queued(rw: &fairlock::ReadWriteLock, n: usize) {
    support::wait_until_async(Duration::from_secs(10), &format!("{n} queued"), || async {
        rw.state().await.unwrap().queue.len() == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_keeps_later_readers_of_preferring_handles_out() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = preferring_client(&server.url()).await;
    let name = "rw:prefer";
    let rw = c.read_write_lock(name).writer_preferring();
    let me = c.holder();
    let r1 = rw.read_lock().with_holder(me).lock().await.unwrap();
    let w = rw.write_lock();
    let writer = tokio::spawn(async move { w.lock().await });
    queued(&rw, 1).await;
    let state = rw.state().await.unwrap();
    assert!(state.queue[0].writer);
    assert!(state.queue[0].alive_until.is_some());
    // A later reader of a preferring handle stays out, and waits behind the writer.
    assert!(rw
        .read_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    // The first reader's holder re-enters past the queued writer (a second read by another
    // holder would wait behind the writer, which waits for the first: the documented deadlock).
    let again = rw
        .read_lock()
        .with_holder(me)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("a re-entry never queues");
    assert_eq!(again.hold_count(), 2);
    again.unlock().await.unwrap();
    let r = rw.read_lock();
    let reader = tokio::spawn(async move { r.lock().await });
    queued(&rw, 2).await;
    // What the mode cannot promise: a handle without it enters as Redisson's readers do.
    let barging = c
        .read_write_lock(name)
        .read_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("a default handle's reader enters in read mode");
    barging.unlock().await.unwrap();
    // The writer's place survives several liveness windows (heartbeats) while r1 holds.
    let marked = rw.state().await.unwrap().queue[0].alive_until.unwrap();
    wait_until(Duration::from_secs(5), "the mark moved on twice", || {
        let now: Vec<(String, f64)> = raw
            .zrange_withscores("fairlock_rw_liveness:{rw:prefer}", 0, 0)
            .unwrap();
        now.first().is_some_and(|(_, score)| {
            *score as u128
                > marked
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis()
                    + 1_000
        })
    });
    assert!(!writer.is_finished() && !reader.is_finished());
    r1.unlock().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer enters when the last reader leaves")
        .unwrap()
        .unwrap();
    assert!(!reader.is_finished(), "the reader waits for the writer");
    w.unlock().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the reader enters after the writer")
        .unwrap()
        .unwrap();
    r.unlock().await.unwrap();
    let left: Vec<String> = raw.keys("*rw:prefer*").unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferring_waiters_are_served_in_arrival_order_readers_together() {
    let server = RedisServer::start();
    let c = preferring_client(&server.url()).await;
    let rw = c.read_write_lock("rw:order").writer_preferring();
    let w0 = rw.write_lock().lock().await.unwrap();
    let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // How many of R1 and R2 are in: each holds until the other is in too (a loaded machine may
    // let the second in late), or for 5 s, after which the order check below fails.
    let pair_in = std::sync::Arc::new(tokio::sync::watch::channel(0usize).0);
    let mut tasks = Vec::new();
    // Arrival: W1, R1, R2, W2, R3 (each queued before the next arrives).
    for (i, label) in ["W1", "R1", "R2", "W2", "R3"].into_iter().enumerate() {
        let (side, served, pair_in) = (rw.clone(), served.clone(), pair_in.clone());
        tasks.push(tokio::spawn(async move {
            let guard = if label.starts_with('W') {
                side.write_lock().lock().await.unwrap()
            } else {
                side.read_lock().lock().await.unwrap()
            };
            served.lock().unwrap().push((label, "in"));
            if label == "R1" || label == "R2" {
                pair_in.send_modify(|n| *n += 1);
                let mut both = pair_in.subscribe();
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), both.wait_for(|n| *n == 2)).await;
            }
            // Hold long enough for whoever may enter alongside to do so.
            tokio::time::sleep(Duration::from_millis(150)).await;
            served.lock().unwrap().push((label, "out"));
            guard.unlock().await.unwrap();
        }));
        queued(&rw, i + 1).await;
    }
    w0.unlock().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("every waiter is served")
            .unwrap();
    }
    let served = served.lock().unwrap().clone();
    // W1 alone; R1 and R2 together; W2 alone; then R3.
    let entered: Vec<&str> = served
        .iter()
        .filter(|(_, e)| *e == "in")
        .map(|(l, _)| *l)
        .collect();
    assert_eq!(entered[0], "W1", "{served:?}");
    assert_eq!(entered[3], "W2", "{served:?}");
    assert_eq!(entered[4], "R3", "{served:?}");
    let pos = |what: (&str, &str)| served.iter().position(|e| *e == what).unwrap();
    assert!(pos(("W1", "out")) < pos(("R1", "in")));
    assert!(
        pos(("R1", "in")) < pos(("R2", "out")) && pos(("R2", "in")) < pos(("R1", "out")),
        "R1 and R2 hold together: {served:?}"
    );
    assert!(pos(("R1", "out")) < pos(("W2", "in")) && pos(("R2", "out")) < pos(("W2", "in")));
    assert!(pos(("W2", "out")) < pos(("R3", "in")));
    assert!(rw.state().await.unwrap().queue.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_or_departed_queued_writer_no_longer_keeps_readers_out() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = preferring_client(&server.url()).await;
    let name = "rw:departed";
    let rw = c.read_write_lock(name).writer_preferring();
    // A queued writer of a process that died: its mark lapses within 300 ms.
    // (Taken before the server's clock is read: the mark lapses 300 ms after that reading.)
    let started = Instant::now();
    let now_ms = support::server_now_ms(&mut raw);
    let dead = "00000000-0000-0000-0000-000000000000:9:write";
    let _: () = redis::pipe()
        .zadd("fairlock_rw_queue:{rw:departed}", dead, 1)
        .zadd("fairlock_rw_writers:{rw:departed}", dead, 1)
        .zadd("fairlock_rw_liveness:{rw:departed}", dead, now_ms + 300)
        .set("fairlock_rw_seq:{rw:departed}", 1)
        .query(&mut raw)
        .unwrap();
    let r = rw
        .read_lock()
        .try_lock(Duration::from_secs(5), None)
        .await
        .unwrap()
        .expect("the reader enters once the dead writer's mark lapsed");
    assert!(started.elapsed() >= Duration::from_millis(200));
    r.unlock().await.unwrap();

    // A live writer that stops waiting leaves at once, and the reader behind it enters.
    let holder = rw.read_lock().lock().await.unwrap();
    let w = rw.write_lock();
    let writer = tokio::spawn(async move { w.try_lock(Duration::from_millis(400), None).await });
    queued(&rw, 1).await;
    let r = rw.read_lock();
    let reader = tokio::spawn(async move { r.lock().await });
    queued(&rw, 2).await;
    assert!(
        writer.await.unwrap().unwrap().is_none(),
        "the writer gave up"
    );
    let gave_up = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the reader is let in")
        .unwrap()
        .unwrap();
    // Woken by the give-up's message, not by a heartbeat (every 300 ms) or a timer.
    assert!(
        gave_up.elapsed() < Duration::from_millis(250),
        "{:?}",
        gave_up.elapsed()
    );
    r.unlock().await.unwrap();
    holder.unlock().await.unwrap();
    let left: Vec<String> = raw.keys("*rw:departed*").unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_as_a_mutex_is_waited_for_not_written_into() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let name = "rw:mixed";
    let mutex = c
        .non_fair_lock(name)
        .lock_with_lease(Duration::from_millis(600))
        .await
        .unwrap();
    let rw = c.read_write_lock(name);
    for attempt in [
        rw.read_lock().try_lock(Duration::ZERO, None).await,
        rw.write_lock().try_lock(Duration::ZERO, None).await,
    ] {
        assert!(attempt.unwrap().is_none(), "a mutex holds the name");
    }
    let fields: Vec<String> = raw.hkeys(name).unwrap();
    assert_eq!(
        fields,
        vec![mutex.owner_field().to_owned()],
        "nothing written into the mutex"
    );
    // Once the mutex's lease ends, the read-write lock takes the name.
    let r = rw
        .read_lock()
        .try_lock(Duration::from_secs(5), None)
        .await
        .unwrap()
        .expect("after the mutex's lease");
    drop(mutex);
    r.unlock().await.unwrap();
}

/// The writer-preferring queue's four keys share one expiry, which only ever rises (a mark
/// looks at one key's TTL, not four): a writers set created by a client with a short liveness
/// window takes the expiry the long-window client's marks gave the others, not one of its own
/// window, and no key is left without a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preferring_queues_keys_share_one_expiry_across_windows() {
    let server = RedisServer::start();
    let mut raw = server.conn();
    let name = "rw:expiry";
    let owner = client(&server.url()).await;
    let patient = Client::builder()
        .standalone(server.url())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let brisk = preferring_client(&server.url()).await;
    let held = owner
        .read_write_lock(name)
        .write_lock()
        .lock_with_lease(Duration::from_secs(60))
        .await
        .unwrap();
    let rw = patient.read_write_lock(name).writer_preferring();
    let r = rw.read_lock();
    let reader = tokio::spawn(async move { r.lock().await });
    queued(&rw, 1).await;
    let w = brisk.read_write_lock(name).writer_preferring().write_lock();
    let writer = tokio::spawn(async move { w.lock().await });
    queued(&rw, 2).await;
    for key in ["queue", "writers", "liveness", "seq"] {
        let key = format!("fairlock_rw_{key}:{{{name}}}");
        let ttl: i64 = raw.pttl(&key).unwrap();
        // The 60 s waiter's mark lies 60 s ahead; its keys must outlive it by most of a window.
        assert!(
            ttl > 100_000,
            "{key} expires in {ttl} ms, soon after the 60 s waiter's mark"
        );
    }
    held.unlock().await.unwrap();
    // The reader arrived before the writer: it enters first, the writer after it.
    let r = reader.await.unwrap().unwrap();
    assert!(!writer.is_finished());
    r.unlock().await.unwrap();
    writer.await.unwrap().unwrap().unlock().await.unwrap();
    let left: Vec<String> = raw.keys(format!("*{name}*")).unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A read release that leaves other readers recomputes the hash's TTL from every reader's lease
/// keys, as Redisson does; it reads the hash once (`HGETALL`), not field by field (`HKEYS`, then
/// an `HGET` per reader). The server's command counts show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_release_reads_the_hash_once() {
    const READERS: usize = 8;
    let server = RedisServer::start();
    let mut raw = server.conn();
    let c = client(&server.url()).await;
    let rw = c.read_write_lock("rw:walk");
    let mut guards = Vec::new();
    for _ in 0..READERS {
        guards.push(
            rw.read_lock()
                .lock_with_lease(Duration::from_secs(60))
                .await
                .unwrap(),
        );
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut raw)
        .unwrap();
    guards.pop().unwrap().unlock().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut raw)
        .unwrap();
    assert_eq!(support::command_calls(&info, "hgetall"), 1, "{info}");
    for by_field in ["hkeys", "hlen"] {
        assert_eq!(support::command_calls(&info, by_field), 0, "{info}");
    }
    // The one HGET is the release's compare-and-set on its own count.
    assert_eq!(support::command_calls(&info, "hget"), 1, "{info}");
    // One lease key per remaining reader was looked at (and the hash's own TTL).
    assert_eq!(
        support::command_calls(&info, "pttl"),
        READERS as u64,
        "{info}"
    );
    let ttl: i64 = raw.pttl("rw:walk").unwrap();
    assert!(ttl > 50_000, "the hash lives as long as its readers: {ttl}");
    for g in guards {
        g.unlock().await.unwrap();
    }
    assert!(!raw.exists::<_, bool>("rw:walk").unwrap());
}

/// A reader's give-up fails (its user may not run scripts for a moment), so its entry stays in
/// the writer-preferring queue, ahead of a writer that came after it. The reader's client does
/// not hand that call's holder id to its next call: that call joins at the tail, behind the
/// writer, instead of entering in the place the failed give-up left (it did, before the field
/// remembered the failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_a_failed_read_give_up_waits_behind_later_arrivals() {
    let name = "rw:failed-give-up";
    // The reader's call ends at its deadline and gives up there, or earlier, when an attempt
    // (a heartbeat's nudge) is refused: then its give-up runs in the background. Either way the
    // ACL is lifted only once that give-up has failed.
    let give_ups_failed = support::EventCount::watch("give-up failed", name);
    let server = RedisServer::start();
    let mut raw = server.conn();
    let acl = |rule: &[&str]| {
        let mut c = server.conn();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("reader")
            .arg(rule)
            .query(&mut c)
            .unwrap();
    };
    acl(&["on", ">pw", "~*", "&*", "+@all"]);
    let url = format!("redis://reader:pw@127.0.0.1:{}", server.port());
    let build = |url: String| async move {
        Client::builder()
            .standalone(url.as_str())
            .watchdog_timeout(Duration::from_secs(5))
            // Long enough that the failed give-up's entry is still alive when the next call
            // starts: a dead one would be purged and prove nothing.
            .waiter_liveness(Duration::from_secs(5))
            .command_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap()
    };
    let ours = build(url).await;
    let other = build(server.url()).await;
    let theirs = other.read_write_lock(name).writer_preferring();
    let holder = theirs.write_lock().lock().await.unwrap();
    let rw = ours.read_write_lock(name).writer_preferring();

    let first = {
        let side = rw.read_lock();
        tokio::spawn(async move { side.try_lock(Duration::from_millis(1500), None).await })
    };
    queued(&rw, 1).await;
    let stale = rw.state().await.unwrap().queue[0].field.clone();
    let writer = {
        let side = theirs.write_lock();
        tokio::spawn(async move { side.try_lock(Duration::from_secs(30), None).await })
    };
    queued(&rw, 2).await;
    // Our user may not run scripts: the reader's wait ends and its give-up is refused.
    acl(&["-eval", "-evalsha"]);
    let outcome = support::joined(first, Duration::from_secs(10), "the first read call").await;
    assert!(!matches!(outcome, Ok(Some(_))), "not granted");
    support::wait_until(
        Duration::from_secs(10),
        "the reader's give-up fails",
        || give_ups_failed.get() > 0,
    );
    acl(&["+eval", "+evalsha"]);
    let queue: Vec<String> = rw
        .state()
        .await
        .unwrap()
        .queue
        .into_iter()
        .map(|w| w.field)
        .collect();
    assert_eq!(queue.first(), Some(&stale), "the entry stayed: {queue:?}");

    // Our next read call joins behind the writer.
    let next = {
        let side = rw.read_lock();
        tokio::spawn(async move { side.try_lock(Duration::from_secs(30), None).await })
    };
    queued(&rw, 3).await;
    holder.unlock().await.unwrap();
    let w = support::joined(writer, Duration::from_secs(20), "the writer")
        .await
        .unwrap()
        .expect("the writer is served before our next reader");
    assert!(
        !next.is_finished(),
        "our next reader waits behind the writer"
    );
    w.unlock().await.unwrap();
    let r = support::joined(next, Duration::from_secs(20), "our next reader")
        .await
        .unwrap()
        .expect("served after the writer");
    r.unlock().await.unwrap();
    let left: Vec<String> = raw.keys("*failed-give-up*").unwrap();
    assert!(left.is_empty(), "{left:?}");
}
