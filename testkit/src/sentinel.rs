//! A Sentinel-monitored group: 1 master, 2 replicas, 3 sentinel processes.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::time::Duration;

use super::server::{info_field, probe_conn, probe_info, RedisServer};
use super::servers::test_server;
use super::wait::wait_for;

const REPLICAS: usize = 2;
const SENTINELS: usize = 3;
const QUORUM: usize = 2;
/// `sentinel down-after-milliseconds`.
pub const DOWN_AFTER_MS: u64 = 1000;
/// `sentinel failover-timeout`.
pub const FAILOVER_TIMEOUT_MS: u64 = 5000;
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// One master with two replicas, monitored by three sentinels (quorum 2). Dropping it kills the
/// sentinels first (so they start no failover while the servers go), then master and replicas.
pub struct SentinelGroup {
    // Declared first so it is dropped (killed) first.
    pub sentinels: Vec<RedisServer>,
    pub master: RedisServer,
    pub replicas: Vec<RedisServer>,
    pub master_name: String,
}

impl SentinelGroup {
    /// Starts the master and the replicas (linked and acknowledging), then the sentinels, and
    /// returns once every sentinel sees the master up, both replicas up with a working link,
    /// and the two other sentinels.
    pub fn start() -> SentinelGroup {
        let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        // A name of its own (the master's port is claimed while the group lives), so that a
        // sentinel of another test's group ignores this group's hello messages should the two
        // ever meet on a server.
        let master_name = format!("group-{}", master.port());
        let replicas: Vec<RedisServer> = (0..REPLICAS)
            .map(|_| RedisServer::start_replica_of(&master))
            .collect();
        let sentinels: Vec<RedisServer> = (0..SENTINELS)
            .map(|_| start_sentinel(&master_name, master.port()))
            .collect();
        let group = SentinelGroup {
            sentinels,
            master,
            replicas,
            master_name,
        };
        wait_for(
            READY_DEADLINE,
            &format!(
                "every sentinel to know {REPLICAS} healthy replicas and {} other sentinels",
                SENTINELS - 1
            ),
            || group.ready().then_some(()),
            || group.describe(),
        );
        group
    }

    fn ready(&self) -> bool {
        self.sentinels.iter().all(|s| {
            let Some(master) = self.sentinel_master(s.port()) else {
                return false;
            };
            let field = |k: &str| master.get(k).map(String::as_str);
            if field("flags") != Some("master")
                || field("num-slaves") != Some(&REPLICAS.to_string())
                || field("num-other-sentinels") != Some(&(SENTINELS - 1).to_string())
            {
                return false;
            }
            let Some(replicas) = self.sentinel_replicas(s.port()) else {
                return false;
            };
            replicas.len() == REPLICAS
                && replicas.iter().all(|r| {
                    r.get("flags").map(String::as_str) == Some("slave")
                        && r.get("master-link-status").map(String::as_str) == Some("ok")
                })
        })
    }

