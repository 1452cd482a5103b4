//! A 6-node Redis Cluster (3 masters, 3 replicas) of real `redis-server` processes.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::server::RedisServer;
use super::server::{info_field, probe_conn, probe_info, tail, WorkDir};
use super::servers::test_server;
use super::wait::{wait_for, wait_until_or};

const NODES: usize = 6;
/// Deadline for `redis-cli --cluster create` and, separately, for the cluster to converge.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(60);
/// `--cluster-node-timeout` in milliseconds.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// Six cluster-enabled servers joined with `redis-cli --cluster create … --cluster-replicas 1`.
/// Dropping it kills every node by PID (each `RedisServer`'s drop) and removes the work dirs.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    /// Holds `redis-cli.log` (output of `--cluster create`); removed on drop.
    dir: WorkDir,
}

/// One master's slot range as seen in `CLUSTER NODES`: (first slot, last slot, master port).
type SlotRange = (u16, u16, u16);

impl RedisCluster {
    /// Starts the six nodes, creates the cluster and returns once every node reports
    /// `cluster_state:ok`, all 16384 slots assigned and ok, 6 known nodes, the same slot map as
    /// every other node, and every replica's `master_link_status:up`.
    pub fn start() -> RedisCluster {
        let cli = &test_server().cli;
        let timeout = NODE_TIMEOUT_MS.to_string();
        let nodes: Vec<RedisServer> = (0..NODES)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    &timeout,
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
            .collect();
        let cluster = RedisCluster {
            nodes,
            dir: WorkDir::new("cluster"),
        };

        let log_path = cluster.dir.path().join("redis-cli.log");
        let log = fs::File::create(&log_path).unwrap();
        let mut cmd = Command::new(cli);
        cmd.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mut child = cmd.spawn().expect("spawn redis-cli --cluster create");
        let deadline = Instant::now() + CLUSTER_DEADLINE;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create did not finish within {CLUSTER_DEADLINE:?}:\n{}",
                    tail(&log_path, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "redis-cli --cluster create failed ({status}):\n{}",
            tail(&log_path, 30)
        );

        wait_for(
            CLUSTER_DEADLINE,
            "cluster converged (state ok, 16384 slots, 6 nodes, same slot map, replicas linked)",
            || cluster.converged().then_some(()),
            || cluster.describe(),
        );
        cluster
    }

    fn converged(&self) -> bool {
        let mut first_map: Option<Vec<SlotRange>> = None;
        let mut masters = 0;
        for node in &self.nodes {
            let Some(info) = cluster_info(node.port()) else {
                return false;
            };
            let ok = info_field(&info, "cluster_state") == Some("ok")
                && info_field(&info, "cluster_slots_assigned") == Some("16384")
                && info_field(&info, "cluster_slots_ok") == Some("16384")
                && info_field(&info, "cluster_known_nodes") == Some("6");
            if !ok {
                return false;
            }
            let Some(map) = slot_map(node.port()) else {
                return false;
            };
            match &first_map {
                None => first_map = Some(map),
                Some(first) if *first != map => return false,
                Some(_) => {}
            }
            let Some(repl) = probe_info(node.port(), "replication") else {
                return false;
            };
            match info_field(&repl, "role") {
                Some("master") => masters += 1,
                Some("slave") if info_field(&repl, "master_link_status") == Some("up") => {}
                _ => return false,
            }
        }
        masters == NODES / 2
    }

