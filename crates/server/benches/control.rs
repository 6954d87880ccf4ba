//! The rule control plane against a real PostgreSQL (started by the test kit): how long a
//! PUT takes, from returning, to reach every one of three nodes (LISTEN/NOTIFY push, and
//! polling alone), and how long 10,000 rules take to load at start and to swap on a change.
//!
//! `cargo bench -p tollgate-server --bench control`. `BENCH_CHANGES` sets the number of pushed
//! changes (default 200; a tenth of that for polling, which waits for the poll).
//!
//! The three nodes run in this process (each its own runtime pieces, connections and
//! listeners), like the test suite's; a node "has" a change when its active rule-set
//! revision reaches the one the change made. Waiting checks every 0.5 ms (tokio's timer
//! rounds that to 1 ms), which is this benchmark's resolution.

use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::Rng;
use tokio::time::Instant;
use tollgate_control::RuleStore;
use tollgate_node::Node;
use tollgate_server::app::App;
use tollgate_server::config::{Config, Settings};
use tollgate_testkit::PostgresServer;

struct Running {
    node: Node,
    admin: u16,
    serving: tollgate_server::app::Serving,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(database_url: &str, listen: bool, poll_ms: u64) -> Running {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, "").expect("rules file");
        let settings = Settings {
            grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
            http_listen: Some("127.0.0.1:0".parse().expect("addr")),
            admin_listen: Some("127.0.0.1:0".parse().expect("addr")),
            rules: Some(vec![rules]),
            rules_snapshot: Some(dir.path().join("snapshot.json")),
            database_url: Some(database_url.to_owned()),
            rules_listen: Some(listen),
            rules_poll_ms: Some(poll_ms),
            ..Settings::default()
        };
        let app = App::start(Config::try_from(settings).expect("config"))
            .await
            .expect("node starts");
        let serving = app.spawn();
        Running {
            node: serving.node.clone(),
            admin: serving.admin_addr.expect("admin API").port(),
            serving,
            _dir: dir,
        }
    }

    async fn stop(mut self) {
        self.serving.stop().await;
    }
}

async fn put(admin: u16, id: &str, body: String) {
    let path = format!("/admin/v1/rate-limit-rules/{id}");
    let response = tokio::task::spawn_blocking(move || {
        tollgate_testkit::http::request(admin, "PUT", &path, &[], Some(body.as_bytes()))
    })
    .await
    .expect("join")
    .expect("PUT");
    assert!(
        matches!(response.status, 200 | 201),
        "PUT failed: {response:?}"
    );
}

