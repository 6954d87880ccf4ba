//! What a client is told, against a node on a real Redis: large limits hold, a cost that can
//! never fit is refused as such, SHADOW rules stay out of answers, and limit, remaining and
//! reset tell one story.

mod support;

use support::{Served, rls_request};
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_server::config::Settings;
use tollgate_testkit::RedisServer;

async fn redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server")
}

fn on_redis(server: &RedisServer) -> Settings {
    Settings {
        redis_url: Some(vec![server.url()]),
        ..Settings::default()
    }
}

/// `{unit: year, requests_per_unit: 1000000}` and `{day, 300000000}` (limit × window past
/// u64 microseconds) are ordinary limits, as rules and as descriptor overrides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_limits_are_enforced_not_turned_into_blocks() {
    let server = redis().await;
    let rules = concat!(
        "domain: big\ndescriptors:\n",
        "  - key: yearly\n    rate_limit: {unit: year, requests_per_unit: 1000000}\n",
        "  - key: daily\n    rate_limit: {unit: day, requests_per_unit: 300000000}\n",
    );
    let mut served = Served::start(rules, on_redis(&server)).await;
    let mut rls = served.rls().await;
    for (entries, limit) in [
        (&[("yearly", "k1")][..], 1_000_000u32),
        (&[("daily", "k1")][..], 300_000_000),
    ] {
        let r = rls
            .should_rate_limit(rls_request("big", &[entries]))
            .await
            .expect("ok")
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32, "{entries:?}");
        let status = &r.statuses[0];
        assert_eq!(
            status.current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(limit)
        );
        assert_eq!(status.limit_remaining, limit - 1, "{entries:?}");
    }
    for (unit, requests) in [(6, 1_000_000u32), (4, 300_000_000)] {
        let mut request = rls_request("big", &[&[("client", "c1")]]);
        request.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: requests,
            unit,
        });
        let r = rls
            .should_rate_limit(request)
            .await
            .expect("ok")
            .into_inner();
        assert_eq!(
            r.overall_code,
            Code::Ok as i32,
            "override {requests} per unit {unit}"
        );
        assert_eq!(r.statuses[0].limit_remaining, requests - 1);
    }
    served.stop().await;
}

fn rls_header<'a>(
    response: &'a tollgate_proto::envoy::service::ratelimit::v3::RateLimitResponse,
    name: &str,
) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

fn check_request(
    domain: &str,
    entries: &[(&str, &str)],
    cost: u64,
) -> tollgate_proto::tollgate::ratelimit::v1::CheckRateLimitRequest {
    use tollgate_proto::tollgate::ratelimit::v1::{CheckRateLimitRequest, Descriptor, descriptor};
    CheckRateLimitRequest {
        domain: domain.into(),
        descriptors: vec![Descriptor {
            entries: entries
                .iter()
                .map(|(k, v)| descriptor::Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
        }],
        cost,
        with_headers: false,
        reserve_ttl_ms: 0,
    }
}

/// Cost 500 against a bucket of 50 can never be admitted: it is refused as such, without a
/// retry-after that could never succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_that_can_never_fit_is_refused_as_such() {
    use tollgate_proto::tollgate::ratelimit::v1::{Decision, DenyReason};
    let server = redis().await;
    let rules = "domain: api\nrules:\n  - {id: burst-50, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 50, refillPerSecond: 5}\n";
    let mut served = Served::start(rules, on_redis(&server)).await;
    let r = served
        .api()
        .await
        .check_rate_limit(check_request("api", &[("api_key", "k1")], 500))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(r.decision, Decision::Deny as i32);
    assert_eq!(r.reason, DenyReason::CostExceedsLimit as i32);
    assert_eq!(r.retry_after_ms, 0, "no wait can help");
    assert_eq!(r.matched_rule, "burst-50");
    let mut heavy = rls_request("api", &[&[("api_key", "k1")]]);
    heavy.hits_addend = 500;
    let r = served
        .rls()
        .await
        .should_rate_limit(heavy)
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(rls_header(&r, "retry-after"), None);
    assert_eq!(
        rls_header(&r, "tollgate-reason"),
        Some("cost-exceeds-limit")
    );
    // The bucket is untouched: an ordinary request still has all of it.
    let r = served
        .api()
        .await
        .check_rate_limit(check_request("api", &[("api_key", "k1")], 1))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!((r.decision, r.remaining), (Decision::Allow as i32, 49));
    served.stop().await;
}

