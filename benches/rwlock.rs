//! The read-write lock under contention: C = 64 tasks (two clients, one process) loop
//! acquire → critical section → release on one name, each operation a read with probability
//! `read share` and a write otherwise. A read's critical section is `GET counter`, a write's is
//! `GET counter` + `SET counter`.
//!
//! Four locks run the same workload in the same run, alternating round by round:
//!
//! * **FairLock** and **NonFairLock**: the mutex for every operation (a read excludes other
//!   reads), the baseline a read-write lock has to beat on reads;
//! * **ReadWriteLock**: readers share (Redisson's rules: not fair, readers enter whenever the lock
//!   is in read mode);
//! * **ReadWriteLock, writer-preferring**: `writer_preferring()`: a queued writer keeps later
//!   readers out.
//!
//! Workloads: read-heavy (90 % reads) and write-heavy (10 % reads). Reported per workload and
//! lock: operations/s (median of the rounds, with min–max), reads/s and writes/s, the wait for
//! the lock (call → grant) of writes (p50, p99, max: a starved writer shows here) and of reads
//! (p99), and Redis commands per operation (critical sections included), then for each lock
//! where they went: calls and server µs per operation of every command, scripts' inner commands
//! under their own names.
//!
//! Checked on every run (the bench aborts loudly otherwise): no write overlapped another hold and
//! no read overlapped a write (an in-process monitor every critical section passes through), and
//! the counter equals the number of writes.
//!
//! `cargo bench --bench rwlock` (3 rounds × 8 runs × 5 s, about 2.5 minutes);
//! `FAIRLOCK_BENCH_QUICK=1` or `-- --quick` for 1 round of 1 s runs; `FAIRLOCK_BENCH_SECS=N`.

// The test kit (testkit/): `RedisServer` (a throw-away redis-server on a free loopback port,
// killed by PID on drop).
use fairlock_testkit as support;

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

const NAME: &str = "bench:rw";
const COUNTER: &str = "bench:rw:counter";
const CONTENDERS: usize = 64;
/// A lock call that takes longer than this aborts the bench (something is stuck).
const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Fair,
    NonFair,
    Rw,
    RwPreferring,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Fair,
        Variant::NonFair,
        Variant::Rw,
        Variant::RwPreferring,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::Fair => "FairLock (mutex)",
            Variant::NonFair => "NonFairLock (mutex)",
            Variant::Rw => "ReadWriteLock",
            Variant::RwPreferring => "ReadWriteLock, writer-preferring",
        }
    }
}

/// What one run measured.
struct Run {
    variant: Variant,
    read_share: f64,
    elapsed: Duration,
    /// Waits for the lock in µs, by kind.
    read_waits: Vec<u64>,
    write_waits: Vec<u64>,
    commands: u64,
    /// The server's counters over the run.
    stats: common::Info,
}

/// Every critical section passes through here: readers count up from 0, a writer sets the sign
/// bit; any other combination is an overlap.
struct Monitor {
    state: AtomicI64,
    broken: AtomicBool,
}

const WRITER: i64 = 1 << 40;

impl Monitor {
    fn enter(&self, write: bool) {
        let before = self
            .state
            .fetch_add(if write { WRITER } else { 1 }, Ordering::SeqCst);
        if (write && before != 0) || (!write && before >= WRITER) {
            self.broken.store(true, Ordering::SeqCst);
        }
    }

    fn leave(&self, write: bool) {
        self.state
            .fetch_sub(if write { WRITER } else { 1 }, Ordering::SeqCst);
    }
}

/// A small xorshift per contender (no dependency for a coin toss).
struct Coin(u64);

impl Coin {
    fn reads(&mut self, share: f64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 <= share
    }
}

