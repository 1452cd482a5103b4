//! Server-side cost of one fair acquire + release while N waiters are queued behind the acquirer.
//!
//! Set-up with raw commands: `redisson_lock_queue:{NAME}` gets N fake waiter fields (`RPUSH`) and
//! `redisson_lock_timeout:{NAME}` their deadlines far in the future (`ZADD`). Then, per cycle, a
//! waiter's field goes to the head (`LPUSH` + `ZADD`), fairlock's own acquire script
//! (`lua/fair_acquire.lua`, loaded with `include_str!` exactly as the library loads it) runs as a
//! woken head's attempt does (mode `requeue`) and takes the lock, and fairlock's unlock script
//! releases it. The figure is the `evalsha` time Redis reports in `INFO commandstats` (script run
//! time, the commands the script calls included), per cycle, after `CONFIG RESETSTAT`.
//!
//! The scripts are called directly, as the baseline's are, rather than through a `Client`: a
//! library call that finds its field planted at the head without having queued it takes that
//! entry for one an ended call left behind, drops it and joins at the tail (PROTOCOL 7).
//!
//! Baseline, same run, same depths, interleaved: the same cycle with scripts that behave on the
//! wire as Redisson's fair lock does (our own model of it, `benches/lua/redisson_model_*.lua`),
//! whose acquire shifts the deadline of every queued waiter (`ZRANGE` + one `ZINCRBY` per
//! waiter), the work fairlock's scripts skip (PROTOCOL 7, "O(1) hot path").
//!
//! `cargo bench --bench queue_depth` (about 40 s); `FAIRLOCK_BENCH_QUICK=1` or `-- --quick` for a
//! few seconds.

// The test kit (testkit/): `RedisServer` (a throw-away redis-server on a free loopback port,
// killed by PID on drop).
use fairlock_testkit as support;

mod common;

use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, MultiplexedConnection};

const DEPTHS: [usize; 3] = [1, 100, 1_000];
const LEASE: Duration = Duration::from_secs(30);
/// Redisson's default fair wait (`threadWaitTime`): what its acquire subtracts from every deadline.
const REDISSON_WAIT_MS: i64 = 300_000;
/// A deadline this far ahead never lapses during the bench, even after Redisson's shifts
/// (10^12 ms / 300 000 ms per acquisition = 3.3 million acquisitions).
const FAR_MS: i64 = 1_000_000_000_000;
const REDISSON_FIELD: &str = "0b6e7f9a-8d1c-4c3e-b2a5-9f0e1d2c3b4a:1";
const FAIRLOCK_FIELD: &str = "5d2c8e41-7a3b-4f90-9c6e-1b2a3c4d5e6f:1";

/// fairlock's fair acquire and unlock, composed as `src/scripts.rs` composes them.
const FAIR_ACQUIRE: &str = concat!(
    include_str!("../lua/fair_prologue.lua"),
    "\n",
    include_str!("../lua/fair_acquire.lua")
);
const FAIR_UNLOCK: &str = concat!(
    include_str!("../lua/fair_prologue.lua"),
    "\n",
    include_str!("../lua/fair_unlock.lua")
);

/// A model of Redisson's fair acquire (our own Lua: purge, shift every deadline on a grant).
/// KEYS: name, queue, timeout set; ARGV: lease, field, wait, now.
const REDISSON_ACQUIRE: &str = include_str!("lua/redisson_model_acquire.lua");

/// A model of Redisson's fair unlock (our own Lua: purge, release, tell the head).
/// KEYS: name, queue, timeout set, channel; ARGV: message, lease, field, now.
const REDISSON_UNLOCK: &str = include_str!("lua/redisson_model_unlock.lua");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Fair,
    Redisson,
}

impl Variant {
    fn tag(self) -> &'static str {
        match self {
            Variant::Fair => "fairlock",
            Variant::Redisson => "redisson",
        }
    }
}

/// One lock of the bench: a variant at a depth, each with its own name and queue, so that every
/// (variant, depth) pair can be set up once and then measured in interleaved phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    variant: Variant,
    depth: usize,
}

impl Target {
    fn name(self) -> String {
        format!("bench:depth:{}:{}", self.variant.tag(), self.depth)
    }

    fn queue(self) -> String {
        support::queue_key(&self.name())
    }

    fn deadlines(self) -> String {
        support::timeout_key(&self.name())
    }

    fn channel(self) -> String {
        support::release_channel(&self.name())
    }
}

/// One measured phase: `cycles` acquire + release cycles of one variant at one depth.
struct Phase {
    variant: Variant,
    depth: usize,
    cycles: usize,
    /// `evalsha` + `eval` calls and their total run time, from `INFO commandstats`.
    calls: u64,
    usec: u64,
    /// Client-side wall time of the cycles (set-up commands included).
    wall: Duration,
}

