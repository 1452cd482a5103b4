//! Helpers shared by the Redisson interop tests (`tests/redisson_interop*.rs`, each includes this
//! with `mod interop;`): probes that read a lock's keys and subscribers on the server that owns
//! it, hand-over figures, the timed hand-overs both ways, and the mixed fair queues of Java and
//! fairlock waiters.
// Each test crate uses only some of these helpers (the crash tests no hand-overs, Sentinel no
// mixed queue, …); the rest would be reported as dead code there.
#![allow(dead_code)]

use fairlock_testkit as support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fairlock::Client;
use redis::Commands;
use support::{
    joined, queue_key, release_channel, wait_for, wait_until, waiter_channel, JavaOptions,
    JavaPeer, JavaTopology, RedisCluster, RedisServer,
};

// ---------------------------------------------------------------------------------------------
// Names, probes and figures
// ---------------------------------------------------------------------------------------------

/// Raw reads on the server that owns a lock (the standalone server, the master of its slot).
pub struct Probe {
    pub conn: redis::Connection,
    conn_url: String,
    /// Count sharded (`PUBSUB SHARDNUMSUB`) instead of classic subscribers.
    sharded: bool,
    /// Count classic subscribers over these servers rather than on `conn`'s: every node of a
    /// cluster, where a classic subscription may sit on any node.
    classic_nodes: Vec<String>,
}

impl Probe {
    pub fn new(server: &RedisServer, sharded: bool) -> Probe {
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
    pub fn cluster(cluster: &RedisCluster, name: &str) -> Probe {
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
    pub fn another(&self) -> Probe {
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

    pub fn queue(&mut self, name: &str) -> Vec<String> {
        self.conn.lrange(queue_key(name), 0, -1).unwrap()
    }

    pub fn owners(&mut self, name: &str) -> Vec<(String, i64)> {
        self.conn.hgetall(name).unwrap()
    }

    pub fn pttl(&mut self, name: &str) -> i64 {
        self.conn.pttl(name).unwrap()
    }

    pub fn subscribers(&mut self, channel: &str) -> i64 {
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
    pub fn script_calls(&mut self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn)
            .unwrap();
        support::command_calls(&info, "evalsha") + support::command_calls(&info, "eval")
    }
}

/// Subscribers of `channel` on this server: classic (`PUBSUB NUMSUB`) or sharded.
pub fn subscribers(conn: &mut redis::Connection, sharded: bool, channel: &str) -> i64 {
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
    /// once warm (bounded by `median_bound`, which leaves room for a loaded machine next to a
    /// JVM), and never anything that looks like waiting for a TTL or a heartbeat (a second or
    /// more).
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
pub async fn standalone_client(server: &RedisServer, liveness: Duration) -> Client {
    Client::builder()
        .standalone(server.url())
        .waiter_liveness(liveness)
        .build()
        .await
        .unwrap()
}

pub fn single(server: &RedisServer) -> JavaOptions {
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
pub async fn timed_hand_overs(
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

// ---------------------------------------------------------------------------------------------
// Mixed fair queues
// ---------------------------------------------------------------------------------------------

/// Who acquired, in order, with the owner hash seen at that moment.
type Served = Arc<Mutex<Vec<(String, Vec<(String, i64)>, Instant)>>>;

/// One arrival in a mixed queue.
pub enum Arrival {
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
pub async fn run_mixed_queue(
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
pub fn mixed_arrivals() -> Vec<Arrival> {
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

pub const MIXED_ORDER: [&str; 8] = ["J1", "R1", "J2", "R2", "J3", "R3", "J4", "R4"];

/// Whether the pub/sub mode both defaults pick on a cluster of the server under test (fairlock's
/// `PubSubMode::Auto`, Redisson's `ShardedSubscriptionMode.AUTO`) is sharded (Redis 7+, Valkey)
/// rather than classic (Redis 6.2).
pub fn auto_sharded() -> bool {
    support::test_server().kind.auto_is_sharded()
}
