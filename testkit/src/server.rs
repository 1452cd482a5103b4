//! One server (or sentinel) process per value, on a free loopback port, with its
//! own work directory and log file, signalled and killed by PID.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::servers::{test_server, tls_server_binary};
use super::wait::wait_until;

/// How long a process gets to answer PING after being spawned.
pub const START_DEADLINE: Duration = Duration::from_secs(10);
/// How long `stop` waits after SIGTERM before SIGKILL.
const STOP_DEADLINE: Duration = Duration::from_secs(15);
/// Fresh ports tried by `start` when the server fails to bind (another test took the port).
const START_ATTEMPTS: usize = 8;
/// Name of the log file (stdout + stderr) in every work directory.
pub const LOG_FILE: &str = "process.log";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A claim on a port number (and its cluster bus number, +10000) for the lifetime of one
/// [`RedisServer`] value, across every test process on the machine: an exclusive `flock` on
/// `temp_dir()/fairlock-tests/ports/<n>`. A killed server keeps its claim until the value is
/// dropped, because the processes that knew it are still running: sentinels keep pinging a killed
/// master's address (and reconfigure whatever answers there as a replica), cluster nodes keep
/// a failed node's address, and `restart` brings the server back on it. Without the claim another
/// test's fresh server could be handed that number and be taken into a group it does not belong
/// to. The kernel drops the lock when the process ends, however it ends, so no claim outlives its
/// process.
pub(crate) struct PortClaim {
    _files: [fs::File; 2],
}

impl PortClaim {
    /// Claims `port` and `port + 10000`, or None when another value (in any process) holds either.
    fn take(port: u16) -> Option<PortClaim> {
        let dir = std::env::temp_dir().join("fairlock-tests").join("ports");
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let claim = |n: u32| -> Option<fs::File> {
            let path = dir.join(n.to_string());
            let file = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            file.try_lock().ok().map(|()| file)
        };
        let own = claim(u32::from(port))?;
        let bus = claim(u32::from(port) + 10_000)?;
        Some(PortClaim { _files: [own, bus] })
    }
}

/// Whether some [`RedisServer`] value, in this process or another, claims `port` (as its own
/// port or as its cluster bus port) right now.
pub fn port_claimed(port: u16) -> bool {
    PortClaim::take(port).is_none()
}

/// A pseudo-random port in 20000..=40000 (seeded from pid, time and a counter) that no other
/// [`RedisServer`] value claims (see [`PortClaim`]) and such that both it and its cluster bus
/// port (+10000) can be bound right now. A process outside the test kit can still take the port
/// before our server binds it; the server then fails to bind and `launch` retries elsewhere.
pub(crate) fn free_port() -> (u16, PortClaim) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut x = nanos
        ^ (u64::from(std::process::id()) << 20)
        ^ (u64::from(COUNTER.fetch_add(1, Ordering::Relaxed)) << 40);
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    for _ in 0..10_000 {
        // splitmix64
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let port = 20_000 + (z % 20_001) as u16;
        let Some(claim) = PortClaim::take(port) else {
            continue;
        };
        if free(port) && free(port + 10_000) {
            return (port, claim);
        }
    }
    panic!("no free port pair (P, P+10000) found in 20000..=40000");
}

/// A fresh, empty directory `temp_dir()/fairlock-tests/<label>-<pid>-<nanos>-<counter>`.
pub(crate) fn work_dir(label: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir = std::env::temp_dir().join("fairlock-tests").join(format!(
        "{label}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create work dir {}: {e}", dir.display()));
    dir
}

/// A work directory that is removed on drop.
pub struct WorkDir(PathBuf);

