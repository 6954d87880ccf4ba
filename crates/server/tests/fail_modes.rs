//! Failure handling against a real Redis: keys decided while the store was down are
//! store-backed again within 2 s of it answering; a store outage is not a node outage
//! (`/readyz` stays ready, the store's health is in its body); a flood of new keys under one
//! rule does not fill the store for the others; the LOCAL fail mode's buckets are bounded and
//! swept, so a later outage still limits.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Served, check, node_on, redis_store};
use tollgate_lease::{RedisConfig, SharedClock, TokioClock};
use tollgate_node::metrics::StoreFailure;
use tollgate_node::runtime::Outcome;
use tollgate_node::runtime::store_health::breaker::BreakerState;
use tollgate_node::{Request, RuntimeConfig};
use tollgate_server::config::Settings;
use tollgate_testkit::RedisServer;

async fn redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server")
}

fn request(kind: &str, user: &str) -> Request {
    Request::new("api").descriptor([("kind", kind), ("user", user)])
}

const RULES: &str = "domain: api\nrules:\n\
  - {id: closed, match: {kind: closed, user: '*'}, per: [user], algorithm: FIXED_WINDOW, limit: 1000, window: 1h, failMode: CLOSED}\n\
  - {id: local, match: {kind: local, user: '*'}, per: [user], algorithm: FIXED_WINDOW, limit: 10, window: 1h, failMode: LOCAL}\n";

