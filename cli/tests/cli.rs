//! The `fairlock` binary (this crate), run as a real process against real servers: a
//! standalone server, a 6-node cluster and a Sentinel group, with locks held and queued for by
//! fairlock clients and by a Redisson-protocol peer made of raw commands (as in
//! tests/fair_interop.rs: HSET/PEXPIRE the owner hash, ZADD/RPUSH a waiter with a client-clock
//! deadline, SUBSCRIBE its own channel). Every command, its table and its JSON output (parsed),
//! every exit code and each bad input.

use fairlock_testkit as support;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fairlock::Client;
use redis::Commands;
use serde_json::Value;
use support::{joined, wait_until, RedisCluster, RedisServer, SentinelGroup};

const BIN: &str = env!("CARGO_BIN_EXE_fairlock");
/// A Redisson client id (a UUID, as Redisson's are) and holder ids (its thread ids).
const JAVA: &str = "6c1b4f5e-0d0a-4c1e-9a51-5b8f8e0f2a11";
/// How long one CLI run may take before the test fails.
const RUN_DEADLINE: Duration = Duration::from_secs(30);

fn java(thread: i64) -> String {
    format!("{JAVA}:{thread}")
}

/// A finished run of the binary.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"))
    }

    /// Exit `code`, and stderr is exactly one `fairlock: …` line: no panic, no backtrace.
    fn fails_with(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "{self:?}");
        assert_one_line_error(&self.stderr);
        self.stderr.trim()
    }

    fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "{self:?}");
        assert!(
            !self.stderr.contains("panicked"),
            "stderr of a successful run: {self:?}"
        );
        self
    }
}

fn assert_one_line_error(stderr: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one line on stderr, got {stderr:?}");
    assert!(lines[0].starts_with("fairlock: "), "{stderr:?}");
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "thread 'main'"] {
        assert!(!stderr.contains(bad), "{stderr:?}");
    }
}

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("REDIS_URL")
        .env_remove("FAIRLOCK_MASTER_PASSWORD")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Collects a child's output, failing the test when it does not end within the deadline.
fn finish(mut child: Child, what: &str) -> Run {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let until = Instant::now() + RUN_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`fairlock {what}` did not end within {RUN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

/// Runs the binary to its end (on a blocking thread: the test's own clients keep running).
async fn cli(args: &[&str]) -> Run {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = command(&refs).spawn().expect("spawn the fairlock binary");
        finish(child, &args.join(" "))
    })
    .await
    .unwrap()
}

/// Starts the binary on a terminal (a pseudo-terminal made by util-linux `script`), feeding it
/// `input`; its stdin is closed after that.
fn spawn_on_terminal(args: &[&str], input: &str) -> Child {
    let line = std::iter::once(BIN)
        .chain(args.iter().copied())
        .map(shell_quote)
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env_remove("REDIS_URL")
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux `script` runs the binary on a pseudo-terminal");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    child
}

/// Runs the binary on a terminal to its end, feeding it `input`.
async fn cli_on_terminal(args: &[&str], input: &str) -> Run {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let input = input.to_owned();
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = spawn_on_terminal(&refs, &input);
        finish(child, &args.join(" "))
    })
    .await
    .unwrap()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn server_now_ms(raw: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(raw).unwrap();
    secs * 1000 + micros / 1000
}

fn queue_key(name: &str) -> String {
    format!("redisson_lock_queue:{{{name}}}")
}

fn deadlines_key(name: &str) -> String {
    format!("redisson_lock_timeout:{{{name}}}")
}

/// The Redisson peer holds `name` under `field` for `ttl_ms` (or for ever when `None`).
fn java_hold(raw: &mut redis::Connection, name: &str, field: &str, ttl_ms: Option<i64>) {
    let _: () = raw.hset(name, field, 1).unwrap();
    if let Some(ttl) = ttl_ms {
        let _: () = raw.pexpire(name, ttl).unwrap();
    }
}

/// The Redisson peer queues `field` on fair lock `name` with a deadline `in_ms` from now
/// (negative: already passed), by its own clock.
fn java_queue(raw: &mut redis::Connection, name: &str, field: &str, in_ms: i64) {
    let now = server_now_ms(raw);
    let _: () = raw.zadd(deadlines_key(name), field, now + in_ms).unwrap();
    let _: () = raw.rpush(queue_key(name), field).unwrap();
}

fn queue_len(raw: &mut redis::Connection, name: &str) -> i64 {
    raw.llen(queue_key(name)).unwrap()
}

fn uuid_of(c: &Client) -> String {
    c.id().hyphenated().to_string()
}

/// The field of the fairlock waiter of client `c` in `name`'s queue.
fn queued_field_of(raw: &mut redis::Connection, name: &str, c: &Client) -> String {
    let fields: Vec<String> = raw.lrange(queue_key(name), 0, -1).unwrap();
    fields
        .into_iter()
        .find(|f| f.starts_with(&uuid_of(c)))
        .expect("the client's waiter is queued")
}

