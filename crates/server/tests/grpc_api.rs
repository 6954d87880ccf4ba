//! The gRPC APIs and the HTTP port, against a node process on ephemeral ports.

mod support;

use std::time::Duration;

use support::{Served, rls_request};
use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_proto::tollgate::ratelimit::v1::{
    CheckRateLimitRequest, Decision, Descriptor, ReleaseSlotsRequest, descriptor,
};
use tollgate_server::config::Settings;
use tonic::Code as Status;

const ENVOY_RULES: &str = "domain: rl\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: open\n    rate_limit: {unlimited: true}\n";

const NATIVE_RULES: &str = "domain: public-api\nrules:\n\
  - {id: gold-orders-create, name: gold-orders, match: {plan: gold, route: POST /orders}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 10}\n\
  - {id: reports, match: {route: GET /reports, api_key: '*'}, per: [api_key], algorithm: CONCURRENCY, maxInFlight: 1, slotTtl: 30s}\n";

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

/// The overall code of Envoy's rate limit service's answer to `request`.
async fn overall(
    rls: &mut tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>,
    request: RateLimitRequest,
) -> i32 {
    rls.should_rate_limit(request)
        .await
        .expect("ok")
        .into_inner()
        .overall_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_answers_each_descriptor_and_denies_over_the_limit_with_headers() {
    let mut served = Served::start(ENVOY_RULES, Settings::default()).await;
    let mut rls = served.rls().await;
    let request = rls_request(
        "rl",
        &[
            &[("remote_address", "10.0.0.1")],
            &[("open", "x")],
            &[("unknown", "y")],
        ],
    );
    for expected_remaining in [2, 1, 0] {
        let r = rls
            .should_rate_limit(request.clone())
            .await
            .expect("ok")
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses.len(), 3, "one status per descriptor");
        let first = &r.statuses[0];
        let limit = first.current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("rl.remote_address", 3, Unit::Minute as i32)
        );
        assert_eq!(first.limit_remaining, expected_remaining);
        assert!(first.duration_until_reset.is_some());
        assert_eq!(r.statuses[1].limit_remaining, u32::MAX, "unlimited");
        assert!(
            r.statuses[2].current_limit.is_none(),
            "no rule: OK without a limit"
        );
        assert!(header(&r, "ratelimit").is_some() && header(&r, "retry-after").is_none());
    }
    let denied = rls
        .should_rate_limit(request)
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(denied.overall_code, Code::OverLimit as i32);
    assert_eq!(denied.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(denied.statuses[1].code, Code::Ok as i32);
    let retry: u64 = header(&denied, "retry-after")
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry));
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"rl.remote_address\";q=3;w=60")
    );
    assert_eq!(
        header(&denied, "ratelimit"),
        Some(format!("\"rl.remote_address\";r=0;t={retry}").as_str())
    );
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        header(&denied, "x-ratelimit-limit"),
        Some("3, 3;w=60;name=\"rl.remote_address\"")
    );
    served.stop().await;
}

