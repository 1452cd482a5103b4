//! Contention: C tasks in two OS processes fight over one lock name, each looping lock → critical
//! section (`GET` + `SET` of a counter) → unlock → lock again, for a fixed time per C.
//!
//! Six locks run the same workload in the same bench run, alternating:
//!
//! * **ideal FIFO** (a yardstick, not a usable lock): a ticket lock, the cheapest strict-FIFO
//!   hand-off Redis allows. Acquire = `INCR NAME:ticket:next` → ticket t, then `BRPOP
//!   NAME:ticket:turn:t` until the baton is there; release = `LPUSH NAME:ticket:turn:(t+1)` (the
//!   baton waits in its list when ticket t+1 has not come yet). Every hand-off wakes a waiter
//!   that sleeps in Redis, as a fair lock's must, and nothing else is paid: no Lua, no owner
//!   record, no lease, no queue deadlines. One connection per contender (`BRPOP` blocks it);
//!   `BRPOP` rather than `BLPOP` so that the coordination's `BLPOP`s stay apart in the counts;
//! * **Redisson layout floor** (a yardstick, not a usable lock): the cheapest fair lock on the
//!   keys a Redisson fair lock shares (owner hash `NAME`, waiter list `redisson_lock_queue:{NAME}`,
//!   deadline set `redisson_lock_timeout:{NAME}`) with pub/sub waits. Acquire is one script
//!   (`lua/layout_acquire.lua`: a free lock with nobody ahead is granted, else the caller is
//!   queued with a deadline score); release is one script (`lua/layout_release.lua`: the head of
//!   the list becomes the owner and is told on its own channel
//!   `redisson_lock__channel:{NAME}:<field>`). One subscriber connection per process routes the
//!   messages to the contenders. It pays what the shared layout and the wake-up by message force
//!   and nothing else: no purge of expired waiters, no liveness of its own, no fencing, no
//!   recovery of a lost message. Set against the ideal FIFO and `FairLock`, it splits the gap
//!   between them into what the layout forces and what fairlock adds;
//! * **layout floor + FairLock's commands** (a yardstick): the floor's contenders and client,
//!   with scripts (`lua/layout_plus_*.lua`) that also run the commands `FairLock`'s scripts run
//!   on the same paths (a join of 13 commands, a hand-over release of 13, on the same kinds of
//!   keys), without deciding anything by them. Between the floor and `FairLock`, it splits
//!   fairlock's share into what its scripts' commands cost the server and what is left to its
//!   client (the engine, the grant's take-up, the bookkeeping) and its scripts' logic;
//! * **FairLock**: `client.fair_lock(NAME).lock()` + `guard.unlock()`, one client per process,
//!   every contender its own tokio task and so its own holder;
//! * **polling** (a baseline): `SET NAME token NX PX 30000`, retried every 10 ms until it
//!   succeeds, released by a small script that deletes the key only if it still holds our token;
//! * **random retry** (a baseline, what rslock and most Redlock-style crates do): the same
//!   `SET NX PX` and release, retried after a random pause of 0–200 ms (uniform, a xorshift per
//!   contender seeded from its id).
//!
//! The bench re-executes its own binary (`FAIRLOCK_BENCH_ROLE=contended-worker`) for the second
//! process; the two coordinate through Redis lists (`BLPOP`), never by sleeping. Every contender
//! records (issue time of its lock call, grant time, release time) per acquisition on the shared
//! wall clock; the helper sends its records to the main process on stdout at the end.
//!
//! Checked on every run (the bench aborts loudly otherwise): the final counter equals the number
//! of acquisitions, and no two critical sections overlap in time.
//!
//! Reported per lock and C: acquisitions/s (grants inside the timed window), wait for the lock
//! p50/p99/max, handoff gap p50/p99 (release → grant of the next holder, when that holder was
//! already waiting), FIFO inversions (pairs A, B where B called lock() more than 2 ms after A,
//! while A was still waiting, and B was granted first; and of those, the pairs where A's place
//! in the queue was taken before B called: the reply of the ticket's `INCR`, of the floor's
//! acquire that queued, or of `FairLock`'s attempt that joined the queue, which the library
//! reports with its `queued` debug event, recorded by a tracing layer that sees only that call
//! site; a call still on its way to Redis when B calls is not overtaken in the queue), Jain's
//! fairness index over the
//! contenders' acquisition counts, Redis commands and round trips (`INFO commandstats` calls,
//! `total_reads_processed`) per acquisition, with the critical section's two commands subtracted,
//! and CPU per acquisition: the server's (`INFO cpu` `used_cpu_sys` + `used_cpu_user`, all its
//! threads) and the clients' (user + system time of both bench processes over the run, from
//! `/proc/self/stat`, 10 ms ticks; the bench's own loop and records included, the same for every
//! lock).
//!
//! `cargo bench --bench contended` (10 s per run, about 70 s); `FAIRLOCK_BENCH_QUICK=1` or
//! `-- --quick` for 1 s per run. `FAIRLOCK_BENCH_SECS=N` sets the run length.

// The test kit (testkit/): `RedisServer` (a throw-away redis-server on a free loopback port,
// killed by PID on drop).
use fairlock_testkit as support;

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const WORKER_ROLE: &str = "contended-worker";
const NAME: &str = "bench:contended";
const COUNTER: &str = "bench:contended:counter";
const POLL_LEASE: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The random-retry baseline pauses a uniform 0..RANDOM_RETRY_MAX between attempts.
const RANDOM_RETRY_MAX: Duration = Duration::from_millis(200);
/// A lock call that takes longer than this aborts the bench (something is stuck).
const LOCK_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound of acquisitions per contender per run, whatever the duration.
const MAX_ACQUISITIONS: usize = 5_000_000;
/// Coordination waits (helper start-up, end of a run).
const COORDINATION_TIMEOUT: Duration = Duration::from_secs(60);
/// FIFO inversion threshold: B must have called lock() this much later than A.
const INVERSION_MARGIN_US: u64 = 2_000;
/// How many FIFO inversions of a fair lock's run are described in the report.
const MAX_INVERSION_EXAMPLES: usize = 5;

