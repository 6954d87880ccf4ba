//! The binary's settings: a YAML file (`--config`), `TOLLGATE_*` environment variables and
//! flags, in rising precedence. `tollgate --help` lists every one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser};
use serde::Deserialize;
use tollgate_lease::RedisConfig;

use tollgate_node::runtime::RuntimeConfig;
use tollgate_node::runtime::breaker::BreakerConfig;
use tollgate_node::runtime::shared::DEFAULT_STORE_PATIENCE;
use tollgate_node::runtime::sizing::LeasePolicy;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Tollgate node: a distributed API rate limiter serving Envoy's rate limit service (gRPC) and Tollgate's own API.",
    long_about = "Tollgate node: a distributed API rate limiter serving Envoy's rate limit service \
                  (envoy.service.ratelimit.v3) and Tollgate's CheckRateLimit over gRPC, with /healthz, \
                  /readyz and /metrics over HTTP.\n\nWithout --redis-url the node keeps its state in \
                  memory (a single node). Settings come from --config (YAML, the same names in \
                  snake_case), then TOLLGATE_* environment variables, then flags."
)]
pub struct Cli {
    /// Without a command, run a node.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// YAML file with any of the settings below (snake_case names).
    #[arg(long, env = "TOLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// The settings.
    #[command(flatten)]
    pub settings: Settings,
}

/// Commands besides running a node.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Move rule sets between files and PostgreSQL.
    Rules {
        /// What to do.
        #[command(subcommand)]
        action: RulesCommand,
    },
}