    /// `SENTINEL MASTER <name>` as a field map (None when the sentinel does not answer).
    pub fn sentinel_master(&self, sentinel_port: u16) -> Option<HashMap<String, String>> {
        let mut conn = probe_conn(sentinel_port)?;
        let flat: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.master_name)
            .query(&mut conn)
            .ok()?;
        Some(pairs(flat))
    }

    /// `SENTINEL REPLICAS <name>`, one field map per replica.
    pub fn sentinel_replicas(&self, sentinel_port: u16) -> Option<Vec<HashMap<String, String>>> {
        let mut conn = probe_conn(sentinel_port)?;
        let all: Vec<Vec<String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(&self.master_name)
            .query(&mut conn)
            .ok()?;
        Some(all.into_iter().map(pairs).collect())
    }

    /// The master address one sentinel reports (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn master_addr_seen_by(&self, sentinel_port: u16) -> Option<(String, u16)> {
        let mut conn = probe_conn(sentinel_port)?;
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master_name)
            .query::<Option<(String, u16)>>(&mut conn)
            .ok()
            .flatten()
    }

    /// `redis://127.0.0.1:PORT` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The master port reported by the first sentinel that answers.
    pub fn current_master_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|s| self.master_addr_seen_by(s.port()))
            .map(|(_, port)| port)
            .unwrap_or_else(|| {
                panic!(
                    "no sentinel answered GET-MASTER-ADDR-BY-NAME\n{}",
                    self.describe()
                )
            })
    }

    /// The group's server (master or replica) listening on `port`.
    pub fn server_on(&self, port: u16) -> &RedisServer {
        std::iter::once(&self.master)
            .chain(&self.replicas)
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server of the group on port {port}"))
    }

    /// Waits until both replicas have every write made so far on the master (`WAIT 2`), kills
    /// the master, waits for the sentinels' failover and returns a connection to the promoted
    /// replica.
    pub fn kill_synced_master(&mut self) -> redis::Connection {
        let acked: i64 = redis::cmd("WAIT")
            .arg(2)
            .arg(2000)
            .query(&mut self.master.conn())
            .unwrap();
        assert_eq!(acked, 2, "the replicas did not catch up before the kill");
        let old = self.master.port();
        self.master.kill();
        let new = self.wait_for_failover(old, Duration::from_secs(30));
        self.server_on(new).conn()
    }

    /// Waits until a majority of the sentinels (of all of them, answering or not) report the
    /// same master port other than `old_port`, and that server says `role:master`; returns
    /// the new port. Panics with every sentinel's view and log tail at the deadline.
    pub fn wait_for_failover(&self, old_port: u16, deadline: Duration) -> u16 {
        self.agreed_master(Some(old_port), deadline)
    }

    /// A connection to the master the sentinels agree on now. A loaded machine can see a
    /// second failover soon after the first (the promoted replica missed the sentinels' pings
    /// for `DOWN_AFTER_MS`), so a test that checks Redis some time after a failover asks here
    /// rather than keeping the connection it had.
    pub fn current_master(&self) -> redis::Connection {
        let port = self.agreed_master(None, Duration::from_secs(30));
        self.server_on(port).conn()
    }

    /// The master port a majority of the sentinels report (other than `other_than`), once that
    /// server says `role:master`. Panics with every sentinel's view and log tail at the deadline.
    fn agreed_master(&self, other_than: Option<u16>, deadline: Duration) -> u16 {
        let majority = self.sentinels.len() / 2 + 1;
        let what = match other_than {
            Some(old) => format!(
                "a majority ({majority}) of sentinels to report a master other than port {old}"
            ),
            None => format!("a majority ({majority}) of sentinels to agree on a master"),
        };
        wait_for(
            deadline,
            &what,
            || {
                let mut votes: HashMap<u16, usize> = HashMap::new();
                for s in &self.sentinels {
                    if let Some((_, port)) = self.master_addr_seen_by(s.port()) {
                        if Some(port) != other_than {
                            *votes.entry(port).or_default() += 1;
                        }
                    }
                }
                let (&port, _) = votes.iter().find(|(_, &n)| n >= majority)?;
                let info = probe_info(port, "replication")?;
                (info_field(&info, "role") == Some("master")).then_some(port)
            },
            || self.describe(),
        )
    }

    /// Every sentinel's view of the group and the tail of its log, for failure messages.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.sentinels.iter().enumerate() {
            let master = self.sentinel_master(s.port()).unwrap_or_default();
            let get = |k: &str| master.get(k).cloned().unwrap_or_else(|| "?".into());
            let _ = writeln!(
                out,
                "sentinel {i} port {}: addr={:?} flags={} num-slaves={} num-other-sentinels={}",
                s.port(),
                self.master_addr_seen_by(s.port()),
                get("flags"),
                get("num-slaves"),
                get("num-other-sentinels"),
            );
            for line in s.log_tail(8).lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
        out
    }
}

/// Starts one sentinel (the server under test run as `<server> sentinel.conf --sentinel`: the
/// PyPI builds of 6.2 and Valkey ship no `redis-sentinel`) with a generated `sentinel.conf` in its
/// work dir.
fn start_sentinel(master_name: &str, master_port: u16) -> RedisServer {
    RedisServer::launch(&test_server().server, "sentinel", |port, dir| {
        let conf = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\n\
             bind 127.0.0.1\n\
             protected-mode no\n\
             daemonize no\n\
             logfile \"\"\n\
             dir \"{dir}\"\n\
             sentinel resolve-hostnames no\n\
             sentinel monitor {master_name} 127.0.0.1 {master_port} {QUORUM}\n\
             sentinel down-after-milliseconds {master_name} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {master_name} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {master_name} 1\n",
            dir = dir.display(),
        );
        fs::write(&conf, text).expect("write sentinel.conf");
        vec![OsString::from(conf), OsString::from("--sentinel")]
    })
}

/// A flat `[field, value, field, value, …]` reply as a map.
fn pairs(flat: Vec<String>) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        map.insert(k, v);
    }
    map
}
