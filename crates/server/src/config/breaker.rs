//! How the node bears with a struggling store: the circuit breaker that stops calling one
//! that fails, how long one that answers slowly is waited for, and how long a starting node
//! waits for it.

use std::time::Duration;

use tollgate_node::runtime::store_health::breaker::BreakerConfig;

use super::defaults;
use super::settings::{ConfigError, Settings, bad};

/// The breaker and the patience, as read.
#[derive(Debug)]
pub(super) struct Breaker {
    /// The store's circuit breaker.
    pub(super) config: BreakerConfig,
    /// How long a call is waited for while the store answers.
    pub(super) patience: Duration,
    /// How long a starting node waits for its store.
    pub(super) startup_patience: Duration,
}

/// Reads the breaker's and the patience settings; the patience is at least
/// `store_timeout`, the budget of one call.
pub(super) fn parse(s: &Settings, store_timeout: Duration) -> Result<Breaker, ConfigError> {
    let ms = Duration::from_millis;
    let failure_ratio = s
        .breaker_failure_ratio
        .unwrap_or(defaults::BREAKER_FAILURE_RATIO);
    if !(failure_ratio > 0.0 && failure_ratio <= 1.0) {
        return Err(bad(
            "breaker_failure_ratio",
            format!("must be in (0, 1], got {failure_ratio}"),
        ));
    }
    let config = BreakerConfig {
        window: s
            .breaker_window_ms
            .map_or(defaults::BREAKER_WINDOW, |w| ms(w.max(10))),
        min_calls: s
            .breaker_min_calls
            .unwrap_or(defaults::BREAKER_MIN_CALLS)
            .max(1),
        failure_ratio,
        cooldown: s
            .breaker_cooldown_ms
            .map_or(defaults::BREAKER_COOLDOWN, |c| ms(c.max(1))),
        max_cooldown: s
            .breaker_max_cooldown_ms
            .map_or(defaults::BREAKER_MAX_COOLDOWN, |c| ms(c.max(1))),
    };
    let patience = s
        .store_patience_ms
        .map(ms)
        .unwrap_or_else(|| defaults::STORE_PATIENCE.max(store_timeout));
    if patience < store_timeout || patience > Duration::from_secs(60) {
        return Err(bad(
            "store_patience_ms",
            "must be at least store_timeout_ms and at most 60000",
        ));
    }
    let startup_patience = s
        .store_startup_patience_ms
        .map_or(defaults::STORE_STARTUP_PATIENCE, ms);
    if startup_patience > Duration::from_secs(600) {
        return Err(bad(
            "store_startup_patience_ms",
            "must be at most 600000 (10 minutes)",
        ));
    }
    Ok(Breaker {
        config,
        patience,
        startup_patience,
    })
}