const CONTENDERS: [usize; 3] = [1, 16, 64];

/// Deletes the polling lock only while it still holds our token.
const POLL_UNLOCK: &str = include_str!("lua/poll_unlock.lua");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Ticket,
    Layout,
    /// The layout floor running FairLock's commands (isolates their server cost).
    LayoutPlus,
    Fair,
    Polling,
    RandomRetry,
}

impl Variant {
    fn arg(self) -> &'static str {
        match self {
            Variant::Ticket => "ticket",
            Variant::Layout => "layout",
            Variant::LayoutPlus => "layout-plus",
            Variant::Fair => "fair",
            Variant::Polling => "polling",
            Variant::RandomRetry => "random",
        }
    }

    fn from_arg(s: &str) -> Variant {
        match s {
            "ticket" => Variant::Ticket,
            "layout" => Variant::Layout,
            "layout-plus" => Variant::LayoutPlus,
            "fair" => Variant::Fair,
            "polling" => Variant::Polling,
            "random" => Variant::RandomRetry,
            other => panic!("unknown variant {other:?}"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Ticket => "ideal FIFO (ticket: INCR + BRPOP)",
            Variant::Layout => "Redisson layout floor (2 scripts + message)",
            Variant::LayoutPlus => "layout floor + FairLock's commands",
            Variant::Fair => "FairLock",
            Variant::Polling => "polling SET NX (10 ms)",
            Variant::RandomRetry => "SET NX, random 0–200 ms retry",
        }
    }
}

/// One acquisition, on the shared wall clock (µs since the epoch).
#[derive(Debug, Clone, Copy)]
struct Record {
    contender: u32,
    /// Just before the lock call.
    issue: u64,
    /// Just after the lock call returned.
    grant: u64,
    /// Just before the unlock call (the critical section is done).
    release: u64,
    /// When the contender knew its place in the queue was taken: the reply of the ticket's `INCR`,
    /// of the layout floor's acquire that queued it, or of `FairLock`'s attempt that joined the
    /// queue (the library's `queued` event). 0 when the call never queued (granted at once, or
    /// a lock without a queue).
    queued: u64,
}

impl Record {
    fn to_line(self) -> String {
        format!(
            "R {} {} {} {} {}",
            self.contender, self.issue, self.grant, self.release, self.queued
        )
    }

