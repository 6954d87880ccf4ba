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
    // 1 MiB for every bucket, a quarter of it for one stream.
    let mut served = Served::start(
        RULES,
        Settings {
            rlqs_max_state_mb: Some(1),
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
    let metrics = |name: &str| metric(&served, name);
    // Every report is either held or refused (the flood's 3,000 and the kept one).
    let (refused, held) = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let refused = metrics("tollgate_rlqs_buckets_refused_total");
            let held = metrics("tollgate_rlqs_buckets ");
            if refused + held >= 3_001.0 {
                return (refused, held);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("every report is held or refused");
    assert_eq!(refused + held, 3_001.0);
    // A quarter of 1 MiB for the flooding stream, each bucket charged whole.
    use tollgate_server::rlqs::streams::{BUCKET_BYTES, SHARE_BYTES};
    let most = (1 << 20) / 4 / (BUCKET_BYTES + SHARE_BYTES);
    assert!(
        (most as f64 / 2.0..=most as f64 + 1.0).contains(&held),
        "{held} buckets held (at most {most} for one stream), {refused} refused"
    );
    let bytes = metrics("tollgate_rlqs_state_bytes ");
    assert!(
        bytes <= 1_048_576.0 && bytes > 0.0,
        "{bytes} bytes held of a 1 MiB budget"
    );
    // The bucket held before the flood is still shared and renewed.
    envoy.report("", &[(&kept, 5, 0)]).await;
    let action = envoy.next_for(&kept, Duration::from_secs(6)).await;
    token_bucket(&action);
    served.stop().await;
}

/// The node's `/metrics` sample `name` (its first line).
fn metric(served: &Served, name: &str) -> f64 {
    let body = tollgate_testkit::http::get(served.http.port(), "/metrics", &[])
        .expect("metrics")
        .body;
    tollgate_testkit::http::metric_sum(&body, name, "")
}

/// An Envoy that has seen more keys than its quarter of the budget holds at once still gets a
/// share for every new key, once the old ones went idle: the buckets its Envoy was told to
/// abandon leave the stream's budget (they used to stay counted against it for good, and new
/// keys got no assignment at all past 10,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_forgets_what_its_envoy_forgot_and_new_keys_get_shares() {
    // A stream's quarter of 4 MiB holds some 400 buckets.
    let mut served = Served::start(
        RULES,
        Settings {
            rlqs_max_state_mb: Some(4),
            ..Settings::default()
        },
    )
    .await;
    let old: Vec<BucketId> = (0..300).map(|i| key(&format!("old-{i}"))).collect();
    let first: Vec<(&BucketId, u64, u64)> = old.iter().map(|id| (id, 1, 0)).collect();
    let mut envoy = Stream::open(served.grpc, "public-api", &first).await;
    token_bucket(&envoy.next_for(&old[299], Duration::from_secs(5)).await);
    let held = metric(&served, "tollgate_rlqs_buckets ");
    assert_eq!(held, 300.0, "every old key held");
    // Three reports with no request: every old key is abandoned, and forgotten.
    let idle: Vec<(&BucketId, u64, u64)> = old.iter().map(|id| (id, 0, 0)).collect();
    for _ in 0..3 {
        envoy.report("", &idle).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metric(&served, "tollgate_rlqs_buckets ") > 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old buckets are forgotten"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&served, "tollgate_rlqs_state_bytes "), 0.0);
    // As many new keys again: each gets a share (had the old ones stayed counted, these would
    // not fit).
    let refused_before = metric(&served, "tollgate_rlqs_buckets_refused_total");
    let new: Vec<BucketId> = (0..300).map(|i| key(&format!("new-{i}"))).collect();
    let report: Vec<(&BucketId, u64, u64)> = new.iter().map(|id| (id, 1, 0)).collect();
    envoy.report("", &report).await;
    for id in new.iter().step_by(50) {
        token_bucket(&envoy.next_for(id, Duration::from_secs(5)).await);
    }
    assert_eq!(
        metric(&served, "tollgate_rlqs_buckets_refused_total"),
        refused_before,
        "no new key refused"
    );
    // An abandoned key its Envoy subscribes again gets a share at once.
    envoy.report("", &[(&old[0], 1, 0)]).await;
    token_bucket(&envoy.next_for(&old[0], Duration::from_secs(2)).await);
    served.stop().await;
}

/// A report larger than the node takes ends its stream with RESOURCE_EXHAUSTED, which Envoy
/// logs (never an OK that reads as a clean close), and the other streams go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_over_the_limit_ends_its_stream_with_a_status() {
    let mut served = Served::start(
        RULES,
        Settings {
            rlqs_max_report_mb: Some(1),
            ..Settings::default()
        },
    )
    .await;
    let honest = key("honest");
    let mut good = Stream::open(served.grpc, "public-api", &[(&honest, 1, 0)]).await;
    token_bucket(&good.next_for(&honest, Duration::from_secs(2)).await);
    // 6,000 keys of 200 bytes: about 1.4 MB.
    let ids: Vec<BucketId> = (0..6_000).map(|i| key(&format!("{i:0>200}"))).collect();
    let big: Vec<(&BucketId, u64, u64)> = ids.iter().map(|id| (id, 1, 0)).collect();
    let mut large = Stream::open(served.grpc, "public-api", &big).await;
    let status = large.ended(Duration::from_secs(5)).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
    assert!(
        status.message().contains("--rlqs-max-report-mb"),
        "{status}"
    );
    assert_eq!(
        served.node.metrics().rlqs.ended_count("report_too_large"),
        1
    );
    good.report("", &[(&honest, 5, 0)]).await;
    token_bucket(&good.next_for(&honest, Duration::from_secs(6)).await);
    served.stop().await;
}

/// A stream that opens and never reports is ended; a stream that does not read its answers is
/// ended, and the buckets it held go when their assignments have run out; one host holds at
/// most 32 streams. Meanwhile an honest Envoy keeps its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_unread_and_too_many_streams_are_ended_and_an_honest_envoy_keeps_its_share() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let honest = key("honest");
    let mut good = Stream::open(served.grpc, "public-api", &[(&honest, 1, 0)]).await;
    token_bucket(&good.next_for(&honest, Duration::from_secs(2)).await);
    let attacker: std::net::IpAddr = "127.0.0.2".parse().expect("ip");
    // Silent: opened, never a report.
    let mut silent = Stream::try_open_from(Some(attacker), served.grpc, None)
        .await
        .expect("opened");
    // Unread: 2,000 buckets reported, no answer read (the stream's outbox fills).
    let many: Vec<BucketId> = (0..2_000).map(|i| key(&format!("unread-{i}"))).collect();
    let report: Vec<(&BucketId, u64, u64)> = many.iter().map(|id| (id, 1, 0)).collect();
    let unread = Stream::try_open_with(
        tonic::transport::Endpoint::from_shared(format!("http://{}", served.grpc))
            .expect("endpoint")
            .local_address(Some(attacker))
            // HTTP/2's smallest windows: once a few answers are in, the server can send no
            // more until this client reads, which it never does.
            .initial_stream_window_size(Some(65_535))
            .initial_connection_window_size(Some(65_535)),
        Some(support::rlqs_stream::usage_reports("public-api", &report)),
    )
    .await
    .expect("opened");
    // Too many from one host: 30 more stand, the 33rd is refused.
    let mut crowd = vec![];
    for i in 0..30 {
        let id = key(&format!("crowd-{i}"));
        crowd.push(
            Stream::try_open_from(
                Some(attacker),
                served.grpc,
                Some(support::rlqs_stream::usage_reports(
                    "public-api",
                    &[(&id, 1, 0)],
                )),
            )
            .await
            .expect("opened"),
        );
    }
    let id = key("one-too-many");
    let refused = match Stream::try_open_from(
        Some(attacker),
        served.grpc,
        Some(support::rlqs_stream::usage_reports(
            "public-api",
            &[(&id, 1, 0)],
        )),
    )
    .await
    {
        Err(status) => status,
        Ok(mut stream) => stream.ended(Duration::from_secs(2)).await,
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    let status = silent.ended(Duration::from_secs(15)).await;
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status}");
    let rlqs = &served.node.metrics().rlqs;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while rlqs.ended_count("unread") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unread stream is ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(unread);
    // The honest Envoy's share was renewed throughout.
    good.report("", &[(&honest, 5, 0)]).await;
    token_bucket(&good.next_for(&honest, Duration::from_secs(6)).await);
    assert_eq!(rlqs.ended_count("too_many_from_host"), 1);
    assert_eq!(rlqs.ended_count("no_first_report"), 1);
    drop(crowd);
    served.stop().await;
}

