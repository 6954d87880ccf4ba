//! Many keys on Redis, in one run: the node over gRPC with keys drawn uniformly and by Zipf
//! from a million (most decisions need the store), beside the lease store's own check driven
//! directly at the same concurrency (64 in flight) over the same million keys, each with store
//! calls batched per shard and without (the direct check without batching is the baseline). Reports
//! throughput, the ratio to the direct check, what the node held (key actors, RSS) and its RSS
//! per key it decided.
//!
//! `cargo bench -p tollgate-server --bench many_keys` (starts its own `redis-server`; builds
//! `tollgate-loadgen` if it is not beside `tollgate`). `BENCH_SECONDS` sets each run
//! (default 15).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use tollgate_lease::{
    BatchConfig, BucketKey, CheckRequest, LeaseStore, Limit, RedisConfig, RedisStore,
};
use tollgate_testkit::RedisServer;
use tollgate_testkit::process::{KilledOnDrop, free_port, loadgen_beside, wait_for};

const RULES: &str = "domain: rl\nrules:\n  - {id: per-address, match: {remote_address: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000000000000, refillPerSecond: 1000000000}\n";
const KEYS: u64 = 1_000_000;
const IN_FLIGHT: usize = 64;
/// The low load whose latency batching must not change, requests/s.
const LOW_RATE: u32 = 1_000;

fn rss_kib(pid: u32) -> u64 {
    tollgate_testkit::process::rss_bytes(pid).unwrap_or(0) / 1024
}

fn metric(http: u16, name: &str) -> f64 {
    tollgate_testkit::http::get(http, "/metrics", &[])
        .map(|r| tollgate_testkit::http::metric_sum(&r.body, name, ""))
        .unwrap_or(0.0)
}

/// What a row's store calls do: batched per shard under load (the default), or each alone.
#[derive(Clone, Copy)]
enum Batching {
    On,
    Off,
}

impl Batching {
    fn max_batch(self) -> usize {
        match self {
            Batching::On => BatchConfig::default().max_batch,
            Batching::Off => 1,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Batching::On => "batching on",
            Batching::Off => "batching off",
        }
    }
}

/// The node over gRPC: requests/s, and what it held (its ratio to `direct`, the direct check
/// with batching off).
fn grpc_row(
    keys: &str,
    batching: Batching,
    redis: &RedisServer,
    rules: &Path,
    secs: u64,
    direct: f64,
    rate: Option<u32>,
) {
    let redis_url = &redis.url();
    let (grpc, http) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let node = KilledOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("--rules")
            .arg(rules)
            .args(["--redis-url", redis_url])
            .args(["--redis-batch-max", &batching.max_batch().to_string()])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(["--http-listen", &format!("127.0.0.1:{http}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tollgate"),
    );
    wait_for("the node", Duration::from_secs(30), || {
        tollgate_testkit::http::get(http, "/readyz", &[])
            .ok()
            .filter(|r| r.status == 200)
            .map(|_| ())
    })
    .expect("ready");
    let idle = rss_kib(node.0.id());
    let json = rules.with_file_name(format!("{}.json", keys.replace(':', "-")));
    let loadgen = loadgen_beside(Path::new(env!("CARGO_BIN_EXE_tollgate"))).expect("loadgen");
    let (cpu_before, decided_before) = (
        redis_cpu_us(redis),
        metric(http, "tollgate_decisions_total"),
    );
    let status = Command::new(loadgen)
        .args(["run", "--target", &format!("http://127.0.0.1:{grpc}")])
        .args(["--keys", keys, "--connections", "8", "--streams", "8"])
        .args(rate.map(|r| format!("--rate={r}")))
        .args([
            "--duration",
            &format!("{secs}s"),
            "--warmup",
            "1s",
            "--quiet",
        ])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .status()
        .expect("loadgen");
    assert!(status.success(), "loadgen failed");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("json");
    let rss = rss_kib(node.0.id());
    let decided = metric(http, "tollgate_decisions_total");
    let redis_cpu = (redis_cpu_us(redis) - cpu_before) / (decided - decided_before).max(1.0);
    let actors = metric(http, "tollgate_key_actors ");
    let failed_open = tollgate_testkit::http::get(http, "/metrics", &[])
        .map(|r| {
            tollgate_testkit::http::metric_sum(
                &r.body,
                "tollgate_decisions_total",
                "outcome=\"failed_open\"",
            )
        })
        .unwrap_or(0.0);
    // Distinct keys decided: drawn with replacement, so fewer than the decisions (expected).
    let distinct = distinct_keys(keys, decided);
    let batches = metric(http, "tollgate_store_batches_total");
    let batched = metric(http, "tollgate_store_batched_requests_total");
    let throughput = report["throughput"].as_f64().unwrap_or(0.0);
    println!(
        "| gRPC, {keys}{}, {} | {throughput:.0} | {:.2} | {:.1} | {redis_cpu:.1} µs | {:.0} µs | {:.0} µs | {:.0} | {actors:.0} | {:.0} MB → {:.0} MB | {:.0} B |",
        rate.map(|r| format!(" at {r}/s")).unwrap_or_default(),
        batching.label(),
        throughput / direct,
        if batches > 0.0 {
            batched / batches
        } else {
            1.0
        },
        report["p50_us"].as_f64().unwrap_or(0.0),
        report["p99_us"].as_f64().unwrap_or(0.0),
        failed_open,
        idle as f64 / 1024.0,
        rss as f64 / 1024.0,
        (rss.saturating_sub(idle) as f64 * 1024.0) / distinct.max(1.0),
    );
}

/// The CPU time Redis has used so far, µs (`INFO cpu`: user and system).
fn redis_cpu_us(redis: &RedisServer) -> f64 {
    let info = redis.cli(&["INFO", "cpu"]).unwrap_or_default();
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| matches!(*name, "used_cpu_user" | "used_cpu_sys"))
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum::<f64>()
        * 1e6
}

