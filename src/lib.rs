//! # fairlock
//!
//! Fair (FIFO), reentrant distributed locks on Redis that share their data with Java services
//! using Redisson (`RFairLock` / `RLock`) on the same lock names.
//!
//! * [`FairLock`]: waiters are served in arrival order; only the head of the queue is woken.
//! * [`NonFairLock`]: Redisson's non-fair `RLock`; one release message wakes one local waiter.
//! * [`RedLock`]: the Redlock algorithm over several independent masters (majority quorum).
//! * Every acquisition call is its own holder, so two calls exclude each other even as futures of
//!   one task; re-entry is explicit ([`LockGuard::reenter`], or a [`Holder`] shared on purpose),
//!   with Redisson's reentrant count.
//! * A watchdog renews locks taken without a lease, from one timer wheel per client, batched; the
//!   holder is told through [`LockGuard::lost`] the moment the lock can no longer be trusted.
//! * Waiters sleep on pub/sub messages over **one** subscriber connection per client, never by
//!   polling; a lost message costs latency, never correctness.
//! * Every lock future is cancel safe: dropping it leaves the queue and wakes the next waiter.
//! * One standalone server, a Redis Cluster ([`Builder::cluster`], sharded pub/sub on Redis 7+)
//!   or a Sentinel-managed master ([`Builder::sentinel`]); waiting calls ride out failovers and
//!   [`Builder::cluster`] documents what a failover does to a held lock.
//!
//! ```no_run
//! # async fn demo() -> fairlock::Result<()> {
//! use std::time::Duration;
//!
//! let client = fairlock::Client::connect("redis://127.0.0.1:6379").await?;
//! let lock = client.fair_lock("orders:42");
//!
//! let guard = lock.lock().await?;            // FIFO wait; the watchdog keeps it
//! tokio::select! {
//!     _ = do_the_work() => {}
//!     reason = guard.lost() => eprintln!("lock lost: {reason}"),
//! }
//! guard.unlock().await?;
//!
//! match lock.try_lock(Duration::from_millis(500), Some(Duration::from_secs(5))).await? {
//!     Some(_guard) => { /* held for at most 5 s */ }
//!     None => { /* somebody else kept it for 500 ms */ }
//! }
//! # Ok(()) }
//! # async fn do_the_work() {}
//! ```
//!
//! # Fencing tokens
//!
//! A lock cannot protect against a holder that is paused (GC, swap, a stopped VM) for longer than
//! its lease: when it wakes up it still believes it holds the lock, while another holder may
//! already have taken it. Handles made with `.fenced()` hand out a **fencing token** with every
//! acquisition: the value of `redisson_lock_token:{NAME}`, incremented atomically with the grant,
//! so tokens strictly increase across holders, clients and processes. Send the token with every
//! write to the protected resource and have the resource remember the highest token it has
//! accepted and refuse lower ones; the paused holder's late write then carries a stale token and is
//! refused.
//!
//! ```no_run
//! # async fn demo(client: fairlock::Client) -> fairlock::Result<()> {
//! let guard = client.fair_lock("ledger").fenced().lock().await?;
//! let token = guard.fencing_token().expect("fenced handles always have a token");
//! // storage.write_if_token_at_least(token, record) ... rejected if a newer holder wrote first
//! # let _ = token; Ok(()) }
//! ```
//!
//! The wire protocol (keys, fields, channels, messages) is Redisson's; [`keys`] derives every key
//! and channel name of a lock, for tools that look at locks from the outside. [`guide`] is the
//! user's guide (configuration, guarantees in detail, Redisson compatibility, operations),
//! [`protocol`] says exactly what is shared with Java clients and what fairlock does beyond it,
//! and [`architecture`] how the crate is put together.
//!
//! # Features
//!
//! None is on by default.
//!
//! | feature | what it adds |
//! |---|---|
//! | `cluster` | Redis Cluster: [`Builder::cluster`], [`Builder::cluster_client`] |
//! | `sentinel` | a master managed by Redis Sentinel: [`Builder::sentinel`] |
//! | `metrics` | counters and histograms through the [`metrics`](https://docs.rs/metrics) facade (the application installs the recorder) |
//! | `tls-rustls` | TLS (`rediss://` URLs, [`redis::Client::build_with_tls`]) through rustls; the application installs rustls's crypto provider, e.g. `rustls::crypto::ring::default_provider().install_default()` |
//! | `tls-rustls-ring` | `tls-rustls` with ring, installed as the process's provider at connect unless the application installed one |
//! | `tls-native-tls` | TLS through native-tls (OpenSSL on Linux) |
//! | `serde` | [`ClientConfig`]: the client's settings loaded from the application's configuration |

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