/// Waits until every node runs `revision` or later.
async fn until_everywhere(nodes: &[Running], revision: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while nodes.iter().any(|n| n.node.rules().version() < revision) {
        assert!(
            Instant::now() < deadline,
            "revision {revision} never arrived"
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

fn report(label: &str, samples: &Histogram<u64>) {
    let ms = |q: f64| samples.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{label:<44} n={:<4} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms",
        samples.len(),
        ms(0.5),
        ms(0.99),
        samples.max() as f64 / 1000.0
    );
}

/// PUT on node 0, then time until all three nodes run the new revision. Between changes a
/// random pause (up to `spread`) so that changes land at every phase of the poll timer.
async fn propagation(url: &str, label: &str, listen: bool, poll_ms: u64, changes: u64) {
    let mut nodes = vec![];
    for _ in 0..3 {
        nodes.push(Running::start(url, listen, poll_ms).await);
    }
    let store = RuleStore::new(url, Duration::from_secs(5)).expect("store");
    let mut revision = store.revision().await.expect("revision") as u64;
    until_everywhere(&nodes, revision).await;
    let mut samples = Histogram::<u64>::new(3).expect("histogram");
    let spread = Duration::from_millis(if listen { 5 } else { poll_ms });
    for i in 0..changes {
        let body = format!(
            r#"{{"domain":"bench","match":{{"route":"GET /items"}},"per":["api_key"],"algorithm":"TOKEN_BUCKET","capacity":{},"refillPerSecond":10}}"#,
            100 + i
        );
        put(nodes[0].admin, "propagated", body).await;
        let returned = Instant::now();
        revision += 1;
        until_everywhere(&nodes, revision).await;
        samples
            .record(returned.elapsed().as_micros() as u64)
            .expect("record");
        let pause = rand::rng().random_range(Duration::ZERO..=spread);
        tokio::time::sleep(pause).await;
    }
    report(label, &samples);
    for node in nodes {
        node.stop().await;
    }
}

fn ten_thousand_rules_yaml() -> String {
    let mut yaml = String::from("domain: bulk\nrules:\n");
    for i in 1..=10_000 {
        yaml.push_str(&format!(
            "  - {{id: rule-{i}, match: {{route: 'GET /r{i}'}}, algorithm: TOKEN_BUCKET, capacity: {}, refillPerSecond: 1}}\n",
            10 + i % 90
        ));
    }
    yaml
}

async fn ten_thousand_rules(pg: &PostgresServer, url: &str, swaps: u64) {
    let store = RuleStore::new(url, Duration::from_secs(5)).expect("store");
    store.migrate().await.expect("migrate");
    let sql = "INSERT INTO rate_limit_rules (id, domain, match_json, per_json, algorithm, parameters, mode, fail_mode, version, updated_by)
        SELECT 'rule-' || i, 'bulk', jsonb_build_object('route', 'GET /r' || i), NULL, 'TOKEN_BUCKET',
               jsonb_build_object('capacity', 10 + i % 90, 'refillPerSecond', 1), 'ENFORCE', 'OPEN', 1, 'bench'
        FROM generate_series(1, 10000) AS i;
        UPDATE rule_set_revision SET revision = revision + 1;";
    pg.psql(sql).expect("bulk insert");
    let started = Instant::now();
    let node = Running::start(url, true, 2000).await;
    println!(
        "{:<44} {:>8.2} ms  (PostgreSQL read, compile, swap, snapshot file)",
        "10,000 rules: node start with the rule store",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let mut samples = Histogram::<u64>::new(3).expect("histogram");
    let mut revision = store.revision().await.expect("revision") as u64;
    for i in 0..swaps {
        let body = format!(
            r#"{{"domain":"bulk","match":{{"route":"GET /r777"}},"algorithm":"TOKEN_BUCKET","capacity":{},"refillPerSecond":1}}"#,
            3 + i
        );
        put(node.admin, "rule-777", body).await;
        let returned = Instant::now();
        revision += 1;
        until_everywhere(std::slice::from_ref(&node), revision).await;
        samples
            .record(returned.elapsed().as_micros() as u64)
            .expect("record");
    }
    report("10,000 rules: PUT returned → swapped in", &samples);
    // The same swap without PostgreSQL: the in-memory part of the cost.
    let yaml = ten_thousand_rules_yaml();
    let loaded = tollgate_node::rules::source::parse(&yaml, Path::new("bulk.yaml")).expect("rules");
    let mut samples = Histogram::<u64>::new(3).expect("histogram");
    for _ in 0..swaps {
        let start = Instant::now();
        node.node.rules().install(&loaded).expect("installs");
        samples
            .record(start.elapsed().as_micros() as u64)
            .expect("record");
    }
    report("10,000 rules: compile + swap only (no PG)", &samples);
    node.stop().await;
}

fn main() {
    let changes: u64 = std::env::var("BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let pg = tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .expect("join")
            .expect("postgres starts");
        let url = pg.url();
        propagation(&url, "push (LISTEN/NOTIFY), 3 nodes", true, 2000, changes).await;
        propagation(
            &url,
            "poll only, every 1000 ms, 3 nodes",
            false,
            1000,
            (changes / 10).max(5),
        )
        .await;
        propagation(
            &url,
            "poll only, every 2000 ms (default), 3 nodes",
            false,
            2000,
            (changes / 10).max(5),
        )
        .await;
        let pg = tokio::task::spawn_blocking(move || {
            // A fresh database for the bulk rules.
            drop(pg);
            PostgresServer::start().expect("postgres starts")
        })
        .await
        .expect("join");
        let url = pg.url();
        ten_thousand_rules(&pg, &url, 20).await;
    });
}
