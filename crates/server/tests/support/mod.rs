//! Helpers for the node's integration tests: nodes on the in-memory store or a real Redis,
//! with rules given inline.

#![allow(dead_code, unreachable_pub)]

pub mod admin;
pub mod rlqs_stream;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{
    MemoryConfig, MemoryStore, RedisConfig, RedisStore, SharedClock, Store, TokioClock,
};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::source;
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::{Node, Request, RuntimeConfig, Verdict};

/// Rules from YAML text.
pub fn rules(yaml: &str, metrics: &Arc<Metrics>) -> Arc<ActiveRules> {
    let active = ActiveRules::new(metrics.clone());
    let loaded = source::parse(yaml, Path::new("test-rules.yaml")).expect("valid rules");
    active.install(&loaded).expect("compiles");
    active
}

/// A node on `store` with `yaml` rules, started as the builder and the binary start one: its
/// store warmed up (up to the start-up patience) before it decides anything.
pub async fn node_on(store: Store, yaml: &str, config: RuntimeConfig, clock: SharedClock) -> Node {
    let metrics = Metrics::new();
    let rules = rules(yaml, &metrics);
    // The store budget a Redis store was opened with (as the binary passes
    // `--store-timeout-ms`), else the default.
    let budget = match &store {
        Store::Redis(redis) => redis.call_timeout(),
        _ => RedisConfig::default().call_timeout,
    };
    let node = Node::start(store, rules, config, clock, metrics, budget)
        .await
        .expect("node starts");
    node.warm_up().await;
    node
}

/// A node on its own in-memory store.
pub async fn memory_node(yaml: &str, config: RuntimeConfig) -> (Node, MemoryStore) {
    let clock: SharedClock = Arc::new(TokioClock::new());
    let memory = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    (
        node_on(Store::Memory(memory.clone()), yaml, config, clock).await,
        memory,
    )
}

/// A Redis store with a given call budget.
pub fn redis_store(config: RedisConfig, budget: Duration) -> Store {
    Store::Redis(
        RedisStore::open(&RedisConfig {
            call_timeout: budget,
            ..config
        })
        .expect("redis store"),
    )
}

/// Checks `request` `n` times; how many were allowed.
pub async fn allowed(node: &Node, request: &Request, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        if node.check(request).await.expect("valid request").allowed {
            count += 1;
        }
    }
    count
}

/// One check.
pub async fn check(node: &Node, request: &Request) -> Verdict {
    node.check(request).await.expect("valid request")
}

/// A whole node process (memory store unless `redis` is given) serving on ephemeral ports, with
/// its rules in a temporary file.
pub struct Served {
    pub grpc: std::net::SocketAddr,
    pub http: std::net::SocketAddr,
    pub admin: Option<std::net::SocketAddr>,
    pub node: Node,
    pub rules_file: std::path::PathBuf,
    serving: tollgate_server::app::Serving,
    _dir: tempfile::TempDir,
}

impl Served {
    pub async fn start(yaml: &str, extra: tollgate_server::config::Settings) -> Served {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules_file = dir.path().join("rules.yaml");
        std::fs::write(&rules_file, yaml).expect("write rules");
        let settings = tollgate_server::config::Settings {
            grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
            http_listen: Some("127.0.0.1:0".parse().expect("addr")),
            rules: Some(vec![rules_file.clone()]),
            rules_reload_ms: Some(50),
            rules_snapshot: Some(dir.path().join("snapshot.json")),
            ..Default::default()
        };
        let config = tollgate_server::config::Config::try_from(extra.or(settings)).expect("config");
        let app = tollgate_server::app::App::start(config)
            .await
            .expect("app starts");
        let serving = app.spawn();
        Served {
            grpc: serving.grpc_addr,
            http: serving.http_addr,
            admin: serving.admin_addr,
            node: serving.node.clone(),
            rules_file,
            serving,
            _dir: dir,
        }
    }

    /// Where the plaintext probe port listens, when asked for.
    pub fn serving_probe_addr(&self) -> Option<std::net::SocketAddr> {
        self.serving.probe_addr
    }

    /// Where the region link listens, when the node runs in one of two regions.
    pub fn serving_region_addr(&self) -> Option<std::net::SocketAddr> {
        self.serving.region_addr
    }

    /// Stops the node and waits until it has returned its leases.
    pub async fn stop(&mut self) {
        self.serving.stop().await;
    }

    pub async fn rls(&self) -> tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>{
        tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect")
    }

    pub async fn api(
        &self,
    ) -> tollgate_proto::tollgate::ratelimit::v1::rate_limiter_client::RateLimiterClient<
        tonic::transport::Channel,
    > {
        tollgate_proto::tollgate::ratelimit::v1::rate_limiter_client::RateLimiterClient::connect(
            format!("http://{}", self.grpc),
        )
        .await
        .expect("connect")
    }

    /// GET `path` on the HTTP port: (status, body).
    pub async fn get(&self, path: &str) -> (u16, String) {
        self.get_with(path, &[]).await
    }

    /// `GET path` on the HTTP port with extra header lines (`Name: value`).
    pub async fn get_with(&self, path: &str, headers: &[&str]) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(self.http)
            .await
            .expect("connect");
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: test\r\n{extra}Connection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .expect("write");
        let mut out = String::new();
        stream.read_to_string(&mut out).await.expect("read");
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }
}

/// An RLS request with one descriptor per entry list.
pub fn rls_request(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest {
    use tollgate_proto::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.to_string(),
                        value: v.as_bytes().to_vec(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

impl Served {
    /// A node process following the rule store at `database_url` (rules file: `yaml`).
    pub async fn with_database(
        database_url: &str,
        yaml: &str,
        extra: tollgate_server::config::Settings,
    ) -> Served {
        let settings = tollgate_server::config::Settings {
            database_url: Some(database_url.to_owned()),
            admin_listen: Some("127.0.0.1:0".parse().expect("addr")),
            ..extra
        };
        Served::start(yaml, settings).await
    }

    /// The admin API's port.
    pub fn admin_port(&self) -> u16 {
        self.admin.expect("the admin API runs").port()
    }
}
