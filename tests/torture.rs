//! The seeded torture test: several client processes (this test binary, re-executed), a
//! Redisson-protocol peer and injected faults hammer a few lock names; every process records what
//! it did, the parent snapshots the fair queues, and a checker verifies mutual exclusion, fencing
//! order, FIFO, bounded waits and, at the end, that nothing is left behind in Redis.
//!
//! Environment (all optional):
//! * `FAIRLOCK_TORTURE_SEED=<n>`: the seed of `torture_fresh_seed` (else a random one, printed).
//! * `FAIRLOCK_TORTURE_SECS=<n>`: seconds of load per seed (default 12).
//! * `FAIRLOCK_TORTURE_FAULTS=all|none|<kinds>`: comma-separated fault kinds from `sigstop`,
//!   `sigkill`, `clientkill`, `pause`, `sleep`, `scriptflush`, `restart`, `proxy` (default all).
//! * `FAIRLOCK_TORTURE_OPS=all|<kinds>`: client operations from `lock`, `lease`, `try`, `try0`,
//!   `cancel`, `reenter`, `drop`, `droprelock`, `longhold`, `shared`, `shutdown`, `java`, `plain`,
//!   `fair` (default all). `cancel` drops pending futures at random points; `java` adds the
//!   Redisson-protocol peer; `plain` / `fair` choose the lock kinds in use.
//! * `FAIRLOCK_TORTURE_CHILDREN=<n>`: client processes (default 3, at least 3 in CI).
//!
//! CI runs `torture_seed_1..3` (fixed seeds) and `torture_fresh_seed` one after the other,
//! about 15 s each (12 s of load, then teardown and the check), with every operation and every
//! fault kind on. The long run `benches/README.md` reports: `FAIRLOCK_TORTURE_SECS=1800 cargo
//! nextest run --all-features --profile long --test torture torture_fresh_seed --no-capture` (the
//! `long` profile lifts the default profile's 3-minute limit).
//!
//! A failing run prints its seed, each broken rule with the calls that show it and the history
//! around them. Replay: `FAIRLOCK_TORTURE_SEED=<n> cargo nextest run --test torture
//! torture_fresh_seed` (the schedule of operations and faults is the seed's; the interleaving of
//! processes is the machine's, so a replay makes the same kind of trouble, not the same trace).

use fairlock_testkit as support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{Client, FairLock, Lock, LockGuard};
use support::history::{
    self, epoch_ms, mono_ns, Event, Fault, History, InstantClock, Outcome, Params, Scope, Snapshot,
};
use support::redisson_peer::{splitmix, PeerConfig, RedissonPeer, Sink, Wait};
use support::{Proxy, RedisServer};
use tracing::Instrument;

const ROLE_ENV: &str = "FAIRLOCK_TORTURE_ROLE";

/// Seeds CI runs every time (a failure names the seed; new finds can be added here).
const FIXED_SEEDS: [u64; 3] = [0x5eed_0001, 0x5eed_0002, 0x5eed_0003];

// ---------------------------------------------------------------------------------------------
// Timing shared by parent and children.

/// Short timings so a lot happens per second.
#[derive(Debug, Clone, Copy)]
struct Timing {
    watchdog: Duration,
    liveness: Duration,
    tick: Duration,
    command_timeout: Duration,
}

const TIMING: Timing = Timing {
    watchdog: Duration::from_millis(1000),
    liveness: Duration::from_millis(1000),
    tick: Duration::from_millis(10),
    command_timeout: Duration::from_millis(300),
};

fn peer_config() -> PeerConfig {
    PeerConfig {
        watchdog: Duration::from_millis(1000),
        renew_every: Duration::from_millis(333),
        lock_wait: Duration::from_millis(300_000),
        command_timeout: Duration::from_millis(500),
        min_poll: Duration::from_millis(5),
        abandon_limit: Duration::from_millis(1500),
    }
}

const FAIR_NAMES: [&str; 2] = ["torture-fair-a", "torture-fair-b"];
const PLAIN_NAMES: [&str; 1] = ["torture-plain"];

// ---------------------------------------------------------------------------------------------
// A small seeded random generator (splitmix64).

#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(splitmix(seed))
    }

    fn next(&mut self) -> u64 {
        self.0 = splitmix(self.0);
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// Selections from the environment.

const ALL_FAULTS: [&str; 8] = [
    "sigstop",
    "sigkill",
    "clientkill",
    "pause",
    "sleep",
    "scriptflush",
    "restart",
    "proxy",
];
const ALL_OPS: [&str; 14] = [
    "lock",
    "lease",
    "try",
    "try0",
    "cancel",
    "reenter",
    "drop",
    "droprelock",
    "longhold",
    "shared",
    "shutdown",
    "java",
    "plain",
    "fair",
];

fn selection(var: &str, all: &[&str]) -> HashSet<String> {
    let raw = std::env::var(var).unwrap_or_else(|_| "all".into());
    let raw = raw.trim();
    if raw == "all" || raw.is_empty() {
        return all.iter().map(|s| s.to_string()).collect();
    }
    if raw == "none" {
        return HashSet::new();
    }
    let picked: HashSet<String> = raw.split(',').map(|s| s.trim().to_owned()).collect();
    for p in &picked {
        assert!(
            all.contains(&p.as_str()),
            "{var}: unknown kind {p:?}; known: {all:?}"
        );
    }
    picked
}

fn env_u64(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var}={v:?} is not a number"))
        })
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Child process: many tasks doing random lock operations, recording every event.

/// Writes events, one line per `write`, so a killed process leaves whole lines behind.
struct Recorder {
    file: Mutex<File>,
}

impl Recorder {
    fn log(&self, ev: Event) {
        let mut line = ev.to_line();
        line.push('\n');
        let _ = self.file.lock().unwrap().write_all(line.as_bytes());
    }
}

/// The id of the call a `torture_call` span stands for.
struct CallId(String);

/// Turns the library's `queued` event (its attempt joined a fair queue; emitted inside the call's
/// own future, never by an attempt a dropped call abandoned) into an [`Event::Joined`] of the
/// call whose `torture_call` span encloses it.
struct JoinLog(Arc<Recorder>);

/// Reads a span's `id` field.
struct IdField(Option<String>);

impl tracing::field::Visit for IdField {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "id" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

/// Whether an event's message is `queued`.
struct QueuedMessage(bool);

impl tracing::field::Visit for QueuedMessage {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}") == "queued" {
            self.0 = true;
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for JoinLog
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() != "torture_call" {
            return;
        }
        let mut call = IdField(None);
        attrs.record(&mut call);
        if let (Some(call), Some(span)) = (call.0, ctx.span(id)) {
            span.extensions_mut().insert(CallId(call));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let t = mono_ns();
        let mut queued = QueuedMessage(false);
        event.record(&mut queued);
        if !queued.0 {
            return;
        }
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(CallId(id)) = span.extensions().get::<CallId>() {
                self.0.log(Event::Joined { id: id.clone(), t });
                return;
            }
        }
    }
}

#[derive(Clone)]
enum Handle {
    Fair(FairLock),
    Plain(Lock),
}

impl Handle {
    fn new(client: &Client, name: &str, fair: bool, holder: Option<i64>) -> Handle {
        if fair {
            let mut l = client.fair_lock(name).fenced();
            if let Some(h) = holder {
                l = l.holder(h);
            }
            Handle::Fair(l)
        } else {
            let mut l = client.lock(name).fenced();
            if let Some(h) = holder {
                l = l.holder(h);
            }
            Handle::Plain(l)
        }
    }

    fn is_fair(&self) -> bool {
        matches!(self, Handle::Fair(_))
    }

    fn name(&self) -> &str {
        match self {
            Handle::Fair(l) => l.name(),
            Handle::Plain(l) => l.name(),
        }
    }

