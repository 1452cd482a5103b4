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
//! A second part measures a **heartbeat round**: N fairlock waiters queued (marks in
//! `fairlock_liveness:{NAME}`, scores in the deadline set), and fairlock's heartbeat script
//! (`lua/fair_heartbeat.lua`) refreshing every one of them in batches of 100, as a client's driver
//! does once per period. Depths 100, 1,000 and 3,000; the figure is script time per waiter per
//! round, and the target is that it grows at most 2× from 100 to 3,000 waiters (a round costs
//! O(waiters)). Baseline, same run, interleaved: the same script on waiters whose score is above
//! their mark, as when Redisson waiters may be ahead, which takes the member-by-member count
//! (`LPOS` + `LRANGE` + `ZMSCORE`, O(place) per waiter): the cost every heartbeat had before
//! (issue 21, item 5).
//!
//! `cargo bench --bench queue_depth` (about a minute); `FAIRLOCK_BENCH_QUICK=1` or `-- --quick`
//! for a few seconds.

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

const COUNT_PROLOGUE: &str = include_str!("../lua/count_prologue.lua");
const FAIR_PROLOGUE: &str = include_str!("../lua/fair_prologue.lua");
const RELEASE_PROLOGUE: &str = include_str!("../lua/release_prologue.lua");

/// A fair script composed as `src/scripts.rs` composes it: the count helpers in front, the fair
/// prologue at the script's `-- @prologue` marker (in front when it has none) and, for a release
/// script, the release prologue in front of everything.
fn fair_script(file: &str, release: bool) -> redis::Script {
    let body = match file.split_once("-- @prologue\n") {
        Some((before, after)) => format!("{COUNT_PROLOGUE}\n{before}{FAIR_PROLOGUE}\n{after}"),
        None => format!("{COUNT_PROLOGUE}\n{FAIR_PROLOGUE}\n{file}"),
    };
    if release {
        redis::Script::new(&format!("{RELEASE_PROLOGUE}\n{body}"))
    } else {
        redis::Script::new(&body)
    }
}

const FAIR_ACQUIRE: &str = include_str!("../lua/fair_acquire.lua");
const FAIR_UNLOCK: &str = include_str!("../lua/fair_unlock.lua");
const FAIR_HEARTBEAT: &str = include_str!("../lua/fair_heartbeat.lua");

/// Queue depths of the heartbeat rounds.
const BEAT_DEPTHS: [usize; 3] = [100, 1_000, 3_000];
/// Waiters per heartbeat script call (the client's default batch size).
const BEAT_BATCH: usize = 100;
/// The liveness window the heartbeats use (long, so no mark lapses during the bench).
const BEAT_WINDOW_MS: i64 = 600_000;

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
                    .key(format!("fairlock_grants:{{{name}}}"))
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
                    .arg("") // no direct hand-off asked for
                    .arg(fairlock::DEFAULT_WAITER_LIVENESS.as_millis() as i64)
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
                    .key(format!("fairlock_grants:{{{name}}}"))
                    .key(format!("redisson_lock_token:{{{name}}}"))
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
            fair_acquire: fair_script(FAIR_ACQUIRE, false),
            fair_unlock: fair_script(FAIR_UNLOCK, true),
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

        let beat = fair_script(FAIR_HEARTBEAT, false);
        let (beat_rounds, rounds_per_phase) = if quick { (1, 2) } else { (5, 4) };
        let mut beats = Vec::new();
        for depth in BEAT_DEPTHS {
            for walk in [false, true] {
                fill_beaters(&mut b.conn, depth, walk).await;
                heartbeat_phase(&mut b, &beat, depth, walk, 1).await; // warm-up
            }
        }
        for _ in 0..beat_rounds {
            for depth in BEAT_DEPTHS {
                for walk in [false, true] {
                    beats.push(heartbeat_phase(&mut b, &beat, depth, walk, rounds_per_phase).await);
                }
            }
        }
        report_beats(&beats);
    });
}

/// The lock of a heartbeat phase: its name encodes depth and variant.
fn beat_name(depth: usize, walk: bool) -> String {
    format!("bench:beat:{}:{depth}", if walk { "walk" } else { "fast" })
}

fn beat_field(i: usize) -> String {
    format!("5d2c8e41-7a3b-4f90-9c6e-1b2a3c4d5e6f:-{}", i + 1)
}

