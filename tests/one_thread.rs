//! Ordinary code on a current-thread runtime (`#[tokio::main(flavor = "current_thread")]`), for
//! the kinds beside the mutex: semaphores, expirable permits, read-write locks, multi-locks and
//! latches. Everything the library does in the background (releases of dropped guards, renewals,
//! give-ups of cancelled calls) must run on the caller's one thread between its awaits.
//!
//! The patterns are the ones users write without thinking about them: drop a guard and take
//! again at once, wrap a call in `timeout()` and retry, poll several calls of one task together
//! (`join!`, `select!`), shut the client down while calls wait. The seeded runs
//! (`FAIRLOCK_ONE_THREAD_SEED` replays one) check that limits and exclusion hold at every moment,
//! that no call hangs, and that nothing is left in Redis at the end.

use fairlock_testkit as support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fairlock::{Client, MultiLock, MultiMember};
use support::{RedisServer, Rng};

/// No call of these tests may take longer than this (a hang fails the test with its seed).
const CALL_BOUND: Duration = Duration::from_secs(20);

/// Keys whose name contains `name`, call marks with a TTL left out (they expire by themselves);
/// a call mark without a TTL is kept (it would be a leak).
async fn leftovers(raw: &mut redis::aio::MultiplexedConnection, name: &str) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{name}*"))
        .query_async(raw)
        .await
        .unwrap();
    let mut left = Vec::new();
    for key in keys {
        if key.contains(":fairlock_call:") {
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(raw).await.unwrap();
            if ttl > 0 {
                continue;
            }
        }
        left.push(key);
    }
    left.sort();
    left
}

/// A seeded run against one server: what a hang reports.
#[derive(Clone, Copy)]
struct Run {
    seed: u64,
    port: u16,
}

impl Run {
    fn new(seed: u64, server: &RedisServer) -> Self {
        Run {
            seed,
            port: server.port(),
        }
    }
}

/// Runs `fut` under [`CALL_BOUND`]; when it hangs, fails with the seed, `what`, and every key
/// the server held at that moment (who holds and who waits).
async fn bounded<T>(run: Run, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(CALL_BOUND, fut).await {
        Ok(out) => out,
        Err(_) => panic!(
            "seed {}: {what} took over {CALL_BOUND:?}; the server held:\n{}",
            run.seed,
            support::dump_keys(&format!("redis://127.0.0.1:{}", run.port))
        ),
    }
}