    async fn run(&self, acq: &Acq) -> fairlock::Result<Option<LockGuard>> {
        match (self, acq.kind) {
            (Handle::Fair(l), AcqKind::Lock) => l.lock().await.map(Some),
            (Handle::Plain(l), AcqKind::Lock) => l.lock().await.map(Some),
            (Handle::Fair(l), AcqKind::Lease(d)) => l.lock_with_lease(d).await.map(Some),
            (Handle::Plain(l), AcqKind::Lease(d)) => l.lock_with_lease(d).await.map(Some),
            (Handle::Fair(l), AcqKind::Try(w, d)) => l.try_lock(w, d).await,
            (Handle::Plain(l), AcqKind::Try(w, d)) => l.try_lock(w, d).await,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum AcqKind {
    Lock,
    Lease(Duration),
    Try(Duration, Option<Duration>),
}

/// One acquisition call: what it asks for, and when the caller drops it (if ever).
#[derive(Debug, Clone, Copy)]
struct Acq {
    kind: AcqKind,
    cancel_after: Option<Duration>,
}

impl Acq {
    fn op(&self) -> &'static str {
        match self.kind {
            AcqKind::Lock => "lock",
            AcqKind::Lease(_) => "lock_with_lease",
            AcqKind::Try(w, _) if w.is_zero() => "try_lock0",
            AcqKind::Try(..) => "try_lock",
        }
    }

    fn wait_ms(&self) -> Option<u64> {
        match self.kind {
            AcqKind::Try(w, _) => Some(w.as_millis() as u64),
            _ => None,
        }
    }

    fn lease_ms(&self) -> Option<u64> {
        match self.kind {
            AcqKind::Lease(d) | AcqKind::Try(_, Some(d)) => Some(d.as_millis() as u64),
            _ => None,
        }
    }
}

struct ChildCtx {
    proc: String,
    url: String,
    ops: HashSet<String>,
    log: Arc<Recorder>,
    clock: InstantClock,
    /// The current client and its id (`<proc>.c<generation>`).
    client: tokio::sync::RwLock<(Client, String)>,
    generation: AtomicU32,
    shutting_down: AtomicBool,
    stopping: AtomicBool,
    next_call: AtomicU64,
    counts: Mutex<BTreeMap<String, u64>>,
}

impl ChildCtx {
    fn has(&self, op: &str) -> bool {
        self.ops.contains(op)
    }

    fn count(&self, what: &str) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry(what.to_owned())
            .or_default() += 1;
    }

    async fn current(&self) -> (Client, String) {
        let c = self.client.read().await;
        (c.0.clone(), c.1.clone())
    }

    fn anomaly(&self, what: String) {
        self.log.log(Event::Anomaly {
            proc: self.proc.clone(),
            t: mono_ns(),
            what,
        });
    }

    /// Runs one acquisition call and records it. `Some((guard, call id))` when granted.
    #[allow(clippy::too_many_arguments)]
    async fn acquire(
        &self,
        client: &(Client, String),
        h: &Handle,
        holder: i64,
        shared: bool,
        reentrant: bool,
        acq: Acq,
    ) -> (Option<(LockGuard, String)>, Outcome) {
        let id = format!(
            "{}.{}",
            self.proc,
            self.next_call.fetch_add(1, Ordering::SeqCst)
        );
        let field = format!("{}:{holder}", client.0.id());
        self.log.log(Event::Call {
            id: id.clone(),
            proc: self.proc.clone(),
            client: client.1.clone(),
            name: h.name().to_owned(),
            fair: h.is_fair(),
            field: field.clone(),
            op: acq.op().to_owned(),
            wait_ms: acq.wait_ms(),
            lease_ms: acq.lease_ms(),
            t: mono_ns(),
            shared,
            reentrant,
            java: false,
        });
        self.count(&format!("call {}", acq.op()));
        let run = h
            .run(&acq)
            .instrument(tracing::info_span!("torture_call", id = %id));
        let result = match acq.cancel_after {
            Some(d) => tokio::time::timeout(d, run).await.ok(),
            None => Some(run.await),
        };
        let t = mono_ns();
        let (outcome, guard, detail) = match result {
            None => (Outcome::Cancelled, None, String::new()),
            Some(Ok(Some(g))) => (Outcome::Granted, Some(g), String::new()),
            Some(Ok(None)) => (Outcome::TimedOut, None, String::new()),
            Some(Err(e)) if e.is_shutdown() => (Outcome::Shutdown, None, String::new()),
            Some(Err(e)) => (Outcome::Error, None, format!("{e}")),
        };
        self.count(&format!(
            "outcome {}",
            format!("{outcome:?}").to_lowercase()
        ));
        let (token, vu) = match &guard {
            Some(g) => (g.fencing_token(), Some(self.clock.ns(g.valid_until()))),
            None => (None, None),
        };
        self.log.log(Event::End {
            id: id.clone(),
            t,
            outcome,
            token,
            vu,
            detail,
        });
        if let Some(g) = &guard {
            if g.owner_field() != field {
                self.anomaly(format!(
                    "call {id}: guard owner field {} but the caller's field is {field}",
                    g.owner_field()
                ));
            }
            if g.fencing_token().is_none() {
                self.anomaly(format!("call {id}: a fenced guard without a token"));
            }
        }
        (guard.map(|g| (g, id)), outcome)
    }

    /// Holds for `d` (the critical section), watching `lost()`.
    async fn hold(&self, guard: &LockGuard, id: &str, d: Duration, lost_logged: &mut bool) {
        if *lost_logged {
            tokio::time::sleep(d).await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            reason = guard.lost() => {
                self.log.log(Event::Lost { id: id.to_owned(), t: mono_ns(), reason: format!("{reason:?}") });
                self.count("lost");
                *lost_logged = true;
                // The rest of the critical section is not trusted any more; finish it anyway.
                tokio::time::sleep(d / 4).await;
            }
        }
    }

    async fn release(&self, guard: LockGuard, id: &str, by_drop: bool, lost_logged: bool) {
        let vu = self.clock.ns(guard.valid_until());
        let lost = guard.is_lost();
        if lost && !lost_logged {
            self.log.log(Event::Lost {
                id: id.to_owned(),
                t: mono_ns(),
                reason: "seen-at-release".into(),
            });
        }
        self.log.log(Event::Release {
            id: id.to_owned(),
            t: mono_ns(),
            vu,
            how: if by_drop { "drop" } else { "unlock" }.into(),
            lost,
        });
        if by_drop {
            self.count("release drop");
            drop(guard);
        } else {
            self.count("release unlock");
            let r = guard.unlock().await;
            let result = match r {
                Ok(()) => "ok".to_owned(),
                Err(e) if e.is_not_held() => "notheld".to_owned(),
                Err(e) => format!("err:{e}"),
            };
            self.log.log(Event::Released {
                id: id.to_owned(),
                t: mono_ns(),
                result,
            });
        }
    }

    /// Shuts the current client down and builds the next one (other tasks see `Shutdown`).
    async fn replace_client(&self) {
        if self.shutting_down.swap(true, Ordering::SeqCst) {
            return;
        }
        self.count("shutdown");
        let mut slot = self.client.write().await;
        self.log.log(Event::Shutdown {
            client: slot.1.clone(),
            t: mono_ns(),
        });
        slot.0.shutdown().await;
        let g = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *slot = (build_client(&self.url).await, format!("{}.c{g}", self.proc));
        self.shutting_down.store(false, Ordering::SeqCst);
    }
}

async fn build_client(url: &str) -> Client {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match Client::builder()
            .standalone(url)
            .watchdog_timeout(TIMING.watchdog)
            .waiter_liveness(TIMING.liveness)
            .timer_tick(TIMING.tick)
            .command_timeout(TIMING.command_timeout)
            .build()
            .await
        {
            Ok(c) => return c,
            Err(e) if Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot build a client for {url}: {e}"),
        }
    }
}

/// A random acquisition from the enabled kinds.
fn random_acq(rng: &mut Rng, ctx: &ChildCtx) -> Acq {
    let mut kinds = Vec::new();
    for k in ["lock", "lease", "try", "try0"] {
        if ctx.has(k) {
            kinds.push(k);
        }
    }
    if kinds.is_empty() {
        kinds.push("try");
    }
    let lease = |rng: &mut Rng| {
        if rng.chance(0.5) {
            None
        } else {
            Some(rng.ms(60, 1200))
        }
    };
    let kind = match *rng.pick(&kinds) {
        "lock" => AcqKind::Lock,
        "lease" => AcqKind::Lease(rng.ms(60, 1200)),
        "try0" => AcqKind::Try(Duration::ZERO, lease(rng)),
        _ => AcqKind::Try(rng.ms(1, 400), lease(rng)),
    };
    let unbounded = matches!(kind, AcqKind::Lock | AcqKind::Lease(_));
    let cancel_after = if unbounded {
        // An unbounded wait is always bounded by the caller here: a `timeout()` retry loop.
        Some(if ctx.has("cancel") && rng.chance(0.25) {
            rng.ms(0, 6) // drops the future in the middle of its first round trip
        } else {
            rng.ms(50, 2500)
        })
    } else if ctx.has("cancel") && rng.chance(0.15) {
        Some(rng.ms(0, 300))
    } else {
        None
    };
    Acq { kind, cancel_after }
}

