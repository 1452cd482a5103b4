//! The watchdog at scale: 1, 100, 1,000 and 10,000 locks held at once by one client, renewed by its
//! watchdog. The client is built with `.watchdog_timeout(3 s)`, so a renewal period is 1 s.
//!
//! Each (lock count, variant) runs in a fresh helper process (this binary again, with
//! `FAIRLOCK_BENCH_ROLE=watchdog-worker`), so its CPU time and memory are its own:
//!
//! * **fairlock**: `client.fair_lock(name_i).lock()` for every i, guards kept;
//! * **baseline: a timer per lock**: the same locks written as Redisson's hash (`HSET` +
//!   `PEXPIRE`), each renewed by its own tokio task every period with its own call of a
//!   check-and-`PEXPIRE` script (the shape of a per-lock renewal timer, one script call per lock
//!   per period).
//!
//! Per variant and count, over several whole periods after the first renewals (the window starts
//! half a period after a renewal was seen, so each window edge is half a period from a renewal):
//! script calls (`evalsha` + `eval`) and round trips (`total_reads_processed`) per period, client
//! CPU time per period (`/proc/self/stat` utime + stime), and client memory per held lock (RSS from
//! `/proc/self/statm` before and after acquiring, divided by the count; page-sized steps make the
//! 1-lock figure meaningless).
//!
//! `cargo bench --bench watchdog_scale` (about 70 s); `FAIRLOCK_BENCH_QUICK=1` or `-- --quick` for
//! a one-period window (about 20 s: it still takes and holds 10,000 locks, twice).

// The test kit (testkit/): `RedisServer` (a throw-away redis-server on a free loopback port,
// killed by PID on drop).
use fairlock_testkit as support;

mod common;

use std::time::{Duration, Instant};

const WORKER_ROLE: &str = "watchdog-worker";
const WATCHDOG: Duration = Duration::from_secs(3);
/// The renewal period: a third of the watchdog timeout.
const PERIOD: Duration = Duration::from_secs(1);
const COUNTS: [usize; 4] = [1, 100, 1_000, 10_000];
const HELPER_TIMEOUT: Duration = Duration::from_secs(120);
const BASELINE_FIELD: &str = "5d2c1b0a-9e8f-4a7b-8c6d-5e4f3a2b1c0d:1";

/// Check-and-renew for one lock, as a per-lock renewal timer sends it.
const RENEW_ONE: &str = include_str!("lua/renew_one.lua");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Fairlock,
    TimerPerLock,
}

impl Variant {
    fn arg(self) -> &'static str {
        match self {
            Variant::Fairlock => "fairlock",
            Variant::TimerPerLock => "timer-per-lock",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Fairlock => "fairlock watchdog",
            Variant::TimerPerLock => "baseline: a timer per lock",
        }
    }
}

/// What a helper measured, sent back as one `RESULT` line of `key=value` pairs.
#[derive(Debug, Clone, Default)]
struct Measured {
    count: usize,
    periods: u32,
    script_calls: u64,
    reads: u64,
    cpu_ms: u64,
    rss_before: u64,
    rss_after: u64,
    rss_end: u64,
    acquire_ms: u64,
}

impl Measured {
    fn to_line(&self) -> String {
        format!(
            "RESULT count={} periods={} script_calls={} reads={} cpu_ms={} rss_before={} rss_after={} rss_end={} acquire_ms={}",
            self.count,
            self.periods,
            self.script_calls,
            self.reads,
            self.cpu_ms,
            self.rss_before,
            self.rss_after,
            self.rss_end,
            self.acquire_ms
        )
    }

    fn from_output(out: &str) -> Measured {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .expect("helper printed no RESULT line");
        let mut m = Measured::default();
        for kv in line.split(' ') {
            let (k, v) = kv.split_once('=').expect("key=value");
            let n: u64 = v.parse().expect("number");
            match k {
                "count" => m.count = n as usize,
                "periods" => m.periods = n as u32,
                "script_calls" => m.script_calls = n,
                "reads" => m.reads = n,
                "cpu_ms" => m.cpu_ms = n,
                "rss_before" => m.rss_before = n,
                "rss_after" => m.rss_after = n,
                "rss_end" => m.rss_end = n,
                "acquire_ms" => m.acquire_ms = n,
                _ => {}
            }
        }
        m
    }

    fn per_period(&self, n: u64) -> f64 {
        n as f64 / self.periods as f64
    }

