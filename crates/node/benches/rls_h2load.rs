//! gRPC Envoy RLS throughput on loopback, driven by h2load with a real `ShouldRateLimit`
//! request body: the `tollgate` binary pinned to core 0, h2load (and Redis) on core 1.
//!
//! `cargo bench -p tollgate-node --bench rls_h2load` (needs `h2load` from nghttp2-client and
//! `taskset` from util-linux). `BENCH_SECONDS` sets each run's length (default 10).

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use prost::Message;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_testkit::RedisServer;
use tollgate_testkit::process::{free_port, wait_for};

const RULES: &str = "domain: rl\nrules:\n  - {id: per-address, match: {remote_address: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000000000000, refillPerSecond: 1000000000}\n";

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

fn grpc_body() -> Vec<u8> {
    let request = RateLimitRequest {
        domain: "rl".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "10.1.2.3".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let message = request.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed
}

fn run(
    name: &str,
    redis: Option<&str>,
    extra: &[&str],
    body: &std::path::Path,
    rules: &std::path::Path,
    secs: u64,
) {
    let (grpc, http) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "0", env!("CARGO_BIN_EXE_tollgate"), "--rules"])
        .arg(rules)
        .args([
            "--grpc-listen",
            &format!("127.0.0.1:{grpc}"),
            "--http-listen",
            &format!("127.0.0.1:{http}"),
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(url) = redis {
        cmd.args(["--redis-url", url, "--store-timeout-ms", "50"]);
    }
    let _node = Node(cmd.spawn().expect("start tollgate"));
    wait_for("the node", Duration::from_secs(30), || {
        tollgate_testkit::http::get(http, "/readyz", &[])
            .ok()
            .filter(|r| r.status == 200)
            .map(|_| ())
    })
    .expect("node ready");
    let url = format!(
        "http://127.0.0.1:{grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    let h2load = |extra: &[&str]| {
        let out = Command::new("taskset")
            .args(["-c", "1", "h2load", "-c", "8", "-m", "32", "-d"])
            .arg(body)
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
            .args(extra)
            .arg(&url)
            .output()
            .expect("h2load");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    h2load(&["-n", "50000"]);
    let out = h2load(&["-D", &secs.to_string()]);
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let rps = line("finished in")
        .split(", ")
        .nth(1)
        .unwrap_or("?")
        .to_owned();
    let requests = line("requests:");
    let latency = line("time for request:");
    let metrics = tollgate_testkit::http::get(http, "/metrics", &[])
        .expect("metrics")
        .body;
    let allowed = metrics
        .lines()
        .find(|l| {
            l.starts_with(
                "tollgate_decisions_total{domain=\"rl\",rule=\"per-address\",outcome=\"allowed\"}",
            )
        })
        .and_then(|l| l.split_whitespace().last())
        .unwrap_or("?")
        .to_owned();
    let calls = metrics
        .lines()
        .find(|l| l.starts_with("tollgate_store_calls_total"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap_or("?")
        .to_owned();
    println!(
        "| {name} | {rps} | {latency} | {requests} | allowed decisions: {allowed}, store calls: {calls} |"
    );
}

fn main() {
    for tool in ["h2load", "taskset"] {
        tollgate_testkit::process::require_binary(
            tool,
            if tool == "h2load" {
                "nghttp2-client"
            } else {
                "util-linux"
            },
        )
        .expect("tool");
    }
    let secs: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().expect("tempdir");
    let body = dir.path().join("request.bin");
    std::fs::File::create(&body)
        .expect("body")
        .write_all(&grpc_body())
        .expect("write");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let redis = RedisServer::start().expect("redis-server");
    let _ = Command::new("taskset")
        .args(["-p", "-c", "1", &redis.pid().expect("pid").to_string()])
        .output();
    println!(
        "| store | requests/s | h2load time for request (min, max, mean, sd, ±sd) | requests | node counters |"
    );
    println!("|---|---:|---|---|---|");
    let redis_url = redis.url();
    run("in-memory", None, &[], &body, &rules, secs);
    run(
        "Redis, leases of up to 50 (default)",
        Some(&redis_url),
        &[],
        &body,
        &rules,
        secs,
    );
    run(
        "Redis, leases of up to 5000",
        Some(&redis_url),
        &["--lease-max-units", "5000"],
        &body,
        &rules,
        secs,
    );
}
