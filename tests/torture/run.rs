//! One seeded run, from the parent's side: child processes and their proxies, the queue
//! monitor, the peer, the faults, the teardown and the check.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock_testkit::history::{epoch_ms, mono_ns, Event};
use fairlock_testkit::redisson_peer::{splitmix, RedissonPeer, Sink};
use fairlock_testkit::{derived_key, queue_key, timeout_key, Proxy, RedisServer};

use crate::check::{self, leftovers::leftovers, History, Params, Snapshot};
use crate::child::child_main;
use crate::config::*;
use crate::faults::{run_faults, Shared};
use crate::peer::java_thread;

pub struct ChildProc {
    pub proc: String,
    pub child: Child,
    pub pid: u32,
    pub proxy: Option<Proxy>,
    pub log: PathBuf,
    pub alive: bool,
    pub counts: Arc<Mutex<String>>,
}

pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

pub struct Spawner {
    pub test: String,
    pub server_port: u16,
    pub dir: PathBuf,
    pub seed: u64,
    pub ops: String,
    pub next: usize,
}

impl Spawner {
    pub fn spawn(&mut self, tasks: usize) -> ChildProc {
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

/// Snapshots every fair queue in one `MULTI`, every few ms. Of each run of identical snapshots
/// only the first and the last are kept (the first is the earliest proof of a state, the last
/// the latest).
pub async fn monitor(port: u16, stop: Arc<AtomicBool>, out: Arc<Mutex<Vec<Snapshot>>>) {
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
                .arg(queue_key(name))
                .arg(0)
                .arg(-1)
                .cmd("ZRANGE")
                .arg(timeout_key(name))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .cmd("HKEYS")
                .arg(name)
                .cmd("GET")
                .arg(derived_key("redisson_lock_token", name))
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

pub struct RunDir(PathBuf);

impl RunDir {
    pub fn new(seed: u64) -> RunDir {
        let dir = std::env::temp_dir().join("fairlock-tests").join(format!(
            "torture-{seed}-{}-{}",
            std::process::id(),
            mono_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        RunDir(dir)
    }
}

pub fn read_events(path: &Path) -> Vec<Event> {
    let Ok(f) = File::open(path) else {
        return Vec::new();
    };
    BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| Event::parse(&l))
        .collect()
}

pub fn params(epoch_offset_ms: f64) -> Params {
    Params {
        command_timeout: TIMING.command_timeout,
        liveness: TIMING.liveness,
        slack: Duration::from_millis(250),
        fault_grace: Duration::from_millis(1000),
        lag_threshold: Duration::from_millis(100),
        epoch_offset_ms,
    }
}

pub fn torture(test: &str, seed: u64) {
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
    let mut args = vec![
        // Persistence so a restart is a crash, not an amnesia: replies are sent only after the
        // AOF write, and a killed process loses nothing the kernel has.
        "--appendonly",
        "yes",
        "--appendfsync",
        "no",
    ];
    // DEBUG SLEEP (the "sleep" fault): allowed by an option on 7.0+, always on 6.2.
    args.extend_from_slice(fairlock_testkit::test_server().kind.debug_command_args());
    let server = RedisServer::start_with(&args);
    let port = server.port();
    // The semaphore's permits, set before any child starts (a missing key holds none).
    {
        let mut admin = crate::faults::admin_conn(port).expect("admin connection");
        for name in [SEM_NAME, SEM_PLAIN_NAME, BIG_SEM_NAME] {
            let () = redis::cmd("SET")
                .arg(name)
                .arg(sem_limit(name))
                .query(&mut admin)
                .expect("set the semaphore's permits");
        }
    }
    // Fencing counters: per lock name, from 0 or (drawn by the seed) just below 2^53, so that
    // the run's tokens cross the largest integer a Lua number holds exactly. Tokens once came
    // back rounded past it (two grants could show the same one); the fencing check sees that.
    {
        let mut admin = crate::faults::admin_conn(port).expect("admin connection");
        let mut rng = Rng::new(seed ^ 0x7f0c_e7ed);
        for name in FAIR_NAMES.iter().chain(&PLAIN_NAMES).chain(&RW_NAMES) {
            if rng.chance(0.5) {
                let start = (1u64 << 53) - rng.below(2_000);
                let () = redis::cmd("SET")
                    .arg(format!("redisson_lock_token:{{{name}}}"))
                    .arg(start)
                    .query(&mut admin)
                    .expect("set a fencing counter");
                println!("fencing counter of {name} starts at {start}");
            }
        }
    }
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
    if ops.contains("rw") {
        // The peer reads and writes them as `RReadWriteLock` does (it ignores the
        // writer-preferring queue, as Java clients do).
        names.extend(RW_NAMES.iter().map(|n| (*n, false)));
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
    let (left, plain_count) = rt.block_on(leftovers(port));
    problems.extend(left);

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
    check::add_workload_stalls(&mut h);
    h.frozen = shared.frozen.lock().unwrap().clone();
    h.exited = shared.exited.lock().unwrap().clone();
    let (violations, stats) = check::check(&h, 5);
    // The plain semaphore's count: every permit back, but for those killed processes may have
    // taken with them.
    let (lost_certain, lost_possible) = check::plain_permits_lost(&h);
    let expected_hi = SEM_LIMIT as i64 - lost_certain as i64;
    let expected_lo = expected_hi - lost_possible as i64;
    match plain_count {
        Some(n) if (expected_lo..=expected_hi).contains(&n) => {}
        other => problems.push(format!(
            "permits lost: {SEM_PLAIN_NAME} ends with {other:?} available, expected \
             {expected_lo}..={expected_hi} ({lost_certain} certainly and {lost_possible} \
             possibly held by killed processes)"
        )),
    }

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
        "  direct hand-offs taken up from their message (PROTOCOL 8): {}",
        h.calls.iter().filter(|c| c.handed).count()
    );
    println!(
        "  faults injected: {:?}",
        shared.fault_counts.lock().unwrap()
    );
    println!("  Redisson-protocol entries given up again at teardown: {java_leftovers}");
    println!(
        "  semaphores: {} permit holds checked, at most {} of {SEM_LIMIT} permits trusted at once; \
         the plain one ended with {plain_count:?} available ({lost_certain} certainly, \
         {lost_possible} possibly taken by killed processes)",
        stats.permit_holds, stats.permit_peak
    );
    println!(
        "  checks: {} overlapping hold pairs, {} tokens, {} fifo pairs ({} exempt by faults), \
         {} bounded waits ({} exempt by faults), {} reader/queued-writer pairs ({} exempt by \
         faults), leftovers {}",
        stats.overlap_pairs,
        stats.tokens,
        stats.fifo_pairs,
        stats.fifo_exempt,
        stats.bounded_calls,
        stats.bounded_exempt,
        stats.preference_pairs,
        stats.preference_exempt,
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
        report.push_str(&check::context(&h, v));
    }
    panic!("{report}");
}
