//! How the node spends its limits: lease sizes and lifetimes, the local pre-limit, the nodes
//! that share a limit, and the bounds of its key state.

use std::time::Duration;

use tollgate_node::runtime::sizing::LeasePolicy;

use super::defaults;
use super::settings::{ConfigError, Settings, bad};

/// Leases and key state, as read.
#[derive(Debug)]
pub(super) struct Lease {
    /// Lease sizes and lifetimes.
    pub(super) policy: LeasePolicy,
    /// The local pre-limit's factor (None: off).
    pub(super) prelimit_factor: Option<f64>,
    /// Nodes sharing the limits.
    pub(super) cluster_nodes: u32,
    /// The most bytes of key state.
    pub(super) max_key_state_bytes: usize,
    /// When an idle key actor stops.
    pub(super) idle_timeout: Duration,
}

/// Reads the lease and key-state settings.
pub(super) fn parse(s: &Settings) -> Result<Lease, ConfigError> {
    let ms = Duration::from_millis;
    let max_share = s.lease_max_share.unwrap_or(defaults::LEASE_MAX_SHARE);
    if !(max_share > 0.0 && max_share <= 1.0) {
        return Err(bad(
            "lease_max_share",
            format!("must be in (0, 1], got {max_share}"),
        ));
    }
    let max_units = s.lease_max_units.unwrap_or(defaults::LEASE_MAX_UNITS);
    if max_units == 0 {
        return Err(bad("lease_max_units", "must be at least 1"));
    }
    let ttl = s.lease_ttl_ms.map_or(defaults::LEASE_TTL, ms);
    if ttl < ms(10) || ttl > Duration::from_secs(3600) {
        return Err(bad("lease_ttl_ms", "must be between 10 and 3600000"));
    }
    let prelimit = s.prelimit_factor.unwrap_or(defaults::PRELIMIT_FACTOR);
    if !(prelimit.is_finite() && prelimit >= 0.0) {
        return Err(bad(
            "prelimit_factor",
            format!("must be 0 (off) or positive, got {prelimit}"),
        ));
    }
    let cluster_nodes = s.cluster_nodes.unwrap_or(defaults::CLUSTER_NODES);
    if cluster_nodes == 0 {
        return Err(bad("cluster_nodes", "must be at least 1"));
    }
    Ok(Lease {
        policy: LeasePolicy {
            max_units,
            ttl,
            max_share,
            ..LeasePolicy::default()
        },
        prelimit_factor: (prelimit > 0.0).then_some(prelimit),
        cluster_nodes,
        max_key_state_bytes: s
            .max_key_state_mb
            .map_or(defaults::MAX_KEY_STATE_BYTES, |mb| mb.max(1) << 20),
        idle_timeout: s
            .idle_timeout_ms
            .map_or(defaults::IDLE_TIMEOUT, ms)
            .max(ttl * 2),
    })
}