/// A client whose waiters only heartbeat every 20 s: within a test, a waiter that gets the
/// lock quickly was woken by a message.
async fn patient(url: &str) -> Client {
    Client::builder()
        .standalone(url)
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn inspect_shows_fairlock_and_redisson_holders_and_waiters() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.conn();
    let holder = patient(&url).await;
    let waiter = patient(&url).await;

    // Ours holds a fenced fair lock; one of ours waits; Redisson waiters queue behind it: one
    // alive, one whose deadline passed, and a field of our waiter's client without a mark.
    let name = "orders:42";
    let guard = holder.fair_lock(name).fenced().lock().await.unwrap();
    let lock = waiter.fair_lock(name);
    let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(60), None).await });
    wait_until(Duration::from_secs(10), "our waiter queued", || {
        queue_len(&mut server.conn(), name) == 1
    });
    java_queue(&mut raw, name, &java(58), 300_000);
    java_queue(&mut raw, name, &java(59), -1_000);
    let ghost = format!("{}:4242", uuid_of(&waiter));
    java_queue(&mut raw, name, &ghost, 300_000);
    let _: () = raw
        .set(format!("redisson_unlock_latch:{{{name}}}:0a1b2c3d"), 1)
        .unwrap();

    let run = cli(&["--url", &url, "inspect", name]).await;
    run.ok();
    let text = &run.stdout;
    for want in [
        "kind         fair",
        "state        held",
        &format!("owner        client {}", uuid_of(&holder)),
        "fencing      1 (last token handed out)",
        "queue        4 waiting, 2 look dead",
        "DEAD: deadline passed",
        "DEAD: fairlock client without a liveness mark",
        "Redisson unlock latch without TTL",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let header = text.lines().find(|l| l.starts_with("#  CLIENT")).unwrap();
    assert!(
        header.contains("DEADLINE") && header.contains("STATUS"),
        "{header}"
    );

    let snap = cli(&["inspect", name, "--url", &url, "--json"])
        .await
        .ok()
        .json();
    assert_eq!(snap["name"], name);
    assert_eq!(snap["kind"], "fair");
    assert_eq!(snap["locked"], true);
    assert_eq!(snap["owners"][0]["client_id"], uuid_of(&holder));
    assert_eq!(snap["owners"][0]["holds"], 1);
    assert!(snap["owners"][0]["holder_id"].is_i64());
    let pttl = snap["pttl_ms"].as_i64().unwrap();
    assert!(pttl > 0 && pttl <= 30_000, "{pttl}");
    assert_eq!(
        snap["expires_at_ms"].as_i64().unwrap(),
        snap["server_time_ms"].as_i64().unwrap() + pttl
    );
    assert!(snap["expires_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(snap["fencing_token"], 1);
    assert_eq!(snap["queue_length"], 4);
    assert_eq!(snap["dead_waiters"], 2);
    let q = snap["queue"].as_array().unwrap();
    assert_eq!(q[0]["client_id"], uuid_of(&waiter));
    assert_eq!(q[0]["fairlock"], true);
    assert_eq!(q[0]["alive"], true);
    assert!(q[0]["liveness_in_ms"].as_i64().unwrap() > 0);
    assert_eq!(q[1]["field"], java(58));
    assert_eq!(
        (q[1]["fairlock"].clone(), q[1]["alive"].clone()),
        (false.into(), true.into())
    );
    assert_eq!(q[1]["holder_id"], 58);
    assert!(q[1]["liveness_until_ms"].is_null());
    assert!(q[1]["deadline_in_ms"].as_i64().unwrap() > 200_000);
    assert_eq!(q[2]["dead_reason"], "deadline_passed");
    assert!(q[2]["deadline_in_ms"].as_i64().unwrap() < 0);
    assert_eq!(q[3]["field"], ghost.as_str());
    assert_eq!(q[3]["dead_reason"], "liveness_missing");
    assert_eq!(q[3]["position"], 4);
    let roles: Vec<&str> = snap["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["role"].as_str().unwrap())
        .collect();
    for role in ["lock", "queue", "deadlines", "liveness", "fencing", "latch"] {
        assert!(roles.contains(&role), "{roles:?}");
    }
    assert_eq!(snap["orphans"][0]["problem"], "latch_without_ttl");
    // Without the latch search, the latch is not reported.
    let snap = cli(&["--url", &url, "--json", "inspect", name, "--no-latch-scan"])
        .await
        .ok()
        .json();
    assert_eq!(snap["orphans"].as_array().unwrap().len(), 0);

    // A lock held by the Redisson peer alone: a plain owner hash with its TTL.
    java_hold(&mut raw, "jobs", &java(12), Some(30_000));
    let snap = cli(&["--url", &url, "--json", "inspect", "jobs"])
        .await
        .ok()
        .json();
    assert_eq!(snap["kind"], "plain");
    assert_eq!(snap["owners"][0]["client_id"], JAVA);
    assert_eq!(snap["owners"][0]["holder_id"], 12);
    assert!(snap["queue"].as_array().unwrap().is_empty());
    assert!(snap["fencing_token"].is_null());
    let run = cli(&["--url", &url, "inspect", "jobs"]).await;
    assert!(run.ok().stdout.contains("kind         plain"), "{run:?}");

    // No such lock: the (empty) snapshot, then exit 1 with one line.
    let run = cli(&["--url", &url, "inspect", "nothing-here"]).await;
    assert!(run.fails_with(1).contains("no lock named"));
    assert!(run.stdout.contains("kind         absent"));
    let run = cli(&["--url", &url, "--json", "inspect", "nothing-here"]).await;
    run.fails_with(1);
    assert_eq!(run.json()["kind"], "absent");
    // Absent says so: no PTTL rather than Redis's -2.
    assert!(run.json()["pttl_ms"].is_null(), "{:?}", run.json());
    // A key of another type is not a lock.
    let _: () = raw.set("a-string", "x").unwrap();
    let run = cli(&["--url", &url, "--json", "inspect", "a-string"]).await;
    assert!(run.fails_with(1).contains("not a lock"));
    assert_eq!(run.json()["orphans"][0]["problem"], "not_a_lock");
    // REDIS_URL is the default server.
    let mut cmd = command(&["inspect", "jobs"]);
    cmd.env("REDIS_URL", &url);
    let run = tokio::task::spawn_blocking(move || finish(cmd.spawn().unwrap(), "inspect jobs"))
        .await
        .unwrap();
    assert!(run.ok().stdout.contains(JAVA));

    guard.unlock().await.unwrap();
    let g = joined(waiting, Duration::from_secs(10), "our waiter gets the lock")
        .await
        .unwrap()
        .expect("granted");
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn scan_finds_every_lock_and_each_kind_of_orphan_in_paced_bounded_calls() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.conn();
    let ours = patient(&url).await;

    let g1 = ours.fair_lock("orders:1").lock().await.unwrap();
    let g2 = ours.non_fair_lock("orders:2").lock().await.unwrap();
    java_hold(&mut raw, "jobs:nightly", &java(7), None); // no TTL: an orphan
    java_queue(&mut raw, "stale", &java(8), -5_000); // a queue nobody will ever serve
    let _: () = raw
        .set("redisson_unlock_latch:{jobs:nightly}:ff00", 1)
        .unwrap();
    let _: () = raw.set("redisson_unlock_latch:{orders:2}:ee11", 1).unwrap();
    let _: () = raw
        .pexpire("redisson_unlock_latch:{orders:2}:ee11", 60_000)
        .unwrap();
    let _: () = raw.zadd("fairlock_liveness:{leftover}", "x:1", 1).unwrap();
    // Look-alikes that are not locks, a bare fencing counter, and enough other keys to need
    // many SCAN calls.
    let _: () = raw.hset("page-views", "page:1", 3).unwrap();
    let _: () = raw.hset("settings", format!("{JAVA}:1"), "on").unwrap();
    let _: () = raw.set("redisson_lock_token:{old}", 5).unwrap();
    let mut pipe = redis::pipe();
    for i in 0..600 {
        pipe.set(format!("filler:{i}"), i).ignore();
    }
    let _: () = pipe.query(&mut raw).unwrap();

    let run = cli(&["--url", &url, "scan", "--count", "50", "--pause", "1ms"]).await;
    let text = &run.ok().stdout;
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("LOCK") && header.contains("FENCING"),
        "{text}"
    );
    for name in ["orders:1", "orders:2", "jobs:nightly", "stale", "leftover"] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "no line for {name} in:\n{text}"
        );
    }
    for absent in ["page-views", "settings", "old ", "filler"] {
        assert!(!text.contains(absent), "{absent} listed:\n{text}");
    }
    assert!(text.contains("ORPHAN KEY"), "{text}");
    assert!(text.contains("lock hash without TTL"), "{text}");
    assert!(
        text.contains("queue without a live owner or waiter"),
        "{text}"
    );

    let report = cli(&[
        "--url", &url, "--json", "scan", "--count", "50", "--pause", "1ms",
    ])
    .await
    .ok()
    .json();
    let names: Vec<&str> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["jobs:nightly", "leftover", "orders:1", "orders:2", "stale"]
    );
    assert!(report["scan_calls"].as_u64().unwrap() > 4, "{report}");
    assert!(report["keys_returned"].as_u64().unwrap() >= 10);
    assert_eq!(report["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(report["truncated"], false);
    let s = &report["summary"];
    assert_eq!(
        (
            s["locks"].as_u64(),
            s["held"].as_u64(),
            s["waiters"].as_u64()
        ),
        (Some(5), Some(3), Some(1))
    );
    assert_eq!(s["dead_waiters"], 1);
    let mut problems: Vec<(String, String)> = report["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["key"].as_str().unwrap().to_owned(),
                o["problem"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    problems.sort();
    assert_eq!(
        problems,
        [
            (
                "fairlock_liveness:{leftover}".into(),
                "liveness_without_ttl".into()
            ),
            ("jobs:nightly".into(), "lock_without_ttl".into()),
            (
                "redisson_lock_queue:{stale}".into(),
                "queue_orphaned".into()
            ),
            (
                "redisson_lock_timeout:{stale}".into(),
                "deadlines_orphaned".into()
            ),
            (
                "redisson_unlock_latch:{jobs:nightly}:ff00".into(),
                "latch_without_ttl".into()
            ),
        ]
    );
    assert_eq!(s["orphans"], 5);
    let orders1 = &report["locks"][2];
    assert_eq!(orders1["kind"], "plain"); // a fair lock nobody waits for has only its hash
    assert_eq!(orders1["owners"][0]["client_id"], uuid_of(&ours));

    // A pattern, and the limit.
    let report = cli(&["--url", &url, "--json", "scan", "orders:*"])
        .await
        .ok()
        .json();
    assert_eq!(report["summary"]["locks"], 2);
    let report = cli(&["--url", &url, "--json", "scan", "--limit", "1"])
        .await
        .ok()
        .json();
    assert_eq!(report["locks"].as_array().unwrap().len(), 1);
    assert_eq!(report["truncated"], true);
    let run = cli(&["--url", &url, "scan", "nomatch*"]).await;
    assert!(run.ok().stdout.contains("no locks match"));
    // Counts of one read in the singular.
    let run = cli(&["--url", &url, "scan", "orders:1"]).await;
    let text = &run.ok().stdout;
    assert!(
        text.contains("1 lock (") && text.contains(", 0 orphans;"),
        "{text}"
    );

    // Bad input.
    cli(&["--url", &url, "scan", "--count", "0"])
        .await
        .fails_with(2);
    cli(&["--url", &url, "scan", ""]).await.fails_with(2);
    cli(&["--url", &url, "scan", "--pause", "fast"])
        .await
        .fails_with(2);

    g1.unlock().await.unwrap();
    g2.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn force_unlock_and_purge_dead_wake_the_right_waiter() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.conn();
    let ours = patient(&url).await;

    // A plain lock held by the Redisson peer; our waiter listens on its release channel.
    java_hold(&mut raw, "plain", &java(3), Some(60_000));
    let lock = ours.non_fair_lock("plain");
    let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(50), None).await });
    wait_until(Duration::from_secs(10), "our waiter subscribed", || {
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redisson_lock__channel:{plain}")
            .query(&mut server.conn())
            .unwrap();
        n == 1
    });
    // Without a terminal, and without --yes, nothing happens.
    let run = cli(&["--url", &url, "force-unlock", "plain"]).await;
    assert!(run.fails_with(2).contains("--yes"));
    assert!(raw.exists::<_, bool>("plain").unwrap());
    let report = cli(&["--url", &url, "--json", "force-unlock", "plain", "--yes"])
        .await
        .ok()
        .json();
    assert_eq!(report["removed"], true);
    assert_eq!(report["owners"][0]["field"], java(3));
    assert_eq!(report["owners"][0]["holds"], 1);
    assert_eq!(report["release_channel"], "redisson_lock__channel:{plain}");
    assert_eq!(report["release_channel_receivers"], 1);
    assert!(report["woken"].is_null());
    let g = joined(
        waiting,
        Duration::from_secs(10),
        "our waiter woken by the force-unlock",
    )
    .await
    .unwrap()
    .expect("granted");
    g.unlock().await.unwrap();
    // Nothing to unlock any more: exit 1.
    let run = cli(&["--url", &url, "force-unlock", "plain", "--yes"]).await;
    assert!(run.fails_with(1).contains("not held"));

    // A fair lock held by ours, our live waiter, and in front of it (put there by hand) a field
    // of the waiter's own client without a liveness mark: dead by the tool's rules, though its
    // deadline is in the future (so no script of the library removes it first).
    let name = "fair";
    let guard = ours.fair_lock(name).lock().await.unwrap();
    let other = patient(&url).await;
    let lock = other.fair_lock(name);
    let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(50), None).await });
    wait_until(Duration::from_secs(10), "our waiter queued", || {
        queue_len(&mut server.conn(), name) == 1
    });
    let live = queued_field_of(&mut raw, name, &other);
    let ghost = format!("{}:999", uuid_of(&other));
    let now = server_now_ms(&mut raw);
    let _: () = raw
        .zadd(deadlines_key(name), &ghost, now + 300_000)
        .unwrap();
    let _: () = raw.lpush(queue_key(name), &ghost).unwrap();
    // A grant request of the ghost's (PROTOCOL 8): dropped with it.
    let grants = format!("fairlock_grants:{{{name}}}");
    let _: () = raw.hset(&grants, &ghost, "5000:0:1").unwrap();
    // On a terminal it asks first: "n" changes nothing (exit 4), "y" goes ahead.
    let run = cli_on_terminal(&["--url", &url, "force-unlock", name], "n\n").await;
    assert_eq!(run.code, 4, "{run:?}");
    assert!(run.stdout.contains("[y/N]"), "{run:?}");
    assert!(raw.exists::<_, bool>(name).unwrap());
    let run = cli_on_terminal(&["--url", &url, "force-unlock", name], "y\n").await;
    assert_eq!(run.code, 0, "{run:?}");
    let text = run.stdout.replace('\r', "");
    assert!(
        text.contains(&format!(
            "removed  lock \"{name}\" held by {}",
            uuid_of(&ours)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "dropped  dead waiter {ghost} (fairlock client without a liveness mark)"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "woke     {live} on redisson_lock__channel:{{{name}}}:{live} (1 receivers)"
        )),
        "{text}"
    );
    assert!(!raw.hexists::<_, _, bool>(&grants, &ghost).unwrap());
    assert!(!raw.hexists::<_, _, bool>(&grants, &ghost).unwrap());
    let g = joined(
        waiting,
        Duration::from_secs(10),
        "our waiter woken by the force-unlock",
    )
    .await
    .unwrap()
    .expect("granted");
    g.unlock().await.unwrap();
    drop(guard); // force-unlocked: its release finds the lock gone

    // purge-dead: the Redisson peer holds the lock; behind our live waiter a dead Redisson
    // waiter and a field of our waiter's client without a mark.
    let name = "purge";
    java_hold(&mut raw, name, &java(1), Some(60_000));
    let lock = other.fair_lock(name);
    let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(50), None).await });
    wait_until(Duration::from_secs(10), "our waiter queued", || {
        queue_len(&mut server.conn(), name) == 1
    });
    let ours_field = queued_field_of(&mut raw, name, &other);
    java_queue(&mut raw, name, &java(2), -1);
    let ghost = format!("{}:777", uuid_of(&other));
    java_queue(&mut raw, name, &ghost, 300_000);
    java_queue(&mut raw, name, &java(4), 300_000);
    let grants = format!("fairlock_grants:{{{name}}}");
    assert!(
        raw.hexists::<_, _, bool>(&grants, &ours_field).unwrap(),
        "our waiter asked for a direct hand-off"
    );
    let _: () = raw.hset(&grants, &ghost, "5000:0:1").unwrap();
    let report = cli(&["--url", &url, "--json", "purge-dead", name])
        .await
        .ok()
        .json();
    let purged: Vec<(String, String)> = report["purged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["field"].as_str().unwrap().to_owned(),
                p["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        purged,
        [
            (java(2), "deadline_passed".to_owned()),
            (ghost.clone(), "liveness_missing".to_owned())
        ]
    );
    assert_eq!(report["locked"], true);
    assert!(
        report["woken"].is_null(),
        "a held lock's release wakes the head"
    );
    assert_eq!(report["queue_length"], 2);
    let left: Vec<String> = raw.lrange(queue_key(name), 0, -1).unwrap();
    assert_eq!(left, [ours_field.clone(), java(4)]);
    // The ghost's grant request went with it; our live waiter's stays.
    let requests: Vec<String> = raw.hkeys(&grants).unwrap();
    assert_eq!(requests, std::slice::from_ref(&ours_field));
    let run = cli(&["--url", &url, "purge-dead", name]).await;
    assert!(run.ok().stdout.contains("nothing to purge"), "{run:?}");

    // Our waiter gives up; a dead head is put in front of the live Redisson waiter, and the
    // Redisson holder disappears without telling anyone: purge-dead wakes the new head.
    waiting.abort();
    wait_until(Duration::from_secs(10), "our waiter left", || {
        queue_len(&mut server.conn(), name) == 1
    });
    let mut sub = server.conn();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut pubsub = sub.as_pubsub();
    let channel = format!("redisson_lock__channel:{{{name}}}:{}", java(4));
    pubsub.subscribe(&channel).unwrap();
    let now = server_now_ms(&mut raw);
    let _: () = raw.zadd(deadlines_key(name), java(5), now - 1).unwrap();
    let _: () = raw.lpush(queue_key(name), java(5)).unwrap();
    let _: () = raw.del(name).unwrap();
    let run = cli(&["--url", &url, "purge-dead", name]).await;
    let text = &run.ok().stdout;
    assert!(text.contains("purged 1 dead waiters"), "{text}");
    assert!(
        text.contains(&format!("woke {} on {channel} (1 receivers)", java(4))),
        "{text}"
    );
    let msg = pubsub.get_message().unwrap();
    assert_eq!(msg.get_channel_name(), channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "0");

    // No such lock or queue.
    let run = cli(&["--url", &url, "purge-dead", "nothing"]).await;
    assert!(run.fails_with(1).contains("no lock or queue"));
}