/// `tollgate rules ...`
#[derive(Debug, clap::Subcommand)]
pub enum RulesCommand {
    /// Import rule files (Tollgate's format or envoyproxy/ratelimit YAML) into PostgreSQL.
    Import {
        /// PostgreSQL URL of the rule store.
        #[arg(long, env = "TOLLGATE_DATABASE_URL")]
        database_url: String,
        /// Name recorded in the history as the author.
        #[arg(long, default_value = "import")]
        actor: String,
        /// Delete the stored rules the files do not name.
        #[arg(long)]
        prune: bool,
        /// Domain of rules that name none.
        #[arg(long, env = "TOLLGATE_DEFAULT_DOMAIN", default_value = "default")]
        default_domain: String,
        /// Rule files or directories.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Check rule files of either format (as a node would load them, all together) without a
    /// database or a running node; exit code 0 when valid, 2 with the file, line and field
    /// at fault otherwise (for CI).
    Validate {
        /// Rule files or directories.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Export the rules in PostgreSQL: rules.yaml (Tollgate's format), envoy-<domain>.yaml.
    Export {
        /// PostgreSQL URL of the rule store.
        #[arg(long, env = "TOLLGATE_DATABASE_URL")]
        database_url: String,
        /// Directory to write into.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Every setting; unset ones fall back to the file, then to the default.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// gRPC address (Envoy RLS and Tollgate API) [default: 0.0.0.0:8081]
    #[arg(long, env = "TOLLGATE_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// HTTP address (/healthz, /readyz, /metrics) [default: 0.0.0.0:8080]
    #[arg(long, env = "TOLLGATE_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// A plaintext port answering only /healthz and /readyz (for probes while the HTTP port is
    /// TLS: they then need no handshake, and a flood of handshakes cannot fail them); unset: none
    #[arg(long, env = "TOLLGATE_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,
    /// Rule files or directories (Tollgate rules or envoyproxy/ratelimit YAML), comma-separated.
    #[arg(long = "rules", env = "TOLLGATE_RULES", value_delimiter = ',')]
    pub rules: Option<Vec<PathBuf>>,
    /// How often rule files are checked for changes, ms [default: 1000]
    #[arg(long, env = "TOLLGATE_RULES_RELOAD_MS")]
    pub rules_reload_ms: Option<u64>,
    /// Redis URLs (redis://host:port/); none: the in-memory store. Comma-separated seeds for a cluster.
    #[arg(long = "redis-url", env = "TOLLGATE_REDIS_URL", value_delimiter = ',')]
    pub redis_url: Option<Vec<String>>,
    /// The Redis URLs are Redis Cluster seeds [default: false]
    #[arg(long, env = "TOLLGATE_REDIS_CLUSTER", num_args = 0..=1, default_missing_value = "true")]
    pub redis_cluster: Option<bool>,
    /// Budget of one store call, ms [default: 5]
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT_MS")]
    pub store_timeout_ms: Option<u64>,
    /// Most units one lease takes [default: 50]
    #[arg(long, env = "TOLLGATE_LEASE_MAX_UNITS")]
    pub lease_max_units: Option<u64>,
    /// Lease lifetime, ms [default: 1000]
    #[arg(long, env = "TOLLGATE_LEASE_TTL_MS")]
    pub lease_ttl_ms: Option<u64>,
    /// Longest wait for a store call while the store answers (a busy store or node), ms; a
    /// store answering nothing is waited for only --store-timeout-ms [default: 250]
    #[arg(long, alias = "lease-patience-ms", env = "TOLLGATE_STORE_PATIENCE_MS")]
    #[serde(alias = "lease_patience_ms")]
    pub store_patience_ms: Option<u64>,
    /// How long a starting node waits for its store to answer before it serves, ms; past it,
    /// it serves by its rules' fail modes [default: 5000]
    #[arg(long, env = "TOLLGATE_STORE_STARTUP_PATIENCE_MS")]
    pub store_startup_patience_ms: Option<u64>,
    /// Largest share of what remains globally one lease takes, (0, 1] [default: 0.5]
    #[arg(long, env = "TOLLGATE_LEASE_MAX_SHARE")]
    pub lease_max_share: Option<f64>,
    /// Local pre-limit per bucket as a multiple of the rule's limit; 0 turns it off [default: 1]
    #[arg(long, env = "TOLLGATE_PRELIMIT_FACTOR")]
    pub prelimit_factor: Option<f64>,
    /// Nodes sharing the limits (the LOCAL fail mode gives each limit / nodes) [default: 1]
    #[arg(long, env = "TOLLGATE_CLUSTER_NODES")]
    pub cluster_nodes: Option<u32>,
    /// Most memory the node's key state holds, MiB: key actors and their buckets, the
    /// keys-seen map, LOCAL fallback buckets; past it, keys are decided by direct store calls
    /// and idle actors stop [default: 256]
    #[arg(long, env = "TOLLGATE_MAX_KEY_STATE_MB")]
    pub max_key_state_mb: Option<usize>,
    /// A key actor without leases stops after this long idle, ms [default: 10000]
    #[arg(long, env = "TOLLGATE_IDLE_TIMEOUT_MS")]
    pub idle_timeout_ms: Option<u64>,
    /// Fewest store calls in the breaker's window before it may open [default: 20]
    #[arg(long, env = "TOLLGATE_BREAKER_MIN_CALLS")]
    pub breaker_min_calls: Option<u32>,
    /// Share of failed store calls in the window that opens the breaker, (0, 1] [default: 0.5]
    #[arg(long, env = "TOLLGATE_BREAKER_FAILURE_RATIO")]
    pub breaker_failure_ratio: Option<f64>,
    /// The span over which the breaker counts failures, ms [default: 1000]
    #[arg(long, env = "TOLLGATE_BREAKER_WINDOW_MS")]
    pub breaker_window_ms: Option<u64>,
    /// First breaker cooldown before a probe, ms [default: 200]
    #[arg(long, env = "TOLLGATE_BREAKER_COOLDOWN_MS")]
    pub breaker_cooldown_ms: Option<u64>,
    /// Longest breaker cooldown, ms [default: 1000]
    #[arg(long, env = "TOLLGATE_BREAKER_MAX_COOLDOWN_MS")]
    pub breaker_max_cooldown_ms: Option<u64>,
    /// In-memory store: most memory its keys hold, MiB; past it, the rule holding the most
    /// loses its soonest-expiring keys [default: 256]
    #[arg(long, env = "TOLLGATE_MEMORY_MAX_MB")]
    pub memory_max_mb: Option<usize>,
    /// Log format: text or json [default: text]
    #[arg(long, env = "TOLLGATE_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// OpenTelemetry collector for traces, OTLP over gRPC (http://host:4317); unset: no traces
    #[arg(long, env = "TOLLGATE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Share of the traces started at this node that are exported, 0 to 1 (a caller's
    /// sampled flag is followed) [default: 0.01]
    #[arg(long, env = "TOLLGATE_TRACE_SAMPLE_RATIO")]
    pub trace_sample_ratio: Option<f64>,
    /// How /top-denied shows identities (they may be personal data, or API keys): plain,
    /// truncated or hashed (HMAC under --top-denied-secret) [default: truncated]
    #[arg(long, env = "TOLLGATE_TOP_DENIED_IDENTITIES")]
    pub top_denied_identities: Option<String>,
    /// Whether a request may set its own limit for a descriptor (Envoy's `limit` override):
    /// allow or refuse. The gRPC port is for trusted gateways only [default: allow]
    #[arg(long, env = "TOLLGATE_DESCRIPTOR_OVERRIDES")]
    pub descriptor_overrides: Option<String>,
    /// The deployment's secret for hashed identities (at least 16 bytes; the same on every node)
    #[arg(long, env = "TOLLGATE_TOP_DENIED_SECRET")]
    pub top_denied_secret: Option<String>,
    /// A bearer token that /top-denied on the HTTP port requires; unset, the HTTP port does not
    /// serve it (the admin API does, to a read token)
    #[arg(long, env = "TOLLGATE_TOP_DENIED_TOKEN")]
    pub top_denied_token: Option<String>,
    /// Threads that run the node; 0 or unset: one per CPU the process may use (its affinity
    /// and cgroup quota), and a single-threaded runtime when that is one.
    #[arg(long, env = "TOLLGATE_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// PostgreSQL URL of the rule store (postgres://user@host:5432/db); enables the admin API.
    #[arg(long, env = "TOLLGATE_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Admin API address (loopback only when no token is configured) [default: 0.0.0.0:8082]
    #[arg(long, env = "TOLLGATE_ADMIN_LISTEN")]
    pub admin_listen: Option<SocketAddr>,
    /// Admin tokens allowed to change rules, `name:secret`, comma-separated.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKENS", value_delimiter = ',')]
    pub admin_tokens: Option<Vec<String>>,
    /// Admin tokens allowed to read only, `name:secret`, comma-separated.
    #[arg(long, env = "TOLLGATE_ADMIN_READ_TOKENS", value_delimiter = ',')]
    pub admin_read_tokens: Option<Vec<String>>,
    /// How long an admin client may take to send a request's headers, and then its body, ms
    /// [default: 10000]
    #[arg(long, env = "TOLLGATE_ADMIN_CLIENT_TIMEOUT_MS")]
    pub admin_client_timeout_ms: Option<u64>,
    /// Domain of admin-API rules that name none [default: default]
    #[arg(long, env = "TOLLGATE_DEFAULT_DOMAIN")]
    pub default_domain: Option<String>,
    /// How often the rule store's revision is polled, ms [default: 2000]
    #[arg(long, env = "TOLLGATE_RULES_POLL_MS")]
    pub rules_poll_ms: Option<u64>,
    /// Receive rule changes by LISTEN/NOTIFY (false: polling only) [default: true]
    #[arg(long, env = "TOLLGATE_RULES_LISTEN", num_args = 0..=1, default_missing_value = "true")]
    pub rules_listen: Option<bool>,
    /// File keeping the last rule set from PostgreSQL [default: tollgate-rules-snapshot.json]
    #[arg(long, env = "TOLLGATE_RULES_SNAPSHOT")]
    pub rules_snapshot: Option<PathBuf>,
    /// This node's region (a-z 0-9 -); with --peer-region, enables region sync.
    #[arg(long, env = "TOLLGATE_REGION")]
    pub region: Option<String>,
    /// The other region.
    #[arg(long, env = "TOLLGATE_PEER_REGION")]
    pub peer_region: Option<String>,
    /// The peer region's link address, http://host:port.
    #[arg(long, env = "TOLLGATE_PEER_URL")]
    pub peer_url: Option<String>,
    /// The region link's shared secret (at least 16 characters).
    #[arg(long, env = "TOLLGATE_REGION_SECRET")]
    pub region_secret: Option<String>,
    /// Where this node serves the region link [default: 0.0.0.0:8083]
    #[arg(long, env = "TOLLGATE_REGION_LISTEN")]
    pub region_listen: Option<SocketAddr>,
    /// This region's SPLIT share for rules that name none [default: 0.5]
    #[arg(long, env = "TOLLGATE_REGION_SHARE")]
    pub region_share: Option<f64>,
    /// How often consumption is shipped to the peer region, ms [default: 2000]
    #[arg(long, env = "TOLLGATE_REGION_SYNC_INTERVAL_MS")]
    pub region_sync_interval_ms: Option<u64>,
    /// How often the peer region is probed, ms [default: 500]
    #[arg(long, env = "TOLLGATE_REGION_HEARTBEAT_MS")]
    pub region_heartbeat_ms: Option<u64>,
    /// The peer counts as down after this long unreachable, ms [default: 10000]
    #[arg(long, env = "TOLLGATE_REGION_FAILOVER_AFTER_MS")]
    pub region_failover_after_ms: Option<u64>,
    /// The peer counts as back after this long reachable without a failure, ms [default: 10000]
    #[arg(long, env = "TOLLGATE_REGION_FAILBACK_AFTER_MS")]
    pub region_failback_after_ms: Option<u64>,
    /// How long a HOME_REGION decision waits for the home region, ms [default: 50]
    #[arg(long, env = "TOLLGATE_REGION_FORWARD_DEADLINE_MS")]
    pub region_forward_deadline_ms: Option<u64>,
    /// TLS certificate chain (PEM): with --tls-key, every listener (gRPC, HTTP, admin, region
    /// link) serves TLS only, and the region link presents it to a peer that asks for one.
    #[arg(long, env = "TOLLGATE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM).
    #[arg(long, env = "TOLLGATE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// How often the TLS files are looked at; a changed set is loaded without a restart, ms
    /// [default: 5000]
    #[arg(long, env = "TOLLGATE_TLS_RELOAD_MS")]
    pub tls_reload_ms: Option<u64>,
    /// CA (PEM) whose certificates gRPC clients must present (mutual TLS on the gRPC port).
    #[arg(long, env = "TOLLGATE_GRPC_CLIENT_CA")]
    pub grpc_client_ca: Option<PathBuf>,
    /// CA (PEM) whose certificates the peer region's nodes must present (mutual TLS on the
    /// region link).
    #[arg(long, env = "TOLLGATE_REGION_CLIENT_CA")]
    pub region_client_ca: Option<PathBuf>,
    /// CA (PEM) that signs the peer region's certificate (the peer URL is then https://).
    #[arg(long, env = "TOLLGATE_PEER_CA")]
    pub peer_ca: Option<PathBuf>,
}

macro_rules! merge_fields {
    ($a:ident, $b:ident, $($field:ident),+) => {
        Settings { $($field: $a.$field.or($b.$field)),+ }
    };
}

impl Settings {
    /// These settings where set, else `fallback`'s.
    pub fn or(self, fallback: Settings) -> Settings {
        merge_fields!(
            self,
            fallback,
            grpc_listen,
            http_listen,
            probe_listen,
            rules,
            rules_reload_ms,
            redis_url,
            redis_cluster,
            store_timeout_ms,
            lease_max_units,
            lease_ttl_ms,
            store_patience_ms,
            store_startup_patience_ms,
            lease_max_share,
            prelimit_factor,
            cluster_nodes,
            max_key_state_mb,
            idle_timeout_ms,
            breaker_min_calls,
            breaker_failure_ratio,
            breaker_window_ms,
            breaker_cooldown_ms,
            breaker_max_cooldown_ms,
            memory_max_mb,
            log_format,
            top_denied_identities,
            top_denied_secret,
            top_denied_token,
            descriptor_overrides,
            otlp_endpoint,
            trace_sample_ratio,
            worker_threads,
            database_url,
            admin_listen,
            admin_tokens,
            admin_read_tokens,
            admin_client_timeout_ms,
            default_domain,
            rules_poll_ms,
            rules_listen,
            rules_snapshot,
            region,
            peer_region,
            peer_url,
            region_secret,
            region_listen,
            region_share,
            region_sync_interval_ms,
            region_heartbeat_ms,
            region_failover_after_ms,
            region_failback_after_ms,
            region_forward_deadline_ms,
            tls_cert,
            tls_key,
            tls_reload_ms,
            grpc_client_ca,
            region_client_ca,
            peer_ca
        )
    }

    /// Reads a settings file.
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            field: "config".into(),
            reason: format!("{}: {e}", path.display()),
        })?;
        if text.trim().is_empty() {
            return Ok(Settings::default());
        }
        yaml_serde::from_str(&text).map_err(|e| ConfigError {
            field: "config".into(),
            reason: format!("{}: {e}", path.display()),
        })
    }
}

