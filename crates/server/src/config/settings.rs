//! What an operator sets, as given: flags, `TOLLGATE_*` environment variables and the YAML
//! file, each setting optional so a flag can fall back to the file. Nothing is checked here
//! but the types; the areas beside this file read these into the node's settings.

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use super::defaults;

/// `shown_default = X` on a setting: its help ends in `[default: X]` while the setting stays
/// unset (`None`), so the file beneath the flags can still fill it. clap's own
/// `default_value` would set it.
trait ShowDefault {
    fn shown_default(self, value: impl Display) -> Self;
}

impl ShowDefault for clap::Arg {
    fn shown_default(self, value: impl Display) -> Self {
        let help = self.get_help().map(ToString::to_string).unwrap_or_default();
        self.help(format!("{help} [default: {value}]"))
    }
}

/// Every setting; unset ones fall back to the file, then to the default (in [`defaults`]).
#[derive(Debug, Clone, Default, Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// gRPC address (Envoy RLS and Tollgate API)
    #[arg(long, env = "TOLLGATE_GRPC_LISTEN", shown_default = defaults::GRPC_LISTEN)]
    pub grpc_listen: Option<SocketAddr>,
    /// HTTP address (/healthz, /readyz, /metrics)
    #[arg(long, env = "TOLLGATE_HTTP_LISTEN", shown_default = defaults::HTTP_LISTEN)]
    pub http_listen: Option<SocketAddr>,
    /// A plaintext port answering only /healthz and /readyz (for probes while the HTTP port is
    /// TLS: they then need no handshake, and a flood of handshakes cannot fail them); unset: none
    #[arg(long, env = "TOLLGATE_PROBE_LISTEN")]
    pub probe_listen: Option<SocketAddr>,
    /// Rule files or directories (Tollgate rules or envoyproxy/ratelimit YAML), comma-separated
    /// (in a --config file: a list, or the same comma-separated string)
    #[arg(long = "rules", env = "TOLLGATE_RULES", value_delimiter = ',')]
    #[serde(default, deserialize_with = "one_or_list")]
    pub rules: Option<Vec<PathBuf>>,
    /// How often rule files are checked for changes, ms
    #[arg(long, env = "TOLLGATE_RULES_RELOAD_MS", shown_default = defaults::RULES_RELOAD.as_millis())]
    pub rules_reload_ms: Option<u64>,
    /// What rules in envoyproxy/ratelimit's format do when the store cannot answer (the
    /// format has no field for it): OPEN, CLOSED or LOCAL for every such domain, and/or per
    /// domain, e.g. `public-api=CLOSED,edge=LOCAL`
    #[arg(long, env = "TOLLGATE_ENVOY_FAIL_MODE", shown_default = defaults::ENVOY_FAIL_MODE)]
    pub envoy_fail_mode: Option<String>,
    /// Redis URLs (redis://host:port/); none: the in-memory store. Comma-separated seeds for a cluster.
    #[arg(long = "redis-url", env = "TOLLGATE_REDIS_URL", value_delimiter = ',')]
    #[serde(default, deserialize_with = "one_or_list")]
    pub redis_url: Option<Vec<String>>,
    /// The Redis URLs are Redis Cluster seeds
    #[arg(long, env = "TOLLGATE_REDIS_CLUSTER", num_args = 0..=1, default_missing_value = "true", shown_default = defaults::REDIS_CLUSTER)]
    pub redis_cluster: Option<bool>,
    /// Most checks and lease asks one Redis call carries: under load, calls for keys of one
    /// shard made while another is in flight go together (one round trip, one script run);
    /// 1 sends every call alone; 1 to 1024
    #[arg(long, env = "TOLLGATE_REDIS_BATCH_MAX", shown_default = defaults::REDIS_BATCH_MAX)]
    pub redis_batch_max: Option<usize>,
    /// Budget of one store call, ms; at least 1
    #[arg(long, env = "TOLLGATE_STORE_TIMEOUT_MS", shown_default = defaults::STORE_TIMEOUT.as_millis())]
    pub store_timeout_ms: Option<u64>,
    /// Most units one lease takes; at least 1
    #[arg(long, env = "TOLLGATE_LEASE_MAX_UNITS", shown_default = defaults::LEASE_MAX_UNITS)]
    pub lease_max_units: Option<u64>,
    /// Lease lifetime, ms; 10 to 3600000
    #[arg(long, env = "TOLLGATE_LEASE_TTL_MS", shown_default = defaults::LEASE_TTL.as_millis())]
    pub lease_ttl_ms: Option<u64>,
    /// Longest wait for a store call while the store answers (a busy store or node), ms; a
    /// store answering nothing is waited for only --store-timeout-ms; at least
    /// --store-timeout-ms and at most 60000
    #[arg(long, alias = "lease-patience-ms", env = "TOLLGATE_STORE_PATIENCE_MS", shown_default = defaults::STORE_PATIENCE.as_millis())]
    #[serde(alias = "lease_patience_ms")]
    pub store_patience_ms: Option<u64>,
    /// How long a starting node waits for its store to answer before it serves, ms; past it,
    /// it serves by its rules' fail modes; at most 600000
    #[arg(long, env = "TOLLGATE_STORE_STARTUP_PATIENCE_MS", shown_default = defaults::STORE_STARTUP_PATIENCE.as_millis())]
    pub store_startup_patience_ms: Option<u64>,
    /// Largest share of what remains globally one lease takes, (0, 1]
    #[arg(long, env = "TOLLGATE_LEASE_MAX_SHARE", shown_default = defaults::LEASE_MAX_SHARE)]
    pub lease_max_share: Option<f64>,
    /// Local pre-limit per bucket as a multiple of the rule's limit; 0 turns it off (not
    /// negative)
    #[arg(long, env = "TOLLGATE_PRELIMIT_FACTOR", shown_default = defaults::PRELIMIT_FACTOR)]
    pub prelimit_factor: Option<f64>,
    /// Nodes sharing the limits (the LOCAL fail mode gives each limit / nodes); at least 1
    #[arg(long, env = "TOLLGATE_CLUSTER_NODES", shown_default = defaults::CLUSTER_NODES)]
    pub cluster_nodes: Option<u32>,
    /// Most memory the node's key state holds, MiB: key actors and their buckets, the
    /// keys-seen map, LOCAL fallback buckets; past it, keys are decided by direct store calls
    /// and idle actors stop
    #[arg(long, env = "TOLLGATE_MAX_KEY_STATE_MB", shown_default = defaults::MAX_KEY_STATE_BYTES >> 20)]
    pub max_key_state_mb: Option<usize>,
    /// A key actor without leases stops after this long idle, ms
    #[arg(long, env = "TOLLGATE_IDLE_TIMEOUT_MS", shown_default = defaults::IDLE_TIMEOUT.as_millis())]
    pub idle_timeout_ms: Option<u64>,
    /// Fewest store calls in the breaker's window before it may open
    #[arg(long, env = "TOLLGATE_BREAKER_MIN_CALLS", shown_default = defaults::BREAKER_MIN_CALLS)]
    pub breaker_min_calls: Option<u32>,
    /// Share of failed store calls in the window that opens the breaker, (0, 1]
    #[arg(long, env = "TOLLGATE_BREAKER_FAILURE_RATIO", shown_default = defaults::BREAKER_FAILURE_RATIO)]
    pub breaker_failure_ratio: Option<f64>,
    /// The span over which the breaker counts failures, ms
    #[arg(long, env = "TOLLGATE_BREAKER_WINDOW_MS", shown_default = defaults::BREAKER_WINDOW.as_millis())]
    pub breaker_window_ms: Option<u64>,
    /// First breaker cooldown before a probe, ms
    #[arg(long, env = "TOLLGATE_BREAKER_COOLDOWN_MS", shown_default = defaults::BREAKER_COOLDOWN.as_millis())]
    pub breaker_cooldown_ms: Option<u64>,
    /// Longest breaker cooldown, ms
    #[arg(long, env = "TOLLGATE_BREAKER_MAX_COOLDOWN_MS", shown_default = defaults::BREAKER_MAX_COOLDOWN.as_millis())]
    pub breaker_max_cooldown_ms: Option<u64>,
    /// In-memory store: most memory its keys hold, MiB; past it, the rule holding the most
    /// loses its soonest-expiring keys
    #[arg(long, env = "TOLLGATE_MEMORY_MAX_MB", shown_default = defaults::MEMORY_MAX_BYTES >> 20)]
    pub memory_max_mb: Option<usize>,
    /// Log format: text or json
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", shown_default = defaults::LOG_FORMAT)]
    pub log_format: Option<String>,
    /// OpenTelemetry collector for traces, OTLP over gRPC (http://host:4317); unset: no traces
    #[arg(long, env = "TOLLGATE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Share of the traces started at this node that are exported, 0 to 1 (a caller's
    /// sampled flag is followed)
    #[arg(long, env = "TOLLGATE_TRACE_SAMPLE_RATIO", shown_default = defaults::TRACE_SAMPLE_RATIO)]
    pub trace_sample_ratio: Option<f64>,
    /// How /top-denied shows identities (they may be personal data, or API keys): plain,
    /// truncated or hashed (HMAC under --top-denied-secret)
    #[arg(long, env = "TOLLGATE_TOP_DENIED_IDENTITIES", shown_default = defaults::TOP_DENIED_IDENTITIES)]
    pub top_denied_identities: Option<String>,
    /// Whether a request may set its own limit for a descriptor (Envoy's `limit` override):
    /// allow or refuse. The gRPC port is for trusted gateways only
    #[arg(long, env = "TOLLGATE_DESCRIPTOR_OVERRIDES", shown_default = defaults::DESCRIPTOR_OVERRIDES)]
    pub descriptor_overrides: Option<String>,
    /// The deployment's secret for hashed identities (at least 16 bytes; the same on every node)
    #[arg(long, env = "TOLLGATE_TOP_DENIED_SECRET")]
    pub top_denied_secret: Option<String>,
    /// A bearer token that /top-denied on the HTTP port requires; unset, the HTTP port does not
    /// serve it (the admin API does, to a read token); at least 16 characters
    #[arg(long, env = "TOLLGATE_TOP_DENIED_TOKEN")]
    pub top_denied_token: Option<String>,
    /// Serve POST /json on the HTTP port: Envoy's rate limit request as JSON, decided and
    /// counted like any other (a check you can curl)
    #[arg(long, env = "TOLLGATE_JSON_CHECK", num_args = 0..=1, default_missing_value = "true", shown_default = defaults::JSON_CHECK)]
    pub json_check: Option<bool>,
    /// A bearer token POST /json requires; unset, only callers on this machine (loopback) may
    /// call it: a call counts like a request, and a caller that names someone else's key spends
    /// their limit (and may put them in a penalty box); at least 16 characters
    #[arg(long, env = "TOLLGATE_JSON_CHECK_TOKEN")]
    pub json_check_token: Option<String>,
    /// Send X-RateLimit-Limit, -Remaining and -Reset in Envoy's answers (gRPC and POST /json)
    /// beside RateLimit and RateLimit-Policy; false where Envoy builds them itself
    /// (enable_x_ratelimit_headers: DRAFT_VERSION_03), which would send them twice
    #[arg(long, env = "TOLLGATE_X_RATELIMIT_HEADERS", num_args = 0..=1, default_missing_value = "true", shown_default = defaults::X_RATELIMIT_HEADERS)]
    pub x_ratelimit_headers: Option<bool>,
    /// Memory the node's RLQS buckets may take, MB (each bucket, and each Envoy stream
    /// sharing it, counted with its id's bytes); one stream may take a quarter of it. Reports
    /// of further buckets get no assignment (the Envoy keeps its no-assignment behaviour) and
    /// are counted in tollgate_rlqs_buckets_refused_total; 1 to 4096
    #[arg(long, env = "TOLLGATE_RLQS_MAX_STATE_MB", shown_default = defaults::RLQS_MAX_STATE_MB)]
    pub rlqs_max_state_mb: Option<usize>,
    /// The largest RLQS usage report taken, MB: an Envoy reports every bucket it holds every
    /// 5 s (about 90 bytes a bucket with a 40-byte key); a larger one ends its stream with
    /// RESOURCE_EXHAUSTED; 1 to 64
    #[arg(long, env = "TOLLGATE_RLQS_MAX_REPORT_MB", shown_default = defaults::RLQS_MAX_REPORT_MB)]
    pub rlqs_max_report_mb: Option<usize>,
    /// Threads that run the node; 0 or unset: one per CPU the process may use (its affinity
    /// and cgroup quota), and a single-threaded runtime when that is one; at most 1024
    #[arg(long, env = "TOLLGATE_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// PostgreSQL URL of the rule store (postgres://user@host:5432/db); enables the admin API.
    #[arg(long, env = "TOLLGATE_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Admin API address (loopback only when no token is configured)
    #[arg(long, env = "TOLLGATE_ADMIN_LISTEN", shown_default = defaults::ADMIN_LISTEN)]
    pub admin_listen: Option<SocketAddr>,
    /// Admin tokens allowed to change rules, `name:secret`, comma-separated.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKENS", value_delimiter = ',')]
    #[serde(default, deserialize_with = "one_or_list")]
    pub admin_tokens: Option<Vec<String>>,
    /// Admin tokens allowed to read only, `name:secret`, comma-separated.
    #[arg(long, env = "TOLLGATE_ADMIN_READ_TOKENS", value_delimiter = ',')]
    #[serde(default, deserialize_with = "one_or_list")]
    pub admin_read_tokens: Option<Vec<String>>,
    /// How long an admin client may take to send a request's headers, and then its body, ms
    #[arg(long, env = "TOLLGATE_ADMIN_CLIENT_TIMEOUT_MS", shown_default = defaults::ADMIN_CLIENT_TIMEOUT.as_millis())]
    pub admin_client_timeout_ms: Option<u64>,
    /// Domain of admin-API rules that name none (unset: the node's only domain; such a rule is
    /// refused while the node enforces several); 1 to 64 characters
    #[arg(long, env = "TOLLGATE_DEFAULT_DOMAIN")]
    pub default_domain: Option<String>,
    /// How often the rule store's revision is polled, ms
    #[arg(long, env = "TOLLGATE_RULES_POLL_MS", shown_default = defaults::RULES_POLL.as_millis())]
    pub rules_poll_ms: Option<u64>,
    /// Receive rule changes by LISTEN/NOTIFY (false: polling only)
    #[arg(long, env = "TOLLGATE_RULES_LISTEN", num_args = 0..=1, default_missing_value = "true", shown_default = defaults::RULES_LISTEN)]
    pub rules_listen: Option<bool>,
    /// File keeping the last rule set from PostgreSQL
    #[arg(long, env = "TOLLGATE_RULES_SNAPSHOT", shown_default = defaults::RULES_SNAPSHOT)]
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
    /// Where this node serves the region link
    #[arg(long, env = "TOLLGATE_REGION_LISTEN", shown_default = defaults::REGION_LISTEN)]
    pub region_listen: Option<SocketAddr>,
    /// This region's SPLIT share for rules that name none; above 0 and at most 1
    #[arg(long, env = "TOLLGATE_REGION_SHARE", shown_default = defaults::REGION_SHARE)]
    pub region_share: Option<f64>,
    /// How often consumption is shipped to the peer region, ms; at least 1
    #[arg(long, env = "TOLLGATE_REGION_SYNC_INTERVAL_MS", shown_default = defaults::REGION_SYNC_INTERVAL.as_millis())]
    pub region_sync_interval_ms: Option<u64>,
    /// How often the peer region is probed, ms; at least 1
    #[arg(long, env = "TOLLGATE_REGION_HEARTBEAT_MS", shown_default = defaults::REGION_HEARTBEAT.as_millis())]
    pub region_heartbeat_ms: Option<u64>,
    /// The peer counts as down after this long unreachable, ms; at least 1
    #[arg(long, env = "TOLLGATE_REGION_FAILOVER_AFTER_MS", shown_default = defaults::REGION_FAILOVER_AFTER.as_millis())]
    pub region_failover_after_ms: Option<u64>,
    /// The peer counts as back after this long reachable without a failure, ms; at least 1
    #[arg(long, env = "TOLLGATE_REGION_FAILBACK_AFTER_MS", shown_default = defaults::REGION_FAILBACK_AFTER.as_millis())]
    pub region_failback_after_ms: Option<u64>,
    /// How long a HOME_REGION decision waits for the home region, ms; at least 1
    #[arg(long, env = "TOLLGATE_REGION_FORWARD_DEADLINE_MS", shown_default = defaults::REGION_FORWARD_DEADLINE.as_millis())]
    pub region_forward_deadline_ms: Option<u64>,
    /// TLS certificate chain (PEM): with --tls-key, every listener (gRPC, HTTP, admin, region
    /// link) serves TLS only, and the region link presents it to a peer that asks for one.
    #[arg(long, env = "TOLLGATE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM).
    #[arg(long, env = "TOLLGATE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// How often the TLS files are looked at; a changed set is loaded without a restart, ms
    #[arg(long, env = "TOLLGATE_TLS_RELOAD_MS", shown_default = defaults::TLS_RELOAD.as_millis())]
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
            envoy_fail_mode,
            redis_url,
            redis_cluster,
            redis_batch_max,
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
            json_check,
            json_check_token,
            x_ratelimit_headers,
            rlqs_max_state_mb,
            rlqs_max_report_mb,
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

    /// Reads a settings file: every setting on its own, so that each unknown setting (with
    /// the one it likely meant) and each value of the wrong type is said, all in one run. Only
    /// a YAML syntax error stops the file.
    pub fn from_file(path: &Path) -> Result<Settings, ConfigErrors> {
        match Settings::read_file(path) {
            (settings, errors) if errors.is_empty() => Ok(settings),
            (_, errors) => Err(ConfigErrors(errors)),
        }
    }

    /// Reads a settings file: the settings that read, and every one that does not.
    pub fn read_file(path: &Path) -> (Settings, Vec<ConfigError>) {
        match Settings::read_file_fields(path) {
            Ok((settings, errors)) => (settings, errors),
            Err(e) => (Settings::default(), e.0),
        }
    }

    fn read_file_fields(path: &Path) -> Result<(Settings, Vec<ConfigError>), ConfigErrors> {
        let whole = |reason: String| {
            ConfigErrors::from(bad("config", format!("{}: {reason}", path.display())))
        };
        let text = std::fs::read_to_string(path).map_err(|e| whole(e.to_string()))?;
        if text.trim().is_empty() {
            return Ok((Settings::default(), vec![]));
        }
        let top: yaml_serde::Value =
            yaml_serde::from_str(&text).map_err(|e| whole(e.to_string()))?;
        let yaml_serde::Value::Mapping(fields) = top else {
            return Err(whole("a settings file is a mapping of settings".into()));
        };
        let mut readable = yaml_serde::Mapping::new();
        let mut errors = vec![];
        for (key, value) in fields {
            let name = key
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| format!("{key:?}"));
            let mut alone = yaml_serde::Mapping::new();
            alone.insert(key.clone(), value.clone());
            match yaml_serde::from_value::<Settings>(yaml_serde::Value::Mapping(alone)) {
                Ok(_) => {
                    readable.insert(key, value);
                }
                Err(e) => {
                    let message = e.to_string();
                    let reason = match likely_setting(&name, &message) {
                        Some(meant) => format!("unknown setting; did you mean `{meant}`?"),
                        None => message,
                    };
                    errors.push(bad(&name, format!("{}: {reason}", path.display())));
                }
            }
        }
        let settings: Settings = yaml_serde::from_value(yaml_serde::Value::Mapping(readable))
            .map_err(|e| whole(e.to_string()))?;
        Ok((settings, errors))
    }
}

