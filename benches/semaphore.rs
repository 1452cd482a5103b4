//! Semaphores under contention: C = 64 tasks (two clients, one process) loop acquire one permit →
//! critical section (`GET` of a key: one round trip) → release, on one semaphore of 8 permits.
//!
//! Four semaphores run the same workload in the same run, alternating round by round:
//!
//! * **Semaphore** (`RSemaphore` layout): waiters woken by the release messages;
//! * **ExpirableSemaphore, watchdog**: permits renewed by the client's driver while held;
//! * **ExpirableSemaphore, 30 s lease**: permits that expire on their own;
//! * **polling** (a baseline, what a crate without waiters does): a script takes the permits
//!   when enough are there (`lua/poll_sem_acquire.lua`), retried every 10 ms; `INCRBY` gives
//!   them back.
//!
//! Reported per semaphore: acquisitions/s (median of the rounds, with min–max), the wait for the
//! permits (call → grant: p50, p99, max) and Redis commands per acquisition (the critical
//! section's `GET` included), then for each semaphore where they went: calls and server µs per
//! acquisition of every command, scripts' inner commands under their own names.
//!
//! Checked on every run (the bench aborts loudly otherwise): never more than 8 permits in use (an
//! in-process meter every critical section passes through) and all 8 back at the end.
//!
//! `cargo bench --bench semaphore` (3 rounds × 4 runs × 5 s, about 70 s);
//! `FAIRLOCK_BENCH_QUICK=1` or `-- --quick` for 1 round of 1 s runs; `FAIRLOCK_BENCH_SECS=N`.

// The test kit (testkit/): `RedisServer` (a throw-away redis-server on a free loopback port,
// killed by PID on drop).
use fairlock_testkit as support;

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

const NAME: &str = "bench:sem";
const WORK_KEY: &str = "bench:sem:work";
const CONTENDERS: usize = 64;
const PERMITS: i64 = 8;
const POLL_INTERVAL: Duration = Duration::from_millis(10);
const LEASE: Duration = Duration::from_secs(30);
/// An acquire that takes longer than this aborts the bench (something is stuck).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(60);

/// Takes permits when enough are there (the polling baseline).
const POLL_ACQUIRE: &str = include_str!("lua/poll_sem_acquire.lua");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Plain,
    ExpirableWatchdog,
    ExpirableLease,
    Polling,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Plain,
        Variant::ExpirableWatchdog,
        Variant::ExpirableLease,
        Variant::Polling,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::Plain => "Semaphore",
            Variant::ExpirableWatchdog => "ExpirableSemaphore, watchdog",
            Variant::ExpirableLease => "ExpirableSemaphore, 30 s lease",
            Variant::Polling => "polling (script, retry every 10 ms)",
        }
    }
}

/// What one run measured.
struct Run {
    variant: Variant,
    elapsed: Duration,
    /// Waits for the permit in µs, one per acquisition.
    waits: Vec<u64>,
    commands: u64,
    /// The server's counters over the run.
    stats: common::Info,
}

/// Permits in use as the critical sections see them; `broken` once more than [`PERMITS`].
struct Meter {
    in_use: AtomicI64,
    broken: AtomicBool,
}

impl Meter {
    fn enter(&self) {
        if self.in_use.fetch_add(1, Ordering::SeqCst) + 1 > PERMITS {
            self.broken.store(true, Ordering::SeqCst);
        }
    }