impl Phase {
    fn usec_per_cycle(&self) -> f64 {
        self.usec as f64 / self.cycles as f64
    }
}

struct Bench {
    conn: ConnectionManager,
    admin: MultiplexedConnection,
    acquire: redis::Script,
    unlock: redis::Script,
    fair_acquire: redis::Script,
    fair_unlock: redis::Script,
}

impl Bench {
    /// Queues `target.depth` fake waiters on the target's lock, deadlines far ahead.
    async fn fill(&mut self, target: Target) {
        let far = support::server_now_ms_async(&mut self.conn).await + FAR_MS;
        let fields: Vec<String> = (0..target.depth)
            .map(|i| format!("00000000-0000-4000-8000-{i:012}:{i}"))
            .collect();
        for chunk in fields.chunks(500) {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(target.deadlines());
            for f in chunk {
                zadd.arg(far).arg(f);
            }
            let () = redis::pipe()
                .cmd("RPUSH")
                .arg(target.queue())
                .arg(chunk)
                .ignore()
                .add_command(zadd)
                .ignore()
                .query_async(&mut self.conn)
                .await
                .expect("fill the queue");
        }
    }

    /// Puts `field` at the head of the queue with a far deadline (one round trip).
    async fn push_head(&mut self, target: Target, field: &str, far: i64) {
        let () = redis::pipe()
            .cmd("LPUSH")
            .arg(target.queue())
            .arg(field)
            .ignore()
            .cmd("ZADD")
            .arg(target.deadlines())
            .arg(far)
            .arg(field)
            .ignore()
            .query_async(&mut self.conn)
            .await
            .expect("LPUSH + ZADD");
    }

    async fn cycle(&mut self, target: Target, far: i64) {
        match target.variant {
            Variant::Fair => {
                self.push_head(target, FAIRLOCK_FIELD, far).await;
                let name = target.name();
                let acquired: Vec<i64> = self
                    .fair_acquire
                    .key(&name)
                    .key(target.queue())
                    .key(target.deadlines())
                    .key(format!("fairlock_liveness:{{{name}}}"))
                    .key(format!("redisson_lock_token:{{{name}}}"))
                    .arg(LEASE.as_millis() as i64)
                    .arg(FAIRLOCK_FIELD)
                    .arg(0) // the hold count we believe Redis has
                    .arg("requeue")
                    .arg("0") // not fenced
                    .arg("PUBLISH")
                    .arg(target.channel())
                    .arg(fairlock::DEFAULT_WAITER_LIVENESS.as_millis() as i64)
                    .arg(REDISSON_WAIT_MS)
                    .arg("0") // our call is the one that queued the entry
                    .invoke_async(&mut self.conn)
                    .await
                    .expect("fairlock acquire");
                assert_eq!(acquired, [1, 1, 0], "the head of a free lock acquires");
                let released: Vec<i64> = self
                    .fair_unlock
                    .key(&name)
                    .key(target.queue())
                    .key(target.deadlines())
                    .key(format!("fairlock_liveness:{{{name}}}"))
                    .arg(FAIRLOCK_FIELD)
                    .arg(1) // expected count
                    .arg(1) // release one hold
                    .arg("0") // no attempt of ours lost its reply
                    .arg(-1) // no remaining holds need a TTL
                    .arg("PUBLISH")
                    .arg(target.channel())
                    .invoke_async(&mut self.conn)
                    .await
                    .expect("fairlock unlock");
                assert_eq!(released, [1, 0], "the unlock frees the lock");
            }
            Variant::Redisson => {
                self.push_head(target, REDISSON_FIELD, far).await;
                let now = support::server_now_ms_async(&mut self.conn).await;
                let acquired: Option<i64> = self
                    .acquire
                    .key(target.name())
                    .key(target.queue())
                    .key(target.deadlines())
                    .arg(LEASE.as_millis() as i64)
                    .arg(REDISSON_FIELD)
                    .arg(REDISSON_WAIT_MS)
                    .arg(now)
                    .invoke_async(&mut self.conn)
                    .await
                    .expect("Redisson acquire");
                assert_eq!(acquired, None, "the Redisson-style acquire must succeed");
                let released: Option<i64> = self
                    .unlock
                    .key(target.name())
                    .key(target.queue())
                    .key(target.deadlines())
                    .key(target.channel())
                    .arg(0)
                    .arg(LEASE.as_millis() as i64)
                    .arg(REDISSON_FIELD)
                    .arg(now)
                    .invoke_async(&mut self.conn)
                    .await
                    .expect("Redisson unlock");
                assert_eq!(released, Some(1), "the Redisson-style unlock must release");
            }
        }
    }