async fn task_loop(ctx: Arc<ChildCtx>, task_no: usize, seed: u64, shared_holder: Option<i64>) {
    let mut rng = Rng::new(seed);
    let mut names: Vec<(&str, bool)> = Vec::new();
    if ctx.has("fair") {
        names.extend(FAIR_NAMES.iter().map(|n| (*n, true)));
    }
    if ctx.has("plain") {
        names.extend(PLAIN_NAMES.iter().map(|n| (*n, false)));
    }
    while !ctx.stopping.load(Ordering::SeqCst) {
        if task_no == 0 && ctx.has("shutdown") && rng.chance(0.004) {
            ctx.replace_client().await;
            continue;
        }
        let client = ctx.current().await;
        let (name, fair) = *rng.pick(&names);
        let holder = shared_holder.unwrap_or_else(|| {
            tokio::task::id()
                .to_string()
                .parse::<i64>()
                .expect("a numeric task id")
        });
        let shared = shared_holder.is_some();
        let h = Handle::new(&client.0, name, fair, shared_holder);
        // A `timeout()` retry loop around unbounded waits; a single call otherwise.
        let acq = random_acq(&mut rng, &ctx);
        let attempts = if acq.cancel_after.is_some() && rng.chance(0.6) {
            1 + rng.below(4)
        } else {
            1
        };
        let mut granted = None;
        for _ in 0..attempts {
            let (g, outcome) = ctx.acquire(&client, &h, holder, shared, false, acq).await;
            if g.is_some() || outcome != Outcome::Cancelled || ctx.stopping.load(Ordering::SeqCst) {
                granted = g;
                break;
            }
        }
        let Some((guard, id)) = granted else {
            continue;
        };
        let mut lost = false;
        let lease = acq.lease_ms().map(Duration::from_millis);
        let hold_for = if ctx.has("longhold") && rng.chance(0.06) {
            // Past the lease (or a few renewals), so leases run out and renewals cross releases.
            lease.unwrap_or(TIMING.watchdog) + rng.ms(0, 400)
        } else {
            rng.ms(0, 25)
        };
        ctx.hold(&guard, &id, hold_for, &mut lost).await;
        // Re-entry by the same holder with another lease.
        if ctx.has("reenter") && rng.chance(0.15) {
            let inner_acq = Acq {
                kind: match rng.below(3) {
                    0 => AcqKind::Try(rng.ms(0, 50), Some(rng.ms(50, 900))),
                    1 => AcqKind::Try(Duration::ZERO, None),
                    _ => AcqKind::Lease(rng.ms(50, 900)),
                },
                cancel_after: Some(rng.ms(100, 600)),
            };
            let (inner, _) = ctx
                .acquire(&client, &h, holder, shared, true, inner_acq)
                .await;
            if let Some((ig, iid)) = inner {
                ctx.count("reentered");
                let mut ilost = false;
                ctx.hold(&ig, &iid, rng.ms(0, 15), &mut ilost).await;
                let by_drop = ctx.has("drop") && rng.chance(0.5);
                ctx.release(ig, &iid, by_drop, ilost).await;
            }
            ctx.hold(&guard, &id, rng.ms(0, 10), &mut lost).await;
        }
        let relock = ctx.has("droprelock") && rng.chance(0.2);
        let by_drop = relock || (ctx.has("drop") && rng.chance(0.5));
        ctx.release(guard, &id, by_drop, lost).await;
        if relock {
            // drop(guard); lock again at once: must behave as unlock-then-lock.
            ctx.count("drop-then-relock");
            let again = Acq {
                kind: if rng.chance(0.5) {
                    AcqKind::Lock
                } else {
                    AcqKind::Try(rng.ms(0, 300), None)
                },
                cancel_after: Some(rng.ms(200, 2000)),
            };
            let (g, _) = ctx.acquire(&client, &h, holder, shared, false, again).await;
            if let Some((g, id)) = g {
                let mut lost = false;
                ctx.hold(&g, &id, rng.ms(0, 20), &mut lost).await;
                let by_drop = rng.chance(0.5);
                ctx.release(g, &id, by_drop, lost).await;
            }
        }
    }
}

/// Records runtime stalls: a 5 ms timer that fires much later than asked.
async fn lag_probe(ctx: Arc<ChildCtx>) {
    while !ctx.stopping.load(Ordering::SeqCst) {
        let t0 = mono_ns();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t1 = mono_ns();
        if t1 - t0 > 60_000_000 {
            ctx.log.log(Event::Lag {
                proc: ctx.proc.clone(),
                t0,
                t1,
            });
        }
    }
}

/// The child's main: runs until its stdin closes, then stops its tasks, shuts down and exits.
fn child_main() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("child: {k} unset"));
    let proc = var("FAIRLOCK_TORTURE_PROC");
    let url = var("FAIRLOCK_TORTURE_URL");
    let seed: u64 = var("FAIRLOCK_TORTURE_CHILD_SEED").parse().unwrap();
    let flavour = var("FAIRLOCK_TORTURE_FLAVOUR");
    let tasks: usize = var("FAIRLOCK_TORTURE_TASKS").parse().unwrap();
    let ops: HashSet<String> = var("FAIRLOCK_TORTURE_CHILD_OPS")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let log = File::options()
        .create(true)
        .append(true)
        .open(var("FAIRLOCK_TORTURE_LOG"))
        .unwrap();
    let log = Arc::new(Recorder {
        file: Mutex::new(log),
    });
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let joins = JoinLog(log.clone()).with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("fairlock", tracing::Level::DEBUG)
                .with_target("torture", tracing::Level::INFO),
        );
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(joins))
            .expect("the child sets up tracing once");
    }
    let rt = if flavour == "current" {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let code = rt.block_on(async move {
        let client = build_client(&url).await;
        let ctx = Arc::new(ChildCtx {
            proc: proc.clone(),
            url: url.clone(),
            ops,
            log: log.clone(),
            clock: InstantClock::new(),
            client: tokio::sync::RwLock::new((client, format!("{proc}.c0"))),
            generation: AtomicU32::new(0),
            shutting_down: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            next_call: AtomicU64::new(1),
            counts: Mutex::new(BTreeMap::new()),
        });
        let stop = Arc::new(tokio::sync::Notify::new());
        {
            // Stdin closing is the signal to stop.
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sink = String::new();
                let _ = std::io::stdin().read_line(&mut sink);
                stop.notify_one();
            });
        }
        let shared_holder = 7_000_000 + (seed % 1000) as i64;
        let mut handles = Vec::new();
        for t in 0..tasks {
            let holder = (ctx.has("shared") && t < 2).then_some(shared_holder);
            handles.push(tokio::spawn(task_loop(
                ctx.clone(),
                t,
                splitmix(seed ^ (t as u64 + 1)),
                holder,
            )));
        }
        let probe = tokio::spawn(lag_probe(ctx.clone()));
        println!("READY");
        stop.notified().await;
        ctx.stopping.store(true, Ordering::SeqCst);
        let mut stuck = 0;
        for h in handles {
            match tokio::time::timeout(Duration::from_secs(30), h).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    ctx.anomaly(format!("a task panicked: {e}"));
                    stuck += 1;
                }
                Err(_) => {
                    ctx.anomaly("a task did not finish within 30 s of the stop".into());
                    stuck += 1;
                }
            }
        }
        probe.abort();
        let (client, _) = ctx.current().await;
        if tokio::time::timeout(Duration::from_secs(10), client.shutdown())
            .await
            .is_err()
        {
            ctx.anomaly("client.shutdown() did not return within 10 s".into());
        }
        let counts = ctx.counts.lock().unwrap().clone();
        let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("COUNTS {}", summary.join(";").replace(' ', "_"));
        if stuck > 0 {
            3
        } else {
            0
        }
    });
    std::process::exit(code);
}

// ---------------------------------------------------------------------------------------------
// Parent: processes, proxies, the monitor, the peer, faults, teardown and the check.

