//! What reaches the gRPC port cannot grow the node without bound or make two clients share a
//! counter: descriptor limit overrides (Envoy's `RateLimitOverride`) are bounded, keyed by
//! domain and by an injective encoding of their entries, and never become metric labels;
//! oversized domains and keys are refused (values are decided); and rule ids from different sources
//! (Tollgate rules, envoyproxy/ratelimit configurations, overrides) never share counters. A
//! flood of new long identities stays within the key state budget (in bytes), every request
//! still decided by the store, and the state goes when the flood ends.

mod support;

use std::time::Duration;

use support::{Served, check, rls_request};
use tollgate_node::Request;
use tollgate_node::runtime::Outcome;
use tollgate_node::runtime::keys::registry::ACTOR_BYTES;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_server::config::Settings;
use tonic::Code as Status;

const RULES: &str = "domain: rl\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";

/// `entries` in `domain`, carrying a limit of `requests` per `unit` (Envoy's unit numbers:
/// 1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year).
fn overridden(
    domain: &str,
    entries: &[(&str, &str)],
    requests: u32,
    unit: i32,
) -> RateLimitRequest {
    let mut request = rls_request(domain, &[entries]);
    request.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: requests,
        unit,
    });
    request
}

async fn code(served: &Served, request: RateLimitRequest) -> Result<i32, (Status, String)> {
    served
        .rls()
        .await
        .should_rate_limit(request)
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|s| (s.code(), s.message().to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_domains_and_keys_are_refused() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let huge = "d".repeat(100 * 1024);
    // Domains and entry keys are set by Envoy's configuration: refused. (A long value comes
    // from a client's request: decided, `grpc_api.rs::rls_decides_whatever_a_client_puts_in_a_value`.)
    for request in [
        overridden(&huge, &[("k", "v")], 5, 2),
        rls_request(&huge, &[&[("remote_address", "10.0.0.1")]]),
        rls_request("rl", &[&[(&"k".repeat(1000), "v")]]),
    ] {
        let (status, message) = code(&served, request).await.expect_err("too large");
        assert_eq!(status, Status::InvalidArgument, "{message}");
        assert!(message.contains("at most"), "{message}");
    }
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_are_bounded_and_never_become_metric_labels() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let (_, before) = served.get("/metrics").await;
    let mut rls = served.rls().await;
    // 5,000 distinct limits, each in a domain of its own.
    for i in 0..5_000u32 {
        let request = overridden(&format!("svc-{i}"), &[("user", "u1")], 1_000 + i, 2);
        let r = rls
            .should_rate_limit(request)
            .await
            .expect("ok")
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let (_, after) = served.get("/metrics").await;
    let lines = |text: &str| text.lines().filter(|l| !l.starts_with('#')).count();
    assert!(
        lines(&after) <= lines(&before) + 20,
        "metrics grew from {} to {} lines with request content",
        lines(&before),
        lines(&after)
    );
    assert!(
        !after.contains("svc-4999"),
        "a request's domain became a label"
    );
    let cached = served.node.operator().override_rules();
    assert!(
        cached <= tollgate_node::runtime::MAX_OVERRIDE_RULES,
        "{cached} override rules held"
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_counters_are_per_domain_and_per_exact_entries() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let one_per_hour = |domain: &str, entries: &[(&str, &str)]| overridden(domain, entries, 1, 3);
    assert_eq!(
        code(&served, one_per_hour("svcA", &[("user", "u")])).await,
        Ok(Code::Ok as i32)
    );
    assert_eq!(
        code(&served, one_per_hour("svcA", &[("user", "u")])).await,
        Ok(Code::OverLimit as i32),
        "the override's own counter is spent"
    );
    assert_eq!(
        code(&served, one_per_hour("svcB", &[("user", "u")])).await,
        Ok(Code::Ok as i32),
        "usage in svcA must not deny svcB"
    );
    assert_eq!(
        code(&served, one_per_hour("svcA", &[("a", "b=c")])).await,
        Ok(Code::Ok as i32)
    );
    assert_eq!(
        code(&served, one_per_hour("svcA", &[("a=b", "c")])).await,
        Ok(Code::Ok as i32),
        "[(a, b=c)] and [(a=b, c)] are different clients"
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_different_sources_never_share_counters() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Tollgate rules named like an envoyproxy/ratelimit limit (its descriptor path) and like an
    // override, keyed so a client can make their identities the same bytes as the others'.
    std::fs::write(
        dir.path().join("native.yaml"),
        "domain: native\nrules:\n\
         - {id: e.small, match: {k1: '*', k2: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1h}\n\
         - {id: override.1-per-3600s, match: {tenant: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1h}\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("envoy.yaml"),
        "domain: e\ndescriptors:\n  - key: small\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .expect("write");
    let mut served = Served::start(
        "domain: unused\nrules: []\n",
        Settings {
            rules: Some(vec![dir.path().to_owned()]),
            ..Settings::default()
        },
    )
    .await;
    let native = |entries: &[(&str, &str)]| rls_request("native", &[entries]);
    assert_eq!(
        code(&served, rls_request("e", &[&[("small", "x")]])).await,
        Ok(Code::Ok as i32)
    );
    assert_eq!(
        code(&served, native(&[("k1", "small"), ("k2", "x")])).await,
        Ok(Code::Ok as i32),
        "the Tollgate rule e.small has a counter of its own"
    );
    assert_eq!(
        code(&served, overridden("native", &[("tenant", "t")], 1, 3)).await,
        Ok(Code::Ok as i32)
    );
    assert_eq!(
        code(&served, native(&[("tenant", "tenant=t\u{1f}")])).await,
        Ok(Code::Ok as i32),
        "a Tollgate rule named like an override has a counter of its own"
    );
    served.stop().await;
}

fn rss_bytes() -> u64 {
    tollgate_testkit::process::rss_bytes(std::process::id()).expect("VmRSS")
}

/// 6,000 new 2 KB identities, each sent twice (which earns a key an actor: about 26 KB each
/// before key state was bounded in bytes, 150 MB for this flood): the node holds at most its
/// 4 MiB budget of key state, decides every request by the store (none fails open), and its
/// actors are gone once the flood has been idle for the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_long_identities_stays_within_the_key_state_budget() {
    const BUDGET: usize = 4 << 20;
    let mut served = Served::start(
        RULES,
        Settings {
            max_key_state_mb: Some(BUDGET >> 20),
            idle_timeout_ms: Some(2_000),
            ..Settings::default()
        },
    )
    .await;
    let node = served.node.clone();
    let before = rss_bytes();
    let mut most_actors = 0;
    let mut most_bytes = 0;
    for i in 0..6_000 {
        let identity = format!("{i:06}-{}", "x".repeat(2_000));
        let request = Request::new("rl").descriptor([("remote_address", identity.as_str())]);
        for _ in 0..2 {
            let verdict = check(&node, &request).await;
            assert_eq!(
                verdict.statuses[0].outcome,
                Some(Outcome::Allowed),
                "key {i}"
            );
        }
        if i % 500 == 0 {
            node.operator().refresh_figures();
            most_bytes = most_bytes.max(node.metrics().key_state_bytes.get());
            most_actors = most_actors.max(node.operator().held().0);
        }
    }
    let grown = rss_bytes().saturating_sub(before);
    node.operator().refresh_figures();
    let metrics = node.metrics();
    most_bytes = most_bytes.max(metrics.key_state_bytes.get());
    assert!(
        most_bytes as usize <= BUDGET,
        "{most_bytes} bytes of key state"
    );
    assert!(
        most_actors <= BUDGET / ACTOR_BYTES,
        "{most_actors} actors in {BUDGET} bytes"
    );
    assert!(
        metrics.key_actors_refused.get() > 0,
        "the budget refused actors"
    );
    // The store's entries for 6,000 keys (about 15 MB) and the budget, with room for the
    // allocator; unbounded, the actors alone were about 150 MB.
    assert!(grown < 64 << 20, "RSS grew by {} MiB", grown >> 20);
    // Idle past the idle timeout: every actor stopped, its budget given back.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(
        node.operator().held(),
        (0, 0),
        "actors and buckets after the flood"
    );
    served.stop().await;
}
