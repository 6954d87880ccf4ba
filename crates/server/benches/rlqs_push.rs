//! RLQS push latency on a node process's own port: how long from an Envoy's first report of a
//! bucket to its assignment (one store draw and a push), and from a second Envoy's first
//! report of a bucket to the first Envoy's lowered share (the decrease pushed before the
//! newcomer's assignment), on the in-memory store and on a real Redis. Rule: token bucket
//! 100 + 20/s per key (deploy/rules/rlqs.yaml's).
//!
//! `cargo bench -p tollgate-server --bench rlqs_push` (`BENCH_SAMPLES`, default 200).

#[path = "../tests/support/rlqs_stream.rs"]
#[allow(dead_code, unreachable_pub)]
mod rlqs_stream;

use std::time::Duration;

use rlqs_stream::{Stream, key};
use tokio::time::Instant;
use tollgate_server::config::{Config, Settings};

const RULES: &str = "domain: public-api\nrules:\n  - {id: per-key, match: {name: per-key, api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 20}\n";
const WITHIN: Duration = Duration::from_secs(5);

fn percentiles(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    println!(
        "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
        ms.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        ms[ms.len() - 1]
    );
}

async fn measure(store: &str, redis: Option<String>, samples: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let config = Config::try_from(Settings {
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        rules: Some(vec![rules]),
        redis_url: redis.map(|u| vec![u]),
        ..Settings::default()
    })
    .expect("config");
    let mut serving = tollgate_server::app::App::start(config)
        .await
        .expect("node")
        .spawn();
    let grpc = serving.grpc_addr;
    let warm = key("warm");
    let mut first = Stream::open(grpc, "public-api", &[(&warm, 1, 0)]).await;
    first.next_rate(&warm, WITHIN).await;
    let mut assign = Vec::with_capacity(samples);
    let mut lower = Vec::with_capacity(samples);
    for i in 0..samples {
        let id = key(&format!("k{i}"));
        let t = Instant::now();
        first.report("public-api", &[(&id, 1, 0)]).await;
        let whole = first.next_rate(&id, WITHIN).await;
        assign.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let mut second = Stream::open(grpc, "public-api", &[(&id, 1, 0)]).await;
        let lowered = first.next_rate(&id, WITHIN).await;
        lower.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(lowered < whole, "{lowered} < {whole}");
        second.next_rate(&id, WITHIN).await;
        drop(second);
    }
    percentiles(&format!("{store}: first report to assignment"), assign);
    percentiles(
        &format!("{store}: second Envoy's report to the first's lowered share"),
        lower,
    );
    drop(first);
    serving.stop().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let samples: usize = std::env::var("BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
        .max(1);
    println!("| store: what | samples | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    measure("in-memory", None, samples).await;
    let redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server");
    measure("Redis", Some(redis.url()), samples).await;
}