struct ChildProc {
    proc: String,
    child: Child,
    pid: u32,
    proxy: Option<Proxy>,
    log: PathBuf,
    alive: bool,
    counts: Arc<Mutex<String>>,
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

struct Spawner {
    test: String,
    server_port: u16,
    dir: PathBuf,
    seed: u64,
    ops: String,
    next: usize,
}

impl Spawner {
    fn spawn(&mut self, tasks: usize) -> ChildProc {
        let i = self.next;
        self.next += 1;
        let proc = format!("p{i}");
        // Child 0 talks to Redis directly; the others each through their own proxy.
        let proxy = (!i.is_multiple_of(3)).then(|| Proxy::start(self.server_port));
        let url = match &proxy {
            Some(p) => p.url(),
            None => format!("redis://127.0.0.1:{}", self.server_port),
        };
        let log = self.dir.join(format!("{proc}.events"));
        let flavour = if i.is_multiple_of(2) {
            "current"
        } else {
            "multi"
        };
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([&self.test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, "child")
            .env("FAIRLOCK_TORTURE_PROC", &proc)
            .env("FAIRLOCK_TORTURE_URL", &url)
            .env(
                "FAIRLOCK_TORTURE_CHILD_SEED",
                splitmix(self.seed ^ (0x100 + i as u64)).to_string(),
            )
            .env("FAIRLOCK_TORTURE_FLAVOUR", flavour)
            .env("FAIRLOCK_TORTURE_TASKS", tasks.to_string())
            .env("FAIRLOCK_TORTURE_CHILD_OPS", &self.ops)
            .env("FAIRLOCK_TORTURE_LOG", &log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                File::create(self.dir.join(format!("{proc}.stderr")))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .unwrap();
        let pid = child.id();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let counts = Arc::new(Mutex::new(String::new()));
        let counts_w = counts.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.trim_end().ends_with("READY") {
                    let _ = tx.send(());
                }
                if let Some(rest) = line.strip_prefix("COUNTS ") {
                    *counts_w.lock().unwrap() = rest.to_owned();
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("child {proc} never became READY"));
        ChildProc {
            proc,
            child,
            pid,
            proxy,
            log,
            alive: true,
            counts,
        }
    }
}

/// What the fault thread shares with the rest of the parent.
struct Shared {
    children: Mutex<Vec<ChildProc>>,
    faults: Mutex<Vec<Fault>>,
    frozen: Mutex<HashMap<String, u64>>,
    exited: Mutex<HashMap<String, u64>>,
    fault_counts: Mutex<BTreeMap<String, u64>>,
    stop: AtomicBool,
}

impl Shared {
    fn fault(&self, kind: &str, scope: Scope, t0: u64, t1: u64) {
        self.faults.lock().unwrap().push(Fault {
            kind: kind.to_owned(),
            scope,
            t0,
            t1,
        });
        *self
            .fault_counts
            .lock()
            .unwrap()
            .entry(kind.to_owned())
            .or_default() += 1;
    }
}

/// A sync connection that gives up quickly (the server may be paused or restarting).
fn admin_conn(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(conn)
}

/// Sleeps for a fault's duration: the sleep IS the scenario (how long the fault lasts).
fn fault_sleep(d: Duration) {
    std::thread::sleep(d);
}

fn run_faults(
    shared: Arc<Shared>,
    server: Arc<Mutex<RedisServer>>,
    spawner: Arc<Mutex<Spawner>>,
    kinds: Vec<String>,
    seed: u64,
    until: Instant,
    tasks: usize,
) {
    let mut rng = Rng::new(seed ^ 0xfa17);
    let port = server.lock().unwrap().port();
    let mut kills = 0;
    while Instant::now() < until && !kinds.is_empty() {
        fault_sleep(rng.ms(200, 1200));
        if Instant::now() >= until {
            break;
        }
        let kind = rng.pick(&kinds).clone();
        let pick_child = |rng: &mut Rng| -> Option<(String, u32, Option<u16>)> {
            let children = shared.children.lock().unwrap();
            let live: Vec<&ChildProc> = children.iter().filter(|c| c.alive).collect();
            if live.is_empty() {
                return None;
            }
            let c = live[rng.below(live.len() as u64) as usize];
            Some((c.proc.clone(), c.pid, c.proxy.as_ref().map(|p| p.port())))
        };
        match kind.as_str() {
            "sigstop" => {
                let Some((proc, pid, _)) = pick_child(&mut rng) else {
                    continue;
                };
                let d = rng.ms(50, 1600);
                let t0 = mono_ns();
                signal(pid, libc::SIGSTOP);
                fault_sleep(d);
                signal(pid, libc::SIGCONT);
                shared.fault("sigstop", Scope::Proc(proc), t0, mono_ns());
            }
            "sigkill" => {
                if kills >= 2 {
                    continue;
                }
                kills += 1;
                let Some((proc, _, _)) = pick_child(&mut rng) else {
                    continue;
                };
                let t = {
                    let mut children = shared.children.lock().unwrap();
                    let c = children.iter_mut().find(|c| c.proc == proc).unwrap();
                    let t = mono_ns();
                    let _ = c.child.kill();
                    let _ = c.child.wait();
                    c.alive = false;
                    t
                };
                shared.frozen.lock().unwrap().insert(proc.clone(), t);
                shared.exited.lock().unwrap().insert(proc.clone(), t);
                shared.fault("sigkill", Scope::Proc(proc), t, t);
                // A replacement keeps the load up.
                let fresh = spawner.lock().unwrap().spawn(tasks);
                shared.children.lock().unwrap().push(fresh);
            }
            "clientkill" => {
                let Some((proc, _, proxy_port)) = pick_child(&mut rng) else {
                    continue;
                };
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let pubsub_only = rng.chance(0.5);
                let t0 = mono_ns();
                let scope = match proxy_port {
                    Some(_) => {
                        let addrs = {
                            let children = shared.children.lock().unwrap();
                            children
                                .iter()
                                .find(|c| c.proc == proc)
                                .and_then(|c| c.proxy.as_ref())
                                .map(|p| p.upstream_addrs())
                                .unwrap_or_default()
                        };
                        for a in addrs {
                            let mut cmd = redis::cmd("CLIENT");
                            cmd.arg("KILL").arg("ADDR").arg(a.to_string());
                            if pubsub_only {
                                cmd.arg("TYPE").arg("pubsub");
                            }
                            let _: redis::RedisResult<i64> = cmd.query(&mut conn);
                        }
                        Scope::Proc(proc)
                    }
                    None => {
                        let mut cmd = redis::cmd("CLIENT");
                        cmd.arg("KILL")
                            .arg("TYPE")
                            .arg(if pubsub_only { "pubsub" } else { "normal" })
                            .arg("SKIPME")
                            .arg("yes");
                        let _: redis::RedisResult<i64> = cmd.query(&mut conn);
                        Scope::All
                    }
                };
                shared.fault("clientkill", scope, t0, mono_ns());
            }
            "pause" => {
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let d = rng.ms(50, 1200);
                let mode = if rng.chance(0.5) { "WRITE" } else { "ALL" };
                let t0 = mono_ns();
                let _: redis::RedisResult<()> = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(d.as_millis() as u64)
                    .arg(mode)
                    .query(&mut conn);
                fault_sleep(d);
                shared.fault("pause", Scope::All, t0, mono_ns());
            }
            "sleep" => {
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let d = rng.ms(50, 900);
                let t0 = mono_ns();
                let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg(format!("{:.3}", d.as_secs_f64()))
                    .query(&mut conn);
                shared.fault("sleep", Scope::All, t0, mono_ns());
            }
            "scriptflush" => {
                let Some(mut conn) = admin_conn(port) else {
                    continue;
                };
                let t0 = mono_ns();
                let _: redis::RedisResult<()> = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn);
                shared.fault("scriptflush", Scope::All, t0, mono_ns());
            }
            "restart" => {
                let t0 = mono_ns();
                server.lock().unwrap().restart();
                shared.fault("restart", Scope::All, t0, mono_ns());
            }
            "proxy" => {
                let children = shared.children.lock().unwrap();
                let with_proxy: Vec<&ChildProc> = children
                    .iter()
                    .filter(|c| c.alive && c.proxy.is_some())
                    .collect();
                if with_proxy.is_empty() {
                    continue;
                }
                let c = with_proxy[rng.below(with_proxy.len() as u64) as usize];
                let proxy = c.proxy.as_ref().unwrap();
                let proc = c.proc.clone();
                let t0 = mono_ns();
                let sub = rng.below(5);
                let d = rng.ms(50, 1200);
                let what = match sub {
                    0 => {
                        proxy.set_latency(rng.ms(5, 400), rng.ms(5, 400));
                        fault_sleep(d);
                        proxy.set_latency(Duration::ZERO, Duration::ZERO);
                        "proxy-latency"
                    }
                    1 => {
                        proxy.set_blackhole_replies(true);
                        fault_sleep(d);
                        proxy.set_blackhole_replies(false);
                        "proxy-lost-replies"
                    }
                    2 => {
                        proxy.set_blackhole_requests(true);
                        fault_sleep(d);
                        proxy.set_blackhole_requests(false);
                        "proxy-lost-requests"
                    }
                    3 => {
                        proxy.reset_all();
                        "proxy-reset"
                    }
                    _ => {
                        proxy.refuse_for(d);
                        proxy.reset_all();
                        fault_sleep(d);
                        proxy.stop_refusing();
                        "proxy-refuse"
                    }
                };
                drop(children);
                shared.fault(what, Scope::Proc(proc), t0, mono_ns());
            }
            other => panic!("unknown fault kind {other}"),
        }
    }
}

/// Snapshots every fair queue in one `MULTI`, every few ms. Of each run of identical snapshots
/// only the first and the last are kept (the first is the earliest proof of a state, the last
/// the latest).
async fn monitor(port: u16, stop: Arc<AtomicBool>, out: Arc<Mutex<Vec<Snapshot>>>) {
    let url = format!("redis://127.0.0.1:{port}");
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    let mut per_name: HashMap<&str, (Vec<Snapshot>, usize)> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        if conn.is_none() {
            let client = redis::Client::open(url.as_str()).unwrap();
            let cfg = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(300)))
                .set_response_timeout(Some(Duration::from_millis(300)));
            conn = client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await
                .ok();
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        }
        for name in FAIR_NAMES {
            let c = conn.as_mut().unwrap();
            let t0 = mono_ns();
            type Raw = (
                Vec<String>,
                Vec<(String, f64)>,
                Vec<String>,
                Option<u64>,
                (i64, i64),
            );
            let r: redis::RedisResult<Raw> = redis::pipe()
                .atomic()
                .cmd("LRANGE")
                .arg(format!("redisson_lock_queue:{{{name}}}"))
                .arg(0)
                .arg(-1)
                .cmd("ZRANGE")
                .arg(format!("redisson_lock_timeout:{{{name}}}"))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .cmd("HKEYS")
                .arg(name)
                .cmd("GET")
                .arg(format!("redisson_lock_token:{{{name}}}"))
                .cmd("TIME")
                .query_async(c)
                .await;
            let t1 = mono_ns();
            let Ok((queue, scores, holders, counter, (secs, micros))) = r else {
                conn = None;
                break;
            };
            let snap = Snapshot {
                name: name.to_owned(),
                t0,
                t1,
                counter: counter.unwrap_or(0),
                queue,
                scores: scores.into_iter().collect(),
                holders,
                server_ms: secs * 1000 + micros / 1000,
            };
            let (snaps, run) = per_name.entry(name).or_default();
            let same = snaps.last().is_some_and(|p| {
                p.queue == snap.queue
                    && p.counter == snap.counter
                    && p.holders == snap.holders
                    && p.scores == snap.scores
            });
            if same && *run >= 2 {
                *snaps.last_mut().unwrap() = snap;
            } else {
                *run = if same { *run + 1 } else { 1 };
                snaps.push(snap);
            }
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let mut all = out.lock().unwrap();
    for (_, (snaps, _)) in per_name {
        all.extend(snaps);
    }
}

// ---------------------------------------------------------------------------------------------
// The Redisson-protocol peer's workload: a few Java "threads" on the same names.

async fn java_thread(
    peer: RedissonPeer,
    thread: i64,
    seed: u64,
    stop: Arc<AtomicBool>,
    names: Vec<(&'static str, bool)>,
    calls: Arc<AtomicUsize>,
) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::SeqCst) {
        let (name, fair) = *rng.pick(&names);
        let lease = if rng.chance(0.5) {
            None
        } else {
            Some(rng.ms(100, 1200))
        };
        let how = match rng.below(3) {
            0 => Wait {
                wait: None,
                lease,
                abandon_after: None,
            },
            1 => Wait {
                wait: Some(rng.ms(1, 400)),
                lease,
                abandon_after: None,
            },
            _ => Wait {
                wait: Some(rng.ms(100, 600)),
                lease,
                // An interrupted thread: no give-up, its entry waits out its deadline.
                abandon_after: (fair && rng.chance(0.3)).then(|| rng.ms(5, 300)),
            },
        };
        calls.fetch_add(1, Ordering::SeqCst);
        let Some(guard) = peer.acquire(thread, name, fair, how).await else {
            continue;
        };
        tokio::time::sleep(rng.ms(0, 25)).await;
        if rng.chance(0.1) {
            // Re-entry by the same thread (same lease, as a Java caller re-locking would).
            calls.fetch_add(1, Ordering::SeqCst);
            let inner = Wait {
                wait: Some(rng.ms(0, 20)),
                lease,
                abandon_after: None,
            };
            if let Some(g) = peer.acquire(thread, name, fair, inner).await {
                tokio::time::sleep(rng.ms(0, 10)).await;
                let _ = peer.unlock(g).await;
            }
        }
        let _ = peer.unlock(guard).await;
    }
}