/// A SHADOW rule over its limit is counted in metrics, and nothing a client sees mentions
/// it: not the headers, not `remaining`, not `matchedRule`, not `rules[]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_rules_never_reach_clients() {
    let server = redis().await;
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/rules/example.yaml"
    ))
    .expect("example rules");
    let mut served = Served::start(&rules, on_redis(&server)).await;
    let mut api = served.api().await;
    let mut rls = served.rls().await;
    let partner = [("api_key", "p1"), ("plan", "partner")];
    for n in 1..=25u64 {
        let r = api
            .check_rate_limit(check_request("public-api", &partner, 1))
            .await
            .expect("ok")
            .into_inner();
        assert_eq!(r.matched_rule, "api-key-default", "request {n}");
        assert_eq!(r.remaining, 50 - n, "request {n}: the ENFORCE rule's count");
        assert!(
            r.rules.iter().all(|s| s.rule != "partner-trial"),
            "request {n}: {:?}",
            r.rules
        );
    }
    let r = rls
        .should_rate_limit(rls_request("public-api", &[&partner]))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    for h in &r.response_headers_to_add {
        assert!(!h.value.contains("partner"), "{}: {}", h.key, h.value);
    }
    assert_eq!(rls_header(&r, "x-ratelimit-remaining"), Some("24"));
    let shadow_denied = served.node.metrics().decisions(
        "public-api",
        "partner-trial",
        tollgate_node::runtime::Outcome::ShadowDenied,
    );
    assert_eq!(shadow_denied, 6, "26 requests against a shadow limit of 20");
    served.stop().await;
}

/// Limit, remaining and reset come from one source: two requests into a token bucket of 50
/// refilling 10/s leave 48, full again in a fifth of a second (t=1), not in the five seconds
/// a bucket counting the node's whole lease as spent would say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_remaining_and_reset_tell_one_story() {
    let server = redis().await;
    let rules = "domain: api\nrules:\n  - {id: keys, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 50, refillPerSecond: 10}\n";
    let mut served = Served::start(rules, on_redis(&server)).await;
    let mut rls = served.rls().await;
    let request = rls_request("api", &[&[("api_key", "k1")]]);
    rls.should_rate_limit(request.clone()).await.expect("ok");
    let r = rls
        .should_rate_limit(request)
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(rls_header(&r, "ratelimit"), Some("\"keys\";r=48;t=1"));
    assert_eq!(rls_header(&r, "x-ratelimit-remaining"), Some("48"));
    assert_eq!(rls_header(&r, "x-ratelimit-reset"), Some("1"));
    assert_eq!(r.statuses[0].limit_remaining, 48);
    served.stop().await;
}

/// The seed's login case on a real Redis with the default pre-limit: FIXED_WINDOW 5 per
/// window; the sixth attempt is told to wait until the window turns, and a retry then is
/// admitted. (A pre-limit spreading the window into a rate once said a fifth of the window.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_at_the_retry_after_it_was_given_is_admitted() {
    use tollgate_proto::tollgate::ratelimit::v1::Decision;
    let server = redis().await;
    let rules = "domain: api\nrules:\n  - {id: login-attempts, match: {route: POST /login, ip: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 3s, failMode: CLOSED}\n";
    let mut served = Served::start(rules, on_redis(&server)).await;
    let mut api = served.api().await;
    let login = check_request("api", &[("route", "POST /login"), ("ip", "10.0.0.9")], 1);
    // Start early in a window, so the burst below does not straddle a boundary.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    tokio::time::sleep(std::time::Duration::from_millis(
        3_000 - now_ms % 3_000 + 50,
    ))
    .await;
    for attempt in 1..=5 {
        let r = api
            .check_rate_limit(login.clone())
            .await
            .expect("ok")
            .into_inner();
        assert_eq!(r.decision, Decision::Allow as i32, "attempt {attempt}");
    }
    let denied = api
        .check_rate_limit(login.clone())
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(denied.decision, Decision::Deny as i32);
    assert!(
        denied.retry_after_ms > 2_000,
        "the window has most of its 3 s to run: told {} ms",
        denied.retry_after_ms
    );
    tokio::time::sleep(std::time::Duration::from_millis(denied.retry_after_ms)).await;
    let again = api.check_rate_limit(login).await.expect("ok").into_inner();
    assert_eq!(
        again.decision,
        Decision::Allow as i32,
        "retried exactly {} ms later and denied again",
        denied.retry_after_ms
    );
    served.stop().await;
}