    fn leave(&self) {
        self.in_use.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Permits of one acquisition, however they were taken.
enum Taken {
    Plain(fairlock::Permits),
    Expirable(fairlock::ExpirablePermits),
    Polled,
}

async fn acquire(
    client: &fairlock::Client,
    polls: &mut ConnectionManager,
    variant: Variant,
) -> Taken {
    match variant {
        Variant::Plain => Taken::Plain(client.semaphore(NAME).acquire(1).await.expect("acquire")),
        Variant::ExpirableWatchdog | Variant::ExpirableLease => {
            let lease = (variant == Variant::ExpirableLease).then_some(LEASE);
            let sem = client.expirable_semaphore(NAME);
            Taken::Expirable(sem.acquire(1, lease).await.expect("acquire"))
        }
        Variant::Polling => {
            let script = redis::Script::new(POLL_ACQUIRE);
            loop {
                let taken: i64 = script
                    .key(NAME)
                    .arg(1)
                    .invoke_async(polls)
                    .await
                    .expect("poll acquire");
                if taken == 1 {
                    return Taken::Polled;
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }
}

async fn release(taken: Taken, polls: &mut ConnectionManager) {
    match taken {
        Taken::Plain(p) => {
            p.release().await.expect("release");
        }
        Taken::Expirable(p) => {
            assert_eq!(p.release().await.expect("release"), 1, "a permit expired");
        }
        Taken::Polled => {
            let _: i64 = redis::cmd("INCRBY")
                .arg(NAME)
                .arg(1)
                .query_async(polls)
                .await
                .expect("INCRBY");
        }
    }
}

async fn contender(
    client: fairlock::Client,
    mut polls: ConnectionManager,
    mut cs: ConnectionManager,
    variant: Variant,
    until: Instant,
    meter: Arc<Meter>,
) -> Vec<u64> {
    let mut waits = Vec::new();
    while Instant::now() < until {
        let asked = Instant::now();
        let taken = tokio::time::timeout(ACQUIRE_TIMEOUT, acquire(&client, &mut polls, variant))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: an acquire took over {ACQUIRE_TIMEOUT:?}",
                    variant.label()
                )
            });
        waits.push(asked.elapsed().as_micros() as u64);
        meter.enter();
        let _: Option<String> = redis::cmd("GET")
            .arg(WORK_KEY)
            .query_async(&mut cs)
            .await
            .expect("GET");
        meter.leave();
        release(taken, &mut polls).await;
    }
    waits
}

async fn run_once(url: &str, variant: Variant, secs: Duration) -> Run {
    let mut admin = common::admin_conn(url).await;
    common::flush_all(&mut admin).await;
    let clients = [
        fairlock::Client::connect(url).await.expect("client"),
        fairlock::Client::connect(url).await.expect("client"),
    ];
    // The two kinds keep their available count in the same plain integer.
    let set = clients[0]
        .semaphore(NAME)
        .try_set_permits(PERMITS as u32)
        .await;
    assert!(set.expect("set permits"), "a fresh semaphore");
    let meter = Arc::new(Meter {
        in_use: AtomicI64::new(0),
        broken: AtomicBool::new(false),
    });
    let polls = common::manager(url).await;
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
                clients[i % 2].clone(),
                polls.clone(),
                cs,
                variant,
                until,
                meter.clone(),
            ))
        })
        .collect();
    let mut waits = Vec::new();
    for t in tasks {
        waits.extend(t.await.expect("contender"));
    }
    let elapsed = started.elapsed();
    let stats = common::info(&mut admin).await.since(&before);
    assert!(
        !meter.broken.load(Ordering::SeqCst),
        "{}: more than {PERMITS} permits in use at once",
        variant.label()
    );
    let available: Option<i64> = redis::cmd("GET")
        .arg(NAME)
        .query_async(&mut admin)
        .await
        .expect("GET count");
    assert_eq!(
        available,
        Some(PERMITS),
        "{}: permits lost or made up",
        variant.label()
    );
    for c in clients {
        c.shutdown().await;
    }
    waits.sort_unstable();
    Run {
        variant,
        elapsed,
        waits,
        commands: stats.calls_except(&["info", "config|resetstat", "flushall"]),
        stats,
    }
}

fn main() {
    let quick = common::quick();
    let secs = common::run_secs(1.0, 5.0);
    let rounds = if quick { 1 } else { 3 };
    common::header("semaphore", quick);
    println!(
        "C = {CONTENDERS} (two clients, one process), {PERMITS} permits, {rounds} rounds × 4 \
         semaphores, {secs:?} per run, semaphores alternating"
    );
    let server = support::RedisServer::start();
    let url = server.url();
    let runs: Vec<Run> = common::runtime().block_on(async {
        let mut runs = Vec::new();
        for round in 0..rounds {
            // Rotate the order every round so no semaphore always runs first or last.
            for k in 0..Variant::ALL.len() {
                let v = Variant::ALL[(k + round) % Variant::ALL.len()];
                let run = run_once(&url, v, secs).await;
                eprintln!(
                    "  {} round {round}: {:.0} acquisitions/s, limit and count ok",
                    v.label(),
                    run.waits.len() as f64 / run.elapsed.as_secs_f64()
                );
                runs.push(run);
            }
        }
        runs
    });
    println!(
        "\n| semaphore | acquisitions/s (median, min–max) | wait p50 / p99 / max ms | cmds/acq |"
    );
    println!("|---|---:|---:|---:|");
    let mut details = Vec::new();
    for v in Variant::ALL {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.variant == v).collect();
        let mut rates: Vec<f64> = mine
            .iter()
            .map(|r| r.waits.len() as f64 / r.elapsed.as_secs_f64())
            .collect();
        let (lo, hi) = rates
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        let med = common::median(&mut rates);
        let mut waits: Vec<u64> = mine.iter().flat_map(|r| r.waits.clone()).collect();
        waits.sort_unstable();
        let total: usize = mine.iter().map(|r| r.waits.len()).sum();
        let cmds: u64 = mine.iter().map(|r| r.commands).sum();
        let ms = |us: u64| us as f64 / 1000.0;
        println!(
            "| {} | {:.0} ({:.0}–{:.0}) | {:.1} / {:.1} / {:.1} | {:.1} |",
            v.label(),
            med,
            lo,
            hi,
            ms(common::percentile(&waits, 50.0)),
            ms(common::percentile(&waits, 99.0)),
            ms(waits.last().copied().unwrap_or(0)),
            cmds as f64 / total.max(1) as f64
        );
        details.push(format!(
            "commands per acquisition, {} (server µs; critical sections included): {}",
            v.label(),
            common::breakdown(mine.iter().map(|r| &r.stats), total)
        ));
    }
    for line in details {
        println!("{line}");
    }
}