/// The expected number of distinct keys among `draws` draws (with replacement) from the
/// distribution, in closed form for uniform and summed over the ranks for Zipf (s = 1, the
/// load generator's default); the RSS figure is per expected distinct key.
fn distinct_keys(keys: &str, draws: f64) -> f64 {
    let n = KEYS as f64;
    if keys.starts_with("uniform") {
        n * (1.0 - (-draws / n).exp())
    } else {
        // Zipf(1): P(key k) = 1/(k H_n); expected distinct = Σ 1 - (1 - p_k)^draws.
        let h: f64 = (1..=KEYS).map(|k| 1.0 / k as f64).sum();
        (1..=KEYS)
            .map(|k| 1.0 - (1.0 - 1.0 / (k as f64 * h)).powf(draws))
            .sum()
    }
}

/// The store's own check, 64 in flight, uniform over the same million keys: with batching
/// off, the baseline (one script call per check, as a client of Redis would make it).
fn direct_row(batching: Batching, redis: &RedisServer, secs: u64, baseline: Option<f64>) -> f64 {
    let redis_url = &redis.url();
    let cpu_before = redis_cpu_us(redis);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let config = RedisConfig {
            batch: BatchConfig {
                max_batch: batching.max_batch(),
                ..BatchConfig::default()
            },
            ..RedisConfig::single(redis_url)
        };
        let store = Arc::new(RedisStore::open(&config).expect("redis store"));
        let limit = Limit::token_bucket(1_000_000_000_000, 1e9).expect("limit");
        let done = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let tasks: Vec<_> = (0..IN_FLIGHT)
            .map(|t| {
                let (store, done, calls) = (store.clone(), done.clone(), calls.clone());
                tokio::spawn(async move {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                    while !done.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let identity = format!("10.{}", x % KEYS);
                        let key = BucketKey::new(identity.as_bytes(), "per-address").expect("key");
                        let req = CheckRequest::single(key, limit, 1).expect("request");
                        if store.check(&req).await.is_ok() {
                            calls.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        done.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        let calls = calls.load(Ordering::Relaxed) as f64;
        let rate = calls / start.elapsed().as_secs_f64();
        let redis_cpu = (redis_cpu_us(redis) - cpu_before) / calls.max(1.0);
        let size = store
            .batch_counts()
            .filter(|c| c.batches > 0)
            .map_or(1.0, |c| c.batched_requests as f64 / c.batches as f64);
        println!(
            "| lease store check, driven directly, uniform:1000000, {} | {rate:.0} | {:.2} | {size:.1} | {redis_cpu:.1} µs | | | | | | |",
            batching.label(),
            rate / baseline.unwrap_or(rate)
        );
        rate
    })
}

fn main() {
    let secs: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let redis = RedisServer::start().expect("redis-server");
    println!(
        "| what (64 in flight) | decisions/s | vs direct check | mean batch | Redis CPU per decision | p50 | p99 | failed open | key actors | node RSS idle → after | RSS per distinct key |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let direct = direct_row(Batching::Off, &redis, secs, None);
    direct_row(Batching::On, &redis, secs, Some(direct));
    for keys in ["uniform:1000000", "zipf:1000000"] {
        for batching in [Batching::Off, Batching::On] {
            grpc_row(keys, batching, &redis, &rules, secs, direct, None);
        }
    }
    // At low load a call finds nothing in flight and goes alone: latency must not move.
    for batching in [Batching::Off, Batching::On] {
        grpc_row(
            "uniform:1000000",
            batching,
            &redis,
            &rules,
            secs,
            direct,
            Some(LOW_RATE),
        );
    }
    println!(
        "\n(the direct check reached {direct:.0}/s; the node's figures are over gRPC, with the load generator on the same machine)"
    );
}
