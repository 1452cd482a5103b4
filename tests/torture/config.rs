//! What parent and children share: timings, lock names, the seeded generator, and the selections
//! of faults and operations from the environment.

use std::collections::HashSet;
use std::time::Duration;

use fairlock_testkit::redisson_peer::{splitmix, PeerConfig};

pub const ROLE_ENV: &str = "FAIRLOCK_TORTURE_ROLE";

// ---------------------------------------------------------------------------------------------
// Timing shared by parent and children.

/// Short timings so a lot happens per second.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub watchdog: Duration,
    pub liveness: Duration,
    pub tick: Duration,
    pub command_timeout: Duration,
}

pub const TIMING: Timing = Timing {
    watchdog: Duration::from_millis(1000),
    liveness: Duration::from_millis(1000),
    tick: Duration::from_millis(10),
    command_timeout: Duration::from_millis(300),
};

pub fn peer_config() -> PeerConfig {
    PeerConfig {
        watchdog: Duration::from_millis(1000),
        renew_every: Duration::from_millis(333),
        lock_wait: Duration::from_millis(300_000),
        command_timeout: Duration::from_millis(500),
        min_poll: Duration::from_millis(5),
        abandon_limit: Duration::from_millis(1500),
    }
}

pub const FAIR_NAMES: [&str; 2] = ["torture-fair-a", "torture-fair-b"];
/// Non-fair locks; a multi-lock round takes both together (op `multi`).
pub const PLAIN_NAMES: [&str; 2] = ["torture-plain", "torture-plain-b"];
/// The permit-expirable semaphore (op `sem`): [`SEM_LIMIT`] permits, set by the parent.
pub const SEM_NAME: &str = "torture-sem";
/// The plain semaphore (op `sem` too), [`SEM_LIMIT`] permits: a killed holder's are never
/// returned, which the parent's final count allows for.
pub const SEM_PLAIN_NAME: &str = "torture-sem-plain";
pub const SEM_LIMIT: u64 = 3;
/// A permit-expirable semaphore for counts near the API's limit (op `sem`, rarely): each call
/// takes thousands of permits (8,000 or more failed in Lua's `unpack` before issue 34), up to
/// `ExpirableSemaphore::MAX_PERMITS`; [`BIG_SEM_LIMIT`] permits, set by the parent.
pub const BIG_SEM_NAME: &str = "torture-sem-big";
pub const BIG_SEM_LIMIT: u64 = 70_000;

/// Whether `name` is one of the semaphores.
pub fn is_sem_name(name: &str) -> bool {
    name == SEM_NAME || name == SEM_PLAIN_NAME || name == BIG_SEM_NAME
}

/// The permits of semaphore `name`.
pub fn sem_limit(name: &str) -> u64 {
    if name == BIG_SEM_NAME {
        BIG_SEM_LIMIT
    } else {
        SEM_LIMIT
    }
}
/// Read-write locks (`Client::read_write_lock`): readers share, a writer excludes everyone. The
/// second is used only through writer-preferring handles ([`is_preferring_name`]).
pub const RW_NAMES: [&str; 2] = ["torture-rw", "torture-rw-pref"];

/// Whether `name` is one of the read-write locks.
pub fn is_rw_name(name: &str) -> bool {
    RW_NAMES.contains(&name)
}

/// Whether every handle of read-write lock `name` is writer-preferring.
pub fn is_preferring_name(name: &str) -> bool {
    name == RW_NAMES[1]
}

// ---------------------------------------------------------------------------------------------
// A small seeded random generator (splitmix64).

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(splitmix(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0 = splitmix(self.0);
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// Selections from the environment.

pub const ALL_FAULTS: [&str; 9] = [
    "sigstop",
    "sigkill",
    "clientkill",
    "pause",
    "sleep",
    "scriptflush",
    "restart",
    "proxy",
    "handoff",
];
pub const ALL_OPS: [&str; 19] = [
    "lock",
    "lease",
    "try",
    "try0",
    "cancel",
    "reenter",
    "drop",
    "droprelock",
    "percall",
    "longhold",
    "shared",
    "joined",
    "shutdown",
    "java",
    "plain",
    "fair",
    "rw",
    "sem",
    "multi",
];

pub fn selection(var: &str, all: &[&str]) -> HashSet<String> {
    let raw = std::env::var(var).unwrap_or_else(|_| "all".into());
    let raw = raw.trim();
    if raw == "all" || raw.is_empty() {
        return all.iter().map(|s| s.to_string()).collect();
    }
    if raw == "none" {
        return HashSet::new();
    }
    let picked: HashSet<String> = raw.split(',').map(|s| s.trim().to_owned()).collect();
    for p in &picked {
        assert!(
            all.contains(&p.as_str()),
            "{var}: unknown kind {p:?}; known: {all:?}"
        );
    }
    picked
}

pub fn env_u64(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var}={v:?} is not a number"))
        })
        .unwrap_or(default)
}