/// Holds the lock (so no head is told to take it) and queues `depth` fairlock waiters with fresh
/// marks. `walk`: each score is far above its mark, as when Redisson waiters may be ahead, so
/// every heartbeat counts the unmarked waiters ahead member by member.
async fn fill_beaters(conn: &mut ConnectionManager, depth: usize, walk: bool) {
    let name = beat_name(depth, walk);
    let now = support::server_now_ms_async(conn).await;
    let mark = now + BEAT_WINDOW_MS;
    let score = if walk { mark + FAR_MS } else { mark };
    let mut pipe = redis::pipe();
    pipe.hset(&name, REDISSON_FIELD, 1).ignore();
    pipe.pexpire(&name, 3_600_000).ignore();
    for chunk in (0..depth).collect::<Vec<_>>().chunks(500) {
        let fields: Vec<String> = chunk.iter().map(|&i| beat_field(i)).collect();
        pipe.rpush(support::queue_key(&name), &fields).ignore();
        let scored: Vec<(i64, &String)> = fields.iter().map(|f| (score, f)).collect();
        pipe.zadd_multiple(support::timeout_key(&name), &scored)
            .ignore();
        let marked: Vec<(i64, &String)> = fields.iter().map(|f| (mark, f)).collect();
        pipe.zadd_multiple(support::derived_key("fairlock_liveness", &name), &marked)
            .ignore();
    }
    pipe.pexpire(support::derived_key("fairlock_liveness", &name), 3_600_000)
        .ignore();
    let _: () = pipe.query_async(conn).await.expect("fill the queue");
}

/// One measured heartbeat phase: `rounds` rounds over every waiter of one queue.
struct BeatPhase {
    depth: usize,
    walk: bool,
    rounds: usize,
    usec: u64,
}

impl BeatPhase {
    fn usec_per_waiter(&self) -> f64 {
        self.usec as f64 / (self.rounds * self.depth) as f64
    }
}

async fn heartbeat_phase(
    b: &mut Bench,
    beat: &redis::Script,
    depth: usize,
    walk: bool,
    rounds: usize,
) -> BeatPhase {
    let name = beat_name(depth, walk);
    let channel = support::release_channel(&name);
    common::reset_stats(&mut b.admin).await;
    for _ in 0..rounds {
        for batch in (0..depth).collect::<Vec<_>>().chunks(BEAT_BATCH) {
            let mut call = beat.prepare_invoke();
            call.arg(BEAT_WINDOW_MS)
                .arg("PUBLISH")
                .arg(REDISSON_WAIT_MS);
            for &i in batch {
                call.key(&name)
                    .key(support::queue_key(&name))
                    .key(support::timeout_key(&name))
                    .key(support::derived_key("fairlock_liveness", &name))
                    .key(support::derived_key("fairlock_grants", &name))
                    .key(support::derived_key("redisson_lock_token", &name));
                call.arg(beat_field(i)).arg(&channel);
            }
            let codes: Vec<i64> = call.invoke_async(&mut b.conn).await.expect("heartbeat");
            assert!(
                codes.iter().all(|&c| c == 0 || c == 3),
                "every waiter is still queued behind a held lock: {codes:?}"
            );
        }
    }
    let info = common::info(&mut b.admin).await;
    let len: usize = redis::cmd("LLEN")
        .arg(support::queue_key(&name))
        .query_async(&mut b.conn)
        .await
        .expect("LLEN");
    assert_eq!(len, depth, "no live waiter may be purged");
    BeatPhase {
        depth,
        walk,
        rounds,
        usec: info.cmd("evalsha").usec + info.cmd("eval").usec,
    }
}

fn report_beats(phases: &[BeatPhase]) {
    let per_waiter = |depth: usize, walk: bool| {
        let mut v: Vec<f64> = phases
            .iter()
            .filter(|p| p.depth == depth && p.walk == walk)
            .map(BeatPhase::usec_per_waiter)
            .collect();
        common::median(&mut v)
    };
    println!();
    println!("Heartbeat rounds (batches of {BEAT_BATCH} waiters per script call):");
    println!();
    println!(
        "| waiters queued | fairlock: script µs per waiter per round | script ms per round | score above mark (member count, as before): µs per waiter | ms per round |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for depth in BEAT_DEPTHS {
        let fast = per_waiter(depth, false);
        let walk = per_waiter(depth, true);
        println!(
            "| {depth} | {fast:.2} | {:.1} | {walk:.2} | {:.1} |",
            fast * depth as f64 / 1000.0,
            walk * depth as f64 / 1000.0,
        );
    }
    let (first, last) = (BEAT_DEPTHS[0], BEAT_DEPTHS[BEAT_DEPTHS.len() - 1]);
    let fast_ratio = per_waiter(last, false) / per_waiter(first, false);
    let walk_ratio = per_waiter(last, true) / per_waiter(first, true);
    println!();
    println!(
        "per-waiter cost, depth {last} / depth {first}: fairlock {fast_ratio:.2}, member count {walk_ratio:.2}"
    );
    println!(
        "target: fairlock ratio ≤ 2 (a round is O(waiters)): {}",
        if fast_ratio <= 2.0 { "met" } else { "MISSED" }
    );
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
