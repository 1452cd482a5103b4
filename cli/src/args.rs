//! The command line (clap derive). Connection options are global: they may stand before or
//! after the command. The crate's README.md documents every option.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use fairlock::keys::{self, NameProblem};

#[derive(Debug, Parser)]
#[command(
    name = "fairlock",
    version,
    about = "Inspect and operate fair and plain Redis locks (fairlock and Redisson RLock / RFairLock)",
    after_help = "Exit codes: 0 ok, 1 no such lock, 2 bad usage or input, 3 Redis error, \
                  4 confirmation declined. See the README of the fairlock-cli crate."
)]
pub struct Cli {
    #[command(flatten)]
    pub conn: ConnArgs,

    /// Print JSON (one document, or one line per event for `watch`) instead of tables
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct ConnArgs {
    /// Redis server URL: redis://[user:password@]host:port[/db].
    /// Default: $REDIS_URL, else redis://127.0.0.1:6379
    #[arg(short = 'u', long, global = true, value_name = "URL")]
    pub url: Option<String>,

    /// A Redis Cluster, through these seed nodes (repeat the option or separate URLs with commas)
    #[arg(long, global = true, value_name = "URL", value_delimiter = ',')]
    pub cluster: Vec<String>,

    /// A master monitored by Redis Sentinel: its name, then the sentinels' URLs separated by
    /// commas (e.g. `--sentinel mymaster redis://10.0.0.5:26379,redis://10.0.0.6:26379`)
    #[arg(long, global = true, num_args = 2, value_names = ["NAME", "URLS"])]
    pub sentinel: Option<Vec<String>>,

    /// Sentinel only: the ACL user of the master (and replicas)
    #[arg(long, global = true, value_name = "USER")]
    pub master_user: Option<String>,

    /// Sentinel only: the password of the master (and replicas); also read from
    /// $FAIRLOCK_MASTER_PASSWORD
    #[arg(long, global = true, value_name = "PASSWORD")]
    pub master_password: Option<String>,

    /// Cluster only: which pub/sub the lock's clients use for release messages. `auto` listens
    /// and publishes both ways on a Redis 7+ cluster (sharded and classic), classic otherwise
    #[arg(long, global = true, value_enum, default_value_t = PubSub::Auto)]
    pub pubsub: PubSub,

    /// Bound of connecting and of each Redis command (e.g. 500ms, 3s)
    #[arg(long, global = true, value_name = "DURATION", default_value = "3s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PubSub {
    Auto,
    Sharded,
    Classic,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Who holds a lock, who waits in which order, until when, and whether each waiter looks
    /// alive; fencing counter and orphaned keys
    Inspect {
        /// The lock name (the Redis key of its owner hash)
        name: String,
        /// Waiters shown in the table (JSON always lists all)
        #[arg(long, default_value_t = 50, value_name = "N")]
        limit: usize,
        /// Do not look for Redisson unlock latches of the lock (a paced SCAN on a standalone
        /// server or Sentinel master; CLUSTER GETKEYSINSLOT on a cluster)
        #[arg(long)]
        no_latch_scan: bool,
    },
    /// Follow a lock live: acquisitions, releases, hand-over gaps, queue length. Listens on
    /// the lock's channels and re-reads on each message, plus a slow periodic refresh
    Watch {
        /// The lock name
        name: String,
        /// Period of the refresh between messages (at least 250ms)
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
        interval: Duration,
        /// Stop after this many events (the initial snapshot not counted)
        #[arg(long, value_name = "N")]
        max_events: Option<u64>,
    },
    /// Find lock hashes, queues, deadline sets, liveness sets and unlock latches with SCAN
    /// (every master of a cluster; bounded COUNT, paced; never KEYS) and report orphans
    Scan {
        /// Only locks whose name matches this Redis glob pattern
        #[arg(default_value = "*")]
        pattern: String,
        /// COUNT hint of each SCAN call
        #[arg(long, default_value_t = 250, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
        count: u32,
        /// Pause between two SCAN calls (and between batches of lock reads)
        #[arg(long, value_name = "DURATION", default_value = "5ms", value_parser = parse_duration)]
        pause: Duration,
        /// Stop after finding this many locks
        #[arg(long, default_value_t = 10_000, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
    },
    /// Delete a lock whoever holds it and wake the next waiter (asks first on a terminal)
    ForceUnlock {
        /// The lock name
        name: String,
        /// Do not ask for confirmation
        #[arg(short = 'y', long)]
        yes: bool,
    },
    /// Remove the queued waiters of a fair lock that look dead, and wake the new head when
    /// the lock is free
    PurgeDead {
        /// The lock name
        name: String,
    },
    /// A semaphore (RSemaphore or RPermitExpirableSemaphore): available permits and, for an
    /// expirable one, every permit in use with its expiry (read only: nothing is reclaimed)
    Semaphore {
        /// The semaphore name (the Redis key of its count)
        name: String,
    },
    /// A count-down latch (RCountDownLatch): its count, or open
    Latch {
        /// The latch name (the Redis key of its count)
        name: String,
    },
}

impl Command {
    /// The lock name the command works on, if it takes one.
    pub fn lock_name(&self) -> Option<&str> {
        match self {
            Command::Inspect { name, .. }
            | Command::Watch { name, .. }
            | Command::ForceUnlock { name, .. }
            | Command::PurgeDead { name }
            | Command::Semaphore { name }
            | Command::Latch { name } => Some(name),
            Command::Scan { .. } => None,
        }
    }
}

/// `250ms`, `3s`, `1.5s`, `2m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?}: use a number and a unit, e.g. 500ms, 3s, 2m");
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1_000.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        return Err(bad());
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    let ms = value * scale;
    if !(0.0..=86_400_000.0).contains(&ms) {
        return Err(bad());
    }
    Ok(Duration::from_micros((ms * 1_000.0) as u64))
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < Duration::from_millis(250) {
        return Err("the refresh interval must be at least 250ms (watch never polls fast)".into());
    }
    Ok(d)
}