/// `x_ratelimit_headers: false` (for an Envoy that builds the X- trio itself) leaves out
/// X-RateLimit-Limit, -Remaining and -Reset, over gRPC and on POST /json, and nothing else:
/// the IETF pair and Retry-After stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_answers_leave_out_the_x_trio_when_told() {
    const DENIED: [&str; 4] = [
        "tollgate-reason",
        "retry-after",
        "ratelimit-policy",
        "ratelimit",
    ];
    let settings = Settings {
        x_ratelimit_headers: Some(false),
        ..Settings::default()
    };
    let mut served = Served::start(ENVOY_RULES, settings).await;
    let mut rls = served.rls().await;
    let request = rls_request("rl", &[&[("remote_address", "10.0.0.9")]]);
    let keys = |r: &RateLimitResponse| {
        r.response_headers_to_add
            .iter()
            .map(|h| h.key.clone())
            .collect::<Vec<_>>()
    };
    for _ in 0..3 {
        let r = rls
            .should_rate_limit(request.clone())
            .await
            .expect("ok")
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(keys(&r), ["ratelimit-policy", "ratelimit"]);
        let remaining = r.statuses[0].limit_remaining;
        let ratelimit = header(&r, "ratelimit").expect("ratelimit");
        assert!(
            ratelimit.starts_with(&format!("\"rl.remote_address\";r={remaining};t=")),
            "the remaining the status says: {ratelimit}"
        );
    }
    let denied = rls
        .should_rate_limit(request)
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(denied.overall_code, Code::OverLimit as i32);
    assert_eq!(keys(&denied), DENIED);
    use support::admin::{call, json_of};
    let body = r#"{"domain":"rl","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.9"}]}]}"#;
    let over = call(served.http.port(), "POST", "/json", &[], Some(body)).await;
    assert_eq!(over.status, 429, "{over:?}");
    let json = json_of(&over);
    let names: Vec<&str> = json["responseHeadersToAdd"]
        .as_array()
        .expect("headers")
        .iter()
        .filter_map(|h| h["key"].as_str())
        .collect();
    assert_eq!(names, DENIED, "{json}");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_hits_addend_and_limit_overrides() {
    let mut served = Served::start(ENVOY_RULES, Settings::default()).await;
    let mut rls = served.rls().await;
    let mut heavy = rls_request("rl", &[&[("remote_address", "10.0.0.2")]]);
    heavy.hits_addend = 2;
    assert_eq!(overall(&mut rls, heavy.clone()).await, Code::Ok as i32);
    assert_eq!(
        overall(&mut rls, heavy.clone()).await,
        Code::OverLimit as i32
    );
    // Descriptor-level hits_addend overrides the request's; 0 peeks.
    heavy.descriptors[0].hits_addend = Some(1);
    assert_eq!(overall(&mut rls, heavy.clone()).await, Code::Ok as i32);
    heavy.descriptors[0].hits_addend = Some(0);
    let peek = rls.should_rate_limit(heavy).await.expect("ok").into_inner();
    assert_eq!(
        (peek.overall_code, peek.statuses[0].limit_remaining),
        (Code::Ok as i32, 0)
    );
    // A descriptor carrying its own limit bypasses the configuration.
    let mut overridden = rls_request("rl", &[&[("anything", "z")]]);
    overridden.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3,
    });
    assert_eq!(overall(&mut rls, overridden.clone()).await, Code::Ok as i32);
    assert_eq!(overall(&mut rls, overridden).await, Code::OverLimit as i32);
    served.stop().await;
}