    async fn phase(&mut self, target: Target, cycles: usize) -> Phase {
        let Target { variant, depth } = target;
        let far = support::server_now_ms_async(&mut self.conn).await + FAR_MS;
        common::reset_stats(&mut self.admin).await;
        let started = Instant::now();
        for _ in 0..cycles {
            self.cycle(target, far).await;
        }
        let wall = started.elapsed();
        let info = common::info(&mut self.admin).await;
        let len: usize = redis::cmd("LLEN")
            .arg(target.queue())
            .query_async(&mut self.conn)
            .await
            .expect("LLEN");
        assert_eq!(len, depth, "the queue must keep its {depth} waiters");
        let calls = info.script_calls();
        assert_eq!(
            calls,
            2 * cycles as u64,
            "{variant:?}: expected one acquire and one unlock script per cycle"
        );
        Phase {
            variant,
            depth,
            cycles,
            calls,
            usec: info.cmd("evalsha").usec + info.cmd("eval").usec,
            wall,
        }
    }
}

fn main() {
    let quick = common::quick();
    let (rounds, cycles) = if quick { (1, 200) } else { (10, 800) };
    common::header("queue_depth", quick);
    println!(
        "depths {DEPTHS:?}, {rounds} rounds × {cycles} cycles per (lock, depth); every round measures every (lock, depth) once"
    );
    let server = support::RedisServer::start();
    let url = server.url();
    common::runtime().block_on(async {
        let mut b = Bench {
            conn: common::manager(&url).await,
            admin: common::admin_conn(&url).await,
            acquire: redis::Script::new(REDISSON_ACQUIRE),
            unlock: redis::Script::new(REDISSON_UNLOCK),
            fair_acquire: redis::Script::new(FAIR_ACQUIRE),
            fair_unlock: redis::Script::new(FAIR_UNLOCK),
        };
        common::flush_all(&mut b.admin).await;
        let targets: Vec<Target> = DEPTHS
            .iter()
            .flat_map(|&depth| {
                [Variant::Fair, Variant::Redisson].map(|variant| Target { variant, depth })
            })
            .collect();
        for &t in &targets {
            b.fill(t).await;
            // Warm-up (script cache, connections) outside the counted phases.
            b.phase(t, 20).await;
        }
        // Every round measures every (variant, depth) once, so drift of the machine over the
        // run hits all of them alike.
        let mut phases = Vec::new();
        for _ in 0..rounds {
            for &t in &targets {
                phases.push(b.phase(t, cycles).await);
            }
        }
        report(&phases);
    });
}

/// Median of the per-phase µs per cycle of one variant at one depth.
fn usec(phases: &[Phase], variant: Variant, depth: usize) -> f64 {
    let mut v: Vec<f64> = phases
        .iter()
        .filter(|p| p.variant == variant && p.depth == depth)
        .map(Phase::usec_per_cycle)
        .collect();
    common::median(&mut v)
}

fn wall_us(phases: &[Phase], variant: Variant, depth: usize) -> f64 {
    let mine: Vec<&Phase> = phases
        .iter()
        .filter(|p| p.variant == variant && p.depth == depth)
        .collect();
    let cycles: usize = mine.iter().map(|p| p.cycles).sum();
    common::us(mine.iter().map(|p| p.wall).sum()) / cycles as f64
}

fn report(phases: &[Phase]) {
    println!();
    println!(
        "| waiters queued | fairlock: script µs per acquire+release | µs per script call | Redisson-style: script µs per acquire+release | Redisson-style / fairlock | fairlock wall µs per cycle (set-up included) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for depth in DEPTHS {
        let fair = usec(phases, Variant::Fair, depth);
        let redisson = usec(phases, Variant::Redisson, depth);
        let calls_per_cycle = phases
            .iter()
            .find(|p| p.variant == Variant::Fair)
            .map_or(2.0, |p| p.calls as f64 / p.cycles as f64);
        println!(
            "| {depth} | {fair:.1} | {:.1} | {redisson:.1} | {:.1} | {:.0} |",
            fair / calls_per_cycle,
            redisson / fair,
            wall_us(phases, Variant::Fair, depth),
        );
    }
    let first = DEPTHS[0];
    let last = DEPTHS[DEPTHS.len() - 1];
    let fair_ratio = usec(phases, Variant::Fair, last) / usec(phases, Variant::Fair, first);
    let redisson_ratio =
        usec(phases, Variant::Redisson, last) / usec(phases, Variant::Redisson, first);
    println!();
    println!("ratio depth {last} / depth {first}: fairlock {fair_ratio:.2}, Redisson-style {redisson_ratio:.2}");
    println!(
        "target: fairlock ratio ≤ 2: {}",
        if fair_ratio <= 2.0 { "met" } else { "MISSED" }
    );
}
