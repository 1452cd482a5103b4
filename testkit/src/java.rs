//! A real Redisson client in a child JVM: `interop/redisson/RedissonPeer.java`, compiled and put on
//! a classpath by `scripts/redisson-classpath.sh`, driven line by line over stdin/stdout.
//!
//! Requests carry an id; the peer answers each with `ID ok [VALUE]` or `ID err CLASS MESSAGE`,
//! possibly much later (a lock that waits), so several requests can be in flight. [`JavaPeer::send`]
//! returns a [`Pending`] reply to await with a deadline; every reply records the instant its line
//! arrived, for hand-over timings.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::server::{tail, WorkDir};

/// How long a JVM gets to connect Redisson and print `READY`.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// The peer's classpath: `REDISSON_PEER_CLASSPATH` (exported by `scripts/test.sh`), else what
/// `scripts/redisson-classpath.sh` prints (it installs and compiles what is missing). Panics with
/// the script's diagnostics when Java or Redisson cannot be found: these tests never skip.
pub fn peer_classpath() -> &'static str {
    static CLASSPATH: OnceLock<String> = OnceLock::new();
    CLASSPATH.get_or_init(|| {
        if let Ok(cp) = std::env::var("REDISSON_PEER_CLASSPATH") {
            if !cp.trim().is_empty() {
                return cp.trim().to_owned();
            }
        }
        // The test kit lives one folder below the repository root.
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/redisson-classpath.sh");
        let output = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "\n\n*** The Redisson interop tests cannot run: {} failed ({}).\n{}\n\
             Install Java 17+ (apt-get install openjdk-17-jdk-headless) and make Redisson \
             available (REDISSON_CLASSPATH, ../shared/redisson/, or Maven); see the script's \
             header. These tests never skip. ***\n",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let cp = String::from_utf8(output.stdout).unwrap().trim().to_owned();
        assert!(!cp.is_empty(), "{} printed no classpath", script.display());
        cp
    })
}

/// What the peer is connected to, and how.
#[derive(Clone, Debug)]
pub enum JavaTopology {
    Single(String),
    Cluster(Vec<String>),
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
}

/// Options of one peer JVM.
#[derive(Clone, Debug)]
pub struct JavaOptions {
    pub topology: JavaTopology,
    /// Redisson's `lockWatchdogTimeout` (ms); renewals every third of it.
    pub watchdog_ms: u64,
    /// `ShardedSubscriptionMode` on a cluster (`auto`, `on`, `off`); `None` keeps the default.
    pub sharded: Option<&'static str>,
}

impl JavaOptions {
    pub fn new(topology: JavaTopology) -> JavaOptions {
        JavaOptions {
            topology,
            watchdog_ms: 30_000,
            sharded: None,
        }
    }

    pub fn watchdog_ms(mut self, ms: u64) -> JavaOptions {
        self.watchdog_ms = ms;
        self
    }

    pub fn sharded(mut self, mode: &'static str) -> JavaOptions {
        self.sharded = Some(mode);
        self
    }

    fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        match &self.topology {
            JavaTopology::Single(url) => args.extend(["--single".into(), url.clone()]),
            JavaTopology::Cluster(urls) => args.extend(["--cluster".into(), urls.join(",")]),
            JavaTopology::Sentinel { master, sentinels } => {
                args.extend(["--sentinel".into(), master.clone(), sentinels.join(",")])
            }
        }
        args.extend(["--watchdog".into(), self.watchdog_ms.to_string()]);
        if let Some(mode) = self.sharded {
            args.extend(["--sharded".into(), mode.into()]);
        }
        args
    }
}

/// One reply line of the peer.
#[derive(Clone, Debug)]
pub struct Reply {
    /// When the line arrived.
    pub at: Instant,
    /// `Ok(value)` for `ok [VALUE]` (empty without a value), `Err(text)` for `err …`.
    pub outcome: Result<String, String>,
}

impl Reply {
    /// The value of an `ok` reply; panics on `err`, naming the request.
    pub fn ok(&self, what: &str) -> &str {
        match &self.outcome {
            Ok(v) => v,
            Err(e) => panic!("{what}: the Java peer answered err {e}"),
        }
    }

    /// The text of an `err` reply; panics on `ok`.
    pub fn err(&self, what: &str) -> &str {
        match &self.outcome {
            Err(e) => e,
            Ok(v) => panic!("{what}: expected an error from the Java peer, got ok {v}"),
        }
    }
}

/// A request in flight.
#[derive(Debug)]
pub struct Pending {
    what: String,
    rx: oneshot::Receiver<Reply>,
    log: PathBuf,
}