/// Reads a child's stdout lines on a thread.
fn line_reader(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next JSON event whose `event` is `kind`, skipping others; panics after `deadline`.
fn next_event(rx: &mpsc::Receiver<String>, kind: &str, deadline: Duration) -> Value {
    let until = Instant::now() + deadline;
    let mut seen = Vec::new();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                if v["event"] == kind {
                    return v;
                }
                seen.push(line);
            }
            Err(_) => panic!("no {kind:?} event within {deadline:?}; saw {seen:#?}"),
        }
    }
}

/// Waits until exactly `n` pattern subscriptions exist on the server (watch's, here).
fn wait_numpat(server: &RedisServer, n: i64) {
    wait_until(
        Duration::from_secs(10),
        &format!("{n} pattern subscriptions"),
        || {
            let got: i64 = redis::cmd("PUBSUB")
                .arg("NUMPAT")
                .query(&mut server.conn())
                .unwrap();
            got == n
        },
    );
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for a child to exit; its stderr must not show a panic.
fn exited(mut child: Child, deadline: Duration) -> i32 {
    let until = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            assert!(!err.contains("panicked"), "{err}");
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the watch did not end within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn watch_follows_acquisitions_releases_and_hand_overs() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.conn();
    let a = patient(&url).await;
    let b = patient(&url).await;
    let name = "watched";

    let mut child = command(&["--url", &url, "--json", "watch", name, "--interval", "1s"])
        .spawn()
        .unwrap();
    let rx = line_reader(&mut child);
    let events = tokio::task::spawn_blocking(move || {
        let first = next_event(&rx, "snapshot", Duration::from_secs(10));
        (first, rx)
    });
    let (first, rx) = events.await.unwrap();
    assert_eq!(first["kind"], "absent");
    assert!(first["pttl_ms"].is_null(), "{first}");
    assert_eq!(first["owners"].as_array().unwrap().len(), 0);
    assert_eq!(first["queue_length"], 0);

    let ga = a.fair_lock(name).lock().await.unwrap();
    let lock = b.fair_lock(name);
    let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(50), None).await });
    let (acquired, queued, rx) = tokio::task::spawn_blocking(move || {
        let acquired = next_event(&rx, "acquired", Duration::from_secs(10));
        let queued = next_event(&rx, "queued", Duration::from_secs(10));
        (acquired, queued, rx)
    })
    .await
    .unwrap();
    assert_eq!(acquired["client_id"], uuid_of(&a));
    assert_eq!(acquired["holds"], 1);
    assert_eq!(acquired["handover"], false);
    assert_eq!(queued["client_id"], uuid_of(&b));
    assert_eq!(queued["position"], 1);
    assert_eq!(queued["queue_length"], 1);

    // The release wakes b on its own channel; watch hears it on its pattern subscription.
    ga.unlock().await.unwrap();
    let gb = joined(waiting, Duration::from_secs(10), "b gets the lock")
        .await
        .unwrap()
        .unwrap();
    let (released, handed, rx) = tokio::task::spawn_blocking(move || {
        let released = next_event(&rx, "released", Duration::from_secs(10));
        let handed = next_event(&rx, "acquired", Duration::from_secs(10));
        (released, handed, rx)
    })
    .await
    .unwrap();
    assert_eq!(released["client_id"], uuid_of(&a));
    assert!(released["held_ms"].as_i64().unwrap() >= 0);
    assert_eq!(handed["client_id"], uuid_of(&b));
    assert_eq!(handed["handover"], true);
    let gap = handed["gap_ms"].as_i64().unwrap();
    assert!((0..1_500).contains(&gap), "hand-over gap {gap} ms");
    assert_eq!(handed["queue_length"], 0);
    assert!(handed["time_ms"].as_i64().unwrap() >= released["time_ms"].as_i64().unwrap());

    // A Redisson peer queues, and its waiter dies (its deadline passes): looks_dead.
    java_queue(&mut raw, name, &java(77), 600);
    let (queued, dead, rx) = tokio::task::spawn_blocking(move || {
        let queued = next_event(&rx, "queued", Duration::from_secs(10));
        let dead = next_event(&rx, "looks_dead", Duration::from_secs(10));
        (queued, dead, rx)
    })
    .await
    .unwrap();
    assert_eq!(queued["field"], java(77));
    assert_eq!(dead["field"], java(77));
    assert_eq!(dead["reason"], "deadline_passed");

    // Ctrl-C ends it cleanly.
    signal(&child, "INT");
    let code = tokio::task::spawn_blocking(move || exited(child, Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(code, 0);
    drop(rx);

    // Plain lines when stdout is not a terminal; --max-events ends it.
    wait_numpat(&server, 0);
    let mut child = command(&["--url", &url, "watch", name, "--max-events", "1"])
        .spawn()
        .unwrap();
    let rx = line_reader(&mut child);
    // The first line is the state the watch starts from, read after it subscribed: a release
    // before that read would be part of the starting state, not an event.
    let (first, rx) = tokio::task::spawn_blocking(move || {
        let first = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the watch prints its starting state");
        (first, rx)
    })
    .await
    .unwrap();
    wait_numpat(&server, 1);
    gb.unlock().await.unwrap();
    let (code, rest) = tokio::task::spawn_blocking(move || {
        let code = exited(child, Duration::from_secs(30));
        (code, rx.iter().collect::<Vec<String>>())
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{first}\n{rest:#?}");
    let lines: Vec<&str> = std::iter::once(first.as_str())
        .chain(rest.iter().map(String::as_str))
        .collect();
    assert!(
        lines[0].contains("watching") || lines[0].contains("snapshot"),
        "{lines:?}"
    );
    assert!(lines[1].contains("released"), "{lines:?}");

    // A reader that goes away (a broken pipe) ends it cleanly at the next event.
    let mut child = command(&[
        "--url",
        &url,
        "--json",
        "watch",
        name,
        "--interval",
        "250ms",
    ])
    .spawn()
    .unwrap();
    let rx = line_reader(&mut child);
    let rx = tokio::task::spawn_blocking(move || {
        next_event(&rx, "snapshot", Duration::from_secs(10));
        rx
    })
    .await
    .unwrap();
    drop(rx); // the reader thread ends at the next line, closing the pipe
    let child = std::sync::Arc::new(std::sync::Mutex::new(child));
    let ended = || {
        let c = child.clone();
        move || c.lock().unwrap().try_wait().unwrap().is_some()
    };
    let until = Instant::now() + Duration::from_secs(20);
    // Each state is kept until the watch has read it (one refresh) or has ended.
    while !ended()() {
        assert!(
            Instant::now() < until,
            "watch did not notice the closed pipe"
        );
        let g = a.fair_lock(name).lock().await.unwrap();
        let e = ended();
        tokio::task::spawn_blocking(move || support::wait_until_or(Duration::from_secs(1), e))
            .await
            .unwrap();
        g.unlock().await.unwrap();
        let e = ended();
        tokio::task::spawn_blocking(move || support::wait_until_or(Duration::from_secs(1), e))
            .await
            .unwrap();
    }
    let child = std::sync::Arc::try_unwrap(child)
        .unwrap()
        .into_inner()
        .unwrap();
    let code = tokio::task::spawn_blocking(move || exited(child, Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(code, 0);

    // On a terminal: a table redrawn in place.
    wait_numpat(&server, 0);
    let args = [
        "--url",
        &url,
        "watch",
        name,
        "--max-events",
        "1",
        "--interval",
        "250ms",
    ];
    let mut child = spawn_on_terminal(&args, "");
    let rx = line_reader(&mut child);
    // The screen is first drawn from the state the watch starts from, read after it subscribed:
    // an acquisition before that read would be part of the starting state, not an event.
    let (first, rx) = tokio::task::spawn_blocking(move || {
        let until = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("fairlock watch \"watched\"") => break (line, rx),
                Ok(line) => seen.push(line),
                Err(_) => panic!("the watch drew no screen within 10s; saw {seen:#?}"),
            }
        }
    })
    .await
    .unwrap();
    assert!(first.contains("\x1b[H"), "{first:?}");
    let g = a.fair_lock(name).lock().await.unwrap();
    let (code, rest) = tokio::task::spawn_blocking(move || {
        let code = exited(child, Duration::from_secs(30));
        (code, rx.iter().collect::<Vec<String>>().join("\n"))
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{first}\n{rest}");
    for want in ["\x1b[H", "recent events", "acquired"] {
        assert!(rest.contains(want), "missing {want:?} in {rest:?}");
    }
    g.unlock().await.unwrap();

    // Bad input.
    cli(&["--url", &url, "watch", name, "--interval", "10ms"])
        .await
        .fails_with(2);
    cli(&["--url", &url, "watch", ""]).await.fails_with(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_one_line_and_its_exit_code() {
    let closed = format!("redis://127.0.0.1:{}", closed_port());
    // Usage errors, before any connection.
    assert!(cli(&["inspect", ""]).await.fails_with(2).contains("empty"));
    cli(&["inspect"]).await.fails_with(2);
    cli(&["frobnicate"]).await.fails_with(2);
    cli(&["--url", "localhost:6379", "inspect", "x"])
        .await
        .fails_with(2);
    cli(&["--url", &closed, "--cluster", &closed, "inspect", "x"])
        .await
        .fails_with(2);
    cli(&["--timeout", "0s", "inspect", "x"])
        .await
        .fails_with(2);
    cli(&["--master-user", "u", "inspect", "x"])
        .await
        .fails_with(2);
    cli(&["--sentinel", "m", "", "inspect", "x"])
        .await
        .fails_with(2);
    let err = cli(&["--cluster", &closed, "inspect", "a{b"]).await;
    assert!(err.fails_with(2).contains("hash tag"), "{err:?}");
    // The same name is fine outside a cluster; the server is not there: a Redis error.
    let err = cli(&["--url", &closed, "inspect", "a{b"]).await;
    assert!(err.fails_with(3).contains("cannot connect"), "{err:?}");
    cli(&["--cluster", &closed, "scan"]).await.fails_with(3);
    cli(&["--sentinel", "mymaster", &closed, "inspect", "x"])
        .await
        .fails_with(3);
    // With --json the error is also a JSON document on stdout.
    let run = cli(&["--json", "--url", &closed, "purge-dead", "x"]).await;
    run.fails_with(3);
    let v = run.json();
    assert_eq!(v["error"]["kind"], "redis");
    assert_eq!(v["error"]["exit_code"], 3);
    // Help and version are not errors.
    let run = cli(&["--help"]).await;
    assert!(run.ok().stdout.contains("force-unlock"));
    assert!(cli(&["--version"])
        .await
        .ok()
        .stdout
        .starts_with("fairlock "));
}

/// A server that needs a password, reached without one or with a wrong one: every command
/// fails at once with one line that says the credentials were refused, and exit code 3 (it used
/// to print twenty pipeline failures, and the library found it only at the first lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_get_one_line() {
    let server = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query(&mut server.conn())
        .unwrap();
    let port = server.port();
    for url in [
        format!("redis://127.0.0.1:{port}"),
        format!("redis://:wrong@127.0.0.1:{port}"),
    ] {
        for args in [
            vec!["inspect", "x"],
            vec!["scan"],
            vec!["semaphore", "s"],
            vec!["latch", "l"],
            vec!["purge-dead", "x"],
            vec!["force-unlock", "x", "--yes"],
            vec!["watch", "x"],
        ] {
            let mut all = vec!["--url", url.as_str()];
            all.extend(args.iter().copied());
            let run = cli(&all).await;
            let err = run.fails_with(3);
            assert!(
                err.contains("refused the client's credentials"),
                "{all:?}: {err:?}"
            );
            assert!(!err.contains("s3cret") && !err.contains("wrong"), "{err:?}");
        }
    }
    let ok = format!("redis://:s3cret@127.0.0.1:{port}");
    let run = cli(&["--url", &ok, "latch", "l"]).await;
    assert_eq!(run.code, 0, "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn every_command_on_a_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let seeds = urls[..2].join(",");
    let c = Client::builder()
        .cluster(urls.clone())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let d = Client::builder()
        .cluster(urls.clone())
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    // One name on each master.
    let mut names = Vec::new();
    let mut masters = Vec::new();
    for i in 0.. {
        let name = format!("cl-{i}");
        let m = cluster.master_for_key(&name);
        if !masters.contains(&m) {
            masters.push(m);
            names.push(name);
            if names.len() == 3 {
                break;
            }
        }
    }
    let (held, java_held, stale) = (&names[0], &names[1], &names[2]);
    let conn = |key: &str| cluster.nodes[cluster.master_for_key(key)].conn();

    let guard = c.fair_lock(held.as_str()).fenced().lock().await.unwrap();
    java_hold(&mut conn(java_held), java_held, &java(21), None);
    java_queue(&mut conn(stale), stale, &java(22), -10);

    // inspect: ours and the Redisson peer's.
    let snap = cli(&["--cluster", &seeds, "--json", "inspect", held])
        .await
        .ok()
        .json();
    assert_eq!(snap["owners"][0]["client_id"], uuid_of(&c));
    assert_eq!(snap["fencing_token"], 1);
    let run = cli(&["--cluster", &seeds, "inspect", java_held]).await;
    let text = &run.ok().stdout;
    assert!(
        text.contains(&format!("client {JAVA}  holder 21  holds 1")),
        "{text}"
    );
    assert!(text.contains("lock hash without TTL"), "{text}");

    // scan: every master.
    let report = cli(&["--cluster", &seeds, "--json", "scan", "cl-*"])
        .await
        .ok()
        .json();
    assert_eq!(report["nodes"].as_array().unwrap().len(), 3, "{report}");
    let found: Vec<&str> = report["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    for name in &names {
        assert!(found.contains(&name.as_str()), "{name} not in {found:?}");
    }
    let problems: Vec<&str> = report["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["problem"].as_str().unwrap())
        .collect();
    assert!(problems.contains(&"lock_without_ttl"), "{problems:?}");
    assert!(problems.contains(&"queue_orphaned"), "{problems:?}");
    let run = cli(&["--cluster", &seeds, "scan"]).await;
    assert!(run.ok().stdout.contains("over 3 masters"), "{run:?}");

    // watch: sharded pub/sub (Redis 7 cluster, auto), following the head's channel.
    let mut child = command(&["--cluster", &seeds, "--json", "watch", held])
        .spawn()
        .unwrap();
    let rx = line_reader(&mut child);
    let rx = tokio::task::spawn_blocking(move || {
        let first = next_event(&rx, "snapshot", Duration::from_secs(10));
        assert_eq!(first["kind"], "plain");
        rx
    })
    .await
    .unwrap();
    let lock = d.fair_lock(held.as_str());
    let waiting = tokio::spawn(async move { lock.try_lock(Duration::from_secs(50), None).await });
    let rx = tokio::task::spawn_blocking(move || {
        let queued = next_event(&rx, "queued", Duration::from_secs(10));
        assert_eq!(queued["position"], 1);
        rx
    })
    .await
    .unwrap();
    guard.unlock().await.unwrap();
    let gd = joined(waiting, Duration::from_secs(10), "d gets the lock")
        .await
        .unwrap()
        .unwrap();
    let handed = tokio::task::spawn_blocking(move || {
        next_event(&rx, "released", Duration::from_secs(10));
        next_event(&rx, "acquired", Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert_eq!(handed["client_id"], uuid_of(&d));
    assert_eq!(handed["handover"], true);
    assert!(handed["gap_ms"].as_i64().unwrap() < 1_500, "{handed}");
    signal(&child, "TERM");
    let code = tokio::task::spawn_blocking(move || exited(child, Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(code, 0);

    // force-unlock and purge-dead.
    let report = cli(&["--cluster", &seeds, "--json", "force-unlock", held, "--yes"])
        .await
        .ok()
        .json();
    assert_eq!(report["owners"][0]["client_id"], uuid_of(&d));
    drop(gd);
    let report = cli(&["--cluster", &seeds, "--json", "purge-dead", stale])
        .await
        .ok()
        .json();
    assert_eq!(report["purged"][0]["field"], java(22));
    assert_eq!(report["purged"][0]["reason"], "deadline_passed");
    assert_eq!(queue_len(&mut conn(stale), stale), 0);

    // A name whose keys would span slots.
    let run = cli(&["--cluster", &seeds, "inspect", "a{b"]).await;
    assert!(run.fails_with(2).contains("hash tag"));
    let snap = cli(&["--cluster", &seeds, "--json", "inspect", "{tag}:x"]).await;
    assert_eq!(snap.code, 1, "{snap:?}");
    assert_eq!(snap.json()["kind"], "absent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn inspect_through_sentinel() {
    let group = SentinelGroup::start();
    let client = Client::builder()
        .sentinel(group.master_name.clone(), group.sentinel_urls())
        .build()
        .await
        .unwrap();
    let guard = client.fair_lock("sentineled").lock().await.unwrap();
    java_queue(&mut group.master.conn(), "sentineled", &java(31), 300_000);
    let sentinels = group.sentinel_urls().join(",");
    let snap = cli(&[
        "--sentinel",
        &group.master_name,
        &sentinels,
        "--json",
        "inspect",
        "sentineled",
    ])
    .await
    .ok()
    .json();
    assert_eq!(snap["kind"], "fair");
    assert_eq!(snap["owners"][0]["client_id"], uuid_of(&client));
    assert_eq!(snap["queue"][0]["field"], java(31));
    assert_eq!(snap["queue"][0]["alive"], true);
    let run = cli(&[
        "inspect",
        "sentineled",
        "--sentinel",
        &group.master_name,
        &sentinels,
    ])
    .await;
    assert!(run.ok().stdout.contains(&java(31)[..36]));
    guard.unlock().await.unwrap();
}

/// Runs `openssl` (failing loudly when it is missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_connect_over_tls() {
    // A throw-away CA and a certificate for 127.0.0.1, on a server built with TLS (the test kit
    // uses Debian's Redis 7.0 whatever server is under test: the PyPI builds have no TLS).
    let tls = support::TlsFiles::generate();
    let (server, tls_port) = tls.start_server(false);
    java_hold(&mut server.conn(), "secured", &java(5), Some(30_000));
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let ca = tls.path("ca.pem");
    let run_tls = |args: Vec<String>, trust: bool| {
        let ca = ca.clone();
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut cmd = command(&refs);
            if trust {
                cmd.env("SSL_CERT_FILE", &ca);
            } else {
                cmd.env_remove("SSL_CERT_FILE");
            }
            finish(cmd.spawn().unwrap(), &args.join(" "))
        })
    };
    let args = |rest: &[&str]| -> Vec<String> {
        ["--url", &url, "--json"]
            .iter()
            .chain(rest)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let snap = run_tls(args(&["inspect", "secured"]), true).await.unwrap();
    let snap = snap.ok().json();
    assert_eq!(snap["owners"][0]["field"], java(5));
    let report = run_tls(args(&["scan"]), true).await.unwrap().ok().json();
    assert_eq!(report["summary"]["locks"], 1);
    // A server whose certificate is not trusted: one line, a Redis error.
    let run = run_tls(args(&["inspect", "secured"]), false).await.unwrap();
    assert!(run.fails_with(3).contains("certificate"), "{run:?}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn read_write_locks_in_inspect_scan_watch_and_force_unlock() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.conn();
    // A short watchdog: our reader learns of the force unlock at its next renewal (1 s).
    let ours = Client::builder()
        .standalone(url.as_str())
        .watchdog_timeout(Duration::from_secs(3))
        .waiter_liveness(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let name = "catalog";
    // A watch from the start, to see the read-write lock's holders come and go.
    let mut child = command(&["--url", &url, "--json", "watch", name, "--interval", "1s"])
        .spawn()
        .unwrap();
    let rx = line_reader(&mut child);
    let rx = tokio::task::spawn_blocking(move || {
        next_event(&rx, "snapshot", Duration::from_secs(10));
        rx
    })
    .await
    .unwrap();

    // A Java reader (Redisson's data: mode, its field, its lease key) and one of ours.
    let java_reader = java(31);
    let lease = format!("{{{name}}}:{java_reader}:rwlock_timeout:1");
    let _: () = redis::pipe()
        .hset(name, "mode", "read")
        .hset(name, &java_reader, 1)
        .set(&lease, 1)
        .pexpire(&lease, 60_000)
        .pexpire(name, 60_000)
        .query(&mut raw)
        .unwrap();
    let rw = ours.read_write_lock(name).writer_preferring();
    let reader = rw.read_lock().lock().await.unwrap();
    let me = uuid_of(&ours);
    let rx = tokio::task::spawn_blocking(move || {
        // Both readers show up as holders (in one snapshot or two).
        let mut seen = Vec::new();
        while !(seen.contains(&me) && seen.iter().any(|c| c.len() == 36 && *c != me)) {
            let ev = next_event(&rx, "acquired", Duration::from_secs(10));
            seen.push(ev["client_id"].as_str().unwrap().to_owned());
        }
        rx
    })
    .await
    .unwrap();
    // A writer of ours queues behind both readers (writer-preferring).
    let w = rw.write_lock();
    let writer = tokio::spawn(async move { w.lock().await });
    wait_until(Duration::from_secs(10), "writer queued", || {
        raw.zcard::<_, i64>(format!("fairlock_rw_queue:{{{name}}}"))
            .unwrap()
            == 1
    });

    let run = cli(&["--url", &url, "--json", "inspect", name]).await;
    run.ok();
    let snap = run.json();
    assert_eq!(snap["kind"], "rw");
    assert_eq!(snap["mode"], "read");
    assert_eq!(snap["locked"], true);
    let readers = snap["readers"].as_array().unwrap();
    assert_eq!(readers.len(), 2, "{snap}");
    assert!(readers.iter().all(|r| r["alive"] == true));
    let java_view = readers
        .iter()
        .find(|r| r["field"] == java_reader.as_str())
        .unwrap();
    assert!(java_view["lease_ttls_ms"][0].as_i64().unwrap() > 50_000);
    assert_eq!(snap["queue_length"], 1);
    assert!(snap["queue"][0]["field"]
        .as_str()
        .unwrap()
        .ends_with(":write"));
    assert_eq!(snap["queue"][0]["alive"], true);
    let roles: Vec<&str> = snap["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["role"].as_str().unwrap())
        .collect();
    for role in [
        "lock",
        "lease",
        "rw_queue",
        "rw_writers",
        "rw_liveness",
        "rw_seq",
    ] {
        assert!(roles.contains(&role), "no {role} key in {roles:?}");
    }
    assert_eq!(snap["orphans"].as_array().unwrap().len(), 0, "{snap}");
    let text = cli(&["--url", &url, "inspect", name]).await;
    text.ok();
    for want in [
        "kind         rw (a read-write lock",
        "mode         read",
        "reader       client",
    ] {
        assert!(
            text.stdout.contains(want),
            "missing {want:?} in:\n{}",
            text.stdout
        );
    }

    // Scan finds it as one read-write lock (its lease keys and queue keys included).
    let scan = cli(&["--url", &url, "--json", "scan"]).await;
    scan.ok();
    let report = scan.json();
    let locks = report["locks"].as_array().unwrap();
    let found: Vec<&Value> = locks.iter().filter(|l| l["name"] == name).collect();
    assert_eq!(found.len(), 1, "{report}");
    assert_eq!(found[0]["kind"], "rw");
    assert_eq!(report["summary"]["orphans"], 0, "{report}");

    // Force unlock: the readers are gone, and our queued writer is woken by '1' on the
    // read-write channel at once (not by its 60 s TTL).
    let forced = Instant::now();
    cli(&["--url", &url, "force-unlock", name, "--yes"])
        .await
        .ok();
    let w = joined(writer, Duration::from_secs(5), "the writer enters")
        .await
        .unwrap();
    assert!(forced.elapsed() < Duration::from_secs(3));
    let (writing, rx) = tokio::task::spawn_blocking(move || {
        let ev = next_event(&rx, "acquired", Duration::from_secs(10));
        (ev, rx)
    })
    .await
    .unwrap();
    assert!(
        writing["field"].as_str().unwrap().ends_with(":write"),
        "{writing}"
    );
    drop(rx);
    let _ = child.kill();
    let _ = child.wait();
    tokio::time::timeout(Duration::from_secs(5), reader.lost())
        .await
        .expect("our reader learns it lost the lock");
    w.unlock().await.unwrap();
}

/// `semaphore` and `latch`: a Java-made expirable permit (no lease, never expires), one of ours
/// with a lease and a plain semaphore's count; a latch closed, then open; typed exits for a
/// missing semaphore, a key of another type, and a hash-tagged latch name on a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_latches_are_shown_read_only() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.conn();
    let c = Client::connect(&url).await.unwrap();
    let sem = c.expirable_semaphore("gpus");
    assert!(sem.try_set_permits(3).await.unwrap());
    let ours = sem.acquire(1, Some(Duration::from_secs(60))).await.unwrap();
    // A Redisson permit without a lease: raw 16 bytes, the never-expiring score.
    let java_id = [0xabu8; 16];
    let _: () = redis::pipe()
        .zadd("{gpus}:timeout", &java_id[..], 922_337_203_685_477i64)
        .decr("gpus", 1)
        .query(&mut raw)
        .unwrap();
    let run = cli(&["--url", &url, "--json", "semaphore", "gpus"]).await;
    let v = run.ok().json();
    assert_eq!(v["kind"], "expirable");
    assert_eq!(v["available"], 1);
    assert_eq!(v["channel"], "redisson_sc:{gpus}");
    let permits = v["permits"].as_array().unwrap();
    assert_eq!(permits.len(), 2);
    let ids: Vec<&str> = permits.iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&ours.ids()[0].as_str()), "{ids:?}");
    assert!(ids.contains(&"abababababababababababababababab"), "{ids:?}");
    let never = permits
        .iter()
        .find(|p| p["id"] == "abababababababababababababababab")
        .unwrap();
    assert!(never["expires_at_ms"].is_null());
    assert_eq!(v["expired"], 0);
    // The table names the same facts, and nothing was written (the count is unchanged).
    let run = cli(&["--url", &url, "semaphore", "gpus"]).await;
    let text = &run.ok().stdout;
    assert!(
        text.contains("expirable") && text.contains("never (no lease)"),
        "{text}"
    );
    assert_eq!(raw.get::<_, i64>("gpus").unwrap(), 1);
    ours.release().await.unwrap();

    let plain = c.semaphore("slots");
    assert!(plain.try_set_permits(2).await.unwrap());
    let v = cli(&["--url", &url, "--json", "semaphore", "slots"])
        .await
        .ok()
        .json();
    assert_eq!(
        (v["kind"].as_str(), v["available"].as_i64()),
        (Some("semaphore"), Some(2))
    );
    let run = cli(&["--url", &url, "semaphore", "nothing"]).await;
    assert!(run.fails_with(1).contains("no semaphore"));
    let _: () = raw.hset("a-hash", "f", 1).unwrap();
    let run = cli(&["--url", &url, "semaphore", "a-hash"]).await;
    assert!(run.fails_with(1).contains("not a semaphore"));

    let latch = c.count_down_latch("boot");
    assert!(latch.try_set_count(2).await.unwrap());
    let v = cli(&["--url", &url, "--json", "latch", "boot"])
        .await
        .ok()
        .json();
    assert_eq!(
        (v["kind"].as_str(), v["count"].as_i64()),
        (Some("latch"), Some(2))
    );
    assert_eq!(v["channel"], "redisson_countdownlatch__channel__{boot}");
    latch.count_down().await.unwrap();
    latch.count_down().await.unwrap();
    let v = cli(&["--url", &url, "--json", "latch", "boot"])
        .await
        .ok()
        .json();
    assert_eq!(
        (v["kind"].as_str(), v["count"].as_i64()),
        (Some("open"), Some(0))
    );

    let cluster = RedisCluster::start();
    let run = cli(&[
        "--cluster",
        &cluster.urls().join(","),
        "latch",
        "{user1}:latch",
    ])
    .await;
    assert!(run.fails_with(2).contains("another slot"), "{run:?}");
}
