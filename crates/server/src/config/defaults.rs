//! Every setting's default, each named once: `--help` shows these and the conversion falls
//! back on them. Where a library already names a default, this is that constant; the rest
//! match the libraries' `Default` impls, and the tests below hold them to it.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tollgate_node::runtime::shared::{
    DEFAULT_MAX_KEY_STATE_BYTES, DEFAULT_STARTUP_PATIENCE, DEFAULT_STORE_PATIENCE,
};

const fn any_address(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))
}

// Listeners and rule files.

/// `grpc_listen`.
pub const GRPC_LISTEN: SocketAddr = any_address(8081);
/// `http_listen`.
pub const HTTP_LISTEN: SocketAddr = any_address(8080);
/// `rules_reload_ms`.
pub const RULES_RELOAD: Duration = Duration::from_millis(1000);
/// `envoy_fail_mode`.
pub const ENVOY_FAIL_MODE: &str = "OPEN";

// The store.

/// `redis_cluster`.
pub const REDIS_CLUSTER: bool = false;
/// `redis_batch_max`.
pub const REDIS_BATCH_MAX: usize = 64;
/// `rlqs_max_state_mb`: some 25,000 buckets of one stream each (docs/rlqs.md).
pub const RLQS_MAX_STATE_MB: usize = 64;
/// `rlqs_max_report_mb`.
pub const RLQS_MAX_REPORT_MB: usize = 4;
/// `store_timeout_ms`.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(5);
/// `store_patience_ms` (the runtime's).
pub const STORE_PATIENCE: Duration = DEFAULT_STORE_PATIENCE;
/// `store_startup_patience_ms` (the runtime's).
pub const STORE_STARTUP_PATIENCE: Duration = DEFAULT_STARTUP_PATIENCE;
/// `memory_max_mb`, in bytes (the in-memory store's).
pub const MEMORY_MAX_BYTES: usize = tollgate_lease::DEFAULT_MEMORY_MAX_BYTES;

// Leases and the node's key state.

/// `lease_max_units`.
pub const LEASE_MAX_UNITS: u64 = 50;
/// `lease_ttl_ms`.
pub const LEASE_TTL: Duration = Duration::from_millis(1000);
/// `lease_max_share`.
pub const LEASE_MAX_SHARE: f64 = 0.5;
/// `prelimit_factor`.
pub const PRELIMIT_FACTOR: f64 = 1.0;
/// `cluster_nodes`.
pub const CLUSTER_NODES: u32 = 1;
/// `max_key_state_mb`, in bytes (the runtime's).
pub const MAX_KEY_STATE_BYTES: usize = DEFAULT_MAX_KEY_STATE_BYTES;
/// `idle_timeout_ms`.
pub const IDLE_TIMEOUT: Duration = Duration::from_millis(10_000);
/// `descriptor_overrides`.
pub const DESCRIPTOR_OVERRIDES: &str = "allow";

// The store's circuit breaker.

/// `breaker_min_calls`.
pub const BREAKER_MIN_CALLS: u32 = 20;
/// `breaker_failure_ratio`.
pub const BREAKER_FAILURE_RATIO: f64 = 0.5;
/// `breaker_window_ms`.
pub const BREAKER_WINDOW: Duration = Duration::from_millis(1000);
/// `breaker_cooldown_ms`.
pub const BREAKER_COOLDOWN: Duration = Duration::from_millis(200);
/// `breaker_max_cooldown_ms`.
pub const BREAKER_MAX_COOLDOWN: Duration = Duration::from_millis(1000);

// Logs, traces and the most-denied keys.

/// `log_format`.
pub const LOG_FORMAT: &str = "text";
/// `trace_sample_ratio`.
pub const TRACE_SAMPLE_RATIO: f64 = 0.01;
/// `top_denied_identities`.
pub const TOP_DENIED_IDENTITIES: &str = "truncated";

// The rule store and its admin API.