    fn from_line(line: &str) -> Option<Record> {
        let mut it = line.strip_prefix("R ")?.split(' ');
        let mut next = || it.next()?.parse::<u64>().ok();
        Some(Record {
            contender: next()? as u32,
            issue: next()?,
            grant: next()?,
            release: next()?,
            queued: next()?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// When a FairLock call's place in the queue was taken

/// Contender ids are below this (C ≤ 64 over both processes).
const MAX_CONTENDERS: usize = 128;

/// Per contender, when its current `lock()` call first joined the fair queue (µs on the shared
/// clock; 0: not yet). Written by [`QueuedLayer`], read and reset by the contender itself.
static QUEUED_AT: [AtomicU64; MAX_CONTENDERS] = [const { AtomicU64::new(0) }; MAX_CONTENDERS];

tokio::task_local! {
    /// The contender whose task polls the current `lock()` call.
    static CONTENDER: u32;
}

/// Records the library's `queued` event (emitted inside the call's own future once the reply of
/// the attempt that joined the queue is in) against the contender whose task polls the call.
/// Only that one call site's events reach it (see [`install_queued_layer`]), so nothing else
/// of the library's tracing costs anything in the bench.
struct QueuedLayer;

/// Whether an event's message is `queued`.
struct IsQueued(bool);

impl tracing::field::Visit for IsQueued {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && format!("{value:?}") == "queued" {
            self.0 = true;
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for QueuedLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut queued = IsQueued(false);
        event.record(&mut queued);
        if !queued.0 {
            return;
        }
        let t = common::now_us();
        let _ = CONTENDER.try_with(|id| {
            // The first join of the call counts (a call can join again after a given-back grant).
            let _ = QUEUED_AT[*id as usize].compare_exchange(
                0,
                t,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        });
    }
}

/// Installs [`QueuedLayer`] for the debug events of the library's waiting phase only.
fn install_queued_layer() {
    let only_waits = tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_event()
            && *meta.level() == tracing::Level::DEBUG
            && meta.target() == "fairlock::engine::acquire::wait"
    });
    let subscriber = tracing_subscriber::registry().with(QueuedLayer.with_filter(only_waits));
    tracing::subscriber::set_global_default(subscriber).expect("a global tracing subscriber");
}

/// The timed window, sent to every contender at the start.
#[derive(Debug, Clone, Copy)]
struct Plan {
    start_us: u64,
    stop_us: u64,
}

/// Coordination list names of one run.
struct Lists {
    ready: String,
    go: String,
    done: String,
    exit: String,
}

impl Lists {
    fn new(run: &str) -> Lists {
        Lists {
            ready: format!("bench:coord:{run}:ready"),
            go: format!("bench:coord:{run}:go"),
            done: format!("bench:coord:{run}:done"),
            exit: format!("bench:coord:{run}:exit"),
        }
    }
}

fn main() {
    install_queued_layer();
    match common::role().as_deref() {
        Some(WORKER_ROLE) => common::runtime().block_on(worker()),
        Some(other) => panic!("unknown helper role {other:?}"),
        None => parent(),
    }
}

// ---------------------------------------------------------------------------------------------
// Contenders (both processes)

/// The contenders of one process and what they share.
struct Side {
    handles: Vec<JoinHandle<Vec<Record>>>,
    client: Option<fairlock::Client>,
    /// Tasks that serve the contenders (the layout floor's message router), stopped at the end.
    background: Option<JoinHandle<()>>,
}

async fn start_contenders(
    url: &str,
    variant: Variant,
    count: usize,
    first_id: u32,
    plan: watch::Receiver<Option<Plan>>,
) -> Side {
    if count == 0 {
        return Side {
            handles: Vec::new(),
            client: None,
            background: None,
        };
    }
    let cs = common::manager(url).await;
    let mut handles = Vec::with_capacity(count);
    let mut background = None;
    let client = match variant {
        Variant::Fair => {
            let client = fairlock::Client::connect(url).await.expect("connect");
            for i in 0..count {
                let lock = client.fair_lock(NAME);
                let (cs, plan) = (cs.clone(), plan.clone());
                let id = first_id + i as u32;
                handles.push(tokio::spawn(fair_contender(lock, cs, id, plan)));
            }
            Some(client)
        }
        Variant::Ticket => {
            for i in 0..count {
                // BRPOP blocks its connection: one per contender, without a response timeout
                // (every BRPOP passes LOCK_TIMEOUT to Redis).
                let own = common::admin_conn(url).await;
                let (cs, plan) = (cs.clone(), plan.clone());
                let id = first_id + i as u32;
                handles.push(tokio::spawn(ticket_contender(own, cs, id, plan)));
            }
            None
        }
        Variant::Layout | Variant::LayoutPlus => {
            let plus = variant == Variant::LayoutPlus;
            let locks = common::manager(url).await;
            let pubsub = redis::Client::open(url)
                .expect("redis url")
                .get_async_pubsub()
                .await
                .expect("subscriber connection");
            let (mut sink, mut stream) = pubsub.split();
            let mut wake = HashMap::with_capacity(count);
            for i in 0..count {
                let id = first_id + i as u32;
                let notify = Arc::new(Notify::new());
                let channel = format!("{LAYOUT_CHANNEL_PREFIX}{}", layout_field(id));
                sink.subscribe(&channel).await.expect("SUBSCRIBE");
                wake.insert(channel, notify.clone());
                let (cs, locks, plan) = (cs.clone(), locks.clone(), plan.clone());
                handles.push(tokio::spawn(layout_contender(
                    locks, cs, id, plan, notify, plus,
                )));
            }
            // Routes each hand-off message to its contender; the sink lives as long as the task.
            background = Some(tokio::spawn(async move {
                let _sink = sink;
                while let Some(msg) = stream.next().await {
                    if let Some(notify) = wake.get(msg.get_channel_name()) {
                        notify.notify_one();
                    }
                }
            }));
            None
        }
        Variant::Polling | Variant::RandomRetry => {
            let locks = common::manager(url).await;
            for i in 0..count {
                let (cs, locks, plan) = (cs.clone(), locks.clone(), plan.clone());
                let id = first_id + i as u32;
                let retry = if variant == Variant::Polling {
                    Retry::Every(POLL_INTERVAL)
                } else {
                    Retry::Random(0x9e37_79b9_7f4a_7c15 ^ (u64::from(id) + 1))
                };
                handles.push(tokio::spawn(polling_contender(locks, cs, id, plan, retry)));
            }
            None
        }
    };
    Side {
        handles,
        client,
        background,
    }
}

async fn wait_for_plan(mut plan: watch::Receiver<Option<Plan>>) -> Plan {
    let plan = tokio::time::timeout(COORDINATION_TIMEOUT, plan.wait_for(Option::is_some))
        .await
        .expect("no start signal")
        .expect("plan sender dropped");
    plan.expect("checked")
}

/// The critical section: read the counter, write it back plus one (two round trips, so a second
/// holder at the same time would lose an increment).
async fn critical_section(cs: &mut ConnectionManager) {
    let value: Option<i64> = redis::cmd("GET")
        .arg(COUNTER)
        .query_async(cs)
        .await
        .expect("GET counter");
    let () = redis::cmd("SET")
        .arg(COUNTER)
        .arg(value.unwrap_or(0) + 1)
        .query_async(cs)
        .await
        .expect("SET counter");
}

async fn fair_contender(
    lock: fairlock::FairLock,
    cs: ConnectionManager,
    id: u32,
    plan: watch::Receiver<Option<Plan>>,
) -> Vec<Record> {
    // The library's `queued` event is emitted while this task polls its lock() call.
    CONTENDER
        .scope(id, fair_contender_loop(lock, cs, id, plan))
        .await
}

async fn fair_contender_loop(
    lock: fairlock::FairLock,
    mut cs: ConnectionManager,
    id: u32,
    plan: watch::Receiver<Option<Plan>>,
) -> Vec<Record> {
    let plan = wait_for_plan(plan).await;
    let mut records = Vec::new();
    while records.len() < MAX_ACQUISITIONS {
        let issue = common::now_us();
        if issue >= plan.stop_us {
            break;
        }
        QUEUED_AT[id as usize].store(0, Ordering::Relaxed);
        let guard = tokio::time::timeout(LOCK_TIMEOUT, lock.lock())
            .await
            .unwrap_or_else(|_| panic!("contender {id}: lock() took over {LOCK_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("contender {id}: lock() failed: {e}"));
        let grant = common::now_us();
        let queued = QUEUED_AT[id as usize].load(Ordering::Relaxed);
        critical_section(&mut cs).await;
        let release = common::now_us();
        guard
            .unlock()
            .await
            .unwrap_or_else(|e| panic!("contender {id}: unlock() failed: {e}"));
        records.push(Record {
            contender: id,
            issue,
            grant,
            release,
            queued,
        });
    }
    records
}

const TICKET_NEXT: &str = "bench:contended:ticket:next";

fn ticket_turn(ticket: i64) -> String {
    format!("bench:contended:ticket:turn:{ticket}")
}

/// The ideal FIFO yardstick: take a ticket, wait for the baton in the ticket's list, pass it on.
async fn ticket_contender(
    mut own: MultiplexedConnection,
    mut cs: ConnectionManager,
    id: u32,
    plan: watch::Receiver<Option<Plan>>,
) -> Vec<Record> {
    let plan = wait_for_plan(plan).await;
    let mut records = Vec::new();
    while records.len() < MAX_ACQUISITIONS {
        let issue = common::now_us();
        if issue >= plan.stop_us {
            break;
        }
        let ticket: i64 = redis::cmd("INCR")
            .arg(TICKET_NEXT)
            .query_async(&mut own)
            .await
            .expect("INCR ticket");
        let queued = common::now_us();
        let baton: Option<(String, String)> = redis::cmd("BRPOP")
            .arg(ticket_turn(ticket))
            .arg(LOCK_TIMEOUT.as_secs_f64())
            .query_async(&mut own)
            .await
            .expect("BRPOP turn");
        assert!(
            baton.is_some(),
            "contender {id}: ticket {ticket} waited over {LOCK_TIMEOUT:?}"
        );
        let grant = common::now_us();
        critical_section(&mut cs).await;
        let release = common::now_us();
        let _: i64 = redis::cmd("LPUSH")
            .arg(ticket_turn(ticket + 1))
            .arg(1)
            .query_async(&mut own)
            .await
            .expect("LPUSH baton");
        records.push(Record {
            contender: id,
            issue,
            grant,
            release,
            queued,
        });
    }
    records
}

const LAYOUT_QUEUE: &str = "redisson_lock_queue:{bench:contended}";
const LAYOUT_DEADLINES: &str = "redisson_lock_timeout:{bench:contended}";
const LAYOUT_CHANNEL_PREFIX: &str = "redisson_lock__channel:{bench:contended}:";
/// The layout floor's deadline scores lie this far ahead (nothing purges them in the bench).
const LAYOUT_DEADLINE_AHEAD_MS: u64 = 600_000;
const LAYOUT_ACQUIRE: &str = include_str!("lua/layout_acquire.lua");
const LAYOUT_RELEASE: &str = include_str!("lua/layout_release.lua");
const LAYOUT_LIVENESS: &str = "fairlock_liveness:{bench:contended}";
const LAYOUT_GRANTS: &str = "fairlock_grants:{bench:contended}";
/// FairLock's default liveness window, which the layout-plus join's mark lies ahead.
const LAYOUT_LIVENESS_MS: u64 = 5_000;
const LAYOUT_PLUS_ACQUIRE: &str = include_str!("lua/layout_plus_acquire.lua");
const LAYOUT_PLUS_RELEASE: &str = include_str!("lua/layout_plus_release.lua");

/// The layout floor's owner field of a contender (`<process>:<id>`, ids unique over both).
fn layout_field(id: u32) -> String {
    format!("bench-{}:{id}", std::process::id())
}

/// The Redisson layout floor: one script to take the lock or queue, a sleep until the hand-off
/// message, one script to release (handing the lock to the head of the queue). With `plus`, the
/// scripts also run the commands FairLock's run on the same paths (`lua/layout_plus_*.lua`).
async fn layout_contender(
    mut locks: ConnectionManager,
    mut cs: ConnectionManager,
    id: u32,
    plan: watch::Receiver<Option<Plan>>,
    handed_over: Arc<Notify>,
    plus: bool,
) -> Vec<Record> {
    let plan = wait_for_plan(plan).await;
    let (acquire, release) = if plus {
        (LAYOUT_PLUS_ACQUIRE, LAYOUT_PLUS_RELEASE)
    } else {
        (LAYOUT_ACQUIRE, LAYOUT_RELEASE)
    };
    let acquire = redis::Script::new(acquire);
    let release = redis::Script::new(release);
    let field = layout_field(id);
    let lease_ms = POLL_LEASE.as_millis() as u64;
    let mut records = Vec::new();
    while records.len() < MAX_ACQUISITIONS {
        let issue = common::now_us();
        if issue >= plan.stop_us {
            break;
        }
        let mut call = acquire.key(NAME);
        call.key(LAYOUT_QUEUE)
            .key(LAYOUT_DEADLINES)
            .arg(lease_ms)
            .arg(&field)
            .arg(issue / 1_000 + LAYOUT_DEADLINE_AHEAD_MS);
        if plus {
            call.key(LAYOUT_LIVENESS)
                .key(LAYOUT_GRANTS)
                .arg(LAYOUT_LIVENESS_MS);
        }
        let granted: i64 = call.invoke_async(&mut locks).await.expect("layout acquire");
        let queued = if granted == 0 { common::now_us() } else { 0 };
        if granted == 0 {
            // A queued contender is told exactly once, when the lock is already its own: the
            // permit a message stores (even before this wait starts) is this grant's.
            tokio::time::timeout(LOCK_TIMEOUT, handed_over.notified())
                .await
                .unwrap_or_else(|_| panic!("contender {id}: no hand-off in {LOCK_TIMEOUT:?}"));
        }
        let grant = common::now_us();
        critical_section(&mut cs).await;
        let release_at = common::now_us();
        let mut call = release.key(NAME);
        call.key(LAYOUT_QUEUE)
            .key(LAYOUT_DEADLINES)
            .arg(&field)
            .arg(lease_ms)
            .arg(LAYOUT_CHANNEL_PREFIX);
        if plus {
            call.key(LAYOUT_LIVENESS).key(LAYOUT_GRANTS);
        }
        let released: i64 = call.invoke_async(&mut locks).await.expect("layout release");
        assert!(
            released >= 0,
            "contender {id}: the layout lock was not ours"
        );
        records.push(Record {
            contender: id,
            issue,
            grant,
            release: release_at,
            queued,
        });
    }
    records
}

/// How a `SET NX` contender waits between attempts.
#[derive(Debug, Clone, Copy)]
enum Retry {
    Every(Duration),
    /// Uniform in 0..RANDOM_RETRY_MAX; the state of a xorshift64 generator.
    Random(u64),
}

impl Retry {
    fn pause(&mut self) -> Duration {
        match self {
            Retry::Every(d) => *d,
            Retry::Random(state) => {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                let max = RANDOM_RETRY_MAX.as_micros() as u64;
                Duration::from_micros(*state % max)
            }
        }
    }
}

async fn polling_contender(
    mut locks: ConnectionManager,
    mut cs: ConnectionManager,
    id: u32,
    plan: watch::Receiver<Option<Plan>>,
    mut retry: Retry,
) -> Vec<Record> {
    let plan = wait_for_plan(plan).await;
    let unlock = redis::Script::new(POLL_UNLOCK);
    let mut records = Vec::new();
    while records.len() < MAX_ACQUISITIONS {
        let issue = common::now_us();
        if issue >= plan.stop_us {
            break;
        }
        let token = format!("{}:{id}:{}", std::process::id(), records.len());
        loop {
            let ok: Option<String> = redis::cmd("SET")
                .arg(NAME)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(POLL_LEASE.as_millis() as u64)
                .query_async(&mut locks)
                .await
                .expect("SET NX");
            if ok.is_some() {
                break;
            }
            assert!(
                common::now_us() - issue < LOCK_TIMEOUT.as_micros() as u64,
                "contender {id}: polling lock took over {LOCK_TIMEOUT:?}"
            );
            tokio::time::sleep(retry.pause()).await;
        }
        let grant = common::now_us();
        critical_section(&mut cs).await;
        let release = common::now_us();
        let deleted: i64 = unlock
            .key(NAME)
            .arg(&token)
            .invoke_async(&mut locks)
            .await
            .expect("polling unlock");
        assert_eq!(deleted, 1, "contender {id}: the polling lock was lost");
        records.push(Record {
            contender: id,
            issue,
            grant,
            release,
            queued: 0,
        });
    }
    records
}

async fn join_all(side: Side) -> (Vec<Record>, Option<fairlock::Client>) {
    let mut records = Vec::new();
    for handle in side.handles {
        records.extend(handle.await.expect("contender panicked"));
    }
    if let Some(task) = side.background {
        task.abort();
    }
    (records, side.client)
}

// ---------------------------------------------------------------------------------------------
// Helper process

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("helper needs {name}"))
}

async fn worker() {
    let url = env("FAIRLOCK_BENCH_URL");
    let lists = Lists::new(&env("FAIRLOCK_BENCH_RUN"));
    let variant = Variant::from_arg(&env("FAIRLOCK_BENCH_VARIANT"));
    let count: usize = env("FAIRLOCK_BENCH_CONTENDERS").parse().expect("count");
    let first_id: u32 = env("FAIRLOCK_BENCH_FIRST_ID").parse().expect("first id");

    let mut admin = common::admin_conn(&url).await;
    let (tx, rx) = watch::channel(None);
    let side = start_contenders(&url, variant, count, first_id, rx).await;
    common::rpush(&mut admin, &lists.ready, "1").await;
    let go = common::blpop(&mut admin, &lists.go, COORDINATION_TIMEOUT, "the start").await;
    let (start, stop) = go.split_once(',').expect("start,stop");
    let plan = Plan {
        start_us: start.parse().expect("start"),
        stop_us: stop.parse().expect("stop"),
    };
    let cpu_start = common::cpu_time();
    tx.send_replace(Some(plan));
    let (records, client) = join_all(side).await;
    let cpu = common::cpu_time() - cpu_start;
    common::rpush(&mut admin, &lists.done, "1").await;
    // Stay connected until the main process has read the server counters.
    common::blpop(&mut admin, &lists.exit, COORDINATION_TIMEOUT, "the end").await;
    if let Some(client) = client {
        client.shutdown().await;
    }
    let mut out = String::with_capacity(records.len() * 48 + 32);
    out.push_str(&format!("CPU {}\n", cpu.as_micros()));
    for r in records {
        out.push_str(&r.to_line());
        out.push('\n');
    }
    print!("{out}");
}

// ---------------------------------------------------------------------------------------------
// Main process

fn parent() {
    let quick = common::quick();
    let duration = common::run_secs(1.0, 10.0);
    common::header("contended", quick);
    println!(
        "C = {CONTENDERS:?} contenders split over 2 processes, {duration:?} per run, the ideal FIFO ticket lock, the Redisson layout floor, the two SET NX baselines, then FairLock per C"
    );
    let server = support::RedisServer::start();
    let url = server.url();
    common::runtime().block_on(async {
        let mut admin = common::admin_conn(&url).await;
        let mut results = Vec::new();
        for c in CONTENDERS {
            for variant in [
                Variant::Ticket,
                Variant::Layout,
                Variant::LayoutPlus,
                Variant::Polling,
                Variant::RandomRetry,
                Variant::Fair,
            ] {
                let r = run_once(&url, &mut admin, variant, c, duration).await;
                eprintln!(
                    "  {} C={c}: {:.0} acq/s, {} acquisitions ({} queued first), counter ok",
                    variant.label(),
                    r.rate,
                    r.total,
                    r.queued
                );
                results.push(r);
            }
        }
        report(&results);
    });
}

/// The figures of one run.
struct Outcome {
    variant: Variant,
    contenders: usize,
    /// Every acquisition, also those granted after the window while the queue drained.
    total: usize,
    /// Of them, the calls that waited in the queue (their place was confirmed before the grant).
    queued: usize,
    /// Grants inside the window per second.
    rate: f64,
    wait_us: Vec<u64>,
    /// Grant → release: the critical section as the holder saw it.
    hold_us: Vec<u64>,
    handoff_us: Vec<u64>,
    inversions: u64,
    /// Of those, the pairs where A had its place in the queue before B called.
    queue_inversions: u64,
    /// The first few inversions, described (who waited, who overtook, by how much).
    inversion_examples: Vec<String>,
    /// Acquisitions that overtook at least one earlier waiter.
    overtakers: u64,
    jain: f64,
    /// Per acquisition, the critical section's GET + SET excluded.
    commands: f64,
    round_trips: f64,
    /// Server CPU per acquisition (µs).
    redis_cpu_us: f64,
    /// Both bench processes' CPU per acquisition (µs).
    client_cpu_us: f64,
    /// Per command (scripts' inner commands included): calls and server µs per acquisition,
    /// most calls first; coordination and the critical section included (`common::breakdown`).
    breakdown: String,
}

async fn run_once(
    url: &str,
    admin: &mut MultiplexedConnection,
    variant: Variant,
    contenders: usize,
    duration: Duration,
) -> Outcome {
    common::flush_all(admin).await;
    let () = redis::cmd("SET")
        .arg(COUNTER)
        .arg(0)
        .query_async(admin)
        .await
        .expect("SET counter");
    if variant == Variant::Ticket {
        // The baton for the first ticket (INCR returns 1 first).
        let _: i64 = redis::cmd("LPUSH")
            .arg(ticket_turn(1))
            .arg(1)
            .query_async(admin)
            .await
            .expect("LPUSH first baton");
    }
    let run = format!("{}-{contenders}-{}", variant.arg(), common::now_us());
    let lists = Lists::new(&run);
    let mine = contenders.div_ceil(2);
    let theirs = contenders - mine;
    let child = common::spawn_self(
        WORKER_ROLE,
        &[
            ("FAIRLOCK_BENCH_URL", url.to_owned()),
            ("FAIRLOCK_BENCH_RUN", run.clone()),
            ("FAIRLOCK_BENCH_VARIANT", variant.arg().to_owned()),
            ("FAIRLOCK_BENCH_CONTENDERS", theirs.to_string()),
            ("FAIRLOCK_BENCH_FIRST_ID", mine.to_string()),
        ],
    );
    let (tx, rx) = watch::channel(None);
    let side = start_contenders(url, variant, mine, 0, rx).await;
    common::blpop(
        admin,
        &lists.ready,
        COORDINATION_TIMEOUT,
        "the helper process",
    )
    .await;

    // From here on the server counters belong to the run.
    common::reset_stats(admin).await;
    let before = common::info(admin).await;
    let start_us = common::now_us();
    let plan = Plan {
        start_us,
        stop_us: start_us + duration.as_micros() as u64,
    };
    common::rpush(
        admin,
        &lists.go,
        &format!("{},{}", plan.start_us, plan.stop_us),
    )
    .await;
    let cpu_start = common::cpu_time();
    tx.send_replace(Some(plan));
    let (mut records, client) = join_all(side).await;
    let main_cpu = common::cpu_time() - cpu_start;
    common::blpop(
        admin,
        &lists.done,
        COORDINATION_TIMEOUT + duration,
        "the helper's contenders",
    )
    .await;
    let delta = common::info(admin).await.since(&before);
    common::rpush(admin, &lists.exit, "1").await;
    let out = common::finish_child(child, COORDINATION_TIMEOUT, "contended helper").await;
    records.extend(out.lines().filter_map(Record::from_line));
    let helper_cpu_us: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("CPU "))
        .map_or(0, |v| v.parse().expect("helper CPU"));
    if let Some(client) = client {
        client.shutdown().await;
    }

    // Mutual exclusion, checked on every run.
    let counter: i64 = redis::cmd("GET")
        .arg(COUNTER)
        .query_async(admin)
        .await
        .expect("GET counter");
    assert_eq!(
        counter,
        records.len() as i64,
        "MUTUAL EXCLUSION VIOLATED ({} C={contenders}): counter {counter} != {} acquisitions",
        variant.label(),
        records.len()
    );
    records.sort_by_key(|r| r.grant);
    for pair in records.windows(2) {
        assert!(
            pair[1].grant >= pair[0].release,
            "MUTUAL EXCLUSION VIOLATED ({} C={contenders}): contender {} was granted at {} µs \
             while contender {} held the lock until {} µs",
            variant.label(),
            pair[1].contender,
            pair[1].grant,
            pair[0].contender,
            pair[0].release
        );
    }

    // Coordination inside the counted interval: RPUSH go and done, the closing INFO and the
    // helper's BLPOP go (excluded by name with INFO, CONFIG and BLPOP); one read each for the two
    // RPUSHes, the BLPOP done and the closing INFO.
    let total = records.len();
    let commands = delta
        .calls_except(&["info", "config", "blpop"])
        .saturating_sub(2);
    let reads = delta.reads.saturating_sub(4);
    let per_acq = |n: u64| n as f64 / total.max(1) as f64 - 2.0;
    let mut outcome = analyse(
        variant,
        contenders,
        plan,
        &records,
        per_acq(commands),
        per_acq(reads),
    );
    let per = |us: u64| us as f64 / total.max(1) as f64;
    outcome.redis_cpu_us = per(delta.cpu_us);
    outcome.client_cpu_us = per(main_cpu.as_micros() as u64 + helper_cpu_us);
    outcome.breakdown = common::breakdown([&delta], total);
    outcome
}

/// Every figure of one run from its records (sorted by grant time).
fn analyse(
    variant: Variant,
    contenders: usize,
    plan: Plan,
    records: &[Record],
    commands: f64,
    round_trips: f64,
) -> Outcome {
    let in_window = |r: &Record| r.grant >= plan.start_us && r.grant < plan.stop_us;
    let window: Vec<&Record> = records.iter().filter(|r| in_window(r)).collect();
    let secs = (plan.stop_us - plan.start_us) as f64 / 1e6;

    let mut wait_us: Vec<u64> = window.iter().map(|r| r.grant - r.issue).collect();
    wait_us.sort_unstable();
    let mut hold_us: Vec<u64> = window.iter().map(|r| r.release - r.grant).collect();
    hold_us.sort_unstable();

    // Handoff: the next holder was already waiting when the previous one released.
    let mut handoff_us: Vec<u64> = records
        .windows(2)
        .filter(|p| in_window(&p[1]) && p[1].issue < p[0].release)
        .map(|p| p[1].grant - p[0].release)
        .collect();
    handoff_us.sort_unstable();

    // FIFO inversions: A waiting, B calls lock() more than 2 ms after A, B granted before A.
    let mut by_issue: Vec<&Record> = records.iter().collect();
    by_issue.sort_by_key(|r| r.issue);
    // Queue-order inversions: of those, the pairs where A's place in the queue was taken before
    // B even called (A's queued reply came first), so B's attempts all ran after A had joined.
    let mut inversions = 0u64;
    let mut queue_inversions = 0u64;
    let mut examples = Vec::new();
    let mut overtook = vec![false; by_issue.len()];
    for (i, a) in by_issue.iter().enumerate() {
        for (j, b) in by_issue.iter().enumerate().skip(i + 1) {
            if b.issue >= a.grant {
                break;
            }
            if b.issue > a.issue + INVERSION_MARGIN_US && b.grant < a.grant {
                inversions += 1;
                let after_queued = a.queued != 0 && a.queued < b.issue;
                if after_queued {
                    queue_inversions += 1;
                }
                overtook[j] = true;
                if examples.len() < MAX_INVERSION_EXAMPLES {
                    // Contenders below `first_helper` run in this process, the others in the helper.
                    let first_helper = contenders.div_ceil(2) as u32;
                    let side = |c: u32| if c < first_helper { "main" } else { "helper" };
                    let queued = if a.queued == 0 {
                        "never queued".to_owned()
                    } else {
                        format!(
                            "queued {} ms after its call, {} the other's call",
                            ms(a.queued.saturating_sub(a.issue)),
                            if after_queued { "before" } else { "after" }
                        )
                    };
                    examples.push(format!(
                        "contender {} ({}) called at {:.3} s, {queued}, and waited {} ms; \
                         contender {} ({}) called {} ms later and was granted {} ms before it",
                        a.contender,
                        side(a.contender),
                        a.issue.saturating_sub(plan.start_us) as f64 / 1e6,
                        ms(a.grant - a.issue),
                        b.contender,
                        side(b.contender),
                        ms(b.issue - a.issue),
                        ms(a.grant - b.grant),
                    ));
                }
            }
        }
    }
    let overtakers = overtook.iter().filter(|o| **o).count() as u64;

    // Jain's index over every contender's count in the window (zeros included).
    let mut counts: HashMap<u32, f64> = (0..contenders as u32).map(|id| (id, 0.0)).collect();
    for r in &window {
        *counts.entry(r.contender).or_default() += 1.0;
    }
    let sum: f64 = counts.values().sum();
    let sum_sq: f64 = counts.values().map(|x| x * x).sum();
    let jain = if sum_sq > 0.0 {
        sum * sum / (counts.len() as f64 * sum_sq)
    } else {
        0.0
    };

    Outcome {
        variant,
        contenders,
        total: records.len(),
        queued: records.iter().filter(|r| r.queued != 0).count(),
        rate: window.len() as f64 / secs,
        wait_us,
        hold_us,
        handoff_us,
        inversions,
        queue_inversions,
        inversion_examples: examples,
        overtakers,
        jain,
        commands,
        round_trips,
        redis_cpu_us: 0.0,
        client_cpu_us: 0.0,
        breakdown: String::new(),
    }
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1e3)
}

fn report(results: &[Outcome]) {
    println!();
    println!(
        "| lock | C | acq/s | wait p50 ms | wait p99 ms | wait max ms | hold p50 ms | handoff p50 ms | handoff p99 ms | FIFO inversions (overtaking acq.) | of them after A queued | Jain | cmds/acq | round trips/acq | Redis CPU µs/acq | client CPU µs/acq |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in results {
        let handoff = |p| {
            if r.handoff_us.is_empty() {
                "n/a".to_owned()
            } else {
                ms(common::percentile(&r.handoff_us, p))
            }
        };
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {:.3} | {:.1} | {:.2} | {:.0} | {:.0} |",
            r.variant.label(),
            r.contenders,
            r.rate,
            ms(common::percentile(&r.wait_us, 50.0)),
            ms(common::percentile(&r.wait_us, 99.0)),
            ms(r.wait_us.last().copied().unwrap_or(0)),
            ms(common::percentile(&r.hold_us, 50.0)),
            handoff(50.0),
            handoff(99.0),
            r.inversions,
            r.overtakers,
            if matches!(r.variant, Variant::Polling | Variant::RandomRetry) {
                "n/a".to_owned()
            } else {
                r.queue_inversions.to_string()
            },
            r.jain,
            r.commands,
            r.round_trips,
            r.redis_cpu_us,
            r.client_cpu_us,
        );
    }
    for r in results {
        if matches!(
            r.variant,
            Variant::Fair | Variant::Layout | Variant::LayoutPlus | Variant::Ticket
        ) && !r.inversion_examples.is_empty()
        {
            println!(
                "FIFO inversions of {} C={} (the first {}):",
                r.variant.label(),
                r.contenders,
                r.inversion_examples.len()
            );
            for example in &r.inversion_examples {
                println!("  {example}");
            }
        }
    }
    println!();
    println!("hold = grant → release (the critical section, GET + SET); handoff = release → grant of a holder that was already waiting.");
    println!("cmds/acq and round trips/acq exclude the critical section's GET + SET (2 + 2); CPU per acquisition includes them (and, on the client side, the bench's own loop).");
    let find = |variant, c| {
        results
            .iter()
            .find(|r| r.variant == variant && r.contenders == c)
    };
    if let (Some(r), Some(poll), Some(random)) = (
        find(Variant::Fair, 64),
        find(Variant::Polling, 64),
        find(Variant::RandomRetry, 64),
    ) {
        let p50 = common::percentile(&r.handoff_us, 50.0) as f64 / 1e3;
        let p99 = common::percentile(&r.handoff_us, 99.0) as f64 / 1e3;
        println!(
            "FairLock C=64: {:.2}× polling, {:.2}× random retry",
            r.rate / poll.rate,
            r.rate / random.rate
        );
        let checks = [
            ("acq/s ≥ 1.0× polling", r.rate >= poll.rate),
            ("acq/s ≥ 1.0× random retry", r.rate >= random.rate),
            ("zero FIFO inversions", r.inversions == 0),
            (
                "zero FIFO inversions after A queued",
                r.queue_inversions == 0,
            ),
            ("Jain ≥ 0.99", r.jain >= 0.99),
            ("handoff p50 ≤ 0.1 ms", p50 <= 0.1),
            ("handoff p99 ≤ 1 ms", p99 <= 1.0),
            ("≤ 33 cmds/acq", r.commands <= 33.0),
        ];
        println!("targets, FairLock C=64:");
        for (what, ok) in checks {
            println!("  {what}: {}", if ok { "met" } else { "MISSED" });
        }
    }
    // Issue 36: against the ideal FIFO hand-off, in the same run.
    if let (Some(r), Some(ideal)) = (find(Variant::Fair, 64), find(Variant::Ticket, 64)) {
        let p50 = |o: &Outcome| common::percentile(&o.handoff_us, 50.0) as f64 / 1e3;
        println!(
            "FairLock C=64 against the ideal FIFO: {:.2}× its acq/s, handoff p50 {:.3} vs {:.3} ms, Redis CPU {:.2}×, client CPU {:.2}×, {:.1} vs {:.1} cmds/acq",
            r.rate / ideal.rate,
            p50(r),
            p50(ideal),
            r.redis_cpu_us / ideal.redis_cpu_us,
            r.client_cpu_us / ideal.client_cpu_us,
            r.commands,
            ideal.commands
        );
        let checks = [
            ("acq/s ≥ 0.9× ideal FIFO", r.rate >= 0.9 * ideal.rate),
            ("handoff p50 ≤ ideal + 0.03 ms", p50(r) <= p50(ideal) + 0.03),
            (
                "Redis CPU/acq ≤ 1.5× ideal",
                r.redis_cpu_us <= 1.5 * ideal.redis_cpu_us,
            ),
            (
                "client CPU/acq ≤ 1.5× ideal",
                r.client_cpu_us <= 1.5 * ideal.client_cpu_us,
            ),
            ("≤ 12 cmds/acq", r.commands <= 12.0),
        ];
        println!("targets (issue 36), FairLock C=64:");
        for (what, ok) in checks {
            println!("  {what}: {}", if ok { "met" } else { "MISSED" });
        }
    }
    // What the shared layout forces, and what fairlock adds on top of it.
    if let (Some(r), Some(floor), Some(ideal)) = (
        find(Variant::Fair, 64),
        find(Variant::Layout, 64),
        find(Variant::Ticket, 64),
    ) {
        println!(
            "Redisson layout floor C=64 against the ideal FIFO: {:.2}× its acq/s, Redis CPU {:.2}×, client CPU {:.2}×, {:.1} cmds/acq; FairLock against the floor: {:.2}× its acq/s, Redis CPU {:.2}×, client CPU {:.2}×",
            floor.rate / ideal.rate,
            floor.redis_cpu_us / ideal.redis_cpu_us,
            floor.client_cpu_us / ideal.client_cpu_us,
            floor.commands,
            r.rate / floor.rate,
            r.redis_cpu_us / floor.redis_cpu_us,
            r.client_cpu_us / floor.client_cpu_us,
        );
    }
    // Of FairLock's distance to the floor, what its scripts' commands cost (the floor running
    // them, with the floor's client) and what is left to its client and its scripts' logic.
    if let (Some(r), Some(plus), Some(floor), Some(ideal)) = (
        find(Variant::Fair, 64),
        find(Variant::LayoutPlus, 64),
        find(Variant::Layout, 64),
        find(Variant::Ticket, 64),
    ) {
        println!(
            "layout floor + FairLock's commands C=64: {:.2}× the ideal FIFO's acq/s, {:.2}× the floor's, Redis CPU {:.2}× the floor's, {:.1} cmds/acq; FairLock against it: {:.2}× its acq/s, Redis CPU {:.2}×, client CPU {:.2}×",
            plus.rate / ideal.rate,
            plus.rate / floor.rate,
            plus.redis_cpu_us / floor.redis_cpu_us,
            plus.commands,
            r.rate / plus.rate,
            r.redis_cpu_us / plus.redis_cpu_us,
            r.client_cpu_us / plus.client_cpu_us,
        );
    }
    for c in [1, 64] {
        for variant in [
            Variant::Ticket,
            Variant::Layout,
            Variant::LayoutPlus,
            Variant::Fair,
        ] {
            let Some(r) = find(variant, c) else { continue };
            println!(
                "commands per acquisition, {} C={c} (server µs; coordination and critical section included): {}",
                r.variant.label(),
                r.breakdown
            );
        }
    }
    if let (Some(r), Some(ideal)) = (find(Variant::Fair, 1), find(Variant::Ticket, 1)) {
        println!(
            "FairLock C=1: {:.2}× the ideal FIFO's acq/s",
            r.rate / ideal.rate
        );
    }
}
