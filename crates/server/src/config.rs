//! The binary's settings: a YAML file (`--config`), `TOLLGATE_*` environment variables and
//! flags, in rising precedence. `tollgate --help` lists every one.
//!
//! - `settings`: every setting as given ([`Settings`]), flags merged over the file.
//! - [`defaults`]: every default, named once.
//! - one file per area reads its settings into the node's: `store`, `lease`, `telemetry`,
//!   `access`, `breaker`, `control`, `tls`, `region`; [`Config`] gathers them.

pub mod defaults;

mod access;
mod breaker;
mod control;
mod lease;
mod region;
mod settings;
mod store;
mod telemetry;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tollgate_lease::RedisConfig;
use tollgate_node::headers::XRateLimitHeaders;
use tollgate_node::rules::EnvoyFailModes;
use tollgate_node::runtime::RuntimeConfig;

pub use control::ControlConfig;
pub use region::RegionSettings;
pub use settings::{ConfigError, ConfigErrors, Settings};
pub use tls::TlsSettings;

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
    /// Validate rule files, and move rule sets between files and PostgreSQL.
    Rules {
        /// What to do.
        #[command(subcommand)]
        action: RulesCommand,
    },
    /// Ask a running node whether a request may pass, over gRPC (Envoy's ShouldRateLimit, as
    /// a gateway asks it: the check counts like a request): the decision, each descriptor's
    /// status and the headers a client would get. Exit code 0 when admitted, 1 when over the
    /// limit, 2 when the node cannot be asked.
    ///
    /// Example: tollgate check --domain public-api api_key=k_123
    Check(crate::check_client::CheckArgs),
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
        #[arg(long, default_value = defaults::IMPORT_ACTOR)]
        actor: String,
        /// Delete the stored rules the files do not name.
        #[arg(long)]
        prune: bool,
        /// Domain of rules that name none.
        #[arg(long, env = "TOLLGATE_DEFAULT_DOMAIN", default_value = defaults::DEFAULT_DOMAIN)]
        default_domain: String,
        /// Rule files or directories.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Check rule files of either format (as a node would load them, all together) without a
    /// database or a running node: every error with its file, line and field, exit code 0
    /// when valid, 2 otherwise (for CI). Empty files and subfolders (which are not read) are
    /// named; with --strict they fail the check too.
    Validate {
        /// Empty files and subfolders of the directories given fail the check.
        #[arg(long)]
        strict: bool,
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
    /// The fail mode of envoyproxy/ratelimit-format domains (the format has no field for it).
    pub envoy_fail_modes: EnvoyFailModes,
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
    /// Whether the HTTP port serves `POST /json`.
    pub json_check: bool,
    /// The bearer token `POST /json` requires (None: loopback callers only).
    pub json_check_token: Option<String>,
    /// Whether Envoy's answers carry the X-RateLimit trio beside the IETF headers.
    pub x_ratelimit_headers: XRateLimitHeaders,
    /// How RLQS quotas are shared.
    pub rlqs: crate::rlqs::RlqsConfig,
}

/// The most memory `rlqs_max_state_mb` may give RLQS buckets, MB (each holds a little state and
/// a task that ticks four times a second).
pub const MAX_RLQS_STATE_MB: usize = 4096;
/// The largest report `rlqs_max_report_mb` may allow, MB.
pub const MAX_RLQS_REPORT_MB: usize = 64;

/// The CPUs this process may use: its CPU affinity and its cgroup's CPU quota (a Kubernetes
/// CPU limit) both count; at least 1.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

impl TryFrom<Settings> for Config {
    type Error = ConfigErrors;

    /// Every setting at fault, in one run: each area is read even when another failed, and a
    /// setting found bad is read again at its default, so that it hides no other in its area.
    fn try_from(s: Settings) -> Result<Config, ConfigErrors> {
        let mut settings = s;
        let mut errors: Vec<ConfigError> = vec![];
        loop {
            match Config::read(&settings) {
                Ok(config) if errors.is_empty() => return Ok(config),
                Ok(_) => return Err(ConfigErrors(errors)),
                Err(ConfigErrors(found)) => {
                    let mut next = None;
                    for e in found {
                        if next.is_none() {
                            next = settings.without(&e.field);
                        }
                        if !errors.contains(&e) {
                            errors.push(e);
                        }
                    }
                    match next {
                        Some(next) => settings = next,
                        None => return Err(ConfigErrors(errors)),
                    }
                }
            }
        }
    }
}