/// Many streams of one host on one bucket share that host's part: an Envoy on another host
/// keeps half the rate (it used to be handed DENY_ALL when 2,000 streams shared a bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_of_one_host_cannot_drain_another_hosts_share() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("shared");
    let attacker: std::net::IpAddr = "127.0.0.3".parse().expect("ip");
    let mut crowd = vec![];
    for _ in 0..30 {
        let mut stream = Stream::try_open_from(
            Some(attacker),
            served.grpc,
            Some(support::rlqs_stream::usage_reports(
                "public-api",
                &[(&id, 100, 0)],
            )),
        )
        .await
        .expect("opened");
        stream.next_for(&id, Duration::from_secs(2)).await;
        crowd.push(stream);
    }
    let mut honest = Stream::open(served.grpc, "public-api", &[(&id, 100, 0)]).await;
    // Its share follows the next rebalances: half the rule's 20 a second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut rate = honest.next_rate(&id, Duration::from_secs(6)).await;
    while rate < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the honest host's share stays at {rate}"
        );
        rate = honest.next_rate(&id, Duration::from_secs(6)).await;
    }
    assert!(rate <= 10, "{rate}");
    drop(crowd);
    served.stop().await;
}

/// What an Envoy reports is counted up to what it could have done: a report of 2^64 - 1
/// requests admitted on a share of 20 a second adds no more than that share allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_counts_are_taken_up_to_what_the_envoy_could_do() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("liar");
    let mut envoy = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    token_bucket(&envoy.next_for(&id, Duration::from_secs(2)).await);
    envoy.report("", &[(&id, u64::MAX, u64::MAX)]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = tollgate_testkit::http::get(served.http.port(), "/metrics", &[])
        .expect("metrics")
        .body;
    let allowed = tollgate_testkit::http::metric_sum(
        &body,
        "tollgate_rlqs_reported_requests_total",
        "result=\"allowed\"",
    );
    let denied = tollgate_testkit::http::metric_sum(
        &body,
        "tollgate_rlqs_reported_requests_total",
        "result=\"denied\"",
    );
    // The first report's 1, then at most the bucket's 100 and a second or two of 20.
    assert!(allowed <= 200.0, "{allowed} allowed counted");
    assert!(denied <= 2_000_000.0, "{denied} denied counted");
    served.stop().await;
}

