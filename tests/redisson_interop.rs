//! Interoperability with the real Redisson client: `interop/redisson/RedissonPeer.java` runs
//! Redisson (found and compiled by `scripts/redisson-classpath.sh`) in a child JVM, and these tests
//! share lock names between it and fairlock against real redis-server processes: hand-overs both
//! ways (timed), mixed fair queues, reentry, force unlock, killed processes, inspection, fencing,
//! Redis Cluster and Sentinel. Java or Redisson missing fails the run; nothing is skipped.

use fairlock_testkit as support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::{Client, LostReason, PubSubMode};
use redis::Commands;
use support::{
    joined, queue_key, release_channel, sigkill, timeout_key, wait_for, wait_until, waiter_channel,
    JavaOptions, JavaPeer, JavaTopology, Monitor, RedisCluster, RedisServer, SentinelGroup,
};

// ---------------------------------------------------------------------------------------------
// Names, probes and figures
// ---------------------------------------------------------------------------------------------

/// Raw reads on the server that owns a lock (the standalone server, the master of its slot).
struct Probe {
    conn: redis::Connection,
    conn_url: String,
    /// Count sharded (`PUBSUB SHARDNUMSUB`) instead of classic subscribers.
    sharded: bool,
    /// Count classic subscribers over these servers rather than on `conn`'s: every node of a
    /// cluster, where a classic subscription may sit on any node.
    classic_nodes: Vec<String>,
}

impl Probe {
    fn new(server: &RedisServer, sharded: bool) -> Probe {
        Probe {
            conn: server.conn(),
            conn_url: server.url(),
            sharded,
            classic_nodes: Vec::new(),
        }
    }

    /// A probe on the master of `name`'s slot that counts subscribers of the pub/sub mode that
    /// Redisson's and fairlock's defaults use on the server under test: sharded ones on that
    /// master (Redis 7+), classic ones over every node (Redis 6.2, which has no sharded pub/sub).
    fn cluster(cluster: &RedisCluster, name: &str) -> Probe {
        let master = &cluster.nodes[cluster.master_for_key(name)];
        if auto_sharded() {
            Probe::new(master, true)
        } else {
            Probe {
                classic_nodes: cluster.urls(),
                ..Probe::new(master, false)
            }
        }
    }

    /// Another probe on the same server.
    fn another(&self) -> Probe {
        Probe {
            conn: redis::Client::open(self.conn_url.as_str())
                .unwrap()
                .get_connection()
                .unwrap(),
            conn_url: self.conn_url.clone(),
            sharded: self.sharded,
            classic_nodes: self.classic_nodes.clone(),
        }
    }

    fn queue(&mut self, name: &str) -> Vec<String> {
        self.conn.lrange(queue_key(name), 0, -1).unwrap()
    }

    fn owners(&mut self, name: &str) -> Vec<(String, i64)> {
        self.conn.hgetall(name).unwrap()
    }

    fn pttl(&mut self, name: &str) -> i64 {
        self.conn.pttl(name).unwrap()
    }

    fn subscribers(&mut self, channel: &str) -> i64 {
        if self.classic_nodes.is_empty() {
            return subscribers(&mut self.conn, self.sharded, channel);
        }
        self.classic_nodes
            .iter()
            .map(|url| {
                let mut conn = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                subscribers(&mut conn, false, channel)
            })
            .sum()
    }

    /// Scripts run on this server so far (`EVALSHA` and `EVAL` calls).
    fn script_calls(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn)
            .unwrap();
        support::command_calls(&info, "evalsha") + support::command_calls(&info, "eval")
    }
}

/// Subscribers of `channel` on this server: classic (`PUBSUB NUMSUB`) or sharded.
fn subscribers(conn: &mut redis::Connection, sharded: bool, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg(if sharded { "SHARDNUMSUB" } else { "NUMSUB" })
        .arg(channel)
        .query(conn)
        .unwrap();
    n
}

/// Hand-over latencies of one direction, in arrival order.
struct Figures {
    label: String,
    samples: Vec<Duration>,
}

impl Figures {
    fn sorted(&self) -> Vec<Duration> {
        let mut s = self.samples.clone();
        s.sort();
        s
    }

    fn median(&self) -> Duration {
        let s = self.sorted();
        s[s.len() / 2]
    }

    fn p90(&self) -> Duration {
        let s = self.sorted();
        s[(s.len() * 9 / 10).min(s.len() - 1)]
    }

    fn max(&self) -> Duration {
        *self.sorted().last().unwrap()
    }

    /// Prints the figures (visible with `--no-capture`) and checks them: a median of a few ms
    /// once warm, and never anything that looks like waiting for a TTL or a heartbeat.
    fn report_and_check(&self, median_bound: Duration) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        eprintln!(
            "HAND-OVER {}: n={} median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
            self.label,
            self.samples.len(),
            ms(self.median()),
            ms(self.p90()),
            ms(self.max())
        );
        assert!(
            self.median() <= median_bound,
            "{}: median hand-over {:?} over {median_bound:?}; samples {:?}",
            self.label,
            self.median(),
            self.samples
        );
        assert!(
            self.max() < Duration::from_secs(1),
            "{}: a hand-over took {:?}: someone waited for a TTL instead of a message",
            self.label,
            self.max()
        );
    }
}

/// A fairlock client on one server with the given waiter liveness.
async fn standalone_client(server: &RedisServer, liveness: Duration) -> Client {
    Client::builder()
        .standalone(server.url())
        .waiter_liveness(liveness)
        .build()
        .await
        .unwrap()
}

fn single(server: &RedisServer) -> JavaOptions {
    JavaOptions::new(JavaTopology::Single(server.url()))
}

// ---------------------------------------------------------------------------------------------
// Hand-overs
// ---------------------------------------------------------------------------------------------

/// Warm-up rounds (JIT, connection pools) before the timed ones.
const WARM_UP_ROUNDS: usize = 30;
const TIMED_ROUNDS: usize = 30;

/// Fair hand-overs on `name`, Java thread `jt` ↔ fairlock, `rounds` times each way. The Java side
/// holds the lock between rounds. Returns (Java → Rust, Rust → Java) latencies: from just before
/// the release is sent to the moment the waiter holds the lock (for Java: its reply line arrived).
async fn fair_hand_overs(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
    name: &str,
    jt: i64,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let java_field = peer.field(jt);
    let (mut j2r, mut r2j) = (Vec::new(), Vec::new());
    peer.call(&format!("lock fair {name} {jt} -1"))
        .await
        .ok("first Java lock");
    for round in 0..rounds {
        // Java → Rust: a fairlock waiter queued and listening on its own channel.
        let lock = client.fair_lock(name);
        let waiter = tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            (Instant::now(), guard)
        });
        let rust_field = wait_for(
            Duration::from_secs(10),
            "the fairlock waiter queued and subscribed",
            || {
                let q = probe.queue(name);
                let head = q.first()?.clone();
                (q.len() == 1
                    && head != java_field
                    && probe.subscribers(&waiter_channel(name, &head)) == 1)
                    .then_some(head)
            },
            || format!("round {round}"),
        );
        let released = Instant::now();
        peer.call(&format!("unlock fair {name} {jt}"))
            .await
            .ok("Java unlock");
        let (acquired, guard) = joined(waiter, Duration::from_secs(10), "Rust waiter served").await;
        j2r.push(acquired - released);
        assert_eq!(probe.owners(name), vec![(rust_field.clone(), 1)]);

        // Rust → Java: the Java thread queues, listens on its own channel, and attempts again
        // (Redisson attempts, subscribes, attempts: then it is parked).
        let calls = probe.script_calls();
        let java_wait = peer.send(&format!("lock fair {name} {jt} -1"));
        wait_until(
            Duration::from_secs(10),
            "the Java waiter queued, subscribed and parked",
            || {
                probe.queue(name) == [java_field.clone()]
                    && probe.subscribers(&waiter_channel(name, &java_field)) == 1
                    && probe.script_calls() >= calls + 2
            },
        );
        let released = Instant::now();
        guard.unlock().await.unwrap();
        let reply = java_wait.wait(Duration::from_secs(10)).await;
        reply.ok("Java lock after the Rust release");
        r2j.push(reply.at - released);
        assert_eq!(probe.owners(name), vec![(java_field.clone(), 1)]);
    }
    peer.call(&format!("unlock fair {name} {jt}"))
        .await
        .ok("last Java unlock");
    (j2r, r2j)
}

