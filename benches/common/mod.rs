//! Helpers shared by the bench programs (each includes this with `mod common;`): quick mode, the
//! runtime, clocks, percentiles, Redis `INFO` snapshots and their deltas, `/proc` readers, and
//! child processes that die with the bench.
//!
//! The Redis server itself comes from the test kit (`testkit/`, the `fairlock-testkit`
//! dev-dependency).
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::AsyncConnectionConfig;

/// Environment variable that turns on quick mode (a few seconds per program, for smoke checks).
pub const QUICK_ENV: &str = "FAIRLOCK_BENCH_QUICK";

/// Quick mode: `FAIRLOCK_BENCH_QUICK=1` (anything but empty or `0`) or a `--quick` argument.
/// (`cargo bench` passes `--bench` to every harness-less bench; other arguments are ignored.)
pub fn quick() -> bool {
    std::env::var(QUICK_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
        || std::env::args().any(|a| a == "--quick")
}

/// The runtime every bench runs on: tokio's multi-threaded scheduler with one worker per core,
/// as an application using the library would.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The length of one run: `FAIRLOCK_BENCH_SECS` when set, else `quick` or `full` seconds.
pub fn run_secs(quick: f64, full: f64) -> Duration {
    let secs = std::env::var("FAIRLOCK_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if self::quick() { quick } else { full });
    Duration::from_secs_f64(secs)
}

/// Wall-clock microseconds since the Unix epoch. Every process on the machine reads the same clock,
/// so records from two processes can be merged on it.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// Nearest-rank percentile `p` (0..=100) of an ascending slice; 0 for an empty one.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median of a list of floats (sorted in place); NaN for an empty list.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Microseconds of a duration as a float.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A connection for the bench's own coordination and `INFO` reads: never times out by itself
/// (`BLPOP` waits longer than redis-rs's default 500 ms response timeout; every blocking call
/// passes its own timeout to Redis).
pub async fn admin_conn(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection_with_config(
            &AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .expect("admin connection")
}

/// A `ConnectionManager` configured as the library configures its own command connection
/// (3 s response and connect timeouts, 2 reconnect retries): the baselines use the same
/// multiplexed connection type and settings.
pub async fn manager(url: &str) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(3)))
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(redis::Client::open(url).expect("redis url"), config)
        .await
        .expect("connection manager")
}

/// `n` connection managers (one per contender: their critical sections never share a socket).
pub async fn managers(url: &str, n: usize) -> Vec<ConnectionManager> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(manager(url).await);
    }
    all
}

/// Calls and total microseconds of one command in `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmdStat {
    pub calls: u64,
    pub usec: u64,
    /// Calls that returned an error (e.g. `NOSCRIPT` before redis-rs loads a script).
    pub failed: u64,
}

/// One snapshot of the server counters the benches read.
#[derive(Debug, Clone, Default)]
pub struct Info {
    /// Per command (lowercase, e.g. `evalsha`), from `INFO commandstats`. Commands run by scripts
    /// are counted here too, under their own names.
    pub commands: HashMap<String, CmdStat>,
    /// `INFO stats` `total_reads_processed`: read events on client sockets, i.e. round trips as
    /// the server sees them (pipelined commands that arrive together are one read).
    pub reads: u64,
    /// `INFO cpu` `used_cpu_sys` + `used_cpu_user`: the server process's CPU time (all its
    /// threads) in µs. Not reset by `CONFIG RESETSTAT`: read it as a difference ([`Info::since`]).
    pub cpu_us: u64,
}

impl Info {
    /// Parses the text of `INFO commandstats stats`.
    pub fn parse(text: &str) -> Info {
        let mut info = Info::default();
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("cmdstat_") {
                let Some((name, fields)) = rest.split_once(':') else {
                    continue;
                };
                let mut stat = CmdStat::default();
                for kv in fields.split(',') {
                    match kv.split_once('=') {
                        Some(("calls", v)) => stat.calls = v.parse().unwrap_or(0),
                        Some(("usec", v)) => stat.usec = v.parse().unwrap_or(0),
                        Some(("failed_calls", v)) => stat.failed = v.parse().unwrap_or(0),
                        _ => {}
                    }
                }
                info.commands.insert(name.to_ascii_lowercase(), stat);
            } else if let Some(v) = line.strip_prefix("total_reads_processed:") {
                info.reads = v.parse().unwrap_or(0);
            } else if let Some(v) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                info.cpu_us += (v.parse::<f64>().unwrap_or(0.0) * 1e6) as u64;
            }
        }
        info
    }

    /// Calls and microseconds of one command (zero when it never ran).
    pub fn cmd(&self, name: &str) -> CmdStat {
        self.commands.get(name).copied().unwrap_or_default()
    }

    /// Everything that happened between `before` and `self`.
    pub fn since(&self, before: &Info) -> Info {
        let commands = self
            .commands
            .iter()
            .map(|(name, now)| {
                let was = before.cmd(name);
                (
                    name.clone(),
                    CmdStat {
                        calls: now.calls.saturating_sub(was.calls),
                        usec: now.usec.saturating_sub(was.usec),
                        failed: now.failed.saturating_sub(was.failed),
                    },
                )
            })
            .collect();
        Info {
            commands,
            reads: self.reads.saturating_sub(before.reads),
            cpu_us: self.cpu_us.saturating_sub(before.cpu_us),
        }
    }

    /// Total calls of every command except those named in `except`.
    pub fn calls_except(&self, except: &[&str]) -> u64 {
        self.commands
            .iter()
            .filter(|(name, _)| !except.contains(&name.as_str()))
            .map(|(_, s)| s.calls)
            .sum()
    }

    /// Script calls that ran: `evalsha` plus `eval`, without failed ones (a `NOSCRIPT` reply
    /// before redis-rs loads the script and sends it again).
    pub fn script_calls(&self) -> u64 {
        let (sha, eval) = (self.cmd("evalsha"), self.cmd("eval"));
        sha.calls + eval.calls - sha.failed - eval.failed
    }
}