    fn bytes_per_lock(&self, after: u64) -> f64 {
        after.saturating_sub(self.rss_before) as f64 / self.count as f64
    }
}

fn main() {
    match common::role().as_deref() {
        Some(WORKER_ROLE) => common::runtime().block_on(worker()),
        Some(other) => panic!("unknown helper role {other:?}"),
        None => parent(),
    }
}

fn parent() {
    let quick = common::quick();
    // Periods to settle after the last acquisition, and periods measured.
    let (settle, periods) = if quick { (1u32, 1u32) } else { (2, 6) };
    common::header("watchdog_scale", quick);
    println!(
        "held locks {COUNTS:?}, watchdog timeout {WATCHDOG:?} (period {PERIOD:?}), {periods} periods measured after {settle} settling"
    );
    let server = support::RedisServer::start();
    let url = server.url();
    common::runtime().block_on(async {
        let mut results = Vec::new();
        for count in COUNTS {
            for variant in [Variant::Fairlock, Variant::TimerPerLock] {
                let child = common::spawn_self(
                    WORKER_ROLE,
                    &[
                        ("FAIRLOCK_BENCH_URL", url.clone()),
                        ("FAIRLOCK_BENCH_VARIANT", variant.arg().to_owned()),
                        ("FAIRLOCK_BENCH_COUNT", count.to_string()),
                        ("FAIRLOCK_BENCH_SETTLE", settle.to_string()),
                        ("FAIRLOCK_BENCH_PERIODS", periods.to_string()),
                    ],
                );
                let out = common::finish_child(child, HELPER_TIMEOUT, "watchdog helper").await;
                let m = Measured::from_output(&out);
                eprintln!(
                    "  {} × {count}: {:.1} script calls/period, {:.1} ms CPU/period",
                    variant.label(),
                    m.per_period(m.script_calls),
                    m.per_period(m.cpu_ms)
                );
                results.push((variant, m));
            }
        }
        report(&results);
    });
}

fn report(results: &[(Variant, Measured)]) {
    println!();
    println!(
        "| renewer | held locks | script calls/period | round trips/period | client CPU ms/period | RSS bytes/lock after acquiring | RSS bytes/lock at the end | time to acquire all (ms) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (variant, m) in results {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {} |",
            variant.label(),
            m.count,
            m.per_period(m.script_calls),
            m.per_period(m.reads),
            m.per_period(m.cpu_ms),
            m.bytes_per_lock(m.rss_after),
            m.bytes_per_lock(m.rss_end),
            m.acquire_ms,
        );
    }
    println!();
    println!("CPU time has a 10 ms resolution per reading (100 Hz ticks), spread over the measured periods.");
    if let Some((_, m)) = results
        .iter()
        .find(|(v, m)| *v == Variant::Fairlock && m.count == 10_000)
    {
        let checks = [
            (
                "≤ 100 script calls/period",
                m.per_period(m.script_calls) <= 100.0,
            ),
            ("≤ 50 ms CPU/period", m.per_period(m.cpu_ms) <= 50.0),
            ("≤ 1 KiB/lock", m.bytes_per_lock(m.rss_after) <= 1024.0),
        ];
        println!("targets, fairlock × 10000:");
        for (what, ok) in checks {
            println!("  {what}: {}", if ok { "met" } else { "MISSED" });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helper process

fn env<T: std::str::FromStr>(name: &str) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("helper needs {name}"))
}

/// What the helper keeps alive while it measures.
enum Holding {
    Fairlock {
        client: fairlock::Client,
        guards: Vec<fairlock::LockGuard>,
    },
    TimerPerLock {
        tasks: Vec<tokio::task::JoinHandle<()>>,
    },
}