/// 20 keys, each store-backed; Redis killed; each decided (denied, failing closed); Redis
/// restarted: every one of the 20 keys is store-backed again within 2 s of Redis answering
/// (not only new keys: keys seen failing once used to stay failed until their actor idled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_is_store_backed_again_within_two_seconds_of_redis_answering() {
    let mut server = redis().await;
    let clock: SharedClock = Arc::new(TokioClock::new());
    let node = node_on(
        redis_store(RedisConfig::single(server.url()), Duration::from_millis(20)),
        RULES,
        RuntimeConfig::default(),
        clock,
    )
    .await;
    let keys: Vec<String> = (0..20).map(|i| format!("user-{i}")).collect();
    for key in &keys {
        let v = check(&node, &request("closed", key)).await;
        assert_eq!(v.statuses[0].outcome, Some(Outcome::Allowed), "{key} warm");
    }
    server.kill();
    for _ in 0..3 {
        for key in &keys {
            let v = check(&node, &request("closed", key)).await;
            assert!(!v.allowed, "{key}: CLOSED denies while Redis is down");
        }
    }
    let mut server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .expect("join");
    // From the moment Redis answers again.
    let answering = tokio::time::Instant::now();
    let mut back: Vec<Option<Duration>> = vec![None; keys.len()];
    while back.iter().any(Option::is_none) && answering.elapsed() < Duration::from_secs(15) {
        for (i, key) in keys.iter().enumerate() {
            if back[i].is_some() {
                continue;
            }
            let v = check(&node, &request("closed", key)).await;
            if v.allowed && v.statuses[0].outcome == Some(Outcome::Allowed) {
                back[i] = Some(answering.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let slowest = back.iter().map(|b| b.unwrap_or(Duration::MAX)).max();
    eprintln!("store-backed again after the restart: slowest key {slowest:?}");
    for (key, took) in keys.iter().zip(&back) {
        assert!(
            took.is_some_and(|t| t <= Duration::from_secs(2)),
            "{key} store-backed again after {took:?}"
        );
    }
    node.shutdown().await;
    server.kill();
}

/// With Redis down the node keeps deciding by fail mode, so it stays ready: `/readyz` says
/// 200, and its body says the store is not answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_stays_while_the_store_is_down_and_reports_it() {
    let mut server = redis().await;
    let mut served = Served::start(
        RULES,
        Settings {
            redis_url: Some(vec![server.url()]),
            store_timeout_ms: Some(20),
            ..Settings::default()
        },
    )
    .await;
    let (status, body) = served.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let started: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        started["store"]["startup"]["answered"], true,
        "the node warmed its store up before serving: {body}"
    );
    server.kill();
    // Enough decisions for the breaker to see a failing store.
    for i in 0..60 {
        let v = check(&served.node, &request("closed", &format!("u{i}"))).await;
        assert!(!v.allowed);
    }
    assert!(matches!(
        served.node.store().breaker_state(),
        BreakerState::Open { .. } | BreakerState::HalfOpen { .. }
    ));
    let (status, body) = served.get("/readyz").await;
    assert_eq!(status, 200, "a store outage is not a node outage: {body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["ready"], true);
    assert_eq!(body["store"]["answering"], false, "{body}");
    served.stop().await;
}

/// A store that does not answer within the start-up patience does not stop the node: it
/// serves by its rules' fail modes, is ready, and says in `/readyz` that its store did not
/// answer when it started (and why); once Redis is up, decisions are the store's again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_store_does_not_answer_at_start_serves_by_fail_mode_and_says_so() {
    let mut server = redis().await;
    server.kill();
    let start = tokio::time::Instant::now();
    let mut served = Served::start(
        RULES,
        Settings {
            redis_url: Some(vec![server.url()]),
            store_startup_patience_ms: Some(300),
            ..Settings::default()
        },
    )
    .await;
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "the node waited its start-up patience for the store"
    );
    let (status, body) = served.get("/readyz").await;
    assert_eq!(status, 200, "a store outage is not a node outage: {body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["store"]["startup"]["answered"], false, "{body}");
    assert!(
        body["store"]["startup"]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    let verdict = check(&served.node, &request("closed", "early")).await;
    assert_eq!(verdict.statuses[0].outcome, Some(Outcome::FailedClosed));
    let _server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .expect("join");
    let back = tokio::time::Instant::now();
    loop {
        let verdict = check(&served.node, &request("closed", "later")).await;
        if verdict.statuses[0].outcome == Some(Outcome::Allowed) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "decisions never went back to the store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    served.stop().await;
}

/// Anyone can send new keys, but no one can fill the store for everyone: a flood of new keys
/// under one OPEN rule fills the in-memory store at `--memory-max-mb`, which then evicts that
/// rule's soonest-expiring keys. A new user under an unrelated CLOSED rule is still decided
/// by the store (it was refused, and so denied, on every request before), an existing key is
/// still decided by the store, nothing is refused as full and the node stays ready. (That the
/// other rules' keys keep their state is `crates/lease/tests/expiry.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_keys_under_one_rule_does_not_fill_the_store_for_others() {
    const FLOOD_RULES: &str = "domain: api\nrules:\n\
  - {id: closed, match: {kind: closed, user: '*'}, per: [user], algorithm: FIXED_WINDOW, limit: 1000, window: 1h, failMode: CLOSED}\n\
  - {id: open, match: {kind: open, user: '*'}, per: [user], algorithm: FIXED_WINDOW, limit: 100, window: 1h, failMode: OPEN}\n";
    let mut served = Served::start(
        FLOOD_RULES,
        Settings {
            memory_max_mb: Some(1),
            ..Settings::default()
        },
    )
    .await;
    let node = &served.node;
    let existing = request("closed", "existing");
    for _ in 0..2 {
        assert_eq!(
            check(node, &existing).await.statuses[0].outcome,
            Some(Outcome::Allowed)
        );
    }
    // Far more new keys than a mebibyte holds (each an hour's window).
    for i in 0..20_000 {
        check(node, &request("open", &format!("flood-{i}"))).await;
    }
    node.operator().refresh_figures();
    let metrics = node.metrics();
    assert!(
        metrics.memory_store_evictions.get() > 10_000,
        "{} keys evicted",
        metrics.memory_store_evictions.get()
    );
    assert!(
        metrics.memory_store_bytes.get() <= 1 << 20,
        "{} bytes held",
        metrics.memory_store_bytes.get()
    );
    assert_eq!(metrics.failures(StoreFailure::Full), 0, "nothing refused");
    for i in 0..5 {
        let v = check(node, &request("closed", "someone-new")).await;
        assert_eq!(
            v.statuses[0].outcome,
            Some(Outcome::Allowed),
            "a new user's request {i} is decided by the store"
        );
    }
    let v = check(node, &existing).await;
    assert_eq!(v.statuses[0].outcome, Some(Outcome::Allowed));
    assert_eq!(
        node.store().breaker_state(),
        BreakerState::Closed,
        "a full store is up"
    );
    let (status, body) = served.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    served.stop().await;
}

/// The LOCAL fail mode's buckets for keys without an actor are bounded and swept: an outage
/// touching many more keys than the cap does not leave the map full, so in a later outage a
/// LOCAL rule still holds each node to its share (it used to fail open, for want of room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fallback_buckets_are_bounded_and_swept_between_outages() {
    let mut server = redis().await;
    let clock: SharedClock = Arc::new(TokioClock::new());
    let config = RuntimeConfig {
        // Two nodes share each limit (LOCAL gives this one 5 of 10); a key state budget whose
        // eighth for fallbacks holds ten of these keys' buckets.
        cluster_nodes: 2,
        max_key_state_bytes: 8 * 10 * (tollgate_node::runtime::fallbacks::FALLBACK_BYTES + 20),
        idle_timeout: Duration::from_secs(2),
        ..RuntimeConfig::default()
    };
    let node = node_on(
        redis_store(RedisConfig::single(server.url()), Duration::from_millis(20)),
        RULES,
        config,
        clock,
    )
    .await;
    // Ten keys hold the actors (and keep them: they are used throughout).
    let held: Vec<Request> = (0..10)
        .map(|i| request("local", &format!("held-{i}")))
        .collect();
    for r in &held {
        check(&node, r).await;
    }
    server.kill();
    for i in 0..200 {
        check(&node, &request("local", &format!("outage-1-{i}"))).await;
    }
    let (fallbacks, overflow) = node.operator().fallback_buckets();
    assert!(
        fallbacks <= 10,
        "{fallbacks} fallback buckets for room for 10"
    );
    assert!(overflow <= 1, "one overflow bucket per rule: {overflow}");
    let mut server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .expect("join");
    // Past the idle timeout, the first outage's buckets are stale.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    server.kill();
    let key = request("local", "outage-2");
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(check(&node, &key).await.allowed);
    }
    assert_eq!(
        admitted, 5,
        "LOCAL holds this node to half of 10 in the second outage"
    );
    assert_eq!(
        node.metrics()
            .decisions("api", "local", Outcome::FailedOpen),
        0,
        "a LOCAL rule never fails open"
    );
    node.shutdown().await;
}