pub mod admin;
mod config;
mod conn;
mod coord;
mod engine;
mod error;
pub mod keys;
mod lock;
mod metrics;
mod redlock;
mod retry;
mod scripts;
mod state;
mod util;
mod wire;

pub use config::{
    Builder, PubSubMode, ServerAddr, SyncFailure, DEFAULT_BATCH_SIZE, DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_REDISSON_WAIT, DEFAULT_TIMER_SLOTS, DEFAULT_TIMER_TICK,
    DEFAULT_WAITER_LIVENESS, DEFAULT_WATCHDOG_TIMEOUT, MAX_DURATION, MIN_LEASE,
};
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use config::{ClientConfig, SentinelConfig};
pub use conn::subscriber::SubscriberState;
pub use coord::latch::CountDownLatch;
pub use coord::permits::{ExpirablePermits, ExpirableSemaphore};
pub use coord::semaphore::{Permits, Semaphore};
pub use engine::validity::LostReason;
pub use error::{Error, RedisCause, Result};
pub use lock::client::Client;
pub use lock::client::Health;
pub use lock::holder::Holder;
pub use lock::multi::{MultiGuard, MultiLock, MultiMember};
pub use lock::mutex::FairLock;
#[allow(deprecated)]
pub use lock::mutex::Lock;
pub use lock::mutex::NonFairLock;
pub use lock::mutex::{LockGuard, LostSignal};
pub use lock::rw::{ReadLock, ReadWriteLock, WriteLock};
/// The redis-rs crate fairlock is built on, for the types its builder takes
/// ([`redis::Client`], [`redis::ConnectionInfo`], [`redis::cluster::ClusterClientBuilder`],
/// [`redis::sentinel::SentinelNodeConnectionInfo`]) without a second, mismatched version.
pub use redis;
pub use redlock::{RedLock, RedLockGuard};
pub use state::{
    DeadReason, LockState, Owner, QueuedWaiter, Reader, RwLockState, RwMode, RwWaiter,
};

// Doc-only modules: the repository's documents, so docs.rs shows them beside the API.

#[doc = include_str!("../docs/PROTOCOL.md")]
pub mod protocol {}

// These link definitions come first, so they win over the file's own (which serve readers of the
// repository): `[PROTOCOL.md]` goes to the module above, `[cli/README.md]` to the repository.
#[doc = "[PROTOCOL.md]: crate::protocol"]
#[doc = "[cli/README.md]: https://github.com/fairlock-rs/fairlock/blob/main/cli/README.md"]
#[doc = ""]
#[doc = include_str!("../docs/ARCHITECTURE.md")]
pub mod architecture {}

// As above: the guide's own link definitions point into the repository.
#[doc = "[README]: https://github.com/fairlock-rs/fairlock/blob/main/README.md"]
#[doc = "[PROTOCOL.md]: crate::protocol"]
#[doc = "[ARCHITECTURE.md]: crate::architecture"]
#[doc = "[CONTRIBUTING.md]: https://github.com/fairlock-rs/fairlock/blob/main/CONTRIBUTING.md"]
#[doc = "[cli/README.md]: https://github.com/fairlock-rs/fairlock/blob/main/cli/README.md"]
#[doc = "[benches/README.md]: https://github.com/fairlock-rs/fairlock/blob/main/benches/README.md"]
#[doc = ""]
#[doc = include_str!("../docs/GUIDE.md")]
pub mod guide {}

// The README's Rust examples are compiled as doc tests (not run: they need a server).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
