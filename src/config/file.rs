//! [`ClientConfig`]: the client's settings as an application's configuration file holds them
//! (crate feature `serde`).

use std::time::Duration;

use super::builder::Builder;
use super::settings::PubSubMode;
use crate::error::{Error, Result};

/// The client's settings, to load with serde from the application's own configuration (TOML,
/// YAML, JSON, environment layers: whatever the application uses), then
/// [`connect`](Self::connect). Every field is optional except the one that names the servers:
/// exactly one of `url`, `cluster` and `sentinel`. Durations are whole milliseconds; a setting
/// left out keeps the [`Builder`]'s default, and the checks are the builder's.
///
/// ```no_run
/// # async fn demo() -> fairlock::Result<()> {
/// # let text = "";
/// // e.g. from the application's settings file, with serde_json, toml or config:
/// // { "url": "redis://127.0.0.1:6379", "watchdog_timeout_ms": 15000 }
/// let config: fairlock::ClientConfig = serde_json::from_str(text).expect("valid settings");
/// let client = config.connect().await?;
/// # let _ = client; Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClientConfig {
    /// One server (or a master whose replicas the client does not follow): a URL,
    /// `redis://[user:password@]host:port[/db]` or `rediss://…`.
    pub url: Option<String>,
    /// A Redis Cluster: the URLs of some of its nodes (one reachable master is enough).
    pub cluster: Option<Vec<String>>,
    /// A master managed by Sentinel.
    pub sentinel: Option<SentinelConfig>,
    /// How release messages travel on a cluster: `auto`, `sharded` or `classic`
    /// ([`PubSubMode`]).
    pub pubsub: Option<String>,
    /// [`Builder::watchdog_timeout`], in milliseconds.
    pub watchdog_timeout_ms: Option<u64>,
    /// [`Builder::waiter_liveness`], in milliseconds.
    pub waiter_liveness_ms: Option<u64>,
    /// [`Builder::command_timeout`], in milliseconds.
    pub command_timeout_ms: Option<u64>,
    /// [`Builder::connect_timeout`], in milliseconds.
    pub connect_timeout_ms: Option<u64>,
    /// [`Builder::redisson_wait`], in milliseconds.
    pub redisson_wait_ms: Option<u64>,
    /// [`Builder::timer_tick`], in milliseconds.
    pub timer_tick_ms: Option<u64>,
    /// [`Builder::timer_slots`].
    pub timer_slots: Option<usize>,
    /// [`Builder::batch_size`].
    pub batch_size: Option<usize>,
    /// [`Builder::metrics_lock_names`].
    pub metrics_lock_names: Option<bool>,
}

/// A master behind Sentinel, for [`ClientConfig::sentinel`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SentinelConfig {
    /// The master's name, as the sentinels know it.
    pub master_name: String,
    /// The sentinels' URLs.
    pub sentinels: Vec<String>,
}

impl ClientConfig {
    /// The builder these settings make, to change further in code.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when not exactly one of `url`, `cluster` and `sentinel` is set,
    /// or `pubsub` is none of `auto`, `sharded`, `classic`. (The builder checks the rest when it
    /// builds.)
    pub fn builder(&self) -> Result<Builder> {
        let mut b = Builder::new();
        if let Some(mode) = &self.pubsub {
            b = b.pubsub_mode(match mode.as_str() {
                "auto" => PubSubMode::Auto,
                "sharded" => PubSubMode::Sharded,
                "classic" => PubSubMode::Classic,
                other => {
                    return Err(Error::invalid_argument(
                        "pubsub",
                        format!("{other:?} is none of auto, sharded, classic"),
                    ))
                }
            });
        }
        b = match (&self.url, &self.cluster, &self.sentinel) {
            (Some(url), None, None) => b.standalone(url),
            #[cfg(feature = "cluster")]
            (None, Some(nodes), None) => b.cluster(nodes.iter().map(String::as_str)),
            #[cfg(not(feature = "cluster"))]
            (None, Some(_), None) => {
                return Err(Error::invalid_argument(
                    "cluster",
                    "this build of fairlock has no `cluster` feature",
                ))
            }
            #[cfg(feature = "sentinel")]
            (None, None, Some(s)) => b.sentinel(
                s.master_name.clone(),
                s.sentinels.iter().map(String::as_str),
            ),
            #[cfg(not(feature = "sentinel"))]
            (None, None, Some(_)) => {
                return Err(Error::invalid_argument(
                    "sentinel",
                    "this build of fairlock has no `sentinel` feature",
                ))
            }
            _ => {
                return Err(Error::invalid_argument(
                    "servers",
                    "set exactly one of url, cluster and sentinel",
                ))
            }
        };
        let ms = Duration::from_millis;
        if let Some(v) = self.watchdog_timeout_ms {
            b = b.watchdog_timeout(ms(v));
        }
        if let Some(v) = self.waiter_liveness_ms {
            b = b.waiter_liveness(ms(v));
        }
        if let Some(v) = self.command_timeout_ms {
            b = b.command_timeout(ms(v));
        }
        if let Some(v) = self.connect_timeout_ms {
            b = b.connect_timeout(ms(v));
        }
        if let Some(v) = self.redisson_wait_ms {
            b = b.redisson_wait(ms(v));
        }
        if let Some(v) = self.timer_tick_ms {
            b = b.timer_tick(ms(v));
        }
        if let Some(v) = self.timer_slots {
            b = b.timer_slots(v);
        }
        if let Some(v) = self.batch_size {
            b = b.batch_size(v);
        }
        if let Some(v) = self.metrics_lock_names {
            b = b.metrics_lock_names(v);
        }
        Ok(b)
    }
}