/// The same for the non-fair lock. Waiters of both sides listen on the one release channel of
/// the lock (where fairlock keeps an unused subscription for a few seconds), so a waiter counts as
/// parked once it is subscribed and its attempts ran: one `EVALSHA` for a fairlock waiter already
/// subscribed, two for Redisson (it attempts, subscribes, attempts again).
async fn plain_hand_overs(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
    name: &str,
    jt: i64,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let java_field = peer.field(jt);
    let channel = release_channel(name);
    let (mut j2r, mut r2j) = (Vec::new(), Vec::new());
    peer.call(&format!("lock plain {name} {jt} -1"))
        .await
        .ok("first Java lock");
    for round in 0..rounds {
        let calls = probe.script_calls();
        let lock = client.non_fair_lock(name);
        let waiter = tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            (Instant::now(), guard)
        });
        wait_until(
            Duration::from_secs(10),
            &format!("round {round}: the fairlock waiter attempted and subscribed"),
            || probe.script_calls() > calls && probe.subscribers(&channel) >= 1,
        );
        let released = Instant::now();
        peer.call(&format!("unlock plain {name} {jt}"))
            .await
            .ok("Java unlock");
        let (acquired, guard) = joined(waiter, Duration::from_secs(10), "Rust waiter served").await;
        j2r.push(acquired - released);
        assert_eq!(probe.owners(name).len(), 1);
        assert_ne!(probe.owners(name)[0].0, java_field);

        let calls = probe.script_calls();
        let java_wait = peer.send(&format!("lock plain {name} {jt} -1"));
        wait_until(
            Duration::from_secs(10),
            &format!("round {round}: the Java waiter attempted twice"),
            || probe.script_calls() >= calls + 2,
        );
        let released = Instant::now();
        guard.unlock().await.unwrap();
        let reply = java_wait.wait(Duration::from_secs(10)).await;
        reply.ok("Java lock after the Rust release");
        r2j.push(reply.at - released);
        assert_eq!(probe.owners(name), vec![(java_field.clone(), 1)]);
    }
    peer.call(&format!("unlock plain {name} {jt}"))
        .await
        .ok("last Java unlock");
    (j2r, r2j)
}