/// A node told to refuse caller-supplied limits (`--descriptor-overrides refuse`) answers a
/// descriptor carrying one with INVALID_ARGUMENT, naming it and the setting; a descriptor
/// without one is decided as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_can_refuse_limits_its_callers_set() {
    let mut served = Served::start(
        ENVOY_RULES,
        Settings {
            descriptor_overrides: Some("refuse".into()),
            ..Settings::default()
        },
    )
    .await;
    let mut rls = served.rls().await;
    let mut overridden = rls_request("rl", &[&[("remote_address", "10.1.1.1")], &[("x", "y")]]);
    overridden.descriptors[1].limit = Some(RateLimitOverride {
        requests_per_unit: 1_000_000,
        unit: 1,
    });
    let refused = rls
        .should_rate_limit(overridden)
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Status::InvalidArgument);
    assert!(
        refused.message().contains("descriptors[1].limit")
            && refused.message().contains("descriptor_overrides"),
        "{}",
        refused.message()
    );
    let plain = rls_request("rl", &[&[("remote_address", "10.1.1.1")]]);
    let answer = rls.should_rate_limit(plain).await.expect("decided");
    assert_eq!(answer.into_inner().overall_code, Code::Ok as i32);
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_bad_input_gets_a_clear_status() {
    let mut served = Served::start(ENVOY_RULES, Settings::default()).await;
    let mut rls = served.rls().await;
    let code = |r: Result<tonic::Response<RateLimitResponse>, tonic::Status>| {
        r.map(|r| r.into_inner().overall_code)
            .map_err(|s| (s.code(), s.message().to_owned()))
    };
    let ok = rls_request("rl", &[&[("remote_address", "10.9.9.9")]]);
    let mut empty_domain = ok.clone();
    empty_domain.domain.clear();
    assert_eq!(
        code(rls.should_rate_limit(empty_domain).await)
            .expect_err("invalid")
            .0,
        Status::InvalidArgument
    );
    let mut none = ok.clone();
    none.descriptors.clear();
    assert_eq!(
        code(rls.should_rate_limit(none).await)
            .expect_err("invalid")
            .0,
        Status::InvalidArgument
    );
    let mut many = ok.clone();
    many.descriptors = (0..10_000)
        .map(|i| RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: i.to_string().into_bytes(),
            }],
            ..Default::default()
        })
        .collect();
    let (status, message) = code(rls.should_rate_limit(many).await).expect_err("too many");
    assert_eq!(status, Status::InvalidArgument, "{message}");
    assert!(message.contains("10000"), "{message}");
    let empty_key = rls_request("rl", &[&[("", "v")]]);
    assert_eq!(
        code(rls.should_rate_limit(empty_key).await)
            .expect_err("invalid")
            .0,
        Status::InvalidArgument
    );
    let no_entries = {
        let mut r = ok.clone();
        r.descriptors[0].entries.clear();
        r
    };
    assert_eq!(
        code(rls.should_rate_limit(no_entries).await)
            .expect_err("invalid")
            .0,
        Status::InvalidArgument
    );
    let negative = {
        let mut r = ok.clone();
        r.descriptors[0].is_negative_hits = true;
        r
    };
    assert_eq!(
        code(rls.should_rate_limit(negative).await)
            .expect_err("invalid")
            .0,
        Status::InvalidArgument
    );
    let mut huge = ok.clone();
    huge.hits_addend = u32::MAX;
    assert_eq!(
        code(rls.should_rate_limit(huge).await),
        Ok(Code::OverLimit as i32),
        "a cost above the limit can never fit"
    );
    let oversized = rls_request("rl", &[&[("remote_address", &"x".repeat(2 << 20))]]);
    let status = code(rls.should_rate_limit(oversized).await)
        .expect_err("too large")
        .0;
    assert!(
        matches!(status, Status::OutOfRange | Status::ResourceExhausted),
        "{status:?}"
    );
    // The node still serves after all that.
    assert_eq!(code(rls.should_rate_limit(ok).await), Ok(Code::Ok as i32));
    served.stop().await;
}

/// What a client's request puts in a descriptor (a value's length and bytes, a cost from a
/// header) is decided, never refused: an RPC error is an uncounted allow behind Envoy's default
/// `failure_mode_deny: false`. A long value counts against its own limit (kept as a digest), a
/// value that is not UTF-8 is read with U+FFFD, a cost past the most a count holds is denied
/// as one no limit admits; each is counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_decides_whatever_a_client_puts_in_a_value() {
    let mut served = Served::start(ENVOY_RULES, Settings::default()).await;
    let mut rls = served.rls().await;
    let mut decide = async |request: RateLimitRequest| {
        rls.should_rate_limit(request)
            .await
            .map(|r| r.into_inner().overall_code)
            .map_err(|s| (s.code(), s.message().to_owned()))
    };
    // Two values of 5,000 bytes that differ only in their last byte: each its own counter of
    // 3 a minute (the digest covers every byte).
    let long = |last: char| format!("{}{last}", "x".repeat(4999));
    let mut answers = vec![];
    for _ in 0..4 {
        answers.push(decide(rls_request("rl", &[&[("remote_address", &long('a'))]])).await);
    }
    let ok = Ok(Code::Ok as i32);
    let over = Ok(Code::OverLimit as i32);
    assert_eq!(answers, [ok.clone(), ok.clone(), ok.clone(), over.clone()]);
    assert_eq!(
        decide(rls_request("rl", &[&[("remote_address", &long('b'))]])).await,
        ok,
        "another long value is another counter"
    );
    // Bytes that are not UTF-8 (Envoy copies a header's bytes as they came).
    let mut not_utf8 = rls_request("rl", &[&[("remote_address", "")]]);
    not_utf8.descriptors[0].entries[0].value = b"10.0.0.\xff\xfe".to_vec();
    let mut answers = vec![];
    for _ in 0..4 {
        answers.push(decide(not_utf8.clone()).await);
    }
    assert_eq!(answers, [ok.clone(), ok.clone(), ok.clone(), over.clone()]);
    // A cost no count holds: denied, as no limit can ever admit it.
    let mut costly = rls_request("rl", &[&[("remote_address", "10.0.0.9")]]);
    costly.descriptors[0].hits_addend = Some(u64::MAX);
    assert_eq!(decide(costly).await, over);
    assert_eq!(
        decide(rls_request("rl", &[&[("remote_address", "10.0.0.9")]])).await,
        ok,
        "and it spent nothing"
    );
    let input = &served.node.metrics().client_input;
    use tollgate_node::metrics::client_input::Adjustment;
    assert_eq!(input.count(Adjustment::LongIdentity), 5);
    assert_eq!(input.count(Adjustment::NotUtf8), 4);
    assert_eq!(input.count(Adjustment::CostAboveMax), 1);
    let text = tollgate_testkit::http::get(served.http.port(), "/metrics", &[])
        .expect("metrics")
        .body;
    assert!(
        text.contains("tollgate_client_input_adjusted_total{reason=\"long_identity\"} 5"),
        "{text}"
    );
    served.stop().await;
}