async fn worker() {
    let url: String = env("FAIRLOCK_BENCH_URL");
    let variant: String = env("FAIRLOCK_BENCH_VARIANT");
    let count: usize = env("FAIRLOCK_BENCH_COUNT");
    let settle: u32 = env("FAIRLOCK_BENCH_SETTLE");
    let periods: u32 = env("FAIRLOCK_BENCH_PERIODS");
    let mut admin = common::admin_conn(&url).await;
    common::flush_all(&mut admin).await;
    let names: Vec<String> = (0..count).map(|i| format!("bench:watchdog:{i}")).collect();

    // Connections up and scripts loaded before the first RSS reading.
    let (holding, rss_before, rss_after, acquire_ms) = if variant == Variant::Fairlock.arg() {
        let client = fairlock::Client::builder()
            .standalone(url.as_str())
            .watchdog_timeout(WATCHDOG)
            .build()
            .await
            .expect("connect");
        let warm = client.fair_lock("bench:watchdog:warm-up");
        warm.lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");
        let rss_before = common::rss_bytes();
        let started = Instant::now();
        let mut guards = Vec::with_capacity(count);
        for name in &names {
            guards.push(client.fair_lock(name.as_str()).lock().await.expect("lock"));
        }
        let acquire_ms = started.elapsed().as_millis() as u64;
        let rss_after = common::rss_bytes();
        (
            Holding::Fairlock { client, guards },
            rss_before,
            rss_after,
            acquire_ms,
        )
    } else {
        let mut conn = common::manager(&url).await;
        let renew = redis::Script::new(RENEW_ONE);
        let _: i64 = renew
            .key("bench:watchdog:warm-up")
            .arg(WATCHDOG.as_millis() as u64)
            .arg(BASELINE_FIELD)
            .invoke_async(&mut conn)
            .await
            .expect("renew script");
        let rss_before = common::rss_bytes();
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(count);
        for name in &names {
            let () = redis::pipe()
                .cmd("HSET")
                .arg(name)
                .arg(BASELINE_FIELD)
                .arg(1)
                .ignore()
                .cmd("PEXPIRE")
                .arg(name)
                .arg(WATCHDOG.as_millis() as u64)
                .ignore()
                .query_async(&mut conn)
                .await
                .expect("HSET + PEXPIRE");
            let (mut conn, renew, name) = (conn.clone(), renew.clone(), name.clone());
            tasks.push(tokio::spawn(async move {
                let mut every =
                    tokio::time::interval_at(tokio::time::Instant::now() + PERIOD, PERIOD);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                // Bounded: the helper is ended long before this runs out.
                for _ in 0..10_000 {
                    every.tick().await;
                    let renewed: i64 = renew
                        .key(&name)
                        .arg(WATCHDOG.as_millis() as u64)
                        .arg(BASELINE_FIELD)
                        .invoke_async(&mut conn)
                        .await
                        .expect("renew");
                    assert_eq!(renewed, 1, "baseline lock {name} was lost");
                }
            }));
        }
        let acquire_ms = started.elapsed().as_millis() as u64;
        let rss_after = common::rss_bytes();
        (
            Holding::TimerPerLock { tasks },
            rss_before,
            rss_after,
            acquire_ms,
        )
    };

    // Let every lock pass its first renewal, then start the window half a period after a renewal
    // was seen at the server.
    tokio::time::sleep(PERIOD * settle).await;
    let seen = common::info(&mut admin).await.script_calls();
    let deadline = Instant::now() + PERIOD * 3;
    while common::info(&mut admin).await.script_calls() == seen {
        assert!(Instant::now() < deadline, "no renewal within 3 periods");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(PERIOD / 2).await;
    let before = common::info(&mut admin).await;
    let cpu_before = common::cpu_time();
    tokio::time::sleep(PERIOD * periods).await;
    let cpu = common::cpu_time() - cpu_before;
    let delta = common::info(&mut admin).await.since(&before);
    let rss_end = common::rss_bytes();

    match holding {
        Holding::Fairlock { client, guards } => {
            let lost = guards.iter().filter(|g| g.is_lost()).count();
            assert_eq!(lost, 0, "{lost} of {count} fairlock locks were lost");
            let held: i64 = redis::cmd("EXISTS")
                .arg(&names)
                .query_async(&mut admin)
                .await
                .expect("EXISTS");
            assert_eq!(held as usize, count, "every lock must still exist");
            // The helper ends here; the next one starts with FLUSHALL, so the locks need no
            // release (dropping the guards only queues background releases that the runtime's
            // shutdown cancels).
            drop(guards);
            drop(client);
        }
        Holding::TimerPerLock { tasks } => {
            for t in &tasks {
                assert!(
                    !t.is_finished(),
                    "a baseline renewal task ended (lock lost?)"
                );
            }
            for t in tasks {
                t.abort();
            }
        }
    }
    let m = Measured {
        count,
        periods,
        script_calls: delta.script_calls(),
        // The closing INFO is the one read of the bench itself inside the window.
        reads: delta.reads.saturating_sub(1),
        cpu_ms: cpu.as_millis() as u64,
        rss_before,
        rss_after,
        rss_end,
        acquire_ms,
    };
    println!("{}", m.to_line());
}