/// Warms up, then times hand-overs of both kinds in both directions and checks the figures.
async fn timed_hand_overs(
    peer: &JavaPeer,
    client: &Client,
    probe_for: impl Fn(&str) -> Probe,
    setting: &str,
    median_bound: Duration,
) {
    let fair = format!("handover-fair-{setting}");
    let plain = format!("handover-plain-{setting}");
    let mut fair_probe = probe_for(&fair);
    let mut plain_probe = probe_for(&plain);
    let (cold_fj2r, cold_fr2j) =
        fair_hand_overs(peer, client, &mut fair_probe, &fair, 11, WARM_UP_ROUNDS).await;
    let (cold_pj2r, cold_pr2j) =
        plain_hand_overs(peer, client, &mut plain_probe, &plain, 12, WARM_UP_ROUNDS).await;
    for (label, samples) in [
        ("fair Java→Rust", cold_fj2r),
        ("fair Rust→Java", cold_fr2j),
        ("plain Java→Rust", cold_pj2r),
        ("plain Rust→Java", cold_pr2j),
    ] {
        eprintln!(
            "HAND-OVER {setting} {label} while warming up: first {:.2} ms, max {:.2} ms",
            samples[0].as_secs_f64() * 1000.0,
            samples.iter().max().unwrap().as_secs_f64() * 1000.0
        );
    }
    let (fj2r, fr2j) =
        fair_hand_overs(peer, client, &mut fair_probe, &fair, 11, TIMED_ROUNDS).await;
    let (pj2r, pr2j) =
        plain_hand_overs(peer, client, &mut plain_probe, &plain, 12, TIMED_ROUNDS).await;
    for (label, samples) in [
        ("fair Java→Rust", fj2r),
        ("fair Rust→Java", fr2j),
        ("plain Java→Rust", pj2r),
        ("plain Rust→Java", pr2j),
    ] {
        Figures {
            label: format!("{setting} {label}"),
            samples,
        }
        .report_and_check(median_bound);
    }
    assert!(!client.fair_lock(fair).is_locked().await.unwrap());
    assert!(!client.non_fair_lock(plain).is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_hand_overs_both_ways_are_fast_once_warm() {
    let server = RedisServer::start();
    let peer = JavaPeer::start(&single(&server));
    let client = standalone_client(&server, Duration::from_secs(5)).await;
    timed_hand_overs(
        &peer,
        &client,
        |_| Probe::new(&server, false),
        "standalone",
        Duration::from_millis(25),
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Mixed fair queues
// ---------------------------------------------------------------------------------------------

/// Who acquired, in order, with the owner hash seen at that moment.
type Served = Arc<Mutex<Vec<(String, Vec<(String, i64)>, Instant)>>>;

/// One arrival in a mixed queue.
enum Arrival {
    /// A Java thread: `lock` (wait `None`) or `tryLock(wait)`.
    Java {
        label: &'static str,
        thread: i64,
        wait_ms: Option<u64>,
    },
    /// A fairlock holder: `lock()` (wait `None`) or `try_lock(wait)`.
    Rust {
        label: &'static str,
        holder: i64,
        wait_ms: Option<u64>,
    },
}

impl Arrival {
    fn label(&self) -> &'static str {
        match self {
            Arrival::Java { label, .. } | Arrival::Rust { label, .. } => label,
        }
    }

    fn gives_up(&self) -> bool {
        match self {
            Arrival::Java { wait_ms, .. } | Arrival::Rust { wait_ms, .. } => {
                wait_ms.is_some_and(|w| w < 10_000)
            }
        }
    }
}

/// How long each waiter holds the lock once served (the critical section IS the scenario).
const MIXED_HOLD: Duration = Duration::from_millis(150);

/// Queues `arrivals` one after another (each waits until it is in the queue before the next
/// arrives) on the fair lock `name`, held by Java thread 100 meanwhile; waits until the give-ups
/// gave up, keeps holding for `extra_hold` (heartbeats and purges happen meanwhile), releases,
/// and returns the labels in the order they were served.
async fn run_mixed_queue(
    peer: &Arc<JavaPeer>,
    client: &Client,
    probe: &mut Probe,
    name: &str,
    arrivals: Vec<Arrival>,
    extra_hold: Duration,
) -> Vec<String> {
    let served: Served = Arc::new(Mutex::new(Vec::new()));
    let owner_probe = Arc::new(Mutex::new(probe.another()));
    peer.call(&format!("lock fair {name} 100 -1"))
        .await
        .ok("the Java holder");
    let mut tasks = Vec::new();
    let mut gave_up = Vec::new();
    for arrival in arrivals {
        let label = arrival.label();
        let gives_up = arrival.gives_up();
        let field = match &arrival {
            Arrival::Java { thread, .. } => peer.field(*thread),
            Arrival::Rust { holder, .. } => format!("{}:{holder}", client.id().hyphenated()),
        };
        let task: tokio::task::JoinHandle<bool> = match arrival {
            Arrival::Java {
                thread, wait_ms, ..
            } => {
                let request = match wait_ms {
                    None => format!("lock fair {name} {thread} -1"),
                    Some(w) => format!("trylock fair {name} {thread} {w} -1"),
                };
                let pending = peer.send(&request);
                let (peer, served, owners, name) = (
                    peer.clone(),
                    served.clone(),
                    owner_probe.clone(),
                    name.to_owned(),
                );
                tokio::spawn(async move {
                    let reply = pending.wait(Duration::from_secs(90)).await;
                    let value = reply.ok(label).to_owned();
                    if wait_ms.is_some() && value == "false" {
                        return false;
                    }
                    let hash = owners.lock().unwrap().owners(&name);
                    served
                        .lock()
                        .unwrap()
                        .push((label.to_owned(), hash, Instant::now()));
                    tokio::time::sleep(MIXED_HOLD).await;
                    peer.call(&format!("unlock fair {name} {thread}"))
                        .await
                        .ok(label);
                    true
                })
            }
            Arrival::Rust {
                holder, wait_ms, ..
            } => {
                let lock = client
                    .fair_lock(name)
                    .with_holder(fairlock::Holder::from_raw(holder).unwrap());
                let (served, owners, name) = (served.clone(), owner_probe.clone(), name.to_owned());
                tokio::spawn(async move {
                    let guard = match wait_ms {
                        None => lock.lock().await.unwrap(),
                        Some(w) => {
                            match lock.try_lock(Duration::from_millis(w), None).await.unwrap() {
                                Some(g) => g,
                                None => return false,
                            }
                        }
                    };
                    let hash = owners.lock().unwrap().owners(&name);
                    served
                        .lock()
                        .unwrap()
                        .push((label.to_owned(), hash, Instant::now()));
                    tokio::time::sleep(MIXED_HOLD).await;
                    guard.unlock().await.unwrap();
                    true
                })
            }
        };
        wait_until(Duration::from_secs(10), &format!("{label} queued"), || {
            probe.queue(name).contains(&field)
        });
        if gives_up {
            gave_up.push((label, field, task));
        } else {
            tasks.push((label, task));
        }
    }
    for (label, field, task) in gave_up {
        let served = joined(task, Duration::from_secs(30), label).await;
        assert!(
            !served,
            "{label} was meant to give up while the lock was held"
        );
        // Its give-up runs in the background once the call returned.
        wait_until(
            Duration::from_secs(5),
            &format!("{label} left the queue"),
            || !probe.queue(name).contains(&field),
        );
    }
    // Holding on IS the scenario: the queue waits through several heartbeats and purges.
    tokio::time::sleep(extra_hold).await;
    let released = Instant::now();
    peer.call(&format!("unlock fair {name} 100"))
        .await
        .ok("the Java holder's release");
    for (label, task) in tasks {
        assert!(
            joined(task, Duration::from_secs(90), label).await,
            "{label} was served"
        );
    }
    let served = served.lock().unwrap().clone();
    let timeline: Vec<String> = served
        .iter()
        .map(|(label, _, at)| format!("{label} +{:?}", at.saturating_duration_since(released)))
        .collect();
    eprintln!("{name}: served after the holder's release: {timeline:?}");
    for (label, hash, _) in &served {
        assert_eq!(hash.len(), 1, "{label} shared the lock: {hash:?}");
    }
    assert!(probe.queue(name).is_empty());
    assert!(probe.owners(name).is_empty());
    served.into_iter().map(|(label, _, _)| label).collect()
}

/// J R J R … with Java and Rust give-ups among them.
fn mixed_arrivals() -> Vec<Arrival> {
    use Arrival::{Java, Rust};
    vec![
        Java {
            label: "J1",
            thread: 1,
            wait_ms: None,
        },
        Rust {
            label: "R1",
            holder: 1001,
            wait_ms: None,
        },
        Java {
            label: "J-gives-up",
            thread: 50,
            wait_ms: Some(2000),
        },
        Java {
            label: "J2",
            thread: 2,
            wait_ms: None,
        },
        Rust {
            label: "R2",
            holder: 1002,
            wait_ms: None,
        },
        Rust {
            label: "R-gives-up",
            holder: 1050,
            wait_ms: Some(2000),
        },
        Java {
            label: "J3",
            thread: 3,
            wait_ms: Some(60_000),
        },
        Rust {
            label: "R3",
            holder: 1003,
            wait_ms: None,
        },
        Java {
            label: "J4",
            thread: 4,
            wait_ms: None,
        },
        Rust {
            label: "R4",
            holder: 1004,
            wait_ms: Some(60_000),
        },
    ]
}

const MIXED_ORDER: [&str; 8] = ["J1", "R1", "J2", "R2", "J3", "R3", "J4", "R4"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mixed_fair_queue_is_served_in_arrival_order() {
    let server = RedisServer::start();
    let peer = Arc::new(JavaPeer::start(&single(&server)));
    // Heartbeats every 500 ms: the queue below waits through many of them.
    let client = standalone_client(&server, Duration::from_millis(1500)).await;
    let mut probe = Probe::new(&server, false);
    let order = run_mixed_queue(
        &peer,
        &client,
        &mut probe,
        "mixed",
        mixed_arrivals(),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(order, MIXED_ORDER, "served out of arrival order");
}

// ---------------------------------------------------------------------------------------------
// Reentry, force unlock, inspection, fencing (one JVM)
// ---------------------------------------------------------------------------------------------

/// A Java holder and a fairlock holder never share a hold, even with the same numeric holder id.
async fn reentry_is_refused_across_the_boundary(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
) {
    for kind in ["fair", "plain"] {
        let name = format!("reentry-{kind}");
        let java7 = peer.field(7);
        let rust7 = format!("{}:7", client.id().hyphenated());
        let (fair, plain) = (
            client
                .fair_lock(name.clone())
                .with_holder(fairlock::Holder::from_raw(7).unwrap()),
            client
                .non_fair_lock(name.clone())
                .with_holder(fairlock::Holder::from_raw(7).unwrap()),
        );
        let try_rust = |wait: Duration| {
            let (fair, plain) = (fair.clone(), plain.clone());
            async move {
                if kind == "fair" {
                    fair.try_lock(wait, None).await.unwrap()
                } else {
                    plain.try_lock(wait, None).await.unwrap()
                }
            }
        };

        // Java thread 7 holds twice (its own reentry); fairlock holder 7 is someone else.
        peer.call(&format!("lock {kind} {name} 7 -1"))
            .await
            .ok("Java lock");
        peer.call(&format!("lock {kind} {name} 7 -1"))
            .await
            .ok("Java reentry");
        assert!(
            try_rust(Duration::ZERO).await.is_none(),
            "{kind}: Rust entered a Java hold"
        );
        assert!(
            try_rust(Duration::from_millis(300)).await.is_none(),
            "{kind}: Rust entered a Java hold after waiting"
        );
        let count = if kind == "fair" {
            fair.hold_count().await
        } else {
            plain.hold_count().await
        };
        assert_eq!(count.unwrap(), 0);
        assert_eq!(probe.owners(&name), vec![(java7.clone(), 2)]);
        // The Rust waiter's give-up runs in the background once its call returned.
        wait_until(
            Duration::from_secs(5),
            "the Rust give-up left the queue",
            || probe.queue(&name).is_empty(),
        );
        peer.call(&format!("unlock {kind} {name} 7"))
            .await
            .ok("Java unlock");
        peer.call(&format!("unlock {kind} {name} 7"))
            .await
            .ok("Java unlock");

        // fairlock holder 7 holds; Java thread 7 can neither enter nor release it.
        let guard = try_rust(Duration::ZERO).await.expect("free lock");
        assert_eq!(
            peer.call(&format!("trylock {kind} {name} 7 0 -1"))
                .await
                .ok("Java try"),
            "false",
            "{kind}: Java entered a Rust hold"
        );
        assert_eq!(
            peer.call(&format!("trylock {kind} {name} 7 300 -1"))
                .await
                .ok("Java try"),
            "false",
            "{kind}: Java entered a Rust hold after waiting"
        );
        assert_eq!(
            peer.call(&format!("held {kind} {name} 7")).await.ok("held"),
            "false"
        );
        let err = peer.call(&format!("unlock {kind} {name} 7")).await;
        assert!(
            err.err("Java unlock of a Rust hold")
                .starts_with("IllegalMonitorStateException"),
            "{err:?}"
        );
        assert_eq!(probe.owners(&name), vec![(rust7.clone(), 1)]);
        assert!(
            probe.queue(&name).is_empty(),
            "the Java give-up left the queue"
        );
        guard.unlock().await.unwrap();
        assert!(probe.owners(&name).is_empty());
    }
}

/// Java's forceUnlock of a fairlock hold: the guard's `lost()` fires, the waiter behind is served.
async fn java_force_unlock_of_a_rust_hold(peer: &JavaPeer, client: &Client, probe: &mut Probe) {
    for kind in ["fair", "plain"] {
        let name = format!("forced-by-java-{kind}");
        let (held, waiting) = if kind == "fair" {
            let fair = client.fair_lock(name.clone());
            let g = fair
                .clone()
                .with_holder(fairlock::Holder::from_raw(1).unwrap())
                .lock()
                .await
                .unwrap();
            let w = fair.with_holder(fairlock::Holder::from_raw(2).unwrap());
            (g, tokio::spawn(async move { w.lock().await.unwrap() }))
        } else {
            let plain = client.non_fair_lock(name.clone());
            let g = plain
                .clone()
                .with_holder(fairlock::Holder::from_raw(1).unwrap())
                .lock()
                .await
                .unwrap();
            let w = plain.with_holder(fairlock::Holder::from_raw(2).unwrap());
            (g, tokio::spawn(async move { w.lock().await.unwrap() }))
        };
        let waiter_field = format!("{}:2", client.id().hyphenated());
        if kind == "fair" {
            wait_until(Duration::from_secs(10), "the waiter queued", || {
                probe.queue(&name) == [waiter_field.clone()]
                    && probe.subscribers(&waiter_channel(&name, &waiter_field)) == 1
            });
        } else {
            wait_until(Duration::from_secs(10), "the waiter subscribed", || {
                probe.subscribers(&release_channel(&name)) == 1
            });
        }
        let forced = Instant::now();
        assert_eq!(
            peer.call(&format!("force {kind} {name}"))
                .await
                .ok("forceUnlock"),
            "true"
        );
        let next = joined(
            waiting,
            Duration::from_secs(5),
            "the waiter behind is served",
        )
        .await;
        eprintln!(
            "{kind}: served {:?} after Java's forceUnlock",
            forced.elapsed()
        );
        let reason = tokio::time::timeout(Duration::from_secs(5), held.lost())
            .await
            .expect("lost() fires after Java's forceUnlock");
        assert_eq!(reason, LostReason::Gone);
        assert_eq!(probe.owners(&name), vec![(waiter_field.clone(), 1)]);
        assert!(held.unlock().await.unwrap_err().is_not_held());
        next.unlock().await.unwrap();
    }
}

/// fairlock's force_unlock of a Java hold: Java's renewals of it stop at the next one, and the
/// Java waiter behind it is served.
async fn rust_force_unlock_of_a_java_hold(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
    monitor: &Monitor,
    renewal_period: Duration,
) {
    let name = "forced-by-rust";
    let (f1, f2) = (peer.field(1), peer.field(2));
    let quoted = |s: &str| format!("\"{s}\"");
    let (qname, qf1, qf2) = (quoted(name), quoted(&f1), quoted(&f2));
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let behind = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "the Java waiter queued", || {
        probe.queue(name) == [f2.clone()] && probe.subscribers(&waiter_channel(name, &f2)) == 1
    });
    // Java renews its hold (inside the renewal script, HEXISTS checks the field first).
    let start = Instant::now();
    monitor.wait_for(
        start,
        &["lua] \"hexists\"", &qname, &qf1],
        renewal_period * 3,
    );

    let forced = Instant::now();
    assert!(client.fair_lock(name).force_unlock().await.unwrap());
    behind
        .wait(Duration::from_secs(5))
        .await
        .ok("the Java waiter behind is served");
    eprintln!(
        "served {:?} after fairlock's force_unlock",
        forced.elapsed()
    );
    assert_eq!(probe.owners(name), vec![(f2.clone(), 1)]);
    assert_eq!(
        peer.call(&format!("held fair {name} 1")).await.ok("held"),
        "false"
    );

    // Watching three renewal periods IS the scenario: the forced hold is renewed at most once
    // more (the renewal that finds it gone), while the new holder's renewals go on.
    tokio::time::sleep(renewal_period * 3 + renewal_period / 2).await;
    let old = monitor.count_since(forced, &["lua] \"hexists\"", &qname, &qf1]);
    let new = monitor.count_since(forced, &["lua] \"hexists\"", &qname, &qf2]);
    eprintln!("renewals after the force: forced hold {old}, new holder {new}");
    assert!(
        old <= 1,
        "Java kept renewing the forced hold: {old} renewals"
    );
    assert!(new >= 2, "the new Java holder was renewed {new} times");
    let err = peer.call(&format!("unlock fair {name} 1")).await;
    assert!(err
        .err("unlock of the forced hold")
        .starts_with("IllegalMonitorStateException"));
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    assert!(probe.owners(name).is_empty());
}

/// `state()` of a Java-held fair lock with Java waiters, and of a Java-held plain lock.
async fn inspection_of_java_holds(
    peer: &JavaPeer,
    client: &Client,
    probe: &mut Probe,
    java_watchdog: Duration,
) {
    let name = "inspected";
    let (f1, f2, f3) = (peer.field(1), peer.field(2), peer.field(3));
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("lock");
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("reentry");
    let w2 = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "thread 2 queued", || {
        probe.queue(name) == [f2.clone()]
    });
    let w3 = peer.send(&format!("lock fair {name} 3 -1"));
    wait_until(Duration::from_secs(10), "thread 3 queued", || {
        probe.queue(name) == [f2.clone(), f3.clone()]
    });
    let lock = client.fair_lock(name);
    let state = lock.state().await.unwrap();
    let java_ttl: i64 = peer
        .call(&format!("ttl fair {name}"))
        .await
        .ok("ttl")
        .parse()
        .unwrap();
    assert!(state.is_locked());
    assert_eq!(state.owners.len(), 1);
    assert_eq!(state.owners[0].field, f1);
    assert_eq!(state.owners[0].holds, 2);
    assert_eq!(state.owners[0].client_id(), peer.uuid());
    assert_eq!(state.owners[0].holder_id(), Some(1));
    let ttl = state.ttl.expect("a Java hold has a TTL");
    assert!(ttl > Duration::ZERO && ttl <= java_watchdog, "{ttl:?}");
    assert!(
        (ttl.as_millis() as i64 - java_ttl).abs() < java_watchdog.as_millis() as i64 / 2,
        "fairlock sees {ttl:?}, Java {java_ttl} ms"
    );
    let fields: Vec<&str> = state.queue.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(fields, [f2.as_str(), f3.as_str()]);
    for waiter in &state.queue {
        let score: f64 = probe.conn.zscore(timeout_key(name), &waiter.field).unwrap();
        assert_eq!(
            waiter.deadline,
            Some(std::time::UNIX_EPOCH + Duration::from_millis(score as u64)),
            "{waiter:?}"
        );
        // Redisson's deadlines: the holder's TTL plus its 5-minute wait, chained per waiter.
        assert!(
            waiter.expires_in.unwrap() > Duration::from_secs(290),
            "{waiter:?}"
        );
        // A Java waiter has no fairlock liveness mark; it is judged by its deadline.
        assert_eq!(waiter.alive_until, None, "{waiter:?}");
        assert!(waiter.alive, "{waiter:?}");
    }
    assert!(
        state.queue[1]
            .deadline
            .unwrap()
            .duration_since(state.queue[0].deadline.unwrap())
            .unwrap()
            >= Duration::from_secs(290),
        "Java chains its deadlines one wait apart: {:?}",
        state.queue
    );
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(lock.hold_count().await.unwrap(), 0);

    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    assert_eq!(lock.state().await.unwrap().owners[0].holds, 1);
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    w2.wait(Duration::from_secs(5)).await.ok("thread 2 served");
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    w3.wait(Duration::from_secs(5)).await.ok("thread 3 served");
    let state = lock.state().await.unwrap();
    assert_eq!(state.owners[0].field, f3);
    assert!(state.queue.is_empty());
    peer.call(&format!("unlock fair {name} 3"))
        .await
        .ok("unlock");
    assert!(!lock.state().await.unwrap().is_locked());

    // A plain Java hold with a fixed lease of 20 s (not the 3 s watchdog).
    let plain = client.non_fair_lock("inspected-plain");
    peer.call("lock plain inspected-plain 4 20000")
        .await
        .ok("lock");
    let state = plain.state().await.unwrap();
    assert_eq!(state.owners.len(), 1);
    assert_eq!(state.owners[0].field, peer.field(4));
    assert_eq!(state.owners[0].holds, 1);
    assert!(
        state
            .ttl
            .is_some_and(|t| t > Duration::from_secs(15) && t <= Duration::from_secs(20)),
        "{state:?}"
    );
    assert!(state.queue.is_empty());
    peer.call("unlock plain inspected-plain 4")
        .await
        .ok("unlock");
}

/// A Java `tryLockAsync(wait, lease, unit, threadId)` that times out in the queue subtracts the
/// fair wait timeout (300 s), not its own wait, from every waiter behind it: the asynchronous form
/// gives up with `acquireFailedAsync(-1, …)`.
async fn java_async_give_up_shifts_by_the_fair_wait_timeout(peer: &JavaPeer, probe: &mut Probe) {
    let name = "give-up-shift";
    let (f2, f9, f3) = (peer.field(2), peer.field(9), peer.field(3));
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("holder");
    let w2 = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "thread 2 queued", || {
        probe.queue(name) == [f2.clone()]
    });
    let gives_up = peer.send(&format!("trylock fair {name} 9 1000 -1"));
    wait_until(Duration::from_secs(10), "thread 9 queued", || {
        probe.queue(name) == [f2.clone(), f9.clone()]
    });
    let w3 = peer.send(&format!("lock fair {name} 3 -1"));
    wait_until(Duration::from_secs(10), "thread 3 queued", || {
        probe.queue(name) == [f2.clone(), f9.clone(), f3.clone()]
    });
    let score = |probe: &mut Probe, field: &str| -> i64 {
        let s: f64 = probe.conn.zscore(timeout_key(name), field).unwrap();
        s as i64
    };
    let (ahead, behind) = (score(probe, &f2), score(probe, &f3));
    assert_eq!(
        gives_up.wait(Duration::from_secs(10)).await.ok("tryLock"),
        "false"
    );
    wait_until(Duration::from_secs(10), "thread 9 left the queue", || {
        probe.queue(name) == [f2.clone(), f3.clone()]
    });
    assert_eq!(score(probe, &f2), ahead, "the waiter ahead is untouched");
    assert_eq!(
        behind - score(probe, &f3),
        300_000,
        "the waiter behind lost the fair wait timeout, not the 1 s wait"
    );
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    w2.wait(Duration::from_secs(5)).await.ok("thread 2 served");
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    w3.wait(Duration::from_secs(5)).await.ok("thread 3 served");
    peer.call(&format!("unlock fair {name} 3"))
        .await
        .ok("unlock");
}

/// Redisson's RFencedLock and fairlock's fenced handles draw from one counter,
/// `redisson_lock_token:{NAME}`: tokens strictly increase across both, hand-overs included.
async fn fencing_tokens_are_shared(peer: &JavaPeer, client: &Client, probe: &mut Probe) {
    let name = "fenced";
    let token = |reply: &str| -> u64 { reply.rsplit(' ').next().unwrap().parse().unwrap() };
    let mut tokens: Vec<(String, u64)> = Vec::new();

    let t = token(
        peer.call(&format!("lock fenced {name} 1 -1"))
            .await
            .ok("Java fenced lock"),
    );
    tokens.push(("Java lock".into(), t));
    // Contended both ways on the non-fair layout RFencedLock uses.
    let plain = client.non_fair_lock(name).fenced();
    let waiter = tokio::spawn(async move { plain.lock().await.unwrap() });
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter subscribed",
        || probe.subscribers(&release_channel(name)) >= 1,
    );
    peer.call(&format!("unlock fenced {name} 1"))
        .await
        .ok("Java unlock");
    let g = joined(waiter, Duration::from_secs(5), "the fenced fairlock waiter").await;
    tokens.push(("Rust lock after Java".into(), g.fencing_token().unwrap()));
    let java_wait = peer.send(&format!("lock fenced {name} 2 -1"));
    let calls = probe.script_calls();
    wait_until(
        Duration::from_secs(10),
        "the Java waiter attempted twice",
        || probe.script_calls() >= calls + 2,
    );
    g.unlock().await.unwrap();
    let t = token(
        java_wait
            .wait(Duration::from_secs(5))
            .await
            .ok("Java after Rust"),
    );
    tokens.push(("Java lock after Rust".into(), t));
    // Java's reentry takes a new token too.
    let t = token(
        peer.call(&format!("lock fenced {name} 2 -1"))
            .await
            .ok("Java reentry"),
    );
    tokens.push(("Java reentry".into(), t));
    peer.call(&format!("unlock fenced {name} 2"))
        .await
        .ok("unlock");
    peer.call(&format!("unlock fenced {name} 2"))
        .await
        .ok("unlock");
    // A fenced fair handle on the same name shares the counter.
    let fair = client.fair_lock(name).fenced();
    let g = fair.lock().await.unwrap();
    tokens.push(("Rust fair lock".into(), g.fencing_token().unwrap()));
    let g2 = g.reenter(None).await.unwrap();
    tokens.push(("Rust fair reentry".into(), g2.fencing_token().unwrap()));
    drop(g2);
    g.unlock().await.unwrap();
    let reply = peer.call(&format!("trylock fenced {name} 3 0 -1")).await;
    assert!(reply.ok("Java tryLock").starts_with("true "), "{reply:?}");
    tokens.push(("Java tryLock".into(), token(reply.ok(""))));
    peer.call(&format!("unlock fenced {name} 3"))
        .await
        .ok("unlock");
    let g = client
        .non_fair_lock(name)
        .fenced()
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .unwrap();
    tokens.push(("Rust tryLock".into(), g.fencing_token().unwrap()));
    g.unlock().await.unwrap();

    eprintln!("FENCING TOKENS: {tokens:?}");
    for pair in tokens.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "tokens must strictly increase: {tokens:?}"
        );
    }
    let counter: u64 = probe
        .conn
        .get(format!("redisson_lock_token:{{{name}}}"))
        .unwrap();
    assert_eq!(counter, tokens.last().unwrap().1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_reentry_force_unlock_inspection_and_fencing() {
    let server = RedisServer::start();
    // Short watchdogs on both sides: renewals every second (Java) and every 500 ms (fairlock).
    let java_watchdog = Duration::from_secs(3);
    let peer = JavaPeer::start(&single(&server).watchdog_ms(java_watchdog.as_millis() as u64));
    let client = Client::builder()
        .standalone(server.url())
        .watchdog_timeout(Duration::from_millis(1500))
        .build()
        .await
        .unwrap();
    let mut probe = Probe::new(&server, false);
    let monitor = Monitor::start(server.port());

    reentry_is_refused_across_the_boundary(&peer, &client, &mut probe).await;
    java_force_unlock_of_a_rust_hold(&peer, &client, &mut probe).await;
    rust_force_unlock_of_a_java_hold(&peer, &client, &mut probe, &monitor, java_watchdog / 3).await;
    inspection_of_java_holds(&peer, &client, &mut probe, java_watchdog).await;
    java_async_give_up_shifts_by_the_fair_wait_timeout(&peer, &mut probe).await;
    fencing_tokens_are_shared(&peer, &client, &mut probe).await;
}

// ---------------------------------------------------------------------------------------------
// Killed processes
// ---------------------------------------------------------------------------------------------

const ROLE_ENV: &str = "FAIRLOCK_INTEROP_ROLE";

/// Starts this test binary again as a child that runs `test` in `role` (the test checks
/// `ROLE_ENV` first) against `url`, and waits until it prints `READY`.
fn spawn_role(test: &str, role: &str, url: &str) -> std::process::Child {
    support::spawn_role(test, &[(ROLE_ENV, role), ("FAIRLOCK_INTEROP_URL", url)])
}

/// In a child process: its role and the server URL.
fn child_role() -> Option<(String, String)> {
    let role = std::env::var(ROLE_ENV).ok()?;
    Some((role, std::env::var("FAIRLOCK_INTEROP_URL").unwrap()))
}

/// The child roles: a fairlock holder of `killed-rust-fair` and `killed-rust-plain` (watchdog
/// 2 s), or a fairlock waiter queued on `dead-waiter` (liveness 1.5 s). Never returns.
async fn play_child_role(role: &str, url: &str) -> ! {
    let client = Client::builder()
        .standalone(url)
        .watchdog_timeout(Duration::from_secs(2))
        .waiter_liveness(Duration::from_millis(1500))
        .build()
        .await
        .unwrap();
    match role {
        "holder" => {
            let _fair = client.fair_lock("killed-rust-fair").lock().await.unwrap();
            let _plain = client
                .non_fair_lock("killed-rust-plain")
                .lock()
                .await
                .unwrap();
            println!("READY");
            std::future::pending::<()>().await;
        }
        "waiter" => {
            let lock = client.fair_lock("dead-waiter");
            let _task = tokio::spawn(async move { lock.lock().await });
            let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
            let prefix = client.id().hyphenated().to_string();
            wait_until(Duration::from_secs(10), "the child queued", || {
                raw.lrange::<_, Vec<String>>(queue_key("dead-waiter"), 0, -1)
                    .unwrap()
                    .iter()
                    .any(|f| f.starts_with(&prefix))
            });
            println!("READY");
            std::future::pending::<()>().await;
        }
        other => panic!("unknown role {other}"),
    }
    unreachable!()
}

/// Checks one hand-over to a waiter after the holder's process died: not before the holder's
/// lease (PTTL when killed) ran out, and soon after.
fn check_served_after_lease(what: &str, pttl_at_kill: i64, waited: Duration) {
    eprintln!("{what}: served {waited:?} after the kill (PTTL then {pttl_at_kill} ms)");
    let waited_ms = waited.as_millis() as i64;
    assert!(
        waited_ms >= pttl_at_kill - 50,
        "{what}: served after {waited_ms} ms, before the lease ({pttl_at_kill} ms) ran out"
    );
    assert!(
        waited_ms <= pttl_at_kill + 1500,
        "{what}: served {waited_ms} ms after the kill, lease was {pttl_at_kill} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holders_free_the_lock_when_their_watchdog_lease_runs_out() {
    if let Some((role, url)) = child_role() {
        play_child_role(&role, &url).await;
    }
    let server = RedisServer::start();
    let mut probe = Probe::new(&server, false);
    let client = standalone_client(&server, Duration::from_secs(5)).await;
    // Two JVMs: one is killed while holding, the other waits for a killed fairlock holder.
    let victim_options = single(&server).watchdog_ms(2000);
    let victim = tokio::task::spawn_blocking(move || JavaPeer::start(&victim_options));
    let survivor = JavaPeer::start(&single(&server).watchdog_ms(2000));
    let mut victim = victim.await.unwrap();

    // A Java holder dies: fairlock waiters get the locks once the watchdog lease runs out.
    victim
        .call("lock fair killed-java-fair 1 -1")
        .await
        .ok("lock");
    victim
        .call("lock plain killed-java-plain 1 -1")
        .await
        .ok("lock");
    let fair = client.fair_lock("killed-java-fair");
    let plain = client.non_fair_lock("killed-java-plain");
    let fair_waiter = tokio::spawn(async move {
        let g = fair.lock().await.unwrap();
        (Instant::now(), g)
    });
    let plain_waiter = tokio::spawn(async move {
        let g = plain.lock().await.unwrap();
        (Instant::now(), g)
    });
    wait_until(Duration::from_secs(10), "the fairlock waiters wait", || {
        probe.queue("killed-java-fair").len() == 1
            && probe.subscribers(&release_channel("killed-java-plain")) == 1
    });
    let (fair_pttl, plain_pttl) = (
        probe.pttl("killed-java-fair"),
        probe.pttl("killed-java-plain"),
    );
    let killed = Instant::now();
    victim.kill();
    let (at, fair_guard) = joined(fair_waiter, Duration::from_secs(10), "fair waiter").await;
    check_served_after_lease("Java holder killed, fair", fair_pttl, at - killed);
    let (at, plain_guard) = joined(plain_waiter, Duration::from_secs(10), "plain waiter").await;
    check_served_after_lease("Java holder killed, plain", plain_pttl, at - killed);
    fair_guard.unlock().await.unwrap();
    plain_guard.unlock().await.unwrap();

    // A fairlock holder dies: Java waiters get the locks likewise.
    let mut child = spawn_role(
        "killed_holders_free_the_lock_when_their_watchdog_lease_runs_out",
        "holder",
        &server.url(),
    );
    let f1 = survivor.field(1);
    let fair_wait = survivor.send("lock fair killed-rust-fair 1 -1");
    let plain_wait = survivor.send("lock plain killed-rust-plain 1 -1");
    wait_until(Duration::from_secs(10), "the Java waiters wait", || {
        probe.queue("killed-rust-fair") == [f1.clone()]
            && probe.subscribers(&waiter_channel("killed-rust-fair", &f1)) == 1
            && probe.subscribers(&release_channel("killed-rust-plain")) == 1
    });
    let (fair_pttl, plain_pttl) = (
        probe.pttl("killed-rust-fair"),
        probe.pttl("killed-rust-plain"),
    );
    let killed = Instant::now();
    sigkill(&mut child);
    let reply = fair_wait.wait(Duration::from_secs(10)).await;
    reply.ok("Java fair waiter");
    check_served_after_lease("fairlock holder killed, fair", fair_pttl, reply.at - killed);
    let reply = plain_wait.wait(Duration::from_secs(10)).await;
    reply.ok("Java plain waiter");
    check_served_after_lease(
        "fairlock holder killed, plain",
        plain_pttl,
        reply.at - killed,
    );
    assert_eq!(probe.owners("killed-rust-fair"), vec![(f1.clone(), 1)]);
    survivor
        .call("unlock fair killed-rust-fair 1")
        .await
        .ok("unlock");
    survivor
        .call("unlock plain killed-rust-plain 1")
        .await
        .ok("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_rust_waiter_ahead_of_a_java_waiter_is_purged_while_a_fairlock_client_is_active() {
    if let Some((role, url)) = child_role() {
        play_child_role(&role, &url).await;
    }
    let name = "dead-waiter";
    let server = RedisServer::start();
    let mut probe = Probe::new(&server, false);
    let peer = JavaPeer::start(&single(&server));
    // The active fairlock client: a live waiter behind the Java one, heartbeating every 500 ms.
    let liveness = Duration::from_millis(1500);
    let client = standalone_client(&server, liveness).await;

    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let mut child = spawn_role(
        "a_dead_rust_waiter_ahead_of_a_java_waiter_is_purged_while_a_fairlock_client_is_active",
        "waiter",
        &server.url(),
    );
    let dead = probe.queue(name)[0].clone();
    let f2 = peer.field(2);
    let java_wait = peer.send(&format!("lock fair {name} 2 -1"));
    wait_until(Duration::from_secs(10), "the Java waiter queued", || {
        probe.queue(name) == [dead.clone(), f2.clone()]
    });
    let live = client
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(3).unwrap());
    let live_field = format!("{}:3", client.id().hyphenated());
    let live_waiter = tokio::spawn(async move { live.lock().await.unwrap() });
    wait_until(
        Duration::from_secs(10),
        "the live fairlock waiter queued",
        || probe.queue(name) == [dead.clone(), f2.clone(), live_field.clone()],
    );

    let killed = Instant::now();
    sigkill(&mut child);
    // The Java holder's release wakes the dead head only.
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("Java release");
    let reply = java_wait.wait(Duration::from_secs(15)).await;
    reply.ok("the Java waiter behind the dead one");
    let waited = reply.at - killed;
    eprintln!("dead fairlock waiter purged: Java waiter served {waited:?} after the kill");
    // The dead head's deadline lapses at most one liveness window after the kill; the live
    // waiter's next heartbeat (every liveness / 3) purges it and tells the Java waiter.
    assert!(
        waited <= liveness * 2 + Duration::from_millis(500),
        "the Java waiter waited {waited:?} behind a dead fairlock waiter (liveness {liveness:?})"
    );
    assert_eq!(probe.owners(name), vec![(f2.clone(), 1)]);
    let queue = probe.queue(name);
    assert!(!queue.contains(&dead), "{queue:?}");
    let score: Option<f64> = probe.conn.zscore(timeout_key(name), &dead).unwrap();
    assert_eq!(score, None, "the dead waiter's deadline is gone too");
    // Its liveness mark goes too. When our heartbeat purged it, the mark went with it; but the
    // dead waiter's score in Z lapses with its mark, so Redisson's own retry may purge it first,
    // from Q and Z only (Redisson does not know L). Then the live waiter's next heartbeat sweeps
    // the lapsed mark of a waiter no longer queued.
    let liveness_key = format!("fairlock_liveness:{{{name}}}");
    wait_until(
        Duration::from_secs(10),
        "the dead waiter's liveness mark is gone",
        || {
            probe
                .conn
                .zscore::<_, _, Option<f64>>(&liveness_key, &dead)
                .unwrap()
                .is_none()
        },
    );
    peer.call(&format!("unlock fair {name} 2"))
        .await
        .ok("unlock");
    let g = joined(
        live_waiter,
        Duration::from_secs(10),
        "the live fairlock waiter",
    )
    .await;
    g.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------------------------

/// Waits until every master's `WAIT 1` is acknowledged at once (a fresh cluster answers WAIT
/// only after about a second at first, and Redisson sends WAIT after each lock script there).
fn settle(cluster: &RedisCluster) {
    for node in &cluster.nodes {
        let info = node.info("replication");
        if support::info_field(&info, "role") != Some("master") {
            continue;
        }
        let mut conn = node.conn();
        let mut fast_in_a_row = 0;
        wait_until(
            Duration::from_secs(30),
            &format!("master {} acknowledges WAIT 1 at once", node.url()),
            || {
                let started = Instant::now();
                let acked: i64 = redis::cmd("WAIT")
                    .arg(1)
                    .arg(1000)
                    .query(&mut conn)
                    .unwrap();
                if acked >= 1 && started.elapsed() < Duration::from_millis(50) {
                    fast_in_a_row += 1;
                } else {
                    fast_in_a_row = 0;
                }
                fast_in_a_row >= 3
            },
        );
    }
}

/// Classic and sharded subscribers of `channel` summed over every node of the cluster (sharded
/// ones are 0 on a server without sharded pub/sub, Redis 6.2).
fn cluster_subscribers(cluster: &RedisCluster, channel: &str) -> (i64, i64) {
    cluster.channel_subscribers(channel)
}

/// Whether the pub/sub mode both defaults pick on a cluster of the server under test (fairlock's
/// `PubSubMode::Auto`, Redisson's `ShardedSubscriptionMode.AUTO`) is sharded (Redis 7+, Valkey)
/// rather than classic (Redis 6.2).
fn auto_sharded() -> bool {
    support::test_server().kind.auto_is_sharded()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_hand_overs_with_redisson_default_pubsub() {
    let cluster = RedisCluster::start();
    settle(&cluster);
    let peer = JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())));
    // PubSubMode::Auto, the default.
    let client = cluster.client().await;

    // Which pub/sub flavour does Redisson use by default here? Park Java waiters and look.
    for kind in ["fair", "plain"] {
        let name = format!("flavour-{kind}");
        let holder = if kind == "fair" {
            client.fair_lock(name.clone()).lock().await.unwrap()
        } else {
            client.non_fair_lock(name.clone()).lock().await.unwrap()
        };
        let java_wait = peer.send(&format!("lock {kind} {name} 1 -1"));
        let channel = if kind == "fair" {
            waiter_channel(&name, &peer.field(1))
        } else {
            release_channel(&name)
        };
        let (classic, sharded) = wait_for(
            Duration::from_secs(15),
            "the Java waiter subscribed (classic or sharded)",
            || {
                let (c, s) = cluster_subscribers(&cluster, &channel);
                (c + s > 0).then_some((c, s))
            },
            || peer.log_tail(20),
        );
        eprintln!("REDISSON CLUSTER PUBSUB ({kind}): classic {classic}, sharded {sharded}");
        assert_eq!(
            (classic, sharded),
            RedisCluster::one_auto_subscriber(),
            "Redisson's default on a Redis 7+ cluster: sharded pub/sub; on 6.2: classic"
        );
        if auto_sharded() {
            let mut master = cluster.nodes[cluster.master_for_key(&name)].conn();
            assert_eq!(
                subscribers(&mut master, true, &channel),
                1,
                "on the lock's master"
            );
        }
        holder.unlock().await.unwrap();
        java_wait
            .wait(Duration::from_secs(10))
            .await
            .ok("Java waiter served");
        peer.call(&format!("unlock {kind} {name} 1"))
            .await
            .ok("unlock");
    }

    timed_hand_overs(
        &peer,
        &client,
        |name| Probe::cluster(&cluster, name),
        "cluster",
        Duration::from_millis(25),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mixed_fair_queue_is_served_in_arrival_order() {
    let cluster = RedisCluster::start();
    settle(&cluster);
    let default_peer = Arc::new(JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(
        cluster.urls(),
    ))));
    let client = Client::builder()
        .cluster(cluster.urls())
        .waiter_liveness(Duration::from_millis(1500))
        .build()
        .await
        .unwrap();
    let name = "mixed-cluster";
    let mut probe = Probe::cluster(&cluster, name);
    let order = run_mixed_queue(
        &default_peer,
        &client,
        &mut probe,
        name,
        mixed_arrivals(),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(order, MIXED_ORDER, "served out of arrival order");
}

/// A Redisson client told to use classic pub/sub (`ShardedSubscriptionMode.OFF`) needs
/// `PubSubMode::Classic`; with `Auto` (sharded on Redis 7) neither side hears the other's release.
/// A Redisson left on its default whose start-up probe failed is on classic pub/sub too. On Redis
/// 6.2, which has no sharded pub/sub, `Auto` is classic and matches, and Redisson's probe always
/// fails (no `PUBSUB SHARDNUMSUB`), so its default is classic too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_classic_pubsub_needs_pubsub_mode_classic() {
    let cluster = RedisCluster::start();
    settle(&cluster);
    let peer =
        JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())).sharded("off"));
    let classic = Client::builder()
        .cluster(cluster.urls())
        .pubsub_mode(PubSubMode::Classic)
        .build()
        .await
        .unwrap();
    let auto = cluster.client().await;

    // Matching modes: hand-overs both ways by message.
    let name = "classic";
    let f1 = peer.field(1);
    let mut master = cluster.nodes[cluster.master_for_key(name)].conn();
    let guard = classic.fair_lock(name).lock().await.unwrap();
    let java_wait = peer.send(&format!("lock fair {name} 1 -1"));
    wait_until(
        Duration::from_secs(10),
        "the Java waiter subscribed",
        || cluster_subscribers(&cluster, &waiter_channel(name, &f1)) == (1, 0),
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let reply = java_wait.wait(Duration::from_secs(5)).await;
    reply.ok("Java served");
    eprintln!("classic Rust→Java: {:?}", reply.at - released);
    assert!(reply.at - released < Duration::from_secs(1));
    let lock = classic.fair_lock(name);
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (Instant::now(), g)
    });
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter subscribed",
        || {
            let q: Vec<String> = master.lrange(queue_key(name), 0, -1).unwrap();
            q.len() == 1 && cluster_subscribers(&cluster, &waiter_channel(name, &q[0])) == (1, 0)
        },
    );
    let released = Instant::now();
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("Java unlock");
    let (at, g) = joined(waiter, Duration::from_secs(5), "fairlock served").await;
    eprintln!("classic Java→Rust: {:?}", at - released);
    assert!(at - released < Duration::from_secs(1));
    g.unlock().await.unwrap();

    // Mismatched on Redis 7+: fairlock (Auto = sharded) releases, the classic Java waiter hears
    // nothing and only gets the lock when its own retry comes, at the end of the lease it was
    // told. On 6.2 Auto is classic: the same release wakes the Java waiter at once.
    let name = "mismatched";
    // Once uncontended first, so Redisson's scripts are loaded on this master (a NOSCRIPT
    // retry would count as an attempt below).
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("lock");
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
    let guard = auto
        .fair_lock(name)
        .lock_with_lease(Duration::from_secs(2))
        .await
        .unwrap();
    let mut probe = Probe::new(&cluster.nodes[cluster.master_for_key(name)], false);
    let calls = probe.script_calls();
    let java_wait = peer.send(&format!("lock fair {name} 1 -1"));
    // Parked: subscribed, and both attempts (before and after subscribing) made.
    wait_until(
        Duration::from_secs(10),
        "the Java waiter subscribed and attempted twice",
        || {
            cluster_subscribers(&cluster, &waiter_channel(name, &f1)) == (1, 0)
                && probe.script_calls() >= calls + 2
        },
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let reply = java_wait.wait(Duration::from_secs(5)).await;
    reply.ok("Java served at last");
    let waited = reply.at - released;
    eprintln!("mismatched Rust→Java: {waited:?}");
    if auto_sharded() {
        assert!(
            waited > Duration::from_millis(500),
            "the classic Java waiter heard a sharded release ({waited:?})"
        );
    } else {
        assert!(
            waited < Duration::from_secs(1),
            "Auto is classic on 6.2: the Java waiter hears the release ({waited:?})"
        );
    }
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");

    // Redisson's default (ShardedSubscriptionMode.AUTO) decides once, at start-up, by running
    // `PUBSUB SHARDNUMSUB` on the first seed node; when that fails it stays on classic pub/sub
    // for good, without a word. Here an ACL denies it on the first seed while the JVM starts
    // (Redis 7+; 6.2 has no such subcommand, and no subcommand deny rules: the probe fails there
    // as it is).
    let mut seed = cluster.nodes[0].conn();
    let acl = |rule: &str, conn: &mut redis::Connection| {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg(rule)
            .query(conn)
            .unwrap();
    };
    let deny_probe = support::test_server().kind.has_sharded_pubsub();
    if deny_probe {
        acl("-pubsub|shardnumsub", &mut seed);
    }
    let probed = JavaPeer::start(&JavaOptions::new(JavaTopology::Cluster(cluster.urls())));
    if deny_probe {
        acl("+pubsub|shardnumsub", &mut seed);
    }
    let name = "failed-probe";
    let guard = classic.fair_lock(name).lock().await.unwrap();
    let java_wait = probed.send(&format!("lock fair {name} 1 -1"));
    let channel = waiter_channel(name, &probed.field(1));
    let seen = wait_for(
        Duration::from_secs(10),
        "the Java waiter subscribed",
        || {
            let (c, s) = cluster_subscribers(&cluster, &channel);
            (c + s > 0).then_some((c, s))
        },
        || probed.log_tail(20),
    );
    eprintln!("Redisson after a failed start-up probe: (classic, sharded) = {seen:?}");
    assert_eq!(seen, (1, 0), "classic pub/sub after a failed probe");
    guard.unlock().await.unwrap();
    java_wait
        .wait(Duration::from_secs(5))
        .await
        .ok("served (Classic on both sides)");
    probed
        .call(&format!("unlock fair {name} 1"))
        .await
        .ok("unlock");
}