// ---------------------------------------------------------------------------------------------
// One seeded run.

struct RunDir(PathBuf);

impl RunDir {
    fn new(seed: u64) -> RunDir {
        let dir = std::env::temp_dir().join("fairlock-tests").join(format!(
            "torture-{seed}-{}-{}",
            std::process::id(),
            mono_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        RunDir(dir)
    }
}

fn read_events(path: &Path) -> Vec<Event> {
    let Ok(f) = File::open(path) else {
        return Vec::new();
    };
    BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| Event::parse(&l))
        .collect()
}

fn params(epoch_offset_ms: f64) -> Params {
    Params {
        command_timeout: TIMING.command_timeout,
        liveness: TIMING.liveness,
        slack: Duration::from_millis(250),
        fault_grace: Duration::from_millis(1000),
        lag_threshold: Duration::from_millis(100),
        epoch_offset_ms,
    }
}

/// Takes every lock once more with a fresh client (after the liveness window, so dead waiters
/// get purged), then waits until nothing but the fencing counters is left in Redis.
async fn leftovers(port: u16) -> Vec<String> {
    let mut problems = Vec::new();
    let url = format!("redis://127.0.0.1:{port}");
    let c = build_client(&url).await;
    tokio::time::sleep(TIMING.liveness).await; // the window itself is the scenario
    let names = FAIR_NAMES
        .iter()
        .map(|n| (*n, true))
        .chain(PLAIN_NAMES.iter().map(|n| (*n, false)));
    for (name, fair) in names {
        let h = Handle::new(&c, name, fair, None);
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let acq = Acq {
                kind: AcqKind::Try(Duration::ZERO, Some(Duration::from_millis(200))),
                cancel_after: None,
            };
            if let Ok(Some(g)) = h.run(&acq).await {
                let _ = g.unlock().await;
                break;
            }
            if Instant::now() >= until {
                let state = match &h {
                    Handle::Fair(l) => format!("{:?}", l.state().await),
                    Handle::Plain(l) => format!("{:?}", l.state().await),
                };
                problems.push(format!(
                    "{name} could not be taken 15 s after the load stopped: {state}"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    c.shutdown().await;
    drop(c);
    let mut admin = admin_conn(port).expect("admin connection at teardown");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut admin).unwrap();
        let keys: Vec<String> = keys
            .into_iter()
            .filter(|k| !k.starts_with("redisson_lock_token:"))
            .collect();
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("*")
            .query(&mut admin)
            .unwrap();
        let shard: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .arg("*")
            .query(&mut admin)
            .unwrap();
        if keys.is_empty() && channels.is_empty() && shard.is_empty() {
            break;
        }
        if Instant::now() >= until {
            let mut described = Vec::new();
            for k in &keys {
                let ty: String = redis::cmd("TYPE").arg(k).query(&mut admin).unwrap();
                let ttl: i64 = redis::cmd("PTTL").arg(k).query(&mut admin).unwrap();
                described.push(format!("{k} ({ty}, pttl {ttl})"));
            }
            problems.push(format!(
                "left behind 10 s after the final touch: keys {described:?}, channels {channels:?}, \
                 shard channels {shard:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    problems
}

fn torture(test: &str, seed: u64) {
    if std::env::var(ROLE_ENV).as_deref() == Ok("child") {
        child_main();
    }
    let secs = env_u64("FAIRLOCK_TORTURE_SECS", 12);
    let fault_kinds: Vec<String> = {
        let set = selection("FAIRLOCK_TORTURE_FAULTS", &ALL_FAULTS);
        ALL_FAULTS
            .iter()
            .filter(|k| set.contains(**k))
            .map(|k| k.to_string())
            .collect()
    };
    let ops = selection("FAIRLOCK_TORTURE_OPS", &ALL_OPS);
    let ops_list: Vec<&str> = ALL_OPS
        .iter()
        .copied()
        .filter(|k| ops.contains(*k))
        .collect();
    let n_children = env_u64("FAIRLOCK_TORTURE_CHILDREN", 3).max(1) as usize;
    let tasks = 6;
    println!(
        "fairlock torture: seed={seed} (replay: FAIRLOCK_TORTURE_SEED={seed} cargo nextest run \
         --test torture torture_fresh_seed) secs={secs} children={n_children} faults={} ops={}",
        if fault_kinds.is_empty() {
            "none".to_owned()
        } else {
            fault_kinds.join(",")
        },
        ops_list.join(",")
    );
    let run_dir = RunDir::new(seed);
    let server = RedisServer::start_with(&[
        // Persistence so a restart is a crash, not an amnesia: replies are sent only after the
        // AOF write, and a killed process loses nothing the kernel has.
        "--appendonly",
        "yes",
        "--appendfsync",
        "no",
        "--enable-debug-command",
        "yes",
    ]);
    let port = server.port();
    let origin = mono_ns();
    let epoch_offset_ms = epoch_ms() as f64 - mono_ns() as f64 / 1e6;
    let spawner = Arc::new(Mutex::new(Spawner {
        test: test.to_owned(),
        server_port: port,
        dir: run_dir.0.clone(),
        seed,
        ops: ops_list.join(","),
        next: 0,
    }));
    let shared = Arc::new(Shared {
        children: Mutex::new(Vec::new()),
        faults: Mutex::new(Vec::new()),
        frozen: Mutex::new(HashMap::new()),
        exited: Mutex::new(HashMap::new()),
        fault_counts: Mutex::new(BTreeMap::new()),
        stop: AtomicBool::new(false),
    });
    for _ in 0..n_children {
        let c = spawner.lock().unwrap().spawn(tasks);
        shared.children.lock().unwrap().push(c);
    }
    let server = Arc::new(Mutex::new(server));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let snapshots = Arc::new(Mutex::new(Vec::new()));
    let monitor_stop = Arc::new(AtomicBool::new(false));
    let monitor_task = rt.spawn(monitor(port, monitor_stop.clone(), snapshots.clone()));
    let sink: Sink = Arc::new(Mutex::new(Vec::new()));
    let java_stop = Arc::new(AtomicBool::new(false));
    let java_calls = Arc::new(AtomicUsize::new(0));
    let mut names: Vec<(&'static str, bool)> = Vec::new();
    if ops.contains("fair") {
        names.extend(FAIR_NAMES.iter().map(|n| (*n, true)));
    }
    if ops.contains("plain") {
        names.extend(PLAIN_NAMES.iter().map(|n| (*n, false)));
    }
    let peer = ops.contains("java").then(|| {
        rt.block_on(RedissonPeer::start(
            &format!("redis://127.0.0.1:{port}"),
            "java",
            peer_config(),
            seed,
            sink.clone(),
        ))
    });
    let java_threads: Vec<_> = peer
        .iter()
        .flat_map(|peer| {
            (0..4).map(|i| {
                rt.spawn(java_thread(
                    peer.clone(),
                    101 + i,
                    splitmix(seed ^ (0x7a7a + i as u64)),
                    java_stop.clone(),
                    names.clone(),
                    java_calls.clone(),
                ))
            })
        })
        .collect::<Vec<_>>();
    // The load runs for `secs`; faults are injected meanwhile (the sleep below IS the run).
    let until = Instant::now() + Duration::from_secs(secs);
    let faults_thread = {
        let (shared, server, spawner, kinds) = (
            shared.clone(),
            server.clone(),
            spawner.clone(),
            fault_kinds.clone(),
        );
        std::thread::spawn(move || run_faults(shared, server, spawner, kinds, seed, until, tasks))
    };
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    shared.stop.store(true, Ordering::SeqCst);
    faults_thread.join().expect("fault thread");
    let mut problems: Vec<String> = Vec::new();
    // Stop the children: close their stdin, wait for them to finish what they do and exit.
    {
        let mut children = shared.children.lock().unwrap();
        for c in children.iter_mut() {
            if let Some(p) = &c.proxy {
                p.clear();
            }
            drop(c.child.stdin.take());
        }
        for c in children.iter_mut().filter(|c| c.alive) {
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                match c.child.try_wait() {
                    Ok(Some(status)) => {
                        shared
                            .exited
                            .lock()
                            .unwrap()
                            .insert(c.proc.clone(), mono_ns());
                        if !status.success() {
                            problems.push(format!(
                                "liveness: {} exited with {status} (see its anomalies)",
                                c.proc
                            ));
                        }
                        break;
                    }
                    _ if Instant::now() >= until => {
                        let t = mono_ns();
                        let _ = c.child.kill();
                        let _ = c.child.wait();
                        shared.frozen.lock().unwrap().insert(c.proc.clone(), t);
                        shared.exited.lock().unwrap().insert(c.proc.clone(), t);
                        problems.push(format!(
                            "liveness: {} did not exit within 60 s of the stop",
                            c.proc
                        ));
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            c.alive = false;
        }
    }
    // The peer: no new calls; waiting ones may finish, then give up. Entries whose give-up was
    // lost to a fault are given up once more (counted in the summary).
    let mut java_leftovers = 0;
    java_stop.store(true, Ordering::SeqCst);
    rt.block_on(async {
        let until = Instant::now() + Duration::from_secs(10);
        while java_threads.iter().any(|t| !t.is_finished()) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(peer) = &peer {
            peer.stop_waiting();
        }
        let until = Instant::now() + Duration::from_secs(10);
        while java_threads.iter().any(|t| !t.is_finished()) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if java_threads.iter().any(|t| !t.is_finished()) {
            problems.push("liveness: a Redisson-protocol thread did not finish".into());
        }
        if let Some(peer) = &peer {
            match peer.give_up_leftovers(&FAIR_NAMES).await {
                Ok(n) => java_leftovers = n,
                Err(e) => problems.push(format!("teardown: the peer's leftovers: {e}")),
            }
        }
    });
    drop(peer);
    monitor_stop.store(true, Ordering::SeqCst);
    let _ = rt.block_on(monitor_task);
    problems.extend(rt.block_on(leftovers(port)));

    // The history.
    let mut h = History::new(params(epoch_offset_ms), origin);
    let children = std::mem::take(&mut *shared.children.lock().unwrap());
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for c in &children {
        h.add_events(read_events(&c.log));
        for kv in c.counts.lock().unwrap().split(';') {
            if let Some((k, v)) = kv.split_once('=') {
                *counts.entry(k.replace('_', " ")).or_default() += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    h.add_events(sink.lock().unwrap().drain(..));
    h.snapshots = std::mem::take(&mut *snapshots.lock().unwrap());
    h.faults = shared.faults.lock().unwrap().clone();
    h.frozen = shared.frozen.lock().unwrap().clone();
    h.exited = shared.exited.lock().unwrap().clone();
    let (violations, stats) = history::check(&h, 5);

    // Summary.
    let java_n = h.calls.iter().filter(|c| c.java).count();
    println!(
        "fairlock torture summary (seed {seed}): {} calls ({} by the Redisson peer), {} holds, \
         {} snapshots",
        h.calls.len(),
        java_n,
        stats.holds,
        h.snapshots.len()
    );
    println!("  client ops: {counts:?}");
    println!(
        "  faults injected: {:?}",
        shared.fault_counts.lock().unwrap()
    );
    println!("  Redisson-protocol entries given up again at teardown: {java_leftovers}");
    println!(
        "  checks: {} overlapping hold pairs, {} tokens, {} fifo pairs ({} exempt by faults), \
         {} bounded waits ({} exempt by faults), leftovers {}",
        stats.overlap_pairs,
        stats.tokens,
        stats.fifo_pairs,
        stats.fifo_exempt,
        stats.bounded_calls,
        stats.bounded_exempt,
        if problems.iter().any(|p| p.starts_with("left behind")) {
            "FAILED"
        } else {
            "clean"
        }
    );
    drop(children);
    // The last reference: the server is killed here.
    drop(server);
    if violations.is_empty() && problems.is_empty() {
        let _ = std::fs::remove_dir_all(&run_dir.0);
        return;
    }
    let mut report = format!(
        "\nfairlock torture FAILED with seed {seed} (replay: FAIRLOCK_TORTURE_SEED={seed} cargo \
         nextest run --test torture torture_fresh_seed; event logs in {})\n",
        run_dir.0.display()
    );
    for p in &problems {
        report.push_str(&format!("[run] {p}\n"));
    }
    for v in &violations {
        report.push_str(&v.to_string());
        report.push_str(&history::context(&h, v));
    }
    panic!("{report}");
}

fn fresh_seed() -> u64 {
    match std::env::var("FAIRLOCK_TORTURE_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("FAIRLOCK_TORTURE_SEED={s:?} is not a number"))
        }
        Err(_) => splitmix(mono_ns() ^ epoch_ms() as u64 ^ u64::from(std::process::id())),
    }
}

#[test]
fn torture_seed_1() {
    torture("torture_seed_1", FIXED_SEEDS[0]);
}

#[test]
fn torture_seed_2() {
    torture("torture_seed_2", FIXED_SEEDS[1]);
}

#[test]
fn torture_seed_3() {
    torture("torture_seed_3", FIXED_SEEDS[2]);
}

/// A new seed every run (printed first thing), or `FAIRLOCK_TORTURE_SEED` to replay one.
#[test]
fn torture_fresh_seed() {
    let seed = fresh_seed();
    torture("torture_fresh_seed", seed);
}

// ---------------------------------------------------------------------------------------------
// The checker on hand-made histories: each rule catches its violation and accepts a legal one.

mod checker {
    use super::*;

    const MS: u64 = 1_000_000;

    fn hist() -> History {
        let mut h = History::new(
            Params {
                command_timeout: Duration::from_millis(300),
                liveness: Duration::from_millis(1000),
                slack: Duration::from_millis(100),
                fault_grace: Duration::from_millis(500),
                lag_threshold: Duration::from_millis(100),
                epoch_offset_ms: 1_000_000.0,
            },
            0,
        );
        h.exited.insert("p0".into(), 100_000 * MS);
        h.exited.insert("p1".into(), 100_000 * MS);
        h
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        id: &str,
        proc: &str,
        name: &str,
        field: &str,
        start_ms: u64,
        wait_ms: Option<u64>,
        end_ms: u64,
        outcome: Outcome,
        token: Option<u64>,
    ) -> Vec<Event> {
        vec![
            Event::Call {
                id: id.into(),
                proc: proc.into(),
                client: format!("{proc}.c0"),
                name: name.into(),
                fair: name.starts_with('f'),
                field: field.into(),
                op: if wait_ms.is_some() {
                    "try_lock"
                } else {
                    "lock"
                }
                .into(),
                wait_ms,
                lease_ms: None,
                t: start_ms * MS,
                shared: false,
                reentrant: false,
                java: proc == "java",
            },
            Event::End {
                id: id.into(),
                t: end_ms * MS,
                outcome,
                token,
                vu: token.map(|_| (end_ms + 1) * MS),
                detail: String::new(),
            },
        ]
    }

    /// A granted call held until `release_ms` (valid until `vu_ms`).
    #[allow(clippy::too_many_arguments)]
    fn hold(
        id: &str,
        proc: &str,
        name: &str,
        field: &str,
        (start_ms, end_ms): (u64, u64),
        token: u64,
        release_ms: u64,
        vu_ms: u64,
    ) -> Vec<Event> {
        let mut ev = call(
            id,
            proc,
            name,
            field,
            start_ms,
            None,
            end_ms,
            Outcome::Granted,
            Some(token),
        );
        ev.push(Event::Release {
            id: id.into(),
            t: release_ms * MS,
            vu: vu_ms * MS,
            how: "unlock".into(),
            lost: false,
        });
        ev
    }

    fn rules(h: &History) -> Vec<&'static str> {
        history::check(h, 100).0.iter().map(|v| v.rule).collect()
    }

    fn snap(name: &str, at_ms: u64, counter: u64, queue: &[&str]) -> Snapshot {
        Snapshot {
            name: name.into(),
            t0: at_ms * MS,
            t1: at_ms * MS + MS / 2,
            counter,
            queue: queue.iter().map(|s| s.to_string()).collect(),
            scores: queue
                .iter()
                .map(|s| (s.to_string(), 1_000_000.0 + at_ms as f64 + 1000.0))
                .collect(),
            holders: vec![],
            server_ms: 1_000_000 + at_ms as i64,
        }
    }

    #[test]
    fn events_round_trip_through_their_text_form() {
        let evs: Vec<Event> = hold("p0.1", "p0", "plain", "u:1", (10, 12), 7, 30, 40)
            .into_iter()
            .chain([
                Event::Lost {
                    id: "p0.1".into(),
                    t: 5,
                    reason: "Gone".into(),
                },
                Event::Shift {
                    name: "fair".into(),
                    t0: 1,
                    t1: 2,
                    ms: 300000,
                },
            ])
            .collect();
        for ev in evs {
            assert_eq!(
                Event::parse(&ev.to_line()),
                Some(ev.clone()),
                "{}",
                ev.to_line()
            );
        }
        assert_eq!(Event::parse("call id=torn"), None);
    }

    #[test]
    fn mutual_exclusion_accepts_hand_overs_and_reentry() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 20, 500));
        // Taken after A's release started; and A's own re-entry overlaps A.
        h.add_events(hold("b", "p1", "plain", "v:1", (15, 25), 2, 40, 500));
        h.add_events(hold("a2", "p0", "plain", "u:1", (12, 13), 3, 18, 500));
        // C overlaps D's hold but D's validity ran out first; E's lost() fired before F.
        h.add_events(hold("c", "p0", "plain2", "u:1", (0, 10), 1, 900, 100));
        h.add_events(hold("d", "p1", "plain2", "v:1", (50, 150), 2, 160, 900));
        h.add_events(hold("e", "p0", "plain3", "u:1", (0, 10), 1, 900, 900));
        h.add_events([Event::Lost {
            id: "e".into(),
            t: 100 * MS,
            reason: "Gone".into(),
        }]);
        h.add_events(hold("f", "p1", "plain3", "v:1", (50, 150), 2, 160, 900));
        // G's validity ran out before its call returned (its process paused): never trusted.
        h.add_events(hold("x", "p1", "plain4", "v:1", (0, 10), 1, 200, 500));
        h.add_events(hold("g", "p0", "plain4", "u:1", (0, 50), 2, 900, 45));
        assert!(
            !rules(&h).contains(&"mutual-exclusion"),
            "{:?}",
            history::check(&h, 9).0
        );
    }

    #[test]
    fn mutual_exclusion_catches_two_holders() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 200, 500));
        h.add_events(hold("b", "p1", "plain", "v:1", (50, 100), 2, 150, 900));
        assert!(rules(&h).contains(&"mutual-exclusion"));
        // A hold never released counts up to its validity at the grant, or the kill.
        let mut h = hist();
        let mut a = call(
            "a",
            "p0",
            "plain",
            "u:1",
            0,
            None,
            10,
            Outcome::Granted,
            Some(1),
        );
        if let Event::End { vu, .. } = &mut a[1] {
            *vu = Some(1000 * MS);
        }
        h.add_events(a);
        h.add_events(hold("b", "p1", "plain", "v:1", (50, 100), 2, 150, 900));
        assert!(rules(&h).contains(&"mutual-exclusion"));
        // Its process froze (killed, or stopped for good) after B took it, or before.
        h.frozen.insert("p0".into(), 120 * MS);
        assert!(rules(&h).contains(&"mutual-exclusion"));
        h.frozen.insert("p0".into(), 90 * MS);
        assert!(!rules(&h).contains(&"mutual-exclusion"));
    }

    #[test]
    fn fencing_catches_reused_and_reordered_tokens() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 5, 20, 500));
        h.add_events(hold("b", "p1", "plain", "v:1", (30, 40), 6, 50, 500));
        assert!(rules(&h).is_empty(), "{:?}", history::check(&h, 9).0);
        // Returned before the other call started, yet a higher token.
        h.add_events(hold("c", "p1", "plain", "v:1", (60, 70), 4, 80, 500));
        assert!(rules(&h).contains(&"fencing"));
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 5, 20, 500));
        h.add_events(hold("b", "p1", "plain", "u:1", (5, 12), 5, 30, 500));
        assert!(rules(&h).contains(&"fencing"));
    }

