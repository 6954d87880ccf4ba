//! A fresh `tollgate` process on a Redis, from outside: started on free ports with a rule
//! file, waited for until its gRPC port accepts (no pause, so load starts the moment it
//! does), read through its `/metrics`. Shared by the cold-start and fidelity scenarios (and
//! their benches, which include those by path).

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_testkit::process::free_port;

/// One `tollgate` process; killed when dropped.
pub struct NodeProcess {
    child: Child,
    pub grpc: u16,
    pub http: u16,
    log: PathBuf,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl NodeProcess {
    /// Starts `binary` on `redis` with `rules` written in `dir`; does not wait for it.
    fn spawn(binary: &Path, redis: &str, dir: &Path, name: &str, rules: &str) -> NodeProcess {
        let text = rules;
        let rules = dir.join("rules.yaml");
        std::fs::write(&rules, text).expect("rules file");
        let (grpc, http) = (
            free_port(false).expect("port"),
            free_port(false).expect("port"),
        );
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(binary)
            .arg("--rules")
            .arg(&rules)
            .args(["--redis-url", redis])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(["--http-listen", &format!("127.0.0.1:{http}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("tollgate starts");
        NodeProcess {
            child,
            grpc,
            http,
            log,
        }
    }

    /// Waits until the gRPC port accepts (no pause between tries: load starts the moment it
    /// does). None if the process exited first (a port taken by another process). The port
    /// is this process's once it has logged that it serves on it: a free port picked by one
    /// test may be taken by another's process meanwhile, which would accept in its stead.
    async fn accepting(&mut self) -> Option<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let serving = format!("grpc=127.0.0.1:{}", self.grpc);
        loop {
            if self.child.try_wait().ok().flatten().is_some() {
                return None;
            }
            if std::fs::read_to_string(&self.log).is_ok_and(|log| log.contains(&serving))
                && tokio::net::TcpStream::connect(("127.0.0.1", self.grpc))
                    .await
                    .is_ok()
            {
                return Some(());
            }
            assert!(
                Instant::now() < deadline,
                "the node never listened: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its `/readyz` body as JSON (null when it does not answer).
    pub fn readyz(&self) -> serde_json::Value {
        tollgate_testkit::http::get(self.http, "/readyz", &[])
            .ok()
            .and_then(|r| serde_json::from_str(&r.body).ok())
            .unwrap_or_default()
    }

    /// Its `/metrics` text (empty when it does not answer).
    pub fn metrics(&self) -> String {
        tollgate_testkit::http::get(self.http, "/metrics", &[])
            .map(|r| r.body)
            .unwrap_or_default()
    }
}

/// The sum of every sample of `name` whose labels contain `labels`.
pub fn metric(text: &str, name: &str, labels: &str) -> u64 {
    tollgate_testkit::http::metric_sum(text, name, labels) as u64
}

/// A `ShouldRateLimit` request in domain `api` with one descriptor: `kind` and `key: value`.
pub fn request(kind: &str, key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "kind".into(),
                    value: kind.into(),
                },
                Entry {
                    key: key.into(),
                    value: value.into(),
                },
            ],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Starts a node that listens (another port when the first was taken meanwhile).
pub async fn started(
    binary: &Path,
    redis: &str,
    dir: &Path,
    name: &str,
    rules: &str,
) -> NodeProcess {
    for _ in 0..5 {
        let mut node = NodeProcess::spawn(binary, redis, dir, name, rules);
        if node.accepting().await.is_some() {
            return node;
        }
    }
    panic!("the node did not start: its ports were taken five times");
}