/// The sum of what the worker tasks report (each its number of holds).
async fn joined_total(tasks: Vec<tokio::task::JoinHandle<u32>>) -> u32 {
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

/// Counts what is in use and fails the moment it goes over `limit`.
#[derive(Clone)]
struct Meter {
    now: Arc<AtomicI64>,
    peak: Arc<AtomicI64>,
    limit: i64,
    seed: u64,
}

impl Meter {
    fn new(limit: i64, seed: u64) -> Self {
        Meter {
            now: Arc::default(),
            peak: Arc::default(),
            limit,
            seed,
        }
    }

    fn take(&self, n: i64, what: &str) {
        let now = self.now.fetch_add(n, Ordering::SeqCst) + n;
        assert!(
            now <= self.limit,
            "seed {}: {now} of {} in use after {what}",
            self.seed,
            self.limit
        );
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn give(&self, n: i64) {
        self.now.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Six tasks on one thread take 1-2 of 3 permits in every ordinary way; the count of permits
/// trusted never exceeds 3, and every permit is back at the end.
#[tokio::test(flavor = "current_thread")]
async fn semaphores_used_every_which_way_on_one_thread() {
    let seed = support::seed("FAIRLOCK_ONE_THREAD_SEED");
    let server = RedisServer::start();
    let run = Run::new(seed, &server);
    let mut raw = server.async_conn().await;
    let clients = [
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
    ];
    let name = "one:sem";
    assert!(clients[0].semaphore(name).try_set_permits(3).await.unwrap());
    let meter = Meter::new(3, seed);
    let mut tasks = Vec::new();
    for w in 0..6u64 {
        let sem = clients[(w % 2) as usize].semaphore(name);
        let meter = meter.clone();
        let mut rng = Rng::for_worker(seed, w);
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(3);
            let mut got = 0u32;
            while Instant::now() < until {
                let n = 1 + rng.below(2) as u32;
                match rng.below(4) {
                    // Take, hold a moment, drop the guard and take again at once.
                    0 => {
                        let p = bounded(run, "acquire", sem.acquire(n)).await.unwrap();
                        meter.take(n.into(), "acquire");
                        tokio::time::sleep(Duration::from_micros(rng.below(2_000))).await;
                        meter.give(n.into());
                        drop(p);
                        let p = bounded(run, "acquire again", sem.acquire(1)).await.unwrap();
                        meter.take(1, "acquire again");
                        meter.give(1);
                        drop(p);
                        got += 2;
                    }
                    // `timeout()` around a waiting acquire, retried until it gets through.
                    1 => {
                        let p = bounded(run, "timeout-and-retry", async {
                            loop {
                                let cut = Duration::from_micros(rng.below(5_000));
                                if let Ok(p) = tokio::time::timeout(cut, sem.acquire(n)).await {
                                    return p.unwrap();
                                }
                            }
                        })
                        .await;
                        meter.take(n.into(), "timeout-and-retry");
                        tokio::task::yield_now().await;
                        meter.give(n.into());
                        p.release().await.unwrap();
                        got += 1;
                    }
                    // Two calls of one task polled together.
                    2 => {
                        let wait = Duration::from_millis(rng.below(30));
                        let (a, b) = bounded(
                            run,
                            "joined acquires",
                            async { tokio::join!(sem.try_acquire(1, wait), sem.try_acquire(1, wait)) },
                        )
                        .await;
                        let taken: Vec<_> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
                        for _ in &taken {
                            meter.take(1, "joined acquire");
                        }
                        for p in taken {
                            meter.give(1);
                            p.release().await.unwrap();
                            got += 1;
                        }
                    }
                    // A `select!` whose losing acquire is dropped wherever it was.
                    _ => {
                        let p = bounded(run, "selected acquire", async {
                            tokio::select! {
                                p = sem.acquire(n) => Some(p.unwrap()),
                                () = tokio::time::sleep(Duration::from_micros(rng.below(3_000))) => None,
                            }
                        })
                        .await;
                        if let Some(p) = p {
                            meter.take(n.into(), "selected acquire");
                            meter.give(n.into());
                            p.release().await.unwrap();
                            got += 1;
                        }
                    }
                }
            }
            got
        }));
    }
    let total = joined_total(tasks).await;
    assert!(total > 50, "seed {seed}: only {total} acquisitions");
    assert!(
        meter.peak.load(Ordering::SeqCst) >= 2,
        "seed {seed}: never contended"
    );
    let sem = clients[0].semaphore(name);
    support::wait_until_async(Duration::from_secs(10), "every permit back", || async {
        sem.available().await.unwrap() == 3
    })
    .await;
    assert_eq!(
        leftovers(&mut raw, name).await,
        vec![name.to_owned()],
        "seed {seed}"
    );
    for c in &clients {
        c.shutdown().await;
    }
}

/// Expirable permits, with and without a lease, dropped or released, cut off by `timeout()` and
/// retried, on one thread: at most 2 trusted at once, all back at the end.
#[tokio::test(flavor = "current_thread")]
async fn expirable_permits_used_every_which_way_on_one_thread() {
    let seed = support::seed("FAIRLOCK_ONE_THREAD_SEED");
    let server = RedisServer::start();
    let run = Run::new(seed, &server);
    let mut raw = server.async_conn().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let name = "one:pes";
    let sem = client.expirable_semaphore(name);
    assert!(sem.try_set_permits(2).await.unwrap());
    let meter = Meter::new(2, seed);
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let sem = client.expirable_semaphore(name);
        let meter = meter.clone();
        let mut rng = Rng::for_worker(seed, w);
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(3);
            let mut got = 0u32;
            while Instant::now() < until {
                let lease = (rng.below(2) == 0).then(|| Duration::from_secs(30));
                let p = bounded(run, "timeout-and-retry", async {
                    loop {
                        let cut = Duration::from_micros(rng.below(6_000));
                        if let Ok(p) = tokio::time::timeout(cut, sem.acquire(1, lease)).await {
                            return p.unwrap();
                        }
                    }
                })
                .await;
                meter.take(1, "acquire");
                assert!(!p.is_lost(), "seed {seed}: a fresh guard is lost");
                tokio::time::sleep(Duration::from_micros(rng.below(1_500))).await;
                meter.give(1);
                if rng.below(2) == 0 {
                    drop(p);
                } else {
                    assert_eq!(p.release().await.unwrap(), 1, "seed {seed}");
                }
                got += 1;
            }
            got
        }));
    }
    let total = joined_total(tasks).await;
    assert!(total > 20, "seed {seed}: only {total} acquisitions");
    support::wait_until_async(Duration::from_secs(10), "every permit back", || async {
        sem.available().await.unwrap() == 2 && sem.acquired().await.unwrap() == 0
    })
    .await;
    assert_eq!(
        leftovers(&mut raw, name).await,
        vec![name.to_owned()],
        "seed {seed}"
    );
    client.shutdown().await;
}