/// A setting that is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{field}`: {reason}")]
pub struct ConfigError {
    /// The setting (snake_case, as in the file).
    pub field: String,
    /// Why.
    pub reason: String,
}

/// The binary's resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// gRPC address.
    pub grpc_listen: SocketAddr,
    /// HTTP address.
    pub http_listen: SocketAddr,
    /// The plaintext probe port, when asked for.
    pub probe_listen: Option<SocketAddr>,
    /// Rule files.
    pub rules: Vec<PathBuf>,
    /// Rule file check interval.
    pub rules_reload: Duration,
    /// Redis, or None for the in-memory store.
    pub redis: Option<RedisConfig>,
    /// The in-memory store's byte budget.
    pub memory_max_bytes: usize,
    /// The store call budget.
    pub store_timeout: Duration,
    /// The decision runtime.
    pub runtime: RuntimeConfig,
    /// Logs as JSON lines.
    pub log_json: bool,
    /// Where sampled spans go (None: no traces).
    pub traces: Option<crate::telemetry::TraceSettings>,
    /// Threads that run the node (at least 1; 1 means a single-threaded runtime).
    pub worker_threads: usize,
    /// The rule store and admin API, when a database is configured.
    pub control: Option<ControlConfig>,
    /// Region sync, when the node runs in one of two regions.
    pub region: Option<RegionSettings>,
    /// TLS on every listener, when a certificate is configured.
    pub tls: Option<TlsSettings>,
    /// The bearer token `/top-denied` on the HTTP port requires (None: not served there).
    pub top_denied_token: Option<String>,
}