async fn take(
    client: &fairlock::Client,
    variant: Variant,
    write: bool,
) -> fairlock::Result<fairlock::LockGuard> {
    match variant {
        Variant::Fair => client.fair_lock(NAME).lock().await,
        Variant::NonFair => client.non_fair_lock(NAME).lock().await,
        Variant::Rw | Variant::RwPreferring => {
            let mut rw = client.read_write_lock(NAME);
            if variant == Variant::RwPreferring {
                rw = rw.writer_preferring();
            }
            if write {
                rw.write_lock().lock().await
            } else {
                rw.read_lock().lock().await
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn contender(
    id: usize,
    client: fairlock::Client,
    mut cs: ConnectionManager,
    variant: Variant,
    read_share: f64,
    until: Instant,
    monitor: Arc<Monitor>,
) -> (Vec<u64>, Vec<u64>, u64) {
    let mut coin =
        Coin(0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    let (mut reads, mut writes, mut written) = (Vec::new(), Vec::new(), 0u64);
    while Instant::now() < until {
        let write = !coin.reads(read_share);
        let asked = Instant::now();
        let guard = tokio::time::timeout(LOCK_TIMEOUT, take(&client, variant, write))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: a lock call took over {LOCK_TIMEOUT:?}",
                    variant.label()
                )
            })
            .expect("lock");
        let waited = asked.elapsed().as_micros() as u64;
        monitor.enter(write);
        let value: i64 = redis::cmd("GET")
            .arg(COUNTER)
            .query_async::<Option<i64>>(&mut cs)
            .await
            .expect("GET")
            .unwrap_or(0);
        if write {
            let _: () = redis::cmd("SET")
                .arg(COUNTER)
                .arg(value + 1)
                .query_async(&mut cs)
                .await
                .expect("SET");
            written += 1;
            writes.push(waited);
        } else {
            reads.push(waited);
        }
        monitor.leave(write);
        guard.unlock().await.expect("unlock");
    }
    (reads, writes, written)
}

async fn run_once(url: &str, variant: Variant, read_share: f64, secs: Duration) -> Run {
    let mut admin = common::admin_conn(url).await;
    common::flush_all(&mut admin).await;
    let clients = [
        fairlock::Client::connect(url).await.expect("client"),
        fairlock::Client::connect(url).await.expect("client"),
    ];
    let monitor = Arc::new(Monitor {
        state: AtomicI64::new(0),
        broken: AtomicBool::new(false),
    });
    let css = common::managers(url, CONTENDERS).await;
    common::reset_stats(&mut admin).await;
    let before = common::info(&mut admin).await;
    let started = Instant::now();
    let until = started + secs;
    let tasks: Vec<_> = css
        .into_iter()
        .enumerate()
        .map(|(i, cs)| {
            tokio::spawn(contender(
                i,
                clients[i % 2].clone(),
                cs,
                variant,
                read_share,
                until,
                monitor.clone(),
            ))
        })
        .collect();
    let (mut read_waits, mut write_waits, mut written) = (Vec::new(), Vec::new(), 0);
    for t in tasks {
        let (r, w, n) = t.await.expect("contender");
        read_waits.extend(r);
        write_waits.extend(w);
        written += n;
    }
    let elapsed = started.elapsed();
    let stats = common::info(&mut admin).await.since(&before);
    assert!(
        !monitor.broken.load(Ordering::SeqCst),
        "{}: two critical sections overlapped that must not",
        variant.label()
    );
    let counter: Option<u64> = redis::cmd("GET")
        .arg(COUNTER)
        .query_async(&mut admin)
        .await
        .expect("GET counter");
    assert_eq!(
        counter.unwrap_or(0),
        written,
        "{}: lost updates",
        variant.label()
    );
    for c in clients {
        c.shutdown().await;
    }
    read_waits.sort_unstable();
    write_waits.sort_unstable();
    Run {
        variant,
        read_share,
        elapsed,
        read_waits,
        write_waits,
        commands: stats.calls_except(&["info", "config|resetstat", "flushall"]),
        stats,
    }
}

fn main() {
    let quick = common::quick();
    let secs = common::run_secs(1.0, 5.0);
    let rounds = if quick { 1 } else { 3 };
    common::header("rwlock", quick);
    println!(
        "C = {CONTENDERS} (two clients, one process), {rounds} rounds × 2 workloads × 4 locks, \
         {secs:?} per run, locks alternating"
    );
    let server = support::RedisServer::start();
    let url = server.url();
    let runs: Vec<Run> = common::runtime().block_on(async {
        let mut runs = Vec::new();
        for round in 0..rounds {
            for share in [0.9, 0.1] {
                // Rotate the order every round so no lock always runs first or last.
                for k in 0..Variant::ALL.len() {
                    let v = Variant::ALL[(k + round) % Variant::ALL.len()];
                    runs.push(run_once(&url, v, share, secs).await);
                }
            }
        }
        runs
    });
    for share in [0.9, 0.1] {
        println!(
            "\n{} ({:.0} % reads):",
            if share > 0.5 {
                "read-heavy"
            } else {
                "write-heavy"
            },
            share * 100.0
        );
        println!(
            "| lock | ops/s (median, min–max) | reads/s | writes/s | write wait p50 / p99 / max ms | read wait p99 ms | cmds/op |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let mut details = Vec::new();
        for v in Variant::ALL {
            let mine: Vec<&Run> = runs
                .iter()
                .filter(|r| r.variant == v && r.read_share == share)
                .collect();
            let rate = |r: &Run, n: usize| n as f64 / r.elapsed.as_secs_f64();
            let mut ops: Vec<f64> = mine
                .iter()
                .map(|r| rate(r, r.read_waits.len() + r.write_waits.len()))
                .collect();
            let (lo, hi) = ops
                .iter()
                .fold((f64::MAX, 0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
            let med = common::median(&mut ops);
            let mut reads: Vec<f64> = mine.iter().map(|r| rate(r, r.read_waits.len())).collect();
            let mut writes: Vec<f64> = mine.iter().map(|r| rate(r, r.write_waits.len())).collect();
            let mut ww: Vec<u64> = mine.iter().flat_map(|r| r.write_waits.clone()).collect();
            let mut rw: Vec<u64> = mine.iter().flat_map(|r| r.read_waits.clone()).collect();
            ww.sort_unstable();
            rw.sort_unstable();
            let ops_total: usize = mine
                .iter()
                .map(|r| r.read_waits.len() + r.write_waits.len())
                .sum();
            let cmds: u64 = mine.iter().map(|r| r.commands).sum();
            let ms = |us: u64| us as f64 / 1000.0;
            println!(
                "| {} | {:.0} ({:.0}–{:.0}) | {:.0} | {:.0} | {:.1} / {:.1} / {:.1} | {:.1} | {:.1} |",
                v.label(),
                med,
                lo,
                hi,
                common::median(&mut reads),
                common::median(&mut writes),
                ms(common::percentile(&ww, 50.0)),
                ms(common::percentile(&ww, 99.0)),
                ms(ww.last().copied().unwrap_or(0)),
                ms(common::percentile(&rw, 99.0)),
                cmds as f64 / ops_total.max(1) as f64
            );
            details.push(format!(
                "commands per op, {} (server µs; critical sections included): {}",
                v.label(),
                common::breakdown(mine.iter().map(|r| &r.stats), ops_total)
            ));
        }
        for line in details {
            println!("{line}");
        }
    }
}
