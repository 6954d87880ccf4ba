//! The README's capacity-planning run, as a user runs it: one `tollgate` process on a fresh
//! `redis-server` with the example rules, and `tollgate-loadgen` in a closed loop (8
//! connections × 32 streams) over a million API keys drawn by Zipf, all on this machine. Besides
//! the load generator's throughput and latency, it reads the node's `/metrics` after the run
//! and reports what the table must not hide: how many decisions were made without the store
//! (failed open, or on a share of its last answer), how many store calls stalled, and how often
//! the breaker opened. A node saturated by its own load must not fail open (target: under 1 %
//! of decisions, no breaker opening).
//!
//! `cargo bench -p tollgate-server --bench capacity_planning` (builds `tollgate-loadgen` if it is
//! not beside `tollgate`). `BENCH_SECONDS` sets the measured run (default 30; 5 s of warm-up
//! before it); `BENCH_RUNS` the number of runs (default 3).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tollgate_testkit::RedisServer;
use tollgate_testkit::http::metric_sum as metric;
use tollgate_testkit::process::{KilledOnDrop, env_or, free_port, loadgen_beside, wait_for};

fn run(secs: u64) -> String {
    let redis = RedisServer::start().expect("redis-server");
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/rules/example.yaml");
    let (grpc, http) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let node = KilledOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("--rules")
            .arg(&rules)
            .args(["--redis-url", &redis.url()])
            .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
            .args(["--http-listen", &format!("127.0.0.1:{http}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tollgate"),
    );
    wait_for("the node", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", grpc)).ok()
    })
    .expect("listening");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("node.json");
    let loadgen = loadgen_beside(Path::new(env!("CARGO_BIN_EXE_tollgate"))).expect("loadgen");
    let status = Command::new(loadgen)
        .args(["run", "--target", &format!("http://127.0.0.1:{grpc}")])
        .args(["--domain", "public-api", "--key", "api_key"])
        .args([
            "--keys",
            "zipf:1000000",
            "--connections",
            "8",
            "--streams",
            "32",
        ])
        .args([
            "--duration",
            &format!("{secs}s"),
            "--warmup",
            "5s",
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
    let text = tollgate_testkit::http::get(http, "/metrics", &[])
        .expect("metrics")
        .body;
    drop(node);
    let decisions = metric(&text, "tollgate_decisions_total", "");
    let failed_open = metric(&text, "tollgate_decisions_total", "outcome=\"failed_open\"");
    let on_share = metric(&text, "tollgate_slow_store_decisions_total", "");
    let stalls = metric(&text, "tollgate_store_stalls_total", "");
    let past_patience = metric(
        &text,
        "tollgate_store_failures_total",
        "failure=\"timeout\"",
    );
    let opened = metric(&text, "tollgate_breaker_opened_total", "");
    format!(
        "| {:.0} | {:.1} ms | {:.1} ms | {decisions:.0} | {failed_open:.0} ({:.3} %) | {on_share:.0} | {stalls:.0} | {past_patience:.0} | {opened:.0} |",
        report["throughput"].as_f64().unwrap_or(0.0),
        report["p50_us"].as_f64().unwrap_or(0.0) / 1000.0,
        report["p99_us"].as_f64().unwrap_or(0.0) / 1000.0,
        100.0 * failed_open / decisions.max(1.0),
    )
}

fn main() {
    let (secs, runs) = (env_or("BENCH_SECONDS", 30), env_or("BENCH_RUNS", 3));
    println!(
        "capacity planning: one node on Redis, loadgen zipf:1000000, 8 x 32 closed loop, {secs} s \
         after 5 s of warm-up, on this machine"
    );
    println!(
        "| req/s | p50 | p99 | decisions (node) | failed open | on a share of a last answer | store stalls | calls past the patience | breaker opened |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for _ in 0..runs {
        println!("{}", run(secs));
    }
}