/// Readers and writers of one read-write lock (default and writer-preferring handles) on one
/// thread: no writer beside anyone, readers only beside readers, two reads of one task polled
/// together both get in (on default handles only: on a writer-preferring one a writer queued
/// between the two reads waits for the first, and the second for it, for ever, as with tokio's
/// `RwLock`; the mode's docs say so), nothing left at the end.
#[tokio::test(flavor = "current_thread")]
async fn read_write_locks_used_every_which_way_on_one_thread() {
    let seed = support::seed("FAIRLOCK_ONE_THREAD_SEED");
    let server = RedisServer::start();
    let run = Run::new(seed, &server);
    let raw = server.async_conn().await;
    let clients = [
        Client::connect(&server.url()).await.unwrap(),
        Client::connect(&server.url()).await.unwrap(),
    ];
    let name = "one:rw";
    let writers = Meter::new(1, seed);
    let readers = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for w in 0..5u64 {
        let client = clients[(w % 2) as usize].clone();
        let rw = client.read_write_lock(name);
        let preferring = w % 3 == 0;
        let rw = if preferring {
            rw.writer_preferring()
        } else {
            rw
        };
        let (writers, readers) = (writers.clone(), readers.clone());
        let mut rng = Rng::for_worker(seed, w);
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(3);
            let mut got = 0u32;
            let enter_read = |what: &str| {
                readers.fetch_add(1, Ordering::SeqCst);
                assert_eq!(
                    writers.now.load(Ordering::SeqCst),
                    0,
                    "seed {seed}: {what} beside a writer"
                );
            };
            while Instant::now() < until {
                match rng.below(4) {
                    // Write, then drop the guard and write again at once.
                    0 => {
                        for what in ["write", "write again"] {
                            let g = bounded(run, what, rw.write_lock().lock()).await.unwrap();
                            writers.take(1, what);
                            assert_eq!(
                                readers.load(Ordering::SeqCst),
                                0,
                                "seed {seed}: {what} beside a reader"
                            );
                            tokio::task::yield_now().await;
                            writers.give(1);
                            drop(g);
                            got += 1;
                        }
                    }
                    // A write under `timeout()`, retried.
                    1 => {
                        let g = bounded(run, "timed write", async {
                            loop {
                                let cut = Duration::from_micros(rng.below(8_000));
                                let write = rw.write_lock();
                                let call = write.try_lock(Duration::from_secs(30), None);
                                if let Ok(g) = tokio::time::timeout(cut, call).await {
                                    return g.unwrap().expect("waited long enough");
                                }
                            }
                        })
                        .await;
                        writers.take(1, "timed write");
                        assert_eq!(readers.load(Ordering::SeqCst), 0, "seed {seed}");
                        writers.give(1);
                        g.unlock().await.unwrap();
                        got += 1;
                    }
                    // Two reads of one task polled together: both get in (readers share).
                    // Not on a writer-preferring handle: there a writer that queues between
                    // the two waits for the first read and the second read for it (a deadlock
                    // by design, see `ReadWriteLock::writer_preferring`); it reads once.
                    2 if preferring => {
                        let r = bounded(run, "read", rw.read_lock().lock()).await.unwrap();
                        enter_read("read");
                        tokio::time::sleep(Duration::from_micros(rng.below(1_000))).await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                        r.unlock().await.unwrap();
                        got += 1;
                    }
                    2 => {
                        let (a, b) = bounded(run, "joined reads", async {
                            let (r1, r2) = (rw.read_lock(), rw.read_lock());
                            tokio::join!(r1.lock(), r2.lock())
                        })
                        .await;
                        let (a, b) = (a.unwrap(), b.unwrap());
                        enter_read("joined reads");
                        enter_read("joined reads");
                        tokio::time::sleep(Duration::from_micros(rng.below(1_000))).await;
                        readers.fetch_sub(2, Ordering::SeqCst);
                        drop(a);
                        b.unlock().await.unwrap();
                        got += 2;
                    }
                    // A writer's holder reads too, then leaves the write (a downgrade).
                    _ => {
                        let me = client.holder();
                        let write = rw.write_lock().with_holder(me);
                        let g = bounded(run, "write to downgrade", write.lock())
                            .await
                            .unwrap();
                        writers.take(1, "write to downgrade");
                        assert_eq!(readers.load(Ordering::SeqCst), 0, "seed {seed}");
                        let read = rw.read_lock().with_holder(me);
                        let r = bounded(run, "downgrade", read.lock()).await.unwrap();
                        writers.give(1);
                        g.unlock().await.unwrap();
                        enter_read("downgrade");
                        tokio::task::yield_now().await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                        r.unlock().await.unwrap();
                        got += 1;
                    }
                }
            }
            got
        }));
    }
    let total = joined_total(tasks).await;
    assert!(total > 30, "seed {seed}: only {total} holds");
    support::wait_until_async(
        Duration::from_secs(10),
        "the lock and its keys gone",
        || async { leftovers(&mut raw.clone(), name).await.is_empty() },
    )
    .await;
    for c in &clients {
        c.shutdown().await;
    }
}

