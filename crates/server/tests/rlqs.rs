//! Envoy's rate limit quota service (RLQS) against a node process on ephemeral ports, spoken
//! by a gRPC client as Envoy 1.40 speaks it: a share assigned at a bucket's first report,
//! shares that sum to the rule's rate, the same limit RLS callers draw from, abandoned idle
//! buckets, and bad input (no domain, garbage, a flood of bucket ids). Real Envoys sharing a
//! quota: tests/rlqs.rs at the workspace root.

mod support;

use std::time::Duration;

use support::rlqs_stream::{Stream, key};
use support::{Served, rls_request};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use tollgate_proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse,
};
use tollgate_server::config::Settings;

const RULES: &str = "domain: public-api\nrules:\n  - {id: per-key, match: {name: per-key, api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 20}\n";

/// A token bucket's (max_tokens, tokens per second, TTL seconds).
fn token_bucket(action: &Action) -> (u32, u32, i64) {
    let Action::QuotaAssignmentAction(assignment) = action else {
        panic!("not an assignment: {action:?}");
    };
    let ttl = assignment
        .assignment_time_to_live
        .as_ref()
        .expect("a TTL is always set (unset expires at once)")
        .seconds;
    match assignment
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
    {
        Some(Strategy::TokenBucket(bucket)) => {
            let interval = bucket.fill_interval.as_ref().expect("fill interval");
            assert_eq!(
                (interval.seconds, interval.nanos),
                (1, 0),
                "whole seconds: Envoy 1.40 divides by them"
            );
            (
                bucket.max_tokens,
                bucket
                    .tokens_per_fill
                    .expect("tokens_per_fill is set (unset means 0)"),
                ttl,
            )
        }
        other => panic!("not a token bucket: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_report_gets_a_share_at_once_and_a_second_envoy_splits_it() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("k1");
    let mut first = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    let action = first.next_for(&id, Duration::from_secs(2)).await;
    let (max_tokens, per_second, ttl) = token_bucket(&action);
    assert_eq!(per_second, 20, "a lone Envoy gets the whole rate");
    assert!(
        (50..=100).contains(&max_tokens),
        "a lone Envoy's first fill is most of the burst, never more: {max_tokens}"
    );
    assert!(ttl >= 2, "{ttl}");

    let mut second = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    let (_, lowered, _) = token_bucket(&first.next_for(&id, Duration::from_secs(2)).await);
    let (second_max, second_rate, _) =
        token_bucket(&second.next_for(&id, Duration::from_secs(2)).await);
    assert!(
        lowered < 20,
        "the first Envoy's share is lowered: {lowered}"
    );
    assert!(
        lowered + second_rate <= 20,
        "shares sum to the rule's rate at most: {lowered} + {second_rate}"
    );
    assert!(second_rate >= 5, "{second_rate}");
    // The burst, plus what docs/rlqs.md allows on credit: a tick of the rate and a unit, and
    // one second of a newcomer's share when the burst is gone.
    assert!(
        max_tokens + second_max <= 100 + 6 + second_rate,
        "first fills come out of one burst: {max_tokens} + {second_max}"
    );
    let readyz = tollgate_testkit::http::get(served.http.port(), "/readyz", &[]).expect("readyz");
    let body: serde_json::Value = serde_json::from_str(&readyz.body).expect("json");
    assert_eq!(body["rlqs"]["streams"], 2, "{body}");
    assert_eq!(body["rlqs"]["buckets"], 1, "{body}");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoys_share_comes_out_of_the_limit_rls_callers_spent() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let mut rls = served.rls().await;
    let request = rls_request("public-api", &[&[("api_key", "k2"), ("name", "per-key")]]);
    let mut admitted = 0;
    for _ in 0..100 {
        let answer = rls
            .should_rate_limit(request.clone())
            .await
            .expect("rls")
            .into_inner();
        admitted += usize::from(answer.overall_code == 1);
    }
    assert_eq!(admitted, 100, "RLS callers spend the burst");
    let id = key("k2");
    let mut envoy = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    let (max_tokens, per_second, _) =
        token_bucket(&envoy.next_for(&id, Duration::from_secs(2)).await);
    assert!(
        max_tokens < 50,
        "the burst was spent by RLS callers; the Envoy's first fill is what refilled since: {max_tokens}"
    );
    assert!(per_second <= 20, "{per_second}");
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_no_rule_limits_is_allowed_all_with_a_ttl() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("k3");
    let mut envoy = Stream::open(served.grpc, "nobody-configured-this", &[(&id, 3, 0)]).await;
    let action = envoy.next_for(&id, Duration::from_secs(2)).await;
    let Action::QuotaAssignmentAction(assignment) = action else {
        panic!("not an assignment: {action:?}");
    };
    assert!(assignment.assignment_time_to_live.expect("ttl").seconds >= 1);
    assert_eq!(
        assignment.rate_limit_strategy.and_then(|s| s.strategy),
        Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32))
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_bucket_is_abandoned() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("k4");
    let mut envoy = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    token_bucket(&envoy.next_for(&id, Duration::from_secs(2)).await);
    for _ in 0..3 {
        envoy.report("", &[(&id, 0, 0)]).await;
    }
    let abandoned = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            if let Action::AbandonAction(_) = envoy.next_for(&id, Duration::from_secs(3)).await {
                return;
            }
        }
    })
    .await;
    assert!(
        abandoned.is_ok(),
        "three empty reports in a row abandon the bucket"
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_a_domain_or_with_another_is_refused() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("k5");
    let mut envoy = Stream::open(served.grpc, "", &[(&id, 1, 0)]).await;
    let refused = envoy.answers.message().await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    assert!(refused.message().contains("domain"), "{refused}");

    let mut envoy = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    token_bucket(&envoy.next_for(&id, Duration::from_secs(2)).await);
    envoy.report("other", &[(&id, 1, 0)]).await;
    let refused = loop {
        match envoy.answers.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without saying why"),
            Err(status) => break status,
        }
    };
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    served.stop().await;
}