// ---------------------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_hand_overs_and_a_failover_under_a_java_holder() {
    support::init_tracing();
    let mut group = SentinelGroup::start();
    let java_watchdog = Duration::from_secs(6);
    let peer = JavaPeer::start(
        &JavaOptions::new(JavaTopology::Sentinel {
            master: group.master_name.clone(),
            sentinels: group.sentinel_urls(),
        })
        .watchdog_ms(java_watchdog.as_millis() as u64),
    );
    let client = Client::builder()
        .sentinel(group.master_name.clone(), group.sentinel_urls())
        .build()
        .await
        .unwrap();
    timed_hand_overs(
        &peer,
        &client,
        |_| Probe::new(&group.master, false),
        "sentinel",
        Duration::from_millis(25),
    )
    .await;

    // A failover under a Java holder with a fairlock waiter queued: the replicas have both
    // (WAIT 2 before the kill), so the promoted one keeps the hold and the queue.
    let name = "failover";
    let f1 = peer.field(1);
    let mut probe = Probe::new(&group.master, false);
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let lock = client
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(2).unwrap());
    let rust_field = format!("{}:2", client.id().hyphenated());
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (Instant::now(), g)
    });
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter queued",
        || probe.queue(name) == [rust_field.clone()],
    );
    let mut new_master = group.kill_synced_master();
    // Java follows the promotion: its renewals land on the new master.
    support::wait_for_renewal(&mut new_master, name, java_watchdog * 2);
    let owners: Vec<(String, i64)> = new_master.hgetall(name).unwrap();
    assert_eq!(
        owners,
        vec![(f1.clone(), 1)],
        "the promoted replica has the Java hold"
    );
    assert_eq!(
        peer.call(&format!("held fair {name} 1")).await.ok("held"),
        "true"
    );
    // Nobody hangs, and nobody overtakes the holder.
    assert!(
        !waiter.is_finished(),
        "the fairlock waiter took a lock Java still holds"
    );
    let released = Instant::now();
    peer.call(&format!("unlock fair {name} 1"))
        .await
        .ok("Java unlock on the new master");
    let (at, g) = joined(
        waiter,
        Duration::from_secs(15),
        "the fairlock waiter served",
    )
    .await;
    eprintln!(
        "after the failover, Java→Rust hand-over: {:?}",
        at - released
    );
    // The sentinels may have failed over a second time by now (a promoted replica that missed
    // their pings on a loaded machine): the checks ask whichever master they agree on.
    let owners: Vec<(String, i64)> = group.current_master().hgetall(name).unwrap();
    let g_field = g.owner_field().to_owned();
    assert_eq!(owners, vec![(g_field.clone(), 1)]);
    g.unlock().await.unwrap();
    assert!(!client.fair_lock(name).is_locked().await.unwrap());
    let mut master = group.current_master();
    let left: Vec<(String, i64)> = master.hgetall(name).unwrap();
    let pttl: i64 = master.pttl(name).unwrap();
    assert!(
        left.is_empty(),
        "after the unlock {name} still holds {left:?} (PTTL {pttl} ms; Java's field {f1}, ours {g_field})"
    );
}