/// TLS on the node's listeners (see `docs/tls.md`).
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The certificate chain every listener serves.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// How often the files are looked at.
    pub reload: Duration,
    /// Clients of the gRPC port must present a certificate of this CA.
    pub grpc_client_ca: Option<PathBuf>,
    /// The peer region's nodes must present a certificate of this CA.
    pub region_client_ca: Option<PathBuf>,
}

impl TlsSettings {
    /// What a listener serves: this node's certificate, and `client_ca` to require.
    pub fn files(&self, client_ca: Option<&PathBuf>) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: client_ca.cloned(),
        }
    }
}

/// Region sync's settings and where its link listens.
#[derive(Debug, Clone)]
pub struct RegionSettings {
    /// The sync settings.
    pub sync: tollgate_regionsync::RegionConfig,
    /// Where this node serves the region link.
    pub listen: SocketAddr,
}

/// The rule store, its admin API and how nodes follow it.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// PostgreSQL URL.
    pub database_url: String,
    /// Admin API address (moved to loopback when no token is configured).
    pub admin_listen: SocketAddr,
    /// Read-write tokens.
    pub admin_tokens: Vec<String>,
    /// Read-only tokens.
    pub admin_read_tokens: Vec<String>,
    /// How long a client may take to send a request's headers, and its body.
    pub admin_client_timeout: Duration,
    /// Domain of rules that name none.
    pub default_domain: String,
    /// Revision poll interval.
    pub poll: Duration,
    /// LISTEN/NOTIFY on.
    pub listen: bool,
    /// Snapshot file.
    pub snapshot: PathBuf,
}