/// Not a usage report: field 1 (the domain, a string) sent as a number.
#[derive(Clone, PartialEq, prost::Message)]
struct Garbage {
    #[prost(uint64, tag = "1")]
    domain: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_one_stream_ends_it_and_the_others_go_on() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("k6");
    let mut good = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    token_bucket(&good.next_for(&id, Duration::from_secs(2)).await);

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", served.grpc))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let (tx, rx) = mpsc::channel(4);
    tx.send(Garbage { domain: 7 }).await.expect("send");
    let answer = grpc
        .streaming(
            tonic::Request::new(ReceiverStream::new(rx)),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
            ),
            tonic_prost::ProstCodec::<Garbage, RateLimitQuotaResponse>::default(),
        )
        .await;
    let ended = match answer {
        Err(status) => Some(status),
        Ok(response) => {
            let mut answers = response.into_inner();
            tokio::time::timeout(Duration::from_secs(2), answers.message())
                .await
                .expect("the garbage stream ends")
                .err()
        }
    };
    drop(tx);
    // Whether the server said why or just ended the stream, the node is unharmed.
    if let Some(status) = ended {
        assert_ne!(status.code(), tonic::Code::Ok, "{status}");
    }
    good.report("", &[(&id, 5, 0)]).await;
    let other = key("k6-other");
    good.report("", &[(&other, 1, 0)]).await;
    token_bucket(&good.next_for(&other, Duration::from_secs(2)).await);
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bucket_ids_is_bounded_and_the_rest_stay_served() {
    let mut served = Served::start(
        RULES,
        Settings {
            rlqs_max_buckets: Some(300),
            ..Settings::default()
        },
    )
    .await;
    let kept = key("kept");
    let mut envoy = Stream::open(served.grpc, "public-api", &[(&kept, 1, 0)]).await;
    token_bucket(&envoy.next_for(&kept, Duration::from_secs(2)).await);

    let ids: Vec<BucketId> = (0..3_000).map(|i| key(&format!("flood-{i}"))).collect();
    let chunks: Vec<Vec<(&BucketId, u64, u64)>> = ids
        .chunks(500)
        .map(|chunk| chunk.iter().map(|id| (id, 1, 0)).collect())
        .collect();
    let flood = Stream::open(served.grpc, "public-api", &chunks[0]).await;
    for chunk in &chunks[1..] {
        flood.report("", chunk).await;
    }
    let metrics = |name: &str| -> f64 {
        let body = tollgate_testkit::http::get(served.http.port(), "/metrics", &[])
            .expect("metrics")
            .body;
        body.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(0.0)
    };
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let refused = metrics("tollgate_rlqs_buckets_refused_total");
            if refused >= 2_700.0 {
                return refused;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the reports beyond the budget are refused");
    assert!(refused <= 2_701.0, "{refused}");
    assert!(metrics("tollgate_rlqs_buckets ") <= 300.0);
    // The bucket held before the flood is still shared and renewed.
    envoy.report("", &[(&kept, 5, 0)]).await;
    let action = envoy.next_for(&kept, Duration::from_secs(6)).await;
    token_bucket(&action);
    served.stop().await;
}
