//! Connections to a single Redis or a Redis Cluster, configured for a limiter: they connect
//! lazily (a node starts while Redis is down), reconnect in the background with jittered
//! exponential backoff (no synchronized reconnect storms), and never retry for long: each call
//! has a budget of a few milliseconds, enforced by the caller.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisResult, Value};

use crate::error::StoreError;

/// Where Redis is and how patient to be with it.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://host:port/` URLs: one for a single server, one or more seeds for a cluster.
    pub urls: Vec<String>,
    /// Whether `urls` are Redis Cluster seeds.
    pub cluster: bool,
    /// The budget of one store call, retries and `NOSCRIPT` reload included (default 5 ms).
    pub call_timeout: Duration,
    /// How long the connection waits for any reply (default 1 s): a caller that gives up at
    /// its budget can still await a late answer this long ([`crate::RedisStore::with_budget`]).
    pub response_timeout: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// The longest pause between reconnect attempts (backoff is exponential and jittered).
    pub reconnect_max_delay: Duration,
    /// How checks and lease asks of one shard are batched under load.
    pub batch: super::batch::BatchConfig,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            urls: vec!["redis://127.0.0.1:6379/".into()],
            cluster: false,
            call_timeout: Duration::from_millis(5),
            response_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_millis(250),
            reconnect_max_delay: Duration::from_millis(500),
            batch: super::batch::BatchConfig::default(),
        }
    }
}

impl RedisConfig {
    /// A single server at `url` with default timeouts.
    pub fn single(url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            ..Self::default()
        }
    }

    /// A cluster reached through `seeds` with default timeouts.
    pub fn cluster(seeds: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            urls: seeds.into_iter().map(Into::into).collect(),
            cluster: true,
            ..Self::default()
        }
    }
}

/// A cheaply cloneable handle multiplexing calls over few connections.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Single(_) => "Connection::Single",
            Connection::Cluster(_) => "Connection::Cluster",
        })
    }
}

fn config_error(e: impl std::fmt::Display) -> StoreError {
    StoreError::Rejected(format!("invalid Redis configuration: {e}"))
}

impl Connection {
    /// Prepares the connection without waiting for Redis (it must run inside a tokio runtime).
    pub(crate) fn open(config: &RedisConfig) -> Result<Self, StoreError> {
        if config.urls.is_empty() {
            return Err(config_error("no Redis URL given"));
        }
        if config.cluster {
            let client = ClusterClientBuilder::new(config.urls.clone())
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.response_timeout.max(config.call_timeout))
                // The redis crate's cluster defaults retry 16 times with waits of over a second:
                // a limiter must give up within its budget instead, and let the next call retry.
                .retries(2)
                .min_retry_wait(1)
                .max_retry_wait(config.call_timeout.as_millis().max(1) as u64)
                .build()
                .map_err(config_error)?;
            let cluster_config = ClusterConfig::new()
                .set_connection_timeout(config.connect_timeout)
                .set_response_timeout(config.response_timeout.max(config.call_timeout));
            Ok(Connection::Cluster(
                client.get_pending_async_connection_with_config(cluster_config),
            ))
        } else {
            let client = redis::Client::open(config.urls[0].as_str()).map_err(config_error)?;
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.response_timeout.max(config.call_timeout)))
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(config.reconnect_max_delay)
                .set_exponent_base(2.0)
                // One connection attempt per call that finds the connection broken: a call
                // fails as soon as Redis refuses it, instead of waiting through a backoff of
                // retries (the node's breaker is the backoff: once open, only its probes try).
                .set_number_of_retries(0);
            let manager = ConnectionManager::new_lazy_with_config(client, manager_config)
                .map_err(config_error)?;
            Ok(Connection::Single(manager))
        }
    }

    pub(crate) async fn run(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}