    #[test]
    fn fifo_order_catches_an_overtake_and_accepts_legal_orders() {
        // A ahead of B at 100 ms (counter 1); B is granted token 2 at 150 ms while A waits on.
        let base = |h: &mut History| {
            h.snapshots.push(snap("fair", 100, 1, &["u:1", "v:1"]));
            h.add_events(call(
                "b",
                "p1",
                "fair",
                "v:1",
                60,
                None,
                150,
                Outcome::Granted,
                Some(2),
            ));
        };
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            None,
            300,
            Outcome::Granted,
            Some(3),
        ));
        assert_eq!(rules(&h), vec!["fifo-order"]);
        // A first: fine.
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            None,
            120,
            Outcome::Granted,
            Some(1),
        ));
        assert!(!rules(&h).contains(&"fifo-order"));
        // A's try_lock wait (60 ms from 50) was over by B's grant: it may have left.
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            Some(60),
            115,
            Outcome::TimedOut,
            None,
        ));
        assert!(!rules(&h).contains(&"fifo-order"));
        // ... but not if the wait was longer.
        let mut h = hist();
        base(&mut h);
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            50,
            Some(400),
            455,
            Outcome::TimedOut,
            None,
        ));
        assert_eq!(rules(&h), vec!["fifo-order"]);
        // A fault on A's process lets its place go.
        h.faults.push(Fault {
            kind: "sigstop".into(),
            scope: Scope::Proc("p0".into()),
            t0: 20 * MS,
            t1: 30 * MS,
        });
        assert!(rules(&h).is_empty());
        // A fault elsewhere does not.
        h.faults[0].scope = Scope::Proc("p1x".into());
        assert_eq!(rules(&h), vec!["fifo-order"]);
    }

    /// A's previous call on the name ("a0", dropped at 95 ms) and its next one ("a", from 96 ms,
    /// granted token 3), both by `proc`; B, queued from 60 ms, granted token 2; a snapshot at
    /// 100 ms shows A's field ahead of B's.
    fn a_field_queued_across_two_calls(proc: &str) -> History {
        let mut h = hist();
        h.snapshots.push(snap("fair", 100, 1, &["u:1", "v:1"]));
        let a0 = call(
            "a0",
            proc,
            "fair",
            "u:1",
            10,
            None,
            95,
            Outcome::Cancelled,
            None,
        );
        h.add_events(a0);
        let a = call(
            "a",
            proc,
            "fair",
            "u:1",
            96,
            None,
            300,
            Outcome::Granted,
            Some(3),
        );
        h.add_events(a);
        let b = call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            None,
            150,
            Outcome::Granted,
            Some(2),
        );
        h.add_events(b);
        h
    }

    #[test]
    fn fifo_entries_are_attributed_only_to_the_call_that_certainly_owns_them() {
        // The entry at 100 ms may be the dropped call's leftover, so the overtake cannot be
        // blamed on A's new call...
        let mut h = a_field_queued_across_two_calls("p0");
        assert!(!rules(&h).contains(&"fifo-order"));
        // ... not even when a snapshot in between shows the field gone: an attempt the dropped
        // call abandoned in flight may still join (and then leave) after that snapshot...
        h.snapshots.push(snap("fair", 97, 1, &["v:1"]));
        assert!(!rules(&h).contains(&"fifo-order"));
        // ... but A's own join before the snapshot makes the entry A's.
        h.add_events([Event::Joined {
            id: "a".into(),
            t: 99 * MS,
        }]);
        assert!(rules(&h).contains(&"fifo-order"));
        // For a Redisson-protocol thread a snapshot showing the field gone is enough: its
        // give-ups run inside its calls.
        let mut h = a_field_queued_across_two_calls("java");
        assert!(!rules(&h).contains(&"fifo-order"));
        h.snapshots.push(snap("fair", 97, 1, &["v:1"]));
        assert!(rules(&h).contains(&"fifo-order"));
    }

    #[test]
    fn fifo_arrival_catches_a_queue_jump() {
        // B queued at 100 ms; A's call starts at 120 ms and is granted (token 2) before B (3).
        let mut h = hist();
        h.snapshots.push(snap("fair", 100, 1, &["v:1"]));
        h.add_events(call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            None,
            400,
            Outcome::Granted,
            Some(3),
        ));
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            120,
            None,
            130,
            Outcome::Granted,
            Some(2),
        ));
        assert_eq!(rules(&h), vec!["fifo-arrival"]);
        // If B's wait was over before A was granted, B had left.
        let mut h = hist();
        h.snapshots.push(snap("fair", 100, 1, &["v:1"]));
        h.add_events(call(
            "b",
            "p1",
            "fair",
            "v:1",
            60,
            Some(50),
            112,
            Outcome::TimedOut,
            None,
        ));
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            120,
            None,
            130,
            Outcome::Granted,
            Some(2),
        ));
        assert!(rules(&h).is_empty());
        // A Redisson waiter whose deadline has passed may be purged.
        let mut h = hist();
        let mut s = snap("fair", 100, 1, &["j:101"]);
        s.scores.insert("j:101".into(), 1_000_000.0 + 110.0);
        h.snapshots.push(s);
        h.add_events(call(
            "b",
            "java",
            "fair",
            "j:101",
            60,
            None,
            400,
            Outcome::Granted,
            Some(3),
        ));
        h.add_events(call(
            "a",
            "p0",
            "fair",
            "u:1",
            120,
            None,
            130,
            Outcome::Granted,
            Some(2),
        ));
        assert!(rules(&h).is_empty(), "{:?}", history::check(&h, 9).0);
        // ... but not while its deadline is ahead (no Java shift since).
        h.snapshots[0]
            .scores
            .insert("j:101".into(), 1_000_000.0 + 5000.0);
        assert_eq!(rules(&h), vec!["fifo-arrival"]);
        // A Java acquisition shifting deadlines by 300 s in between makes it purgeable again.
        h.shifts.push(("fair".into(), 105 * MS, 106 * MS, 300_000));
        assert!(rules(&h).is_empty());
    }

    #[test]
    fn bounded_waits_are_checked_outside_faults() {
        let mut h = hist();
        h.add_events(call(
            "a",
            "p0",
            "plain",
            "u:1",
            0,
            Some(100),
            450,
            Outcome::TimedOut,
            None,
        ));
        assert!(rules(&h).is_empty());
        h.add_events(call(
            "b",
            "p0",
            "plain",
            "u:2",
            0,
            Some(100),
            600,
            Outcome::TimedOut,
            None,
        ));
        assert_eq!(rules(&h), vec!["bounded-wait"]);
        h.faults.push(Fault {
            kind: "pause".into(),
            scope: Scope::All,
            t0: 50 * MS,
            t1: 300 * MS,
        });
        assert!(rules(&h).is_empty());
        // A stalled runtime of its own process counts too.
        h.faults.clear();
        h.lags.push(("p0".into(), 200 * MS, 350 * MS));
        assert!(rules(&h).is_empty());
    }

    #[test]
    fn unlock_not_held_while_trusted_is_caught() {
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 20, 500));
        h.add_events([Event::Released {
            id: "a".into(),
            t: 22 * MS,
            result: "notheld".into(),
        }]);
        assert_eq!(rules(&h), vec!["unlock"]);
        // After its validity ran out, NotHeld is expected.
        let mut h = hist();
        h.add_events(hold("a", "p0", "plain", "u:1", (0, 10), 1, 600, 500));
        h.add_events([Event::Released {
            id: "a".into(),
            t: 602 * MS,
            result: "notheld".into(),
        }]);
        assert!(rules(&h).is_empty());
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy and the peer on their own, against a real redis-server.