/// The CPUs this process may use: its CPU affinity and its cgroup's CPU quota (a Kubernetes
/// CPU limit) both count; at least 1.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

fn bad(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

impl TryFrom<Settings> for Config {
    type Error = ConfigError;

    fn try_from(s: Settings) -> Result<Config, ConfigError> {
        let ms = Duration::from_millis;
        let store_timeout = ms(s.store_timeout_ms.unwrap_or(5));
        if store_timeout.is_zero() {
            return Err(bad("store_timeout_ms", "must be at least 1"));
        }
        let redis = match s.redis_url.filter(|u| !u.is_empty()) {
            None => None,
            Some(urls) => Some(RedisConfig {
                urls,
                cluster: s.redis_cluster.unwrap_or(false),
                call_timeout: store_timeout,
                // A call is awaited up to the patience; the connection must wait at least
                // that long for it.
                response_timeout: s
                    .store_patience_ms
                    .map_or(DEFAULT_STORE_PATIENCE, ms)
                    .max(store_timeout)
                    .max(Duration::from_secs(1)),
                ..RedisConfig::default()
            }),
        };
        // Defaults live with what they configure: the runtime's, the breaker's, the lease
        // policy's `Default` impls.
        let defaults = RuntimeConfig::default();
        let max_share = s.lease_max_share.unwrap_or(defaults.lease.max_share);
        if !(max_share > 0.0 && max_share <= 1.0) {
            return Err(bad(
                "lease_max_share",
                format!("must be in (0, 1], got {max_share}"),
            ));
        }
        let lease_max_units = s.lease_max_units.unwrap_or(defaults.lease.max_units);
        if lease_max_units == 0 {
            return Err(bad("lease_max_units", "must be at least 1"));
        }
        let lease_ttl = s.lease_ttl_ms.map_or(defaults.lease.ttl, ms);
        if lease_ttl < ms(10) || lease_ttl > Duration::from_secs(3600) {
            return Err(bad("lease_ttl_ms", "must be between 10 and 3600000"));
        }
        let prelimit = s
            .prelimit_factor
            .unwrap_or(defaults.prelimit_factor.unwrap_or(0.0));
        if !(prelimit.is_finite() && prelimit >= 0.0) {
            return Err(bad(
                "prelimit_factor",
                format!("must be 0 (off) or positive, got {prelimit}"),
            ));
        }
        let cluster_nodes = s.cluster_nodes.unwrap_or(defaults.cluster_nodes);
        if cluster_nodes == 0 {
            return Err(bad("cluster_nodes", "must be at least 1"));
        }
        let log_json = match s.log_format.as_deref().unwrap_or("text") {
            "text" => false,
            "json" => true,
            other => {
                return Err(bad(
                    "log_format",
                    format!("must be text or json, got {other:?}"),
                ));
            }
        };
        let traces = match &s.otlp_endpoint {
            None => None,
            Some(endpoint) => {
                if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                    return Err(bad(
                        "otlp_endpoint",
                        format!("must be an http:// or https:// URL, got {endpoint:?}"),
                    ));
                }
                let sample_ratio = s.trace_sample_ratio.unwrap_or(0.01);
                if !(0.0..=1.0).contains(&sample_ratio) {
                    return Err(bad(
                        "trace_sample_ratio",
                        format!("must be between 0 and 1, got {sample_ratio}"),
                    ));
                }
                Some(crate::telemetry::TraceSettings {
                    endpoint: endpoint.clone(),
                    sample_ratio,
                })
            }
        };
        let top_denied = match s.top_denied_identities.as_deref() {
            None => tollgate_node::runtime::top_denied::IdentityShown::default(),
            Some(text) => tollgate_node::runtime::top_denied::IdentityShown::parse(
                text,
                s.top_denied_secret.as_deref(),
            )
            .map_err(|reason| bad("top_denied_identities", reason))?,
        };
        let descriptor_overrides = match s.descriptor_overrides.as_deref() {
            None | Some("allow") => true,
            Some("refuse") => false,
            Some(other) => {
                return Err(bad(
                    "descriptor_overrides",
                    format!("must be allow or refuse, got {other:?}"),
                ));
            }
        };
        let top_denied_token = match s.top_denied_token {
            Some(token) if token.len() < tollgate_node::runtime::top_denied::MIN_SECRET => {
                return Err(bad(
                    "top_denied_token",
                    format!(
                        "must be at least {} characters",
                        tollgate_node::runtime::top_denied::MIN_SECRET
                    ),
                ));
            }
            token => token,
        };
        let failure_ratio = s
            .breaker_failure_ratio
            .unwrap_or(defaults.breaker.failure_ratio);
        if !(failure_ratio > 0.0 && failure_ratio <= 1.0) {
            return Err(bad(
                "breaker_failure_ratio",
                format!("must be in (0, 1], got {failure_ratio}"),
            ));
        }
        let breaker = BreakerConfig {
            window: s
                .breaker_window_ms
                .map_or(defaults.breaker.window, |w| ms(w.max(10))),
            min_calls: s
                .breaker_min_calls
                .unwrap_or(defaults.breaker.min_calls)
                .max(1),
            failure_ratio,
            cooldown: s
                .breaker_cooldown_ms
                .map_or(defaults.breaker.cooldown, |c| ms(c.max(1))),
            max_cooldown: s
                .breaker_max_cooldown_ms
                .map_or(defaults.breaker.max_cooldown, |c| ms(c.max(1))),
        };
        let store_patience = s
            .store_patience_ms
            .map(ms)
            .unwrap_or_else(|| defaults.store_patience.max(store_timeout));
        if store_patience < store_timeout || store_patience > Duration::from_secs(60) {
            return Err(bad(
                "store_patience_ms",
                "must be at least store_timeout_ms and at most 60000",
            ));
        }
        let startup_patience = s
            .store_startup_patience_ms
            .map_or(defaults.startup_patience, ms);
        if startup_patience > Duration::from_secs(600) {
            return Err(bad(
                "store_startup_patience_ms",
                "must be at most 600000 (10 minutes)",
            ));
        }
        if let Err(reason) = tollgate_control::auth::Tokens::parse(
            s.admin_tokens.as_deref().unwrap_or_default(),
            s.admin_read_tokens.as_deref().unwrap_or_default(),
        ) {
            let field = if reason.starts_with("admin_read_tokens") {
                "admin_read_tokens"
            } else {
                "admin_tokens"
            };
            return Err(bad(field, reason));
        }
        let control = match s.database_url.filter(|u| !u.is_empty()) {
            None => None,
            Some(database_url) => Some(ControlConfig {
                database_url,
                admin_listen: s
                    .admin_listen
                    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8082))),
                admin_tokens: s.admin_tokens.clone().unwrap_or_default(),
                admin_read_tokens: s.admin_read_tokens.clone().unwrap_or_default(),
                admin_client_timeout: ms(s.admin_client_timeout_ms.unwrap_or(10_000).max(10)),
                default_domain: match s.default_domain {
                    Some(d) if d.is_empty() || d.len() > 64 => {
                        return Err(bad("default_domain", "must be 1 to 64 characters"));
                    }
                    Some(d) => d,
                    None => "default".into(),
                },
                poll: ms(s.rules_poll_ms.unwrap_or(2000).max(10)),
                listen: s.rules_listen.unwrap_or(true),
                snapshot: s
                    .rules_snapshot
                    .unwrap_or_else(|| PathBuf::from("tollgate-rules-snapshot.json")),
            }),
        };
        let tls = match (s.tls_cert, s.tls_key) {
            (None, None) => {
                for (field, set) in [
                    ("grpc_client_ca", s.grpc_client_ca.is_some()),
                    ("region_client_ca", s.region_client_ca.is_some()),
                ] {
                    if set {
                        return Err(bad(field, "needs tls_cert and tls_key (mutual TLS is TLS)"));
                    }
                }
                None
            }
            (Some(_), None) => return Err(bad("tls_key", "is required with tls_cert")),
            (None, Some(_)) => return Err(bad("tls_cert", "is required with tls_key")),
            (Some(cert), Some(key)) => Some(TlsSettings {
                cert,
                key,
                reload: ms(s.tls_reload_ms.unwrap_or(5000).max(10)),
                grpc_client_ca: s.grpc_client_ca,
                region_client_ca: s.region_client_ca,
            }),
        };
        let region = match (s.region, s.peer_region) {
            (None, None) => None,
            (Some(region), Some(peer)) => {
                let url = s
                    .peer_url
                    .ok_or_else(|| bad("peer_url", "is required with region and peer_region"))?;
                let secret = s.region_secret.ok_or_else(|| {
                    bad("region_secret", "is required with region and peer_region")
                })?;
                let mut sync =
                    tollgate_regionsync::RegionConfig::new(&region, &peer, &url, &secret);
                match (&s.peer_ca, url.starts_with("https://")) {
                    (Some(ca), true) => {
                        let read = |field: &str, path: &PathBuf| {
                            std::fs::read(path)
                                .map_err(|e| bad(field, format!("{}: {e}", path.display())))
                        };
                        let identity = match &tls {
                            Some(t) => Some((read("tls_cert", &t.cert)?, read("tls_key", &t.key)?)),
                            None => None,
                        };
                        sync.peer_tls = Some(tollgate_regionsync::PeerTls {
                            ca_pem: read("peer_ca", ca)?,
                            identity,
                        });
                    }
                    (None, true) => {
                        return Err(bad("peer_ca", "is required with an https:// peer_url"));
                    }
                    (Some(_), false) => {
                        return Err(bad("peer_url", "must be https:// with peer_ca"));
                    }
                    (None, false) => {}
                }
                let positive = |field: &str, v: Option<u64>, default: Duration| match v {
                    Some(0) => Err(bad(field, "must be at least 1")),
                    Some(v) => Ok(ms(v)),
                    None => Ok(default),
                };
                sync.sync_interval = positive(
                    "region_sync_interval_ms",
                    s.region_sync_interval_ms,
                    sync.sync_interval,
                )?;
                sync.heartbeat_interval = positive(
                    "region_heartbeat_ms",
                    s.region_heartbeat_ms,
                    sync.heartbeat_interval,
                )?;
                sync.liveness.failover_after = positive(
                    "region_failover_after_ms",
                    s.region_failover_after_ms,
                    sync.liveness.failover_after,
                )?;
                sync.liveness.failback_after = positive(
                    "region_failback_after_ms",
                    s.region_failback_after_ms,
                    sync.liveness.failback_after,
                )?;
                sync.forward_deadline = positive(
                    "region_forward_deadline_ms",
                    s.region_forward_deadline_ms,
                    sync.forward_deadline,
                )?;
                if let Some(share) = s.region_share {
                    if !(share > 0.0 && share <= 1.0) {
                        return Err(bad(
                            "region_share",
                            format!("must be above 0 and at most 1, got {share}"),
                        ));
                    }
                    sync.default_share = share;
                }
                Some(RegionSettings {
                    sync,
                    listen: s
                        .region_listen
                        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8083))),
                })
            }
            (Some(_), None) => return Err(bad("peer_region", "is required with region")),
            (None, Some(_)) => return Err(bad("region", "is required with peer_region")),
        };
        Ok(Config {
            region,
            control,
            tls,
            top_denied_token,
            grpc_listen: s
                .grpc_listen
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8081))),
            probe_listen: s.probe_listen,
            http_listen: s
                .http_listen
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8080))),
            rules: s.rules.unwrap_or_default(),
            rules_reload: ms(s.rules_reload_ms.unwrap_or(1000).max(10)),
            redis,
            memory_max_bytes: s
                .memory_max_mb
                .map_or(tollgate_lease::DEFAULT_MEMORY_MAX_BYTES, |mb| {
                    mb.max(1) << 20
                }),
            store_timeout,
            runtime: RuntimeConfig {
                lease: LeasePolicy {
                    max_units: lease_max_units,
                    ttl: lease_ttl,
                    max_share,
                    ..LeasePolicy::default()
                },
                prelimit_factor: (prelimit > 0.0).then_some(prelimit),
                breaker,
                store_patience,
                startup_patience,
                cluster_nodes,
                max_key_state_bytes: s
                    .max_key_state_mb
                    .map_or(defaults.max_key_state_bytes, |mb| mb.max(1) << 20),
                idle_timeout: s
                    .idle_timeout_ms
                    .map_or(defaults.idle_timeout, ms)
                    .max(lease_ttl * 2),
                seed: None,
                top_denied,
                descriptor_overrides,
            },
            log_json,
            traces,
            worker_threads: match s.worker_threads {
                None | Some(0) => available_cpus(),
                Some(n) if n > 1024 => {
                    return Err(bad("worker_threads", "must be at most 1024"));
                }
                Some(n) => n,
            },
        })
    }
}