fn seed_request(cost: u64) -> CheckRateLimitRequest {
    let d = |pairs: &[(&str, &str)]| Descriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| descriptor::Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
    };
    CheckRateLimitRequest {
        domain: "public-api".into(),
        descriptors: vec![
            d(&[("api_key", "k_123"), ("plan", "gold")]),
            d(&[("route", "POST /orders")]),
        ],
        cost,
        with_headers: true,
        reserve_ttl_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_rate_limit_answers_the_seeds_example() {
    let mut served = Served::start(
        NATIVE_RULES,
        Settings {
            prelimit_factor: Some(0.0),
            ..Settings::default()
        },
    )
    .await;
    let mut api = served.api().await;
    let first = api
        .check_rate_limit(seed_request(1))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(first.decision, Decision::Allow as i32);
    assert_eq!(first.matched_rule, "gold-orders-create");
    assert!(
        first.remaining >= 98 && first.remaining <= 99,
        "{}",
        first.remaining
    );
    let big = api
        .check_rate_limit(seed_request(99))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(big.decision, Decision::Allow as i32);
    let denied = api
        .check_rate_limit(seed_request(5))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(denied.decision, Decision::Deny as i32);
    assert_eq!(denied.matched_rule, "gold-orders-create");
    assert!(
        denied.retry_after_ms > 0 && denied.retry_after_ms <= 500,
        "{}",
        denied.retry_after_ms
    );
    // Asked with_headers: the HTTP headers an edge answers, and the rule's quota.
    let header = |name: &str| {
        denied
            .headers
            .iter()
            .find(|h| h.name == name)
            .map(|h| h.value.as_str())
    };
    assert_eq!(
        header("ratelimit-policy"),
        Some("\"gold-orders\";q=100;w=10")
    );
    assert_eq!(header("retry-after"), Some("1"));
    assert!(header("ratelimit").is_some_and(|v| v.starts_with("\"gold-orders\";r=0")));
    let rule = denied
        .rules
        .iter()
        .find(|r| r.rule == "gold-orders-create")
        .expect("the rule");
    assert_eq!(
        (rule.name.as_str(), rule.quota, rule.window_seconds),
        ("gold-orders", 100, 10)
    );
    let bad = api
        .check_rate_limit(CheckRateLimitRequest {
            domain: String::new(),
            ..seed_request(1)
        })
        .await;
    assert_eq!(bad.expect_err("invalid").code(), Status::InvalidArgument);
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_slots_travel_as_tokens() {
    let mut served = Served::start(NATIVE_RULES, Settings::default()).await;
    let mut api = served.api().await;
    let request = CheckRateLimitRequest {
        domain: "public-api".into(),
        descriptors: vec![Descriptor {
            entries: vec![
                descriptor::Entry {
                    key: "api_key".into(),
                    value: "k".into(),
                },
                descriptor::Entry {
                    key: "route".into(),
                    value: "GET /reports".into(),
                },
            ],
        }],
        cost: 1,
        with_headers: false,
        reserve_ttl_ms: 0,
    };
    let held = api
        .check_rate_limit(request.clone())
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(
        (held.decision, held.slots.len()),
        (Decision::Allow as i32, 1)
    );
    assert_eq!(
        api.check_rate_limit(request.clone())
            .await
            .expect("ok")
            .into_inner()
            .decision,
        Decision::Deny as i32
    );
    let release = ReleaseSlotsRequest {
        domain: "public-api".into(),
        slots: held.slots.clone(),
    };
    assert_eq!(
        api.release_slots(release.clone())
            .await
            .expect("ok")
            .into_inner()
            .released,
        1
    );
    assert_eq!(
        api.release_slots(release)
            .await
            .expect("ok")
            .into_inner()
            .released,
        0
    );
    assert_eq!(
        api.check_rate_limit(request)
            .await
            .expect("ok")
            .into_inner()
            .decision,
        Decision::Allow as i32
    );
    let forged = ReleaseSlotsRequest {
        domain: "public-api".into(),
        slots: vec!["not a token".into()],
    };
    assert_eq!(
        api.release_slots(forged).await.expect_err("invalid").code(),
        Status::InvalidArgument
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_are_served() {
    let mut served = Served::start(ENVOY_RULES, Settings::default()).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", served.grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect("health")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let mut rls = served.rls().await;
    rls.should_rate_limit(rls_request("rl", &[&[("remote_address", "1.2.3.4")]]))
        .await
        .expect("ok");
    assert_eq!(served.get("/healthz").await.0, 200);
    let (code, body) = served.get("/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"rulesVersion\":1"), "{body}");
    let (code, metrics) = served.get("/metrics").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("tollgate_decisions_total{domain=\"rl\",rule=\"rl.remote_address\",outcome=\"allowed\"} 1"), "{metrics}");
    assert!(metrics.contains("tollgate_rules_version 1"));
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_files_reload_when_changed_and_an_invalid_change_is_rejected_whole() {
    let mut served = Served::start(ENVOY_RULES, Settings::default()).await;
    let mut rls = served.rls().await;
    let request = rls_request("rl", &[&[("remote_address", "10.1.1.1")]]);
    let limit_of = |r: RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    assert_eq!(
        limit_of(
            rls.should_rate_limit(request.clone())
                .await
                .expect("ok")
                .into_inner()
        ),
        Some(3)
    );
    std::fs::write(
        &served.rules_file,
        ENVOY_RULES.replace("requests_per_unit: 3", "requests_per_unit: 7"),
    )
    .expect("write");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while limit_of(
        rls.should_rate_limit(request.clone())
            .await
            .expect("ok")
            .into_inner(),
    ) != Some(7)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let errors = served.node.metrics().rules_reload_errors.get();
    std::fs::write(&served.rules_file, "domain: rl\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").expect("write");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while served.node.metrics().rules_reload_errors.get() == errors {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the invalid change was not noticed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        limit_of(
            rls.should_rate_limit(request)
                .await
                .expect("ok")
                .into_inner()
        ),
        Some(7),
        "the old set stays"
    );
    // The node stays ready on its previous set, and /readyz says what it rejected and where.
    let (status, body) = served.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
    let problem = ready["rulesProblem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("rejected the changed rule files") && problem.contains("fortnight"),
        "{body}"
    );
    std::fs::write(
        &served.rules_file,
        ENVOY_RULES.replace("requests_per_unit: 3", "requests_per_unit: 9"),
    )
    .expect("write");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = served.get("/readyz").await;
        let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
        if ready.get("rulesProblem").is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a good change clears the problem: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    served.stop().await;
}

/// `POST /json`: the RLS request as JSON, decided and counted like `ShouldRateLimit`, answered
/// as JSON (200, then 429 over the limit, with the headers Envoy would add); a body it cannot
/// read is a 400 naming the body; with `--json-check-token`, only its holders are answered;
/// `--json-check false` serves nothing there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_you_can_curl() {
    use support::admin::{call, json_of};
    const BODY: &str = r#"{"domain": "rl", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}]}]}"#;
    let mut served = Served::start(ENVOY_RULES, Settings::default()).await;
    let port = served.http.port();
    for remaining in [2, 1, 0] {
        let answer = call(port, "POST", "/json", &[], Some(BODY)).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let json = json_of(&answer);
        assert_eq!(json["overallCode"], "OK", "{json}");
        assert_eq!(json["statuses"][0]["limitRemaining"], remaining, "{json}");
        assert_eq!(
            json["statuses"][0]["currentLimit"]["requestsPerUnit"], 3,
            "{json}"
        );
        assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    }
    // The same counter as the gRPC API's.
    let mut rls = served.rls().await;
    let grpc = rls
        .should_rate_limit(rls_request("rl", &[&[("remote_address", "10.9.9.9")]]))
        .await
        .expect("ok")
        .into_inner();
    assert_eq!(grpc.overall_code, Code::OverLimit as i32);
    let over = call(port, "POST", "/json", &[], Some(BODY)).await;
    assert_eq!(over.status, 429, "{over:?}");
    let json = json_of(&over);
    assert_eq!(json["overallCode"], "OVER_LIMIT", "{json}");
    assert!(
        json["responseHeadersToAdd"]
            .as_array()
            .is_some_and(|h| h.iter().any(|h| h["key"] == "retry-after")),
        "{json}"
    );
    // A request no rule limits says so: a domain no rule serves, and a known domain's
    // descriptor no rule matches; neither states a remaining.
    for (body, label) in [
        (
            r#"{"domain": "nope", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}]}]}"#,
            "(unknown)",
        ),
        (
            r#"{"domain": "rl", "descriptors": [{"entries": [{"key": "nothing", "value": "here"}]}]}"#,
            "rl",
        ),
    ] {
        let before = served.node.metrics().unmatched.count(label);
        let answer = call(port, "POST", "/json", &[], Some(body)).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let json = json_of(&answer);
        assert_eq!(json["overallCode"], "OK", "{json}");
        assert!(
            json["statuses"][0].get("limitRemaining").is_none(),
            "{json}"
        );
        assert!(
            json["responseHeadersToAdd"].as_array().is_some_and(|h| h
                .iter()
                .any(|h| h["key"] == "tollgate-reason" && h["value"] == "no-rule")),
            "{json}"
        );
        assert_eq!(
            served.node.metrics().unmatched.count(label),
            before + 1,
            "{label}"
        );
    }
    let (_, metrics) = served.get("/metrics").await;
    assert!(
        metrics.contains("tollgate_requests_unmatched_total{domain=\"(unknown)\"} 1"),
        "{metrics}"
    );
    let bad = call(port, "POST", "/json", &[], Some(r#"{"domain": 7}"#)).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(json_of(&bad)["errors"][0]["field"], "body", "{bad:?}");
    served.stop().await;

    let mut guarded = Served::start(
        ENVOY_RULES,
        Settings {
            json_check_token: Some("a-token-of-16-chars-or-more".into()),
            ..Settings::default()
        },
    )
    .await;
    let port = guarded.http.port();
    assert_eq!(
        call(port, "POST", "/json", &[], Some(BODY)).await.status,
        401
    );
    let wrong = [("authorization", "Bearer not-the-token-at-all")];
    assert_eq!(
        call(port, "POST", "/json", &wrong, Some(BODY)).await.status,
        401
    );
    let right = [("authorization", "Bearer a-token-of-16-chars-or-more")];
    assert_eq!(
        call(port, "POST", "/json", &right, Some(BODY)).await.status,
        200
    );
    guarded.stop().await;

    let mut off = Served::start(
        ENVOY_RULES,
        Settings {
            json_check: Some(false),
            ..Settings::default()
        },
    )
    .await;
    let port = off.http.port();
    assert_eq!(
        call(port, "POST", "/json", &[], Some(BODY)).await.status,
        404
    );
    off.stop().await;
}