impl Config {
    /// One reading of the settings: the first bad setting of each area.
    fn read(s: &Settings) -> Result<Config, ConfigErrors> {
        let mut errors = vec![];
        fn take<T>(errors: &mut Vec<ConfigError>, read: Result<T, ConfigError>) -> Option<T> {
            read.map_err(|e| errors.push(e)).ok()
        }
        let store = take(&mut errors, store::parse(s));
        let lease = take(&mut errors, lease::parse(s));
        let telemetry = take(&mut errors, telemetry::parse(s));
        let access = take(&mut errors, access::parse(s));
        let store_timeout = store
            .as_ref()
            .map_or(defaults::STORE_TIMEOUT, |s| s.timeout);
        let breaker = take(&mut errors, breaker::parse(s, store_timeout));
        let control = take(&mut errors, control::parse(s));
        let tls = take(&mut errors, tls::parse(s));
        let region = take(
            &mut errors,
            region::parse(s, tls.as_ref().and_then(Option::as_ref)),
        );
        let envoy_fail_modes = take(
            &mut errors,
            EnvoyFailModes::parse(
                s.envoy_fail_mode
                    .as_deref()
                    .unwrap_or(defaults::ENVOY_FAIL_MODE),
            )
            .map_err(|reason| settings::bad("envoy_fail_mode", reason.to_string())),
        );
        let rlqs_max_state_mb = s.rlqs_max_state_mb.unwrap_or(defaults::RLQS_MAX_STATE_MB);
        if !(1..=MAX_RLQS_STATE_MB).contains(&rlqs_max_state_mb) {
            errors.push(settings::bad(
                "rlqs_max_state_mb",
                format!("must be between 1 and {MAX_RLQS_STATE_MB}"),
            ));
        }
        let rlqs_max_report_mb = s.rlqs_max_report_mb.unwrap_or(defaults::RLQS_MAX_REPORT_MB);
        if !(1..=MAX_RLQS_REPORT_MB).contains(&rlqs_max_report_mb) {
            errors.push(settings::bad(
                "rlqs_max_report_mb",
                format!("must be between 1 and {MAX_RLQS_REPORT_MB}"),
            ));
        }
        let worker_threads = match s.worker_threads {
            None | Some(0) => available_cpus(),
            Some(n) if n > 1024 => {
                errors.push(settings::bad("worker_threads", "must be at most 1024"));
                1
            }
            Some(n) => n,
        };
        let (
            Some(store),
            Some(lease),
            Some(telemetry),
            Some(access),
            Some(breaker),
            Some(control),
            Some(tls),
            Some(region),
            Some(envoy_fail_modes),
        ) = (
            store,
            lease,
            telemetry,
            access,
            breaker,
            control,
            tls,
            region,
            envoy_fail_modes,
        )
        else {
            return Err(ConfigErrors(errors));
        };
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        Ok(Config {
            grpc_listen: s.grpc_listen.unwrap_or(defaults::GRPC_LISTEN),
            http_listen: s.http_listen.unwrap_or(defaults::HTTP_LISTEN),
            probe_listen: s.probe_listen,
            rules: s.rules.clone().unwrap_or_default(),
            rules_reload: s
                .rules_reload_ms
                .map_or(defaults::RULES_RELOAD, Duration::from_millis)
                .max(Duration::from_millis(10)),
            envoy_fail_modes,
            redis: store.redis,
            memory_max_bytes: store.memory_max_bytes,
            store_timeout: store.timeout,
            runtime: RuntimeConfig {
                lease: lease.policy,
                prelimit_factor: lease.prelimit_factor,
                breaker: breaker.config,
                store_patience: breaker.patience,
                startup_patience: breaker.startup_patience,
                store_heartbeat: RuntimeConfig::default().store_heartbeat,
                cluster_nodes: lease.cluster_nodes,
                max_key_state_bytes: lease.max_key_state_bytes,
                idle_timeout: lease.idle_timeout,
                seed: None,
                top_denied: access.top_denied,
                descriptor_overrides: access.descriptor_overrides,
            },
            log_json: telemetry.log_json,
            traces: telemetry.traces,
            worker_threads,
            control,
            region,
            tls,
            top_denied_token: access.top_denied_token,
            json_check: access.json_check,
            json_check_token: access.json_check_token,
            x_ratelimit_headers: if s
                .x_ratelimit_headers
                .unwrap_or(defaults::X_RATELIMIT_HEADERS)
            {
                XRateLimitHeaders::Send
            } else {
                XRateLimitHeaders::Omit
            },
            rlqs: crate::rlqs::RlqsConfig {
                max_state_bytes: rlqs_max_state_mb << 20,
                max_report_bytes: rlqs_max_report_mb << 20,
                ..crate::rlqs::RlqsConfig::default()
            },
        })
    }
}

impl Cli {
    /// Flags and environment over the file over defaults.
    pub fn resolve(self) -> Result<Config, ConfigErrors> {
        // A file's unreadable settings and the bad values of the rest: all in one run.
        let (file, mut errors) = match &self.config {
            Some(path) => Settings::read_file(path),
            None => (Settings::default(), vec![]),
        };
        match Config::try_from(self.settings.or(file)) {
            Ok(config) if errors.is_empty() => Ok(config),
            Ok(_) => Err(ConfigErrors(errors)),
            Err(more) => {
                errors.extend(more.0);
                Err(ConfigErrors(errors))
            }
        }
    }
}

#[cfg(test)]
mod tests;