impl Settings {
    /// The settings without `field` (its default then), or None when it is not set: what
    /// the next reading is checked with, so that a bad value does not hide another's.
    pub(super) fn without(&self, field: &str) -> Option<Settings> {
        let yaml_serde::Value::Mapping(mut map) = yaml_serde::to_value(self).ok()? else {
            return None;
        };
        let old = map.remove(field)?;
        if old.is_null() {
            return None;
        }
        yaml_serde::from_value(yaml_serde::Value::Mapping(map)).ok()
    }
}

/// A list setting in a settings file: a YAML list, or a comma-separated string as the flag
/// and the environment take it (`rules: a.yaml,b.yaml`).
fn one_or_list<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: From<String>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrList {
        One(String),
        List(Vec<String>),
    }
    Ok(
        Option::<OneOrList>::deserialize(deserializer)?.map(|given| {
            let items: Vec<String> = match given {
                OneOrList::One(text) => text
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
                OneOrList::List(items) => items,
            };
            items.into_iter().map(T::from).collect()
        }),
    )
}

/// The setting an unknown one most likely meant, read from serde's list of the known ones.
fn likely_setting(unknown: &str, message: &str) -> Option<String> {
    let known = message.split("expected one of ").nth(1)?;
    known
        .split(", ")
        .map(|k| k.trim().trim_matches('`').to_owned())
        .map(|k| (strsim::levenshtein(unknown, &k), k))
        .filter(|(distance, k)| *distance <= 2.max(k.len() / 5))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

/// Every setting at fault, in the order they were found (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The first of them.
    pub fn first(&self) -> &ConfigError {
        &self.0[0]
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&lines.join("\n"))
    }
}

impl std::error::Error for ConfigErrors {}

/// A setting that is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting `{field}`: {reason}")]
pub struct ConfigError {
    /// The setting (snake_case, as in the file).
    pub field: String,
    /// Why.
    pub reason: String,
}

/// The setting `field` is refused, for `reason`.
pub(super) fn bad(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}
