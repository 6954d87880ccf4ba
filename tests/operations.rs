//! The operator's artifacts against the real tools and a real node: promtool checks the alert
//! rules in `deploy/prometheus/` and runs their unit tests; every metric name the rules and the
//! Grafana dashboard (`deploy/grafana/`) use is one a fresh node exports (region metrics only on
//! a node configured for two regions: a single-region node exporting
//! `tollgate_region_peer_up 0` would fire the peer-down alert for nothing).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_server::app::App;
use tollgate_server::config::{Config, Settings};
use tollgate_testkit::http;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy())
        .output()
        .expect(
            "promtool runs (scripts/test installs Debian's prometheus package, which ships it)",
        );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn promtool_checks_the_rules_and_runs_their_tests() {
    let checked = promtool(&["check", "rules", "tollgate-alerts.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "tollgate-alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The `tollgate_*` metric names in `text`.
fn metric_names(text: &str, names: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(at) = rest.find("tollgate_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
}

/// The `tollgate_*` metric names an alert expression uses.
fn names_in_rules() -> BTreeSet<String> {
    let text = std::fs::read_to_string(deploy().join("tollgate-alerts.yaml")).expect("rules");
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        metric_names(line, &mut names);
    }
    names
}

/// The `tollgate_*` metric names the dashboard's queries use (and that it is a dashboard).
fn names_in_dashboard() -> BTreeSet<String> {
    let path = deploy().join("../grafana/tollgate.json");
    let text = std::fs::read_to_string(&path).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "tollgate");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut names = BTreeSet::new();
    let mut queries = 0;
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a query");
            metric_names(expr, &mut names);
            queries += 1;
        }
    }
    assert!(queries >= 20, "{queries} queries");
    names
}

/// The metric names a node at `port` exports (sample names, suffixes included).
fn exported(port: u16) -> BTreeSet<String> {
    let response = http::get(port, "/metrics", &[]).expect("GET /metrics");
    assert_eq!(response.status, 200);
    response
        .body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// A node serving on ephemeral ports; the directory holds its rules while it runs.
async fn node(regions: bool) -> (tollgate_server::app::Serving, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 10, refillPerSecond: 1}\n",
    )
    .expect("rules");
    let mut settings = Settings {
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        rules: Some(vec![rules]),
        ..Settings::default()
    };
    if regions {
        // A peer that is not there: the node starts, and its region metrics are exported.
        settings.region = Some("us".into());
        settings.peer_region = Some("eu".into());
        settings.peer_url = Some("http://127.0.0.1:9".into());
        settings.region_secret = Some("a-region-secret-of-length".into());
        settings.region_listen = Some("127.0.0.1:0".parse().expect("addr"));
    }
    let app = App::start(Config::try_from(settings).expect("config"))
        .await
        .expect("node starts");
    let port = app.http_addr.port();
    (app.spawn(), port, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_an_alert_or_the_dashboard_uses_is_exported_from_the_start() {
    let mut used = names_in_rules();
    assert!(used.len() >= 7, "{used:?}");
    used.extend(names_in_dashboard());
    let (mut serving, port, _rules) = node(true).await;
    let names = tokio::task::spawn_blocking(move || exported(port))
        .await
        .expect("join");
    let missing: Vec<&String> = used.iter().filter(|n| !names.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "not exported by a fresh node: {missing:?}\nexported: {names:?}"
    );
    // Present at zero before any request: the API counters and the unmatched count.
    for name in [
        "tollgate_requests_total",
        "tollgate_request_seconds_count",
        "tollgate_requests_unmatched_total",
    ] {
        assert!(names.contains(name), "{name} missing");
    }
    serving.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_region_node_exports_no_region_metrics() {
    let (mut serving, port, _rules) = node(false).await;
    let names = tokio::task::spawn_blocking(move || exported(port))
        .await
        .expect("join");
    let regional: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("tollgate_region_"))
        .collect();
    assert!(regional.is_empty(), "{regional:?}");
    assert!(names.contains("tollgate_decisions_total"), "{names:?}");
    serving.stop().await;
}