/// Multi-locks over a fair and a non-fair member cut off by `timeout()` and retried, dropped and
/// taken again at once; latch waits polled together in one task while another counts down.
#[tokio::test(flavor = "current_thread")]
async fn multi_locks_and_latches_on_one_thread() {
    let seed = support::seed("FAIRLOCK_ONE_THREAD_SEED");
    let server = RedisServer::start();
    let run = Run::new(seed, &server);
    let raw = server.async_conn().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let inside = Meter::new(1, seed);
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let multi = MultiLock::new([
            MultiMember::from(client.fair_lock("one:m:a")),
            MultiMember::from(client.non_fair_lock("one:m:b")),
        ]);
        let inside = inside.clone();
        let mut rng = Rng::for_worker(seed, w);
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(2);
            let mut got = 0u32;
            while Instant::now() < until {
                let g = bounded(run, "multi-lock", async {
                    loop {
                        let cut = Duration::from_micros(rng.below(10_000));
                        if let Ok(g) = tokio::time::timeout(cut, multi.lock()).await {
                            return g.unwrap();
                        }
                    }
                })
                .await;
                inside.take(1, "multi-lock");
                tokio::task::yield_now().await;
                inside.give(1);
                if rng.below(2) == 0 {
                    drop(g);
                } else {
                    g.unlock().await.unwrap();
                }
                got += 1;
            }
            got
        }));
    }
    let latch = client.count_down_latch("one:latch");
    assert!(latch.try_set_count(3).await.unwrap());
    let waits = {
        let (a, b) = (latch.clone(), latch.clone());
        tokio::spawn(async move {
            tokio::join!(a.wait(), b.wait(), b.wait_timeout(Duration::from_secs(30)))
        })
    };
    let counter = {
        let latch = latch.clone();
        tokio::spawn(async move {
            for _ in 0..3 {
                tokio::task::yield_now().await;
                latch.count_down().await.unwrap();
            }
        })
    };
    let (a, b, c) = bounded(run, "latch waits", waits).await.unwrap();
    a.unwrap();
    b.unwrap();
    assert!(c.unwrap(), "seed {seed}: the latch opened");
    counter.await.unwrap();
    let total = joined_total(tasks).await;
    assert!(total > 10, "seed {seed}: only {total} multi-lock holds");
    support::wait_until_async(Duration::from_secs(10), "nothing left", || async {
        let mut raw = raw.clone();
        leftovers(&mut raw, "one:m:").await.is_empty()
            && leftovers(&mut raw, "one:latch").await.is_empty()
    })
    .await;
    client.shutdown().await;
}