/// `admin_listen`.
pub const ADMIN_LISTEN: SocketAddr = any_address(8082);
/// `admin_client_timeout_ms`.
pub const ADMIN_CLIENT_TIMEOUT: Duration = Duration::from_millis(10_000);
/// `tollgate rules import --default-domain` (the node's `default_domain` has none: its only
/// domain).
pub const DEFAULT_DOMAIN: &str = "default";
/// `rules_poll_ms`.
pub const RULES_POLL: Duration = Duration::from_millis(2000);
/// `rules_listen`.
pub const RULES_LISTEN: bool = true;
/// `json_check`.
pub const JSON_CHECK: bool = true;
/// `x_ratelimit_headers`.
pub const X_RATELIMIT_HEADERS: bool = true;
/// `rules_snapshot`.
pub const RULES_SNAPSHOT: &str = "tollgate-rules-snapshot.json";
/// `tollgate rules import --actor`.
pub const IMPORT_ACTOR: &str = "import";

// Region sync.

/// `region_listen`.
pub const REGION_LISTEN: SocketAddr = any_address(8083);
/// `region_share`.
pub const REGION_SHARE: f64 = 0.5;
/// `region_sync_interval_ms`.
pub const REGION_SYNC_INTERVAL: Duration = Duration::from_millis(2000);
/// `region_heartbeat_ms`.
pub const REGION_HEARTBEAT: Duration = Duration::from_millis(500);
/// `region_failover_after_ms`.
pub const REGION_FAILOVER_AFTER: Duration = Duration::from_millis(10_000);
/// `region_failback_after_ms`.
pub const REGION_FAILBACK_AFTER: Duration = Duration::from_millis(10_000);
/// `region_forward_deadline_ms`.
pub const REGION_FORWARD_DEADLINE: Duration = Duration::from_millis(50);

// TLS.

/// `tls_reload_ms`.
pub const TLS_RELOAD: Duration = Duration::from_millis(5000);

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_node::runtime::RuntimeConfig;
    use tollgate_node::runtime::top_denied::IdentityShown;

    #[test]
    fn the_defaults_are_the_libraries_defaults() {
        let runtime = RuntimeConfig::default();
        assert_eq!(runtime.lease.max_units, LEASE_MAX_UNITS);
        assert_eq!(runtime.lease.ttl, LEASE_TTL);
        assert_eq!(runtime.lease.max_share, LEASE_MAX_SHARE);
        assert_eq!(runtime.prelimit_factor, Some(PRELIMIT_FACTOR));
        assert_eq!(runtime.cluster_nodes, CLUSTER_NODES);
        assert_eq!(runtime.idle_timeout, IDLE_TIMEOUT);
        assert!(runtime.descriptor_overrides);
        assert_eq!(DESCRIPTOR_OVERRIDES, "allow");
        assert_eq!(
            IdentityShown::parse(TOP_DENIED_IDENTITIES, None),
            Ok(runtime.top_denied)
        );
        let breaker = runtime.breaker;
        assert_eq!(breaker.min_calls, BREAKER_MIN_CALLS);
        assert_eq!(breaker.failure_ratio, BREAKER_FAILURE_RATIO);
        assert_eq!(breaker.window, BREAKER_WINDOW);
        assert_eq!(breaker.cooldown, BREAKER_COOLDOWN);
        assert_eq!(breaker.max_cooldown, BREAKER_MAX_COOLDOWN);
        let region = tollgate_regionsync::RegionConfig::new("us", "eu", "http://eu:8083", "s");
        assert_eq!(region.default_share, REGION_SHARE);
        assert_eq!(region.sync_interval, REGION_SYNC_INTERVAL);
        assert_eq!(region.heartbeat_interval, REGION_HEARTBEAT);
        assert_eq!(region.liveness.failover_after, REGION_FAILOVER_AFTER);
        assert_eq!(region.liveness.failback_after, REGION_FAILBACK_AFTER);
        assert_eq!(region.forward_deadline, REGION_FORWARD_DEADLINE);
        assert_eq!(
            tollgate_lease::MemoryConfig::default().max_bytes,
            MEMORY_MAX_BYTES
        );
    }
}