impl WorkDir {
    /// A fresh, empty directory (see [`work_dir`]).
    pub fn new(label: &str) -> WorkDir {
        WorkDir(work_dir(label))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The last `lines` lines of a log file (or a note that it could not be read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// A sync connection with short connect/read/write timeouts, for probes that must not hang on a
/// paused or dead process.
pub(crate) fn probe_conn(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let conn = client
        .get_connection_with_timeout(Duration::from_millis(300))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(1000)))
        .ok()?;
    conn.set_write_timeout(Some(Duration::from_millis(1000)))
        .ok()?;
    Some(conn)
}

/// The value of `field` in an `INFO` reply.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// Runs `INFO section` on the process at `port` (None when it does not answer in time).
pub(crate) fn probe_info(port: u16, section: &str) -> Option<String> {
    let mut conn = probe_conn(port)?;
    redis::cmd("INFO").arg(section).query(&mut conn).ok()
}

/// Process state letter from `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, …); None without procfs.
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ..." – comm may contain spaces or parentheses, so split at the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A running (or killed/stopped) server or sentinel process owned by the test.
pub struct RedisServer {
    /// `None` once killed/stopped and reaped. Behind a mutex so `&self` methods (signals,
    /// `is_running`) can check for exit without racing a concurrent reap.
    child: Mutex<Option<Child>>,
    pid: u32,
    port: u16,
    dir: PathBuf,
    program: &'static str,
    argv: Vec<OsString>,
    /// Held until the value is dropped, kill or no kill (see [`PortClaim`]).
    _claim: PortClaim,
}

impl RedisServer {
    /// A standalone server with persistence off, answering PING.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A standalone server with `extra_args` appended to the command line
    /// (`--port P --bind 127.0.0.1 --save "" --appendonly no --dir <dir> --protected-mode no`).
    /// The binary is the server under test ([`test_server`](crate::test_server)).
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        Self::start_program(&test_server().server, extra_args)
    }

    /// [`RedisServer::start_with`] on a server built with TLS, whatever server is under test:
    /// Debian's Redis 7.0 ([`tls_server_binary`](crate::tls_server_binary)).
    pub fn start_tls_capable_with(extra_args: &[&str]) -> RedisServer {
        Self::start_program(tls_server_binary(), extra_args)
    }