/// Why a lock name cannot be used on this deployment, in the tool's words, or `None`. The rule
/// is the library's ([`keys::check_name`]): on a cluster every key of the lock must share the
/// slot of the name.
pub fn invalid_name(name: &str, cluster: bool) -> Option<String> {
    match keys::check_name(name, cluster) {
        Ok(()) => None,
        Err(NameProblem::CrossSlot) => Some(format!(
            "lock name {name:?} cannot be used on a cluster: its keys would land in different \
             slots; a name containing '{{' needs a non-empty hash tag such as {{orders}}:42"
        )),
        Err(problem) => Some(problem.to_string()),
    }
}

/// Why a count-down latch's name cannot be used on this deployment (the library's
/// [`keys::check_latch_name`]), or `None`.
pub fn invalid_latch_name(name: &str, cluster: bool) -> Option<String> {
    match keys::check_latch_name(name, cluster) {
        Ok(()) => None,
        Err(NameProblem::LatchChannelSlot) => Some(format!(
            "latch name {name:?} cannot be used on a cluster: Redisson's channel for it, \
             {}, lands in another slot than the latch",
            keys::count_down_channel(name)
        )),
        Err(_) => invalid_name(name, cluster),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_interval("100ms").is_err());
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = Cli::try_parse_from([
            "fairlock",
            "inspect",
            "x",
            "--json",
            "--cluster",
            "redis://a:1,redis://b:2",
            "--cluster",
            "redis://c:3",
        ])
        .unwrap();
        assert!(cli.json);
        assert_eq!(cli.conn.cluster.len(), 3);
        let cli = Cli::try_parse_from([
            "fairlock",
            "--sentinel",
            "mymaster",
            "redis://s:1,redis://s:2",
            "scan",
        ])
        .unwrap();
        assert_eq!(cli.conn.sentinel.unwrap()[0], "mymaster");
    }

    #[test]
    fn names_are_checked_by_the_library_rule() {
        assert_eq!(
            invalid_name("", false).as_deref(),
            Some("a lock name must not be empty")
        );
        assert!(invalid_name("a{b", false).is_none());
        assert!(invalid_name("a{b", true).unwrap().contains("hash tag"));
        assert!(invalid_name("x}y", true).is_some());
        assert!(invalid_name("{t}x}y", true).is_none());
        assert!(invalid_name("plain", true).is_none());
        assert!(invalid_latch_name("{t}latch", false).is_none());
        assert!(invalid_latch_name("{t}latch", true)
            .unwrap()
            .contains("another slot"));
    }
}
