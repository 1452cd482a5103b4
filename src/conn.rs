//! The command connection, one type over every topology so lock code never looks at which one it
//! runs on. Standalone is a reconnecting multiplexed [`ConnectionManager`]; the cluster and
//! Sentinel variants slot in here.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::config::{Config, Topology};
use crate::error::Result;

/// A cheap-to-clone handle on the client's command connection.
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(ConnectionManager),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Standalone(_) => f.write_str("Conn::Standalone"),
        }
    }
}

impl Conn {
    /// Opens the command connection for the configured topology.
    pub(crate) async fn connect(config: &Config) -> Result<Conn> {
        match &config.topology {
            Topology::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let cm_config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(config.command_timeout))
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_number_of_retries(2);
                let manager = tokio::time::timeout(
                    config.connect_timeout,
                    ConnectionManager::new_with_config(client, cm_config),
                )
                .await
                .map_err(|_| {
                    redis::RedisError::from((redis::ErrorKind::Io, "connect timed out"))
                })??;
                Ok(Conn::Standalone(manager))
            }
        }
    }

    /// The command that publishes a release message on this topology.
    pub(crate) fn publish_command(&self) -> &'static str {
        match self {
            Conn::Standalone(_) => "PUBLISH",
        }
    }

    /// Whether lock names must keep all their keys in one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        false
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
        }
    }
}