impl Pending {
    /// Awaits the reply for at most `deadline`; panics (with the peer's log tail) after it.
    pub async fn wait(self, deadline: Duration) -> Reply {
        match tokio::time::timeout(deadline, self.rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => panic!(
                "{}: the Java peer exited before answering; its log:\n{}",
                self.what,
                tail(&self.log, 40)
            ),
            Err(_) => panic!(
                "timed out after {deadline:?} waiting for the Java peer to answer: {}\nits log:\n{}",
                self.what,
                tail(&self.log, 40)
            ),
        }
    }

    /// The reply if it has arrived (without waiting).
    pub fn try_take(&mut self) -> Option<Reply> {
        self.rx.try_recv().ok()
    }
}

type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// A Redisson client in its own JVM. Dropping it kills the JVM.
pub struct JavaPeer {
    child: Child,
    stdin: Mutex<ChildStdin>,
    waiting: Waiting,
    next_id: AtomicU64,
    uuid: String,
    dir: WorkDir,
}

impl std::fmt::Debug for JavaPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JavaPeer")
            .field("pid", &self.child.id())
            .field("uuid", &self.uuid)
            .finish()
    }
}

impl JavaPeer {
    /// Starts a JVM with the peer and returns once Redisson is connected (`READY`).
    pub fn start(options: &JavaOptions) -> JavaPeer {
        let classpath = peer_classpath();
        let dir = WorkDir::new("redisson-peer");
        let log_path = dir.path().join("java.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let mut child = Command::new("java")
            .args([
                "-XX:+UseSerialGC",
                "-Xmx256m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-cp",
                classpath,
                "RedissonPeer",
            ])
            .args(options.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `java` (install Java 17+: apt-get install openjdk-17-jdk-headless): {e}")
            });
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let waiting: Waiting = Arc::new(Mutex::new(HashMap::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<String>();
        let reader_waiting = waiting.clone();
        let reader_log = log_path.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let at = Instant::now();
                if let Some(uuid) = line.strip_prefix("READY ") {
                    let _ = ready_tx.send(uuid.trim().to_owned());
                    continue;
                }
                let mut words = line.splitn(3, ' ');
                let (Some(id), Some(kind)) = (words.next(), words.next()) else {
                    continue;
                };
                let rest = words.next().unwrap_or("").to_owned();
                let outcome = match kind {
                    "ok" => Ok(rest),
                    "err" => Err(rest),
                    _ => continue,
                };
                let Ok(id) = id.parse::<u64>() else { continue };
                let sender = reader_waiting.lock().unwrap().remove(&id);
                match sender {
                    Some(tx) => {
                        let _ = tx.send(Reply { at, outcome });
                    }
                    None => {
                        let _ = writeln!(
                            std::fs::OpenOptions::new()
                                .append(true)
                                .open(&reader_log)
                                .unwrap(),
                            "[test] unexpected reply: {line}"
                        );
                    }
                }
            }
            // The JVM is gone: every request still waiting sees its sender dropped.
            reader_waiting.lock().unwrap().clear();
        });
        let uuid = match ready_rx.recv_timeout(READY_DEADLINE) {
            Ok(uuid) => uuid,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the Redisson peer did not become READY within {READY_DEADLINE:?} ({:?}); its log:\n{}",
                    options.topology,
                    tail(&log_path, 60)
                );
            }
        };
        JavaPeer {
            child,
            stdin: Mutex::new(stdin),
            waiting,
            next_id: AtomicU64::new(1),
            uuid,
            dir,
        }
    }

    /// Redisson's client id: the first half of every owner field it writes.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// The owner field of `holder` in this JVM.
    pub fn field(&self, holder: i64) -> String {
        format!("{}:{holder}", self.uuid)
    }

    /// The JVM's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one request (`op` and its arguments, without the id).
    pub fn send(&self, request: &str) -> Pending {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().insert(id, tx);
        let mut stdin = self.stdin.lock().unwrap();
        writeln!(stdin, "{id} {request}")
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| {
                panic!(
                    "writing `{request}` to the Java peer: {e}; its log:\n{}",
                    self.log_tail(40)
                )
            });
        Pending {
            what: request.to_owned(),
            rx,
            log: self.dir.path().join("java.log"),
        }
    }

    /// Sends a request and awaits its reply (10 s).
    pub async fn call(&self, request: &str) -> Reply {
        self.send(request).wait(Duration::from_secs(10)).await
    }

    /// The last lines of the JVM's stderr (Redisson's warnings, uncaught errors).
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.dir.path().join("java.log"), lines)
    }

    /// SIGKILL: the JVM dies without releasing anything (its locks run out with their leases).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for JavaPeer {
    fn drop(&mut self) {
        self.kill();
    }
}