/// A bucket id that is not UTF-8 (a client's header bytes) gets no answer: Envoy 1.40 would
/// refuse the answer and drop the whole stream (found with the shipped config: one such key
/// cut an Envoy's every assignment). It is counted, and the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_id_that_is_not_utf8_gets_no_answer_and_the_stream_goes_on() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let mut odd = key("odd");
    odd.bucket
        .insert("api_key".into(), b"odd-\xff\xfe".to_vec());
    let fine = key("fine");
    let mut envoy = Stream::open(served.grpc, "public-api", &[(&odd, 1, 0), (&fine, 1, 0)]).await;
    token_bucket(&envoy.next_for(&fine, Duration::from_secs(2)).await);
    assert_eq!(
        served.node.metrics().rlqs.refused_count("not_utf8"),
        1,
        "counted"
    );
    let later = key("later");
    envoy.report("", &[(&odd, 1, 0), (&later, 1, 0)]).await;
    token_bucket(&envoy.next_for(&later, Duration::from_secs(2)).await);
    // Nothing the node sends names it, for as long as a renewal takes.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(answer)) = envoy.answers.message().await {
            for action in answer.bucket_action {
                assert_ne!(action.bucket_id.as_ref(), Some(&odd), "an answer names it");
            }
        }
    })
    .await;
    served.stop().await;
}

/// Every action pushed for `id` on `stream` within `within`.
async fn actions_for(
    stream: &mut Stream,
    id: &tollgate_proto::envoy::service::rate_limit_quota::v3::BucketId,
    within: Duration,
) -> Vec<Action> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = vec![];
    while let Ok(Ok(Some(answer))) =
        tokio::time::timeout_at(deadline, stream.answers.message()).await
    {
        out.extend(
            answer
                .bucket_action
                .into_iter()
                .filter(|a| a.bucket_id.as_ref() == Some(id))
                .filter_map(|a| a.bucket_action),
        );
    }
    out
}

/// An Envoy that holds the rule's burst keeps its bucket when others join while the node's
/// credit is short: they wait for theirs. Cut to DENY_ALL, its Envoy dropped the bucket and
/// the burst in it (three real Envoys on a busy node admitted 0.73 of the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_holding_the_burst_keeps_its_bucket_when_others_join() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let id = key("joined");
    let mut first = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    let (max_tokens, _, _) = token_bucket(&first.next_for(&id, Duration::from_secs(2)).await);
    assert_eq!(max_tokens, 100, "the first Envoy's bucket holds the burst");
    // Two more join at once: the burst is gone from the store, the credit short.
    let mut second = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    let mut third = Stream::open(served.grpc, "public-api", &[(&id, 1, 0)]).await;
    second.next_for(&id, Duration::from_secs(2)).await;
    let newcomer = third.next_for(&id, Duration::from_secs(2)).await;
    let pushed = actions_for(&mut first, &id, Duration::from_secs(2)).await;
    for action in &pushed {
        let (max_tokens, per_second, _) = token_bucket(action);
        assert!(
            per_second >= 1 && max_tokens >= 100,
            "the first Envoy's bucket was replaced: {action:?}"
        );
    }
    // The newcomer that waited gets its bucket once the rule's refill pays for it.
    if !matches!(&newcomer, Action::QuotaAssignmentAction(a)
        if matches!(a.rate_limit_strategy.as_ref().and_then(|s| s.strategy.as_ref()), Some(Strategy::TokenBucket(_))))
    {
        assert!(third.next_rate(&id, Duration::from_secs(3)).await >= 1);
    }
    served.stop().await;
}
