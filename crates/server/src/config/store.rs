//! The store: Redis or the in-memory store, and the budget of one call.

use std::time::Duration;

use tollgate_lease::{BatchConfig, RedisConfig};

use super::defaults;
use super::settings::{ConfigError, Settings, bad};

/// A Redis connection waits at least this long for an answer, however short the patience.
const REDIS_RESPONSE_FLOOR: Duration = Duration::from_secs(1);

/// The most requests one batch may carry (a batch's arguments stay well within what Redis
/// and Lua take in one call).
const MAX_BATCH: usize = 1024;

/// The store, as read.
#[derive(Debug)]
pub(super) struct Store {
    /// The budget of one call.
    pub(super) timeout: Duration,
    /// Redis, or None for the in-memory store.
    pub(super) redis: Option<RedisConfig>,
    /// The in-memory store's byte budget.
    pub(super) memory_max_bytes: usize,
}

/// Reads the store's settings.
pub(super) fn parse(s: &Settings) -> Result<Store, ConfigError> {
    let ms = Duration::from_millis;
    let timeout = s.store_timeout_ms.map_or(defaults::STORE_TIMEOUT, ms);
    if timeout.is_zero() {
        return Err(bad("store_timeout_ms", "must be at least 1"));
    }
    let max_batch = s.redis_batch_max.unwrap_or(defaults::REDIS_BATCH_MAX);
    if !(1..=MAX_BATCH).contains(&max_batch) {
        return Err(bad(
            "redis_batch_max",
            format!("must be between 1 (no batching) and {MAX_BATCH}"),
        ));
    }
    let redis = s
        .redis_url
        .as_ref()
        .filter(|u| !u.is_empty())
        .map(|urls| RedisConfig {
            urls: urls.clone(),
            cluster: s.redis_cluster.unwrap_or(defaults::REDIS_CLUSTER),
            call_timeout: timeout,
            // A call is awaited up to the patience (checked with the breaker's settings); the
            // connection must wait at least that long for it.
            response_timeout: s
                .store_patience_ms
                .map_or(defaults::STORE_PATIENCE, ms)
                .max(timeout)
                .max(REDIS_RESPONSE_FLOOR),
            batch: BatchConfig {
                max_batch,
                ..BatchConfig::default()
            },
            ..RedisConfig::default()
        });
    Ok(Store {
        timeout,
        redis,
        memory_max_bytes: s
            .memory_max_mb
            .map_or(defaults::MEMORY_MAX_BYTES, |mb| mb.max(1) << 20),
    })
}