impl Cli {
    /// Flags and environment over the file over defaults.
    pub fn resolve(self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => Settings::from_file(path)?,
            None => Settings::default(),
        };
        Config::try_from(self.settings.or(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_identities_need_a_secret_and_the_top_denied_token_a_length() {
        let field = |settings: Settings| {
            Config::try_from(settings)
                .map(|_| ())
                .expect_err("refused")
                .field
        };
        let hashed = |secret: Option<&str>| Settings {
            top_denied_identities: Some("hashed".into()),
            top_denied_secret: secret.map(String::from),
            ..Settings::default()
        };
        assert_eq!(field(hashed(None)), "top_denied_identities");
        assert_eq!(field(hashed(Some("short"))), "top_denied_identities");
        assert!(Config::try_from(hashed(Some("sixteen-bytes-long"))).is_ok());
        let token = Settings {
            top_denied_token: Some("short".into()),
            ..Settings::default()
        };
        assert_eq!(field(token), "top_denied_token");
    }

    #[test]
    fn flags_override_the_file_and_defaults_fill_the_rest() {
        let file: Settings =
            yaml_serde::from_str("store_timeout_ms: 9\nlease_max_units: 20\n").expect("yaml");
        let cli = Cli::try_parse_from([
            "tollgate",
            "--lease-max-units",
            "30",
            "--redis-url",
            "redis://a:1/,redis://b:2/",
            "--redis-cluster",
        ])
        .expect("flags");
        let config = Config::try_from(cli.settings.or(file)).expect("valid");
        assert_eq!(config.store_timeout, Duration::from_millis(9));
        assert_eq!(config.runtime.lease.max_units, 30);
        let redis = config.redis.expect("redis");
        assert_eq!(redis.urls.len(), 2);
        assert!(redis.cluster);
        assert_eq!(config.grpc_listen.port(), 8081);
        assert_eq!(config.worker_threads, available_cpus());
    }

    #[test]
    fn unset_settings_are_the_runtime_defaults() {
        let config = Config::try_from(Settings::default()).expect("valid");
        let defaults = RuntimeConfig::default();
        let (got, want) = (&config.runtime, &defaults);
        assert_eq!(got.lease.max_units, want.lease.max_units);
        assert_eq!(got.lease.ttl, want.lease.ttl);
        assert_eq!(got.lease.max_share, want.lease.max_share);
        assert_eq!(got.store_patience, want.store_patience);
        assert_eq!(got.startup_patience, want.startup_patience);
        assert_eq!(got.prelimit_factor, want.prelimit_factor);
        assert_eq!(got.cluster_nodes, want.cluster_nodes);
        assert_eq!(got.max_key_state_bytes, want.max_key_state_bytes);
        assert_eq!(got.idle_timeout, want.idle_timeout);
        assert_eq!(got.top_denied, want.top_denied);
        assert_eq!(got.breaker.window, want.breaker.window);
        assert_eq!(got.breaker.min_calls, want.breaker.min_calls);
        assert_eq!(got.breaker.cooldown, want.breaker.cooldown);
        assert_eq!(got.breaker.max_cooldown, want.breaker.max_cooldown);
        assert_eq!(
            config.memory_max_bytes,
            tollgate_lease::MemoryConfig::default().max_bytes
        );
    }

    #[test]
    fn worker_threads_default_to_the_cpus_given_and_zero_means_default() {
        let threads = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tollgate"], args].concat()).expect("flags");
            Config::try_from(cli.settings).map(|c| c.worker_threads)
        };
        assert_eq!(threads(&["--worker-threads", "1"]).expect("valid"), 1);
        assert_eq!(threads(&["--worker-threads", "3"]).expect("valid"), 3);
        assert_eq!(
            threads(&["--worker-threads", "0"]).expect("valid"),
            available_cpus()
        );
        assert_eq!(
            threads(&["--worker-threads", "4096"])
                .expect_err("too many")
                .field,
            "worker_threads"
        );
    }

    #[test]
    fn bad_settings_name_their_field() {
        let err = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["tollgate"], args].concat()).expect("flags");
            Config::try_from(cli.settings).expect_err("invalid").field
        };
        assert_eq!(err(&["--lease-max-share", "1.5"]), "lease_max_share");
        assert_eq!(err(&["--store-timeout-ms", "0"]), "store_timeout_ms");
        assert_eq!(err(&["--log-format", "xml"]), "log_format");
        assert_eq!(err(&["--prelimit-factor=-1"]), "prelimit_factor");
        assert_eq!(err(&["--region", "us"]), "peer_region");
        assert_eq!(err(&["--region", "us", "--peer-region", "eu"]), "peer_url");
        let region = [
            "--region",
            "us",
            "--peer-region",
            "eu",
            "--peer-url",
            "http://eu:8083",
        ];
        assert_eq!(err(&region), "region_secret");
        let with = |extra: &[&str]| {
            let mut args = region.to_vec();
            args.extend(["--region-secret", "0123456789abcdef"]);
            args.extend(extra);
            err(&args)
        };
        assert_eq!(with(&["--region-share", "1.5"]), "region_share");
        assert_eq!(
            with(&["--region-sync-interval-ms", "0"]),
            "region_sync_interval_ms"
        );
        // TLS: a certificate needs its key and the reverse; mutual TLS needs TLS; an https
        // peer needs the CA that signs it, and a peer CA an https peer.
        assert_eq!(err(&["--tls-cert", "cert.pem"]), "tls_key");
        assert_eq!(err(&["--tls-key", "key.pem"]), "tls_cert");
        assert_eq!(err(&["--grpc-client-ca", "ca.pem"]), "grpc_client_ca");
        assert_eq!(err(&["--region-client-ca", "ca.pem"]), "region_client_ca");
        assert_eq!(with(&["--peer-ca", "ca.pem"]), "peer_url");
        let mut https = region.to_vec();
        https[5] = "https://eu:8083";
        https.extend(["--region-secret", "0123456789abcdef"]);
        assert_eq!(err(&https), "peer_ca");
        https.extend(["--peer-ca", "/nonexistent/ca.pem"]);
        assert_eq!(err(&https), "peer_ca");
        let unknown = yaml_serde::from_str::<Settings>("lease_max_unit: 3\n").expect_err("unknown");
        assert!(unknown.to_string().contains("lease_max_unit"), "{unknown}");
    }
}