    fn describe(&self) -> String {
        let mut out = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let info = cluster_info(node.port()).unwrap_or_else(|| "<no answer>".into());
            let state = info_field(&info, "cluster_state").unwrap_or("?");
            let slots = info_field(&info, "cluster_slots_ok").unwrap_or("?");
            let known = info_field(&info, "cluster_known_nodes").unwrap_or("?");
            let repl = probe_info(node.port(), "replication").unwrap_or_default();
            out.push_str(&format!(
                "node {i} port {}: state={state} slots_ok={slots} known={known} role={} link={}\n  log: {}\n",
                node.port(),
                info_field(&repl, "role").unwrap_or("?"),
                info_field(&repl, "master_link_status").unwrap_or("-"),
                node.log_tail(8).replace('\n', "\n  log: "),
            ));
        }
        out.push_str(&format!(
            "redis-cli.log:\n{}",
            tail(&self.dir.path().join("redis-cli.log"), 10)
        ));
        out
    }

    /// A fairlock client of this cluster with the default configuration.
    pub async fn client(&self) -> fairlock::Client {
        fairlock::Client::builder()
            .cluster(self.urls())
            .build()
            .await
            .unwrap_or_else(|e| panic!("cluster client: {e}"))
    }

    /// `redis://127.0.0.1:PORT` of every node, in `nodes` order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Index into `nodes` of the master serving `slot`, per `CLUSTER NODES` of the first node
    /// that answers (failed masters are skipped); `None` while no live node answers or no master
    /// serves the slot (during a failover).
    pub fn try_master_for_slot(&self, slot: u16) -> Option<usize> {
        let map = self
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .find_map(|n| slot_map(n.port()))?;
        let port = map
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(_, _, port)| *port)?;
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// Waits until a live node other than `old` is the master of `slot` (a failover finished)
    /// and returns its index; after `deadline` panics with every node's state and log tail.
    ///
    /// When `old` was killed and its replica has not taken over by half the deadline, every
    /// node's state goes to stderr and the replica is told `CLUSTER FAILOVER TAKEOVER`: these
    /// tests check what fairlock does across a failover, not how fast Redis's failure detector
    /// is on a loaded machine.
    pub fn wait_for_new_master(&self, slot: u16, old: usize, deadline: Duration) -> usize {
        let promoted = || {
            self.try_master_for_slot(slot)
                .filter(|&i| i != old && self.nodes[i].is_running())
        };
        let what = format!("a replica promoted to master of slot {slot}");
        if !self.nodes[old].is_running() {
            if wait_until_or(deadline / 2, || promoted().is_some()) {
                if let Some(i) = promoted() {
                    return i;
                }
            }
            eprintln!(
                "no automatic failover after {:?}; forcing one\n{}",
                deadline / 2,
                self.describe()
            );
            if let Some(r) = self.replica_of(old) {
                let _: redis::RedisResult<()> = redis::cmd("CLUSTER")
                    .arg("FAILOVER")
                    .arg("TAKEOVER")
                    .query(&mut self.nodes[r].conn());
            }
            return wait_for(deadline / 2, &what, promoted, || self.describe());
        }
        wait_for(deadline, &what, promoted, || self.describe())
    }

    /// Subscribers of `channel` summed over every running node: (classic, sharded). Classic
    /// ones are counted with `PUBSUB NUMSUB` (a classic subscription may sit on any node),
    /// sharded ones with `PUBSUB SHARDNUMSUB`, which a server without sharded pub/sub (6.2) does
    /// not have: there nothing can be subscribed sharded and the second count is 0.
    pub fn channel_subscribers(&self, channel: &str) -> (i64, i64) {
        let sharded_too = test_server().kind.has_sharded_pubsub();
        let mut counts = (0, 0);
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let mut conn = node.conn();
            counts.0 += numsub(&mut conn, "NUMSUB", channel);
            if sharded_too {
                counts.1 += numsub(&mut conn, "SHARDNUMSUB", channel);
            }
        }
        counts
    }

    /// Channels matching `pattern` that have subscribers, summed over every running node:
    /// (classic, sharded), the second 0 on a server without sharded pub/sub (see
    /// [`RedisCluster::channel_subscribers`]).
    pub fn subscribed_channels(&self, pattern: &str) -> (usize, usize) {
        let sharded_too = test_server().kind.has_sharded_pubsub();
        let mut counts = (0, 0);
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let mut conn = node.conn();
            counts.0 += crate::subscribed_channels(&mut conn, false, pattern);
            if sharded_too {
                counts.1 += crate::subscribed_channels(&mut conn, true, pattern);
            }
        }
        counts
    }

    /// The counts [`RedisCluster::channel_subscribers`] shows for one subscriber of the mode
    /// that `PubSubMode::Auto` picks on the server under test: `(0, 1)` (sharded) on 7+ and
    /// Valkey, `(1, 0)` (classic) on 6.2.
    pub fn one_auto_subscriber() -> (i64, i64) {
        if test_server().kind.auto_is_sharded() {
            (0, 1)
        } else {
            (1, 0)
        }
    }

    /// Index of a running replica of node `master` (by its `INFO replication`; a replica keeps
    /// naming its master after the master died).
    pub fn replica_of(&self, master: usize) -> Option<usize> {
        let port = self.nodes[master].port().to_string();
        self.nodes.iter().position(|n| {
            n.is_running()
                && probe_info(n.port(), "replication").is_some_and(|info| {
                    info_field(&info, "role") == Some("slave")
                        && info_field(&info, "master_port") == Some(port.as_str())
                })
        })
    }

    /// As [`try_master_for_slot`](Self::try_master_for_slot), panicking when there is none.
    pub fn master_for_slot(&self, slot: u16) -> usize {
        self.try_master_for_slot(slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}\n{}", self.describe()))
    }

    /// Index into `nodes` of the master serving `key`.
    pub fn master_for_key(&self, key: &str) -> usize {
        self.master_for_slot(Self::key_slot(key))
    }

    /// The hash slot of `key`: CRC16 (XMODEM) of the hash tag — the bytes between the first
    /// `{` and the first `}` after it, when non-empty — else of the whole key, mod 16384.
    pub fn key_slot(key: &str) -> u16 {
        let bytes = key.as_bytes();
        let hashed = bytes
            .iter()
            .position(|&b| b == b'{')
            .and_then(|open| {
                let rest = &bytes[open + 1..];
                rest.iter()
                    .position(|&b| b == b'}')
                    .filter(|&close| close > 0)
                    .map(|close| &rest[..close])
            })
            .unwrap_or(bytes);
        crc16_xmodem(hashed) % 16384
    }
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection — Redis Cluster's.
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn cluster_info(port: u16) -> Option<String> {
    let mut conn = probe_conn(port)?;
    redis::cmd("CLUSTER").arg("INFO").query(&mut conn).ok()
}

/// The slot ranges of every non-failed master in `CLUSTER NODES` as seen by the node at
/// `port`, sorted. Lines look like
/// `<id> 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [93->-<id>]`.
fn slot_map(port: u16) -> Option<Vec<SlotRange>> {
    let mut conn = probe_conn(port)?;
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut conn).ok()?;
    let mut map = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            continue;
        }
        let flags: Vec<&str> = fields[2].split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
            continue;
        }
        let node_port: u16 = fields[1]
            .split('@')
            .next()?
            .rsplit_once(':')?
            .1
            .parse()
            .ok()?;
        for slots in &fields[8..] {
            if slots.starts_with('[') {
                continue; // migrating/importing marker
            }
            let (start, end) = match slots.split_once('-') {
                Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                None => {
                    let s = slots.parse().ok()?;
                    (s, s)
                }
            };
            map.push((start, end, node_port));
        }
    }
    map.sort_unstable();
    Some(map)
}

/// `PUBSUB NUMSUB|SHARDNUMSUB channel` on one node: the channel's subscriber count there.
fn numsub(conn: &mut redis::Connection, sub: &str, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg(sub)
        .arg(channel)
        .query(conn)
        .unwrap_or_else(|e| panic!("PUBSUB {sub} {channel}: {e}"));
    n
}