/// Rules in envoyproxy/ratelimit's format have no field for a fail mode (and its own service
/// refuses unknown keys): the node's `--envoy-fail-mode` gives them one, for every such
/// domain or per domain; unset, they fail open. Redis is unreachable throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_format_domains_take_the_nodes_fail_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files: Vec<_> = ["edge", "api"]
        .iter()
        .map(|domain| {
            let file = dir.path().join(format!("{domain}.yaml"));
            std::fs::write(
                &file,
                format!("domain: {domain}\ndescriptors:\n  - key: remote_address\n    rate_limit: {{unit: second, requests_per_unit: 10}}\n"),
            )
            .expect("write");
            file
        })
        .collect();
    let closed = tollgate_testkit::process::free_port(false).expect("port");
    for (setting, edge, api) in [
        (None, Outcome::FailedOpen, Outcome::FailedOpen),
        (
            Some("edge=closed"),
            Outcome::FailedClosed,
            Outcome::FailedOpen,
        ),
        (
            Some("LOCAL,edge=CLOSED"),
            Outcome::FailedClosed,
            Outcome::LocalFallback,
        ),
    ] {
        let mut served = Served::start(
            "",
            Settings {
                rules: Some(files.clone()),
                redis_url: Some(vec![format!("redis://127.0.0.1:{closed}/")]),
                store_startup_patience_ms: Some(100),
                envoy_fail_mode: setting.map(str::to_owned),
                ..Settings::default()
            },
        )
        .await;
        for (domain, expected) in [("edge", edge), ("api", api)] {
            let verdict = check(
                &served.node,
                &Request::new(domain).descriptor([("remote_address", "10.0.0.1")]),
            )
            .await;
            assert_eq!(
                verdict.statuses[0].outcome,
                Some(expected),
                "{domain} with --envoy-fail-mode {setting:?}"
            );
        }
        served.stop().await;
    }
}

/// An answer admitted without the store (failing open) states no remaining it does not know:
/// not in its headers, and not in its descriptor statuses, which an Envoy building its own
/// X-RateLimit headers (`--x-ratelimit-headers false`) would send as `Remaining: 0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_open_answer_states_no_remaining_it_does_not_know() {
    use support::admin::{call, json_of};
    let mut server = redis().await;
    server.kill();
    let mut served = Served::start(
        "domain: api\nrules:\n  - {id: open, match: {user: '*'}, algorithm: FIXED_WINDOW, limit: 10, window: 1h}\n",
        Settings {
            redis_url: Some(vec![server.url()]),
            store_startup_patience_ms: Some(100),
            ..Settings::default()
        },
    )
    .await;
    let body =
        r#"{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "u1"}]}]}"#;
    let answer = call(served.http.port(), "POST", "/json", &[], Some(body)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.header("tollgate-decided-without-store"),
        Some("failed-open"),
        "{answer:?}"
    );
    let json = json_of(&answer);
    let status = &json["statuses"][0];
    assert_eq!(status["code"], "OK", "{json}");
    assert!(status.get("limitRemaining").is_none(), "{json}");
    assert!(status.get("currentLimit").is_none(), "{json}");
    let headers: Vec<&str> = json["responseHeadersToAdd"]
        .as_array()
        .expect("headers")
        .iter()
        .filter_map(|h| h["key"].as_str())
        .collect();
    assert!(
        !headers
            .iter()
            .any(|h| h.contains("remaining") || *h == "ratelimit"),
        "{json}"
    );
    assert!(
        headers.contains(&"ratelimit-policy"),
        "the policy still shows: {json}"
    );
    served.stop().await;
}
