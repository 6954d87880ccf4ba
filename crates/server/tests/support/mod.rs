//! Helpers for the server's integration tests: a whole node process, the admin API, RLQS
//! streams; and the node library's own helpers (`tollgate_node::test_support`).

#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod admin;
pub mod rlqs_stream;

use tollgate_node::Node;
pub use tollgate_node::test_support::{allowed, check, memory_node, node_on, redis_store, rules};

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