/// Where the commands of several runs went, per operation: `name calls (µs)` for every command
/// that ran (scripts' inner commands under their own names), most calls first, without the
/// bench's own `INFO`, `CONFIG RESETSTAT` and `FLUSHALL`. `ops`: the operations of those runs.
pub fn breakdown<'a>(runs: impl IntoIterator<Item = &'a Info>, ops: usize) -> String {
    let mut total: HashMap<String, CmdStat> = HashMap::new();
    for info in runs {
        for (name, stat) in &info.commands {
            let t = total.entry(name.clone()).or_default();
            t.calls += stat.calls;
            t.usec += stat.usec;
        }
    }
    let per = |n: u64| n as f64 / ops.max(1) as f64;
    let mut rows: Vec<(String, f64, f64)> = total
        .into_iter()
        .filter(|(name, s)| {
            s.calls > 0 && !["info", "config|resetstat", "flushall"].contains(&name.as_str())
        })
        .map(|(name, s)| (name, per(s.calls), per(s.usec)))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    rows.iter()
        .map(|(name, calls, usec)| format!("{name} {calls:.2} ({usec:.1} µs)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads `INFO commandstats stats cpu` (one command, one round trip).
pub async fn info(conn: &mut MultiplexedConnection) -> Info {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("stats")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO");
    Info::parse(&text)
}

/// `CONFIG RESETSTAT`: zeroes `INFO commandstats` and `INFO stats`.
pub async fn reset_stats(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// `FLUSHALL`.
pub async fn flush_all(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("FLUSHALL")
        .query_async(conn)
        .await
        .expect("FLUSHALL");
}

/// `BLPOP key timeout`: the popped value, or a panic naming `what` when nothing came in time.
pub async fn blpop(
    conn: &mut MultiplexedConnection,
    key: &str,
    timeout: Duration,
    what: &str,
) -> String {
    let reply: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(key)
        .arg(timeout.as_secs_f64())
        .query_async(conn)
        .await
        .expect("BLPOP");
    match reply {
        Some((_, value)) => value,
        None => panic!("timed out after {timeout:?} waiting for {what} (list {key})"),
    }
}

/// `RPUSH key value`.
pub async fn rpush(conn: &mut MultiplexedConnection, key: &str, value: &str) {
    let _: i64 = redis::cmd("RPUSH")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .expect("RPUSH");
}

/// CPU time (user + system) this process has used so far, from `/proc/self/stat` (clock ticks,
/// 100 per second on Linux, so a 10 ms resolution).
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may contain spaces) start at field 3 (`state`);
    // utime and stime are fields 14 and 15.
    let after = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// Resident set size of this process in bytes, from `/proc/self/statm` (pages × page size).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm resident");
    pages * page_size()
}

fn page_size() -> u64 {
    static SIZE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("PAGESIZE")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096)
    })
}

/// "N cores, model name" of this machine, for the result headers.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_owned))
        })
        .unwrap_or_else(|| "?".into());
    format!(
        "{cores} cores, {model}, redis-server {redis}{}",
        idle_policy()
    )
}

/// The CPU idle driver, and on a guest with `haltpoll` how long an idle CPU polls before it
/// halts: with no polling (`guest_halt_poll_ns` 0) every wake-up of an idle CPU goes through the
/// hypervisor, and a round trip that crosses one costs several times what it does on a busy CPU.
/// Figures from hosts that differ here do not compare (`benches/README.md`, 2026-11-26).
fn idle_policy() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
    };
    match read("/sys/devices/system/cpu/cpuidle/current_driver") {
        Some(driver) if driver == "haltpoll" => {
            let poll = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
                .unwrap_or_else(|| "?".into());
            format!(", cpuidle haltpoll (guest_halt_poll_ns {poll})")
        }
        Some(driver) => format!(", cpuidle {driver}"),
        None => String::new(),
    }
}

/// Prints the common header of a bench program.
pub fn header(bench: &str, quick: bool) {
    println!(
        "== {bench} ({} mode) on {}",
        if quick { "quick" } else { "full" },
        machine()
    );
}

/// Starts this bench binary again as a helper process in `role` (the value of `ROLE_ENV`), with
/// `envs` added. The child is killed when the handle is dropped (also when the parent panics),
/// and reports on stderr directly.
pub fn spawn_self(role: &str, envs: &[(&str, String)]) -> tokio::process::Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = tokio::process::Command::new(exe);
    cmd.env(ROLE_ENV, role)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    cmd.spawn().expect("spawn helper process")
}

/// The environment variable naming a helper process's role; unset in the main process.
pub const ROLE_ENV: &str = "FAIRLOCK_BENCH_ROLE";

/// This process's helper role, if it is a helper.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok().filter(|r| !r.is_empty())
}

/// Waits for a helper process to exit (at most `timeout`) and returns its stdout; panics when it
/// failed or took too long (it is killed then).
pub async fn finish_child(child: tokio::process::Child, timeout: Duration, what: &str) -> String {
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what}: helper process did not exit within {timeout:?}"))
        .expect("wait for helper process");
    assert!(
        output.status.success(),
        "{what}: helper process failed with {}",
        output.status
    );
    String::from_utf8(output.stdout).expect("utf-8 helper output")
}