/// The asynchronous-replication window: the replica promoted never got the Java hold (it was cut
/// off while the other replica acknowledged Redisson's `WAIT 1`, and that one died with the
/// master). The fairlock waiter then takes the free lock on the new master while the Java thread
/// still believes it holds: two holders, until Java's next renewal finds its field gone and stops
/// (Redisson tells the Java thread nothing; its unlock fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_that_lost_the_java_hold_gives_two_holders_until_the_next_renewal() {
    let mut group = SentinelGroup::start();
    let java_watchdog = Duration::from_secs(6);
    let peer = JavaPeer::start(
        &JavaOptions::new(JavaTopology::Sentinel {
            master: group.master_name.clone(),
            sentinels: group.sentinel_urls(),
        })
        .watchdog_ms(java_watchdog.as_millis() as u64),
    );
    let client = Client::builder()
        .sentinel(group.master_name.clone(), group.sentinel_urls())
        .build()
        .await
        .unwrap();
    let name = "lost-in-failover";
    let f1 = peer.field(1);

    // Replica 1 cut off (its link closed, and a wrong master password keeps it from coming back):
    // Redisson's WAIT 1 after the lock script is acknowledged by replica 0 only.
    let mut cut_off = group.replicas[1].conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("masterauth")
        .arg("not-the-password")
        .query(&mut cut_off)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("master")
        .query(&mut cut_off)
        .unwrap();
    wait_until(Duration::from_secs(10), "replica 1 disconnected", || {
        support::info_field(&group.master.info("replication"), "connected_slaves") == Some("1")
    });
    peer.call(&format!("lock fair {name} 1 -1"))
        .await
        .ok("Java holder");
    let lock = client
        .fair_lock(name)
        .with_holder(fairlock::Holder::from_raw(2).unwrap());
    let waiter = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (Instant::now(), g)
    });
    let mut probe = Probe::new(&group.master, false);
    wait_until(
        Duration::from_secs(10),
        "the fairlock waiter queued",
        || probe.queue(name).len() == 1,
    );
    // The replica that has the hold dies with the master; the cut-off one is promoted.
    group.replicas[0].kill();
    let old = group.master.port();
    group.master.kill();
    let new_port = group.wait_for_failover(old, Duration::from_secs(30));
    assert_eq!(new_port, group.replicas[1].port());
    let monitor = Monitor::start(new_port);
    let watching = Instant::now();
    let mut new_master = group.replicas[1].conn();

    let (at, g) = joined(
        waiter,
        Duration::from_secs(30),
        "the fairlock waiter served",
    )
    .await;
    eprintln!(
        "the promoted replica lacked the Java hold: fairlock served {:?} after the failover was reported",
        at.saturating_duration_since(watching)
    );
    let owners: Vec<(String, i64)> = new_master.hgetall(name).unwrap();
    assert_eq!(owners, vec![(g.owner_field().to_owned(), 1)]);
    // Java's renewals reach the new master and stop once one finds the field gone. The first
    // may not count: Redisson follows it with `WAIT 1`, the new master has no replica left, and
    // a renewal whose sync fails is an error (NoSyncedSlavesException) that is retried at the
    // next period. Watching 1.5 watchdog timeouts (4.5 renewal periods) IS the scenario.
    tokio::time::sleep(java_watchdog + java_watchdog / 2).await;
    let renewals = monitor.lines_since(
        watching,
        &[
            "lua] \"hexists\"",
            &format!("\"{name}\""),
            &format!("\"{f1}\""),
        ],
    );
    eprintln!(
        "Java renewals of the lost hold on the new master: {}",
        renewals.len()
    );
    assert!(
        renewals.len() <= 2,
        "Java kept renewing a hold the new master never had: {renewals:#?}"
    );
    assert!(
        !g.is_lost(),
        "Java's renewals must not disturb the new holder"
    );
    assert_eq!(
        peer.call(&format!("held fair {name} 1")).await.ok("held"),
        "false"
    );
    let err = peer.call(&format!("unlock fair {name} 1")).await;
    assert!(err
        .err("Java unlock of the lost hold")
        .starts_with("IllegalMonitorStateException"));
    g.unlock().await.unwrap();
}
