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