/// `shutdown()` while calls of every kind wait, all on one thread: every call ends with
/// `Error::Shutdown` at once, and another client then finds everything free.
#[tokio::test(flavor = "current_thread")]
async fn shutdown_mid_call_ends_every_waiting_call_on_one_thread() {
    let server = RedisServer::start();
    let raw = server.async_conn().await;
    let c = Client::connect(&server.url()).await.unwrap();
    let other = Client::connect(&server.url()).await.unwrap();

    // What the waiting calls wait behind, held by the other client.
    assert!(other
        .semaphore("one:s:sem")
        .try_set_permits(1)
        .await
        .unwrap());
    let sem_held = other.semaphore("one:s:sem").acquire(1).await.unwrap();
    assert!(other
        .expirable_semaphore("one:s:pes")
        .try_set_permits(1)
        .await
        .unwrap());
    let pes_held = other
        .expirable_semaphore("one:s:pes")
        .acquire(1, None)
        .await
        .unwrap();
    let read_held = other
        .read_write_lock("one:s:rw")
        .read_lock()
        .lock()
        .await
        .unwrap();
    let fair_held = other.fair_lock("one:s:fair").lock().await.unwrap();
    assert!(other
        .count_down_latch("one:s:latch")
        .try_set_count(1)
        .await
        .unwrap());

    let waiting: Vec<tokio::task::JoinHandle<fairlock::Result<()>>> = vec![
        {
            let s = c.semaphore("one:s:sem");
            tokio::spawn(async move { s.acquire(1).await.map(drop) })
        },
        {
            let s = c.expirable_semaphore("one:s:pes");
            tokio::spawn(async move { s.acquire(1, None).await.map(drop) })
        },
        {
            let rw = c.read_write_lock("one:s:rw").writer_preferring();
            tokio::spawn(async move { rw.write_lock().lock().await.map(drop) })
        },
        {
            let m = MultiLock::new([
                MultiMember::from(c.non_fair_lock("one:s:plain")),
                MultiMember::from(c.fair_lock("one:s:fair")),
            ]);
            tokio::spawn(async move { m.lock().await.map(drop) })
        },
        {
            let l = c.count_down_latch("one:s:latch");
            tokio::spawn(async move { l.wait().await })
        },
    ];
    // Every call has sent its first attempt and waits: the queued ones show in Redis.
    support::wait_until_async(Duration::from_secs(10), "the calls waiting", || async {
        let mut raw = raw.clone();
        let fair_queue: i64 = redis::cmd("LLEN")
            .arg(support::queue_key("one:s:fair"))
            .query_async(&mut raw)
            .await
            .unwrap();
        let rw_state = other.read_write_lock("one:s:rw").state().await.unwrap();
        fair_queue == 1 && rw_state.queue.len() == 1
    })
    .await;
    tokio::time::timeout(Duration::from_secs(10), c.shutdown())
        .await
        .expect("shutdown took over 10 s");
    for (i, w) in waiting.into_iter().enumerate() {
        let r = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap_or_else(|_| panic!("call {i} still waits after shutdown"))
            .unwrap();
        assert!(
            r.as_ref().is_err_and(fairlock::Error::is_shutdown),
            "call {i}: {r:?}"
        );
    }

    // Nothing of the ended calls is left: the holds of the other client are all there is.
    sem_held.release().await.unwrap();
    pes_held.release().await.unwrap();
    read_held.unlock().await.unwrap();
    fair_held.unlock().await.unwrap();
    assert_eq!(other.semaphore("one:s:sem").available().await.unwrap(), 1);
    assert_eq!(
        other
            .expirable_semaphore("one:s:pes")
            .available()
            .await
            .unwrap(),
        1
    );
    let g = other
        .read_write_lock("one:s:rw")
        .write_lock()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .expect("the read-write lock is free");
    g.unlock().await.unwrap();
    let g = MultiLock::new([
        MultiMember::from(other.non_fair_lock("one:s:plain")),
        MultiMember::from(other.fair_lock("one:s:fair")),
    ])
    .try_lock(Duration::ZERO, None)
    .await
    .unwrap()
    .expect("both members free");
    g.unlock().await.unwrap();
    support::wait_until_async(Duration::from_secs(10), "no queue keys left", || async {
        let mut raw = raw.clone();
        let left = leftovers(&mut raw, "one:s:").await;
        left == ["one:s:latch", "one:s:pes", "one:s:sem"]
    })
    .await;
    other.shutdown().await;
}
