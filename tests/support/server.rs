//! One `redis-server` process per value, on a free loopback port, killed by PID on drop.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const START_DEADLINE: Duration = Duration::from_secs(10);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A running (or stopped) `redis-server` owned by the test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

fn redis_server_binary() -> &'static str {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "redis-server is not installed: run `bash scripts/install-redis.sh` (the test suite needs a real Redis)"
    );
    "redis-server"
}

/// A pseudo-random port in 20000..=40000 whose cluster bus port (+10000) is free too, so tests
/// running in parallel processes rarely collide (a collision is retried by `start`).
fn candidate_port() -> u16 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let seed = nanos ^ (std::process::id() << 8) ^ COUNTER.fetch_add(7919, Ordering::Relaxed);
    loop {
        let mut x = seed
            .wrapping_mul(2_654_435_761)
            .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed));
        x ^= x >> 13;
        let port = 20_000 + (x % 20_001) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

impl RedisServer {
    /// A standalone server with persistence off.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A standalone server with `extra_args` appended to the command line.
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        let binary = redis_server_binary();
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = candidate_port();
            let dir = std::env::temp_dir().join("fairlock-tests").join(format!(
                "{}-{}-{}",
                std::process::id(),
                port,
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).unwrap();
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                args: extra_args.iter().map(|s| s.to_string()).collect(),
            };
            match server.spawn(binary) {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    fn spawn(&mut self, binary: &str) -> Result<(), String> {
        let log = fs::File::create(self.dir.join("redis.log")).unwrap();
        let mut cmd = Command::new(binary);
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if self.ping() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}: {}", self.log_tail()));
                }
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "no PONG within {START_DEADLINE:?}: {}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id (panics when stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is not running").id()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A raw synchronous connection for assertions.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// A raw async connection.
    pub async fn async_conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }

    /// SIGKILL by PID, and reap.
    pub fn kill(&mut self) {
        self.signal("-CONT");
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM by PID; SIGKILL if it has not exited within 5 s.
    pub fn stop(&mut self) {
        self.signal("-CONT");
        self.signal("-TERM");
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
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

    /// Freezes the process (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Starts again on the same port with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            match self.spawn(redis_server_binary()) {
                Ok(()) => return,
                // The old socket may linger for a moment.
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("restart on port {} failed: {e}", self.port),
            }
        }
    }

    /// Whether the process is alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// A replica of `master` (`--replicaof`), returned once its link to the master is up.
    pub fn start_replica_of(master: &RedisServer) -> RedisServer {
        // Full sync at once instead of after the default 5 s diskless-sync delay.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg("0")
            .query(&mut master.conn())
            .unwrap();
        let port = master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        let mut conn = replica.conn();
        let mut master_conn = master.conn();
        let online = format!("port={},state=online", replica.port);
        super::wait_until(
            Duration::from_secs(20),
            "replica up and online at the master",
            || {
                let at_replica: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut conn)
                    .unwrap_or_default();
                let at_master: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut master_conn)
                    .unwrap_or_default();
                at_replica.contains("master_link_status:up") && at_master.contains(&online)
            },
        );
        // And the replication stream flows: a write on the master is acknowledged.
        let _: () = redis::cmd("SET")
            .arg("__replica_ready")
            .arg(1)
            .query(&mut master_conn)
            .unwrap();
        super::wait_until(
            Duration::from_secs(20),
            "replica acknowledges writes",
            || {
                redis::cmd("WAIT")
                    .arg(1)
                    .arg(200)
                    .query::<i64>(&mut master_conn)
                    .unwrap_or(0)
                    == 1
            },
        );
        let _: () = redis::cmd("DEL")
            .arg("__replica_ready")
            .query(&mut master_conn)
            .unwrap();
        replica
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
