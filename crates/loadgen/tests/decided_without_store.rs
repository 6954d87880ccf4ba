//! A load test never passes off a limiter deciding by its fail modes as a fast limiter: the
//! load generator counts the answers a Tollgate node made without its store (the node's
//! `tollgate-decided-without-store` response header), shows them in its table and JSON, and
//! warns. A node whose Redis nobody listens on fails every decision open; a node on its
//! in-memory store decides every one on the store, from its first request (nothing is
//! warmed up: the runs measure from the start).

use std::net::SocketAddr;
use std::path::Path;

use tollgate_server::app::{App, Serving};
use tollgate_server::config::{Config, Settings};

const RULES: &str = "domain: rl\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n";

async fn node(dir: &Path, redis_url: Option<String>) -> Serving {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let settings = Settings {
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        rules: Some(vec![rules]),
        rules_snapshot: Some(dir.join("snapshot.json")),
        redis_url: redis_url.map(|u| vec![u]),
        store_startup_patience_ms: Some(100),
        ..Default::default()
    };
    let config = Config::try_from(settings).expect("config");
    App::start(config).await.expect("node starts").spawn()
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

struct Run {
    report: serde_json::Value,
    stdout: String,
    stderr: String,
}

async fn load(target: SocketAddr, dir: &Path) -> Run {
    let json = dir.join("report.json");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate-loadgen"))
        .args(["run", "--target", &format!("http://{target}")])
        .args(["--connections", "1", "--streams", "4", "--threads", "1"])
        .args(["--duration", "1s", "--warmup", "0s", "--quiet", "--json"])
        .arg(&json)
        .output()
        .await
        .expect("tollgate-loadgen runs");
    assert!(out.status.success(), "{out:?}");
    Run {
        report: serde_json::from_slice(&std::fs::read(&json).expect("report")).expect("json"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_shows_every_answer_the_node_made_without_its_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let unreachable = format!("redis://127.0.0.1:{}/", closed_port());
    let mut serving = node(dir.path(), Some(unreachable)).await;
    let run = load(serving.grpc_addr, dir.path()).await;
    serving.stop().await;
    let requests = run.report["requests"].as_u64().expect("requests");
    assert!(requests > 0, "{}", run.report);
    assert_eq!(
        run.report["decided_without_store"]["failed-open"].as_u64(),
        Some(requests),
        "every answer failed open: {}",
        run.report
    );
    assert!(
        run.stdout.contains("**failed-open: "),
        "the table shows it: {}",
        run.stdout
    );
    assert!(
        run.stderr.contains("warning: ") && run.stderr.contains("without the store"),
        "and a warning says it: {}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_a_store_that_answers_shows_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut serving = node(dir.path(), None).await;
    let run = load(serving.grpc_addr, dir.path()).await;
    serving.stop().await;
    assert!(run.report["requests"].as_u64().expect("requests") > 0);
    assert_eq!(
        run.report["decided_without_store"],
        serde_json::json!({}),
        "{}",
        run.report
    );
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
}