mod tools {
    use super::*;
    use redis::Commands;
    use support::wait_until;

    fn conn_via(proxy: &Proxy, read_timeout: Duration) -> redis::Connection {
        let c = redis::Client::open(proxy.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        c.set_read_timeout(Some(read_timeout)).unwrap();
        c
    }

    #[test]
    fn proxy_passes_commands_and_shows_its_upstream_addresses() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut c = conn_via(&proxy, Duration::from_secs(2));
        let _: () = c.set("k", "v").unwrap();
        assert_eq!(c.get::<_, String>("k").unwrap(), "v");
        assert_eq!(proxy.open_connections(), 1);
        let addrs = proxy.upstream_addrs();
        assert_eq!(addrs.len(), 1);
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut server.conn())
            .unwrap();
        assert!(list.contains(&format!("addr={}", addrs[0])), "{list}");
    }

    #[test]
    fn proxy_latency_delays_replies() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut c = conn_via(&proxy, Duration::from_secs(5));
        proxy.set_latency(Duration::from_millis(100), Duration::from_millis(150));
        let started = Instant::now();
        let _: String = redis::cmd("PING").query(&mut c).unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
        proxy.set_latency(Duration::ZERO, Duration::ZERO);
        let started = Instant::now();
        let _: String = redis::cmd("PING").query(&mut c).unwrap();
        assert!(started.elapsed() < Duration::from_millis(250));
    }

    #[test]
    fn a_blackholed_reply_is_lost_after_the_command_ran_and_the_connection_is_then_reset() {
        let server = RedisServer::start();
        let mut direct = server.conn();
        let proxy = Proxy::start(server.port());
        let mut c = conn_via(&proxy, Duration::from_millis(300));
        let _: String = redis::cmd("PING").query(&mut c).unwrap();
        proxy.set_blackhole_replies(true);
        let r: redis::RedisResult<()> = c.set("ran", "yes");
        assert!(r.unwrap_err().is_timeout());
        // The command ran all the same.
        assert_eq!(
            direct.get::<_, Option<String>>("ran").unwrap().as_deref(),
            Some("yes")
        );
        proxy.set_blackhole_replies(false);
        // The connection that lost a reply is reset, never handed a later reply for an earlier
        // request.
        let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut c);
        assert!(r.is_err(), "{r:?}");
        let mut fresh = conn_via(&proxy, Duration::from_secs(2));
        let _: String = redis::cmd("PING").query(&mut fresh).unwrap();
    }

    #[test]
    fn a_blackholed_request_never_runs() {
        let server = RedisServer::start();
        let mut direct = server.conn();
        let proxy = Proxy::start(server.port());
        let mut c = conn_via(&proxy, Duration::from_millis(300));
        let _: String = redis::cmd("PING").query(&mut c).unwrap();
        proxy.set_blackhole_requests(true);
        let r: redis::RedisResult<()> = c.set("ran", "yes");
        assert!(r.unwrap_err().is_timeout());
        proxy.set_blackhole_requests(false);
        assert_eq!(direct.get::<_, Option<String>>("ran").unwrap(), None);
    }

    #[test]
    fn reset_drops_open_connections_and_refusal_turns_new_ones_away() {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let mut c = conn_via(&proxy, Duration::from_secs(2));
        let _: String = redis::cmd("PING").query(&mut c).unwrap();
        assert_eq!(proxy.reset_all(), 1);
        let r: redis::RedisResult<String> = redis::cmd("PING").query(&mut c);
        let e = r.unwrap_err();
        assert!(e.is_connection_dropped() || e.is_io_error(), "{e:?}");
        wait_until(
            Duration::from_secs(5),
            "the reset connection is gone",
            || proxy.open_connections() == 0,
        );
        proxy.refuse_for(Duration::from_secs(30));
        let refused = redis::Client::open(proxy.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
        assert!(refused.is_err());
        assert!(proxy.counts().1 >= 1);
        proxy.stop_refusing();
        let mut c = conn_via(&proxy, Duration::from_secs(2));
        let _: String = redis::cmd("PING").query(&mut c).unwrap();
    }

    /// The peer queues behind a fairlock holder, is woken by our release on its own channel (long
    /// before its TTL-based re-poll), shifts every deadline by its wait when it takes the lock,
    /// and its release wakes our waiter behind it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_redisson_peer_queues_and_hands_over_with_fairlock() {
        let server = RedisServer::start();
        let mut raw = server.conn();
        let sink: Sink = Arc::new(Mutex::new(Vec::new()));
        let peer = RedissonPeer::start(&server.url(), "java", peer_config(), 7, sink.clone()).await;
        let c = Client::connect(&server.url()).await.unwrap();
        let held = c.fair_lock("handover").fenced().lock().await.unwrap();
        assert_eq!(held.fencing_token(), Some(1));
        let p = peer.clone();
        let java = tokio::spawn(async move {
            let how = Wait {
                wait: Some(Duration::from_secs(20)),
                lease: None,
                abandon_after: None,
            };
            let g = p.acquire(101, "handover", true, how).await;
            (Instant::now(), g)
        });
        let queue = "redisson_lock_queue:{handover}";
        wait_until(Duration::from_secs(10), "the peer queued", || {
            raw.lrange::<_, Vec<String>>(queue, 0, -1).unwrap() == vec![peer.field(101)]
        });
        let lc = c.fair_lock("handover");
        let ours = tokio::spawn(async move { lc.try_lock(Duration::from_secs(20), None).await });
        wait_until(
            Duration::from_secs(10),
            "our waiter queued behind it",
            || raw.llen::<_, i64>(queue).unwrap() == 2,
        );
        let released = Instant::now();
        held.unlock().await.unwrap();
        let (at, g) = java.await.unwrap();
        let g = g.expect("the peer got the lock");
        assert!(
            at - released < Duration::from_secs(5),
            "woken by message, not by polling"
        );
        // Taking the lock shifted every deadline by the peer's wait (recorded for the checker).
        assert!(sink
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, Event::Shift { ms: 20_000, .. })));
        assert_eq!(peer.unlock(g).await, Ok(1));
        let guard = ours
            .await
            .unwrap()
            .unwrap()
            .expect("our waiter got it next");
        guard.unlock().await.unwrap();
        let calls: Vec<Event> = sink.lock().unwrap().clone();
        assert!(calls.iter().any(|e| matches!(
            e,
            Event::End {
                outcome: Outcome::Granted,
                token: Some(2),
                ..
            }
        )));
    }
}