    fn start_program(program: &'static str, extra_args: &[&str]) -> RedisServer {
        let extra: Vec<OsString> = extra_args.iter().map(OsString::from).collect();
        Self::launch(program, "redis", |port, dir| {
            let mut argv: Vec<OsString> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--dir",
            ]
            .iter()
            .map(OsString::from)
            .collect();
            argv.push(dir.as_os_str().to_owned());
            argv.extend(extra.iter().cloned());
            argv
        })
    }

    /// Picks a free port and a fresh work dir, builds the command line with `make_argv(port,
    /// dir)`, spawns `program` and waits until it answers PING (and is the process we spawned).
    /// On a failed start (port taken meanwhile, crash) retries on another port; panics with the
    /// log tails after `START_ATTEMPTS` failures.
    pub(crate) fn launch(
        program: &'static str,
        label: &str,
        mut make_argv: impl FnMut(u16, &Path) -> Vec<OsString>,
    ) -> RedisServer {
        let mut errors = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            let (port, claim) = free_port();
            let dir = work_dir(&format!("{label}-{port}"));
            let argv = make_argv(port, &dir);
            let mut server = RedisServer {
                child: Mutex::new(None),
                pid: 0,
                port,
                dir,
                program,
                argv,
                _claim: claim,
            };
            match server.spawn() {
                Ok(()) => return server,
                // `server` drops here: killed if still alive, work dir removed.
                Err(e) => errors.push(format!("attempt {attempt} on port {port}: {e}")),
            }
        }
        panic!(
            "could not start {program} after {START_ATTEMPTS} attempts:\n{}",
            errors.join("\n---\n")
        );
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// Spawns the process with this value's command line and waits (10 s) for it to answer.
    fn spawn(&mut self) -> Result<(), String> {
        let log_path = self.log_path();
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("open {}: {e}", log_path.display()))?;
        let _ = writeln!(
            log,
            "=== fairlock test harness: {} {:?}",
            self.program, self.argv
        );
        let child = Command::new(self.program)
            .args(&self.argv)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.program))?;
        self.pid = child.id();
        *self.child_lock() = Some(child);
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if self.answers_as_itself() {
                return Ok(());
            }
            {
                let mut guard = self.child_lock();
                if let Some(child) = guard.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        *guard = None;
                        drop(guard);
                        return Err(format!(
                            "{} exited with {status} before answering PING; log tail:\n{}",
                            self.program,
                            tail(&self.log_path(), 20)
                        ));
                    }
                }
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "{} did not answer PING within {START_DEADLINE:?}; log tail:\n{}",
                    self.program,
                    tail(&self.log_path(), 20)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// PING answers and `INFO server` reports our pid (not another test's server that happens
    /// to hold the port while ours is failing to bind).
    fn answers_as_itself(&self) -> bool {
        let Some(mut conn) = probe_conn(self.port) else {
            return false;
        };
        if redis::cmd("PING").query::<String>(&mut conn).is_err() {
            return false;
        }
        let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut conn) else {
            return false;
        };
        info_field(&info, "process_id").and_then(|p| p.parse::<u32>().ok()) == Some(self.pid)
    }

    fn child_lock(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The TCP port (stays the same across `restart`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of the current (or, after kill/stop, the last) process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The work directory (holds the log file, and nodes.conf / sentinel.conf where used).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last `lines` lines of the process's stdout/stderr log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }

    /// A raw synchronous connection for assertions (5 s connect timeout, no read timeout).
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }

    /// A raw multiplexed async connection.
    pub async fn async_conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("async connect to {}: {e}", self.url()))
    }

    /// Sends `-SIG` to the process with the `kill` binary if it has not exited (an exited but
    /// unreaped process keeps its pid, so the pid cannot belong to someone else). Returns
    /// whether a signal was delivered.
    fn signal(&self, sig: &str) -> bool {
        let mut guard = self.child_lock();
        let Some(child) = guard.as_mut() else {
            return false;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("running `kill -{sig} {}`: {e}", child.id()));
        assert!(
            status.success(),
            "`kill -{sig} {}` failed: {status}",
            child.id()
        );
        true
    }

    /// Waits (2 s) until `/proc` shows the process stopped (`stopped == true`) or not.
    fn wait_stopped_state(&self, stopped: bool) {
        let pid = self.pid;
        if proc_state(pid).is_none() {
            return; // no procfs: signals to self-owned children are delivered promptly anyway
        }
        wait_until(
            Duration::from_secs(2),
            &format!("pid {pid} stopped == {stopped}"),
            || match proc_state(pid) {
                Some('T') | Some('t') => stopped,
                Some(_) => !stopped,
                None => true,
            },
        );
    }

    /// SIGKILL by PID and reap. No-op when not running.
    pub fn kill(&mut self) {
        let mut guard = self.child_lock();
        if let Some(mut child) = guard.take() {
            let _ = child.kill(); // SIGKILL also ends a SIGSTOPped process
            let _ = child.wait();
        }
    }

    /// SIGTERM by PID (after SIGCONT in case it is paused), wait up to 15 s for it to exit,
    /// then SIGKILL. Reaps the process.
    pub fn stop(&mut self) {
        if self.signal("CONT") {
            self.signal("TERM");
        }
        let mut guard = self.child_lock();
        if let Some(mut child) = guard.take() {
            let deadline = Instant::now() + STOP_DEADLINE;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing is answered. Returns once
    /// the kernel reports the process stopped.
    pub fn pause(&self) {
        assert!(self.signal("STOP"), "pause: {} is not running", self.url());
        self.wait_stopped_state(true);
    }

    /// Thaws a paused process (SIGCONT). Returns once the kernel reports it running again.
    pub fn resume(&self) {
        assert!(self.signal("CONT"), "resume: {} is not running", self.url());
        self.wait_stopped_state(false);
    }

    /// Kills the process if it is running and starts it again on the same port with the same
    /// command line and work dir; returns once it answers PING. Panics (with the log tail) if
    /// the port cannot be bound again within 10 s.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            match self.spawn() {
                Ok(()) => return,
                // The old socket may linger for a moment.
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("restart on port {} failed: {e}", self.port),
            }
        }
    }

    /// Whether the process is alive (a paused process is alive).
    pub fn is_running(&self) -> bool {
        matches!(
            self.child_lock().as_mut().map(|c| c.try_wait()),
            Some(Ok(None))
        )
    }

    /// `INFO section` as text (panics when the process does not answer within ~1 s).
    pub fn info(&self, section: &str) -> String {
        probe_info(self.port, section)
            .unwrap_or_else(|| panic!("INFO {section} from {} failed", self.url()))
    }

    /// A replica of `master` (`--replicaof 127.0.0.1 P`), returned once its link to the master
    /// is up, the master lists it online, and it has acknowledged a write.
    pub fn start_replica_of(master: &RedisServer) -> RedisServer {
        Self::start_replica_with(master, &[])
    }

    /// [`RedisServer::start_replica_of`] with extra arguments for the replica.
    pub fn start_replica_with(master: &RedisServer, extra_args: &[&str]) -> RedisServer {
        let mut master_conn = master.conn();
        // Full sync at once instead of after the default 5 s diskless-sync delay.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg("0")
            .query(&mut master_conn)
            .unwrap();
        let master_port = master.port.to_string();
        let mut args = vec![
            "--replicaof",
            "127.0.0.1",
            &master_port,
            // Same for its own replicas should it be promoted.
            "--repl-diskless-sync-delay",
            "0",
        ];
        args.extend_from_slice(extra_args);
        let replica = RedisServer::start_with(&args);
        let online = format!("port={},state=online", replica.port);
        wait_until(
            Duration::from_secs(20),
            &format!(
                "replica {} up (master_link_status:up) and online at master {}",
                replica.url(),
                master.url()
            ),
            || {
                let at_replica = probe_info(replica.port, "replication").unwrap_or_default();
                let at_master = probe_info(master.port, "replication").unwrap_or_default();
                info_field(&at_replica, "master_link_status") == Some("up")
                    && at_master.contains(&online)
            },
        );
        // And the replication stream flows: a write is acknowledged by every connected replica.
        let _: () = redis::cmd("SET")
            .arg("__replica_ready")
            .arg(1)
            .query(&mut master_conn)
            .unwrap();
        wait_until(
            Duration::from_secs(20),
            "replicas acknowledge a write (WAIT)",
            || {
                let info = probe_info(master.port, "replication").unwrap_or_default();
                let connected: i64 = info_field(&info, "connected_slaves")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                redis::cmd("WAIT")
                    .arg(connected)
                    .arg(200)
                    .query::<i64>(&mut master_conn)
                    .unwrap_or(0)
                    >= connected
            },
        );
        let _: () = redis::cmd("DEL")
            .arg("__replica_ready")
            .query(&mut master_conn)
            .unwrap();
        replica
    }
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("program", &self.program)
            .field("port", &self.port)
            .field("pid", &self.pid)
            .field("dir", &self.dir)
            .finish()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Makes an ACL user `user` with password `password` allowed everything on each server, and
/// forbids the default user (which replication, Sentinel and the harness keep using) to run
/// scripts, so that a client which does not authenticate as `user` cannot take locks. ACLs do not
/// replicate: pass every server of the deployment.
pub fn add_lock_user<'a>(
    servers: impl IntoIterator<Item = &'a RedisServer>,
    user: &str,
    password: &str,
) {
    for server in servers {
        let mut c = server.conn();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(format!(">{password}"))
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .query(&mut c)
            .unwrap();
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg("-eval")
            .arg("-evalsha")
            .query(&mut c)
            .unwrap();
    }
}
