//! RLQS push latency on a node process's own port: how long from an Envoy's first report of a
//! bucket to its assignment (one store draw and a push), and from a second Envoy's first
//! report of a bucket to the first Envoy's lowered share (the decrease pushed before the
//! newcomer's assignment), on the in-memory store and on a real Redis. Rule: token bucket
//! 100 + 20/s per key (deploy/rules/rlqs.yaml's).
//!
//! `cargo bench -p tollgate-server --bench rlqs_push` (`BENCH_SAMPLES`, default 200).

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use tollgate_proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tollgate_server::config::{Config, Settings};
use tonic::Streaming;

const RULES: &str = "domain: public-api\nrules:\n  - {id: per-key, match: {name: per-key, api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 20}\n";

struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

fn report(id: &BucketId) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "public-api".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(id.clone()),
            time_elapsed: Some(prost_types::Duration::default()),
            num_requests_allowed: 1,
            num_requests_denied: 0,
            last_report: None,
        }],
    }
}

fn key(name: String) -> BucketId {
    BucketId {
        bucket: HashMap::from([
            ("name".to_owned(), "per-key".to_owned()),
            ("api_key".to_owned(), name),
        ]),
    }
}

impl Stream {
    async fn open(port: u16, first: &BucketId) -> Stream {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connect");
        let (reports, rx) = mpsc::channel(16);
        reports.send(report(first)).await.expect("report");
        let answers = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        Stream { reports, answers }
    }

    /// The next token bucket rate pushed for `id`.
    async fn next_rate(&mut self, id: &BucketId) -> u32 {
        loop {
            let answer = tokio::time::timeout(Duration::from_secs(5), self.answers.message())
                .await
                .expect("an answer within 5 s")
                .expect("stream ok")
                .expect("stream open");
            for action in answer.bucket_action {
                if action.bucket_id.as_ref() != Some(id) {
                    continue;
                }
                if let Some(Action::QuotaAssignmentAction(a)) = action.bucket_action {
                    use tollgate_proto::envoy::r#type::v3::rate_limit_strategy::Strategy;
                    if let Some(Strategy::TokenBucket(b)) =
                        a.rate_limit_strategy.and_then(|s| s.strategy)
                    {
                        return b.tokens_per_fill.unwrap_or(0);
                    }
                }
            }
        }
    }
}

fn percentiles(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    println!(
        "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
        ms.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        ms[ms.len() - 1]
    );
}

async fn measure(store: &str, redis: Option<String>, samples: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let config = Config::try_from(Settings {
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        rules: Some(vec![rules]),
        redis_url: redis.map(|u| vec![u]),
        ..Settings::default()
    })
    .expect("config");
    let mut serving = tollgate_server::app::App::start(config)
        .await
        .expect("node")
        .spawn();
    let port = serving.grpc_addr.port();
    let warm = key("warm".into());
    let mut first = Stream::open(port, &warm).await;
    first.next_rate(&warm).await;
    let mut assign = Vec::with_capacity(samples);
    let mut lower = Vec::with_capacity(samples);
    for i in 0..samples {
        let id = key(format!("k{i}"));
        let t = Instant::now();
        first.reports.send(report(&id)).await.expect("report");
        let whole = first.next_rate(&id).await;
        assign.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let mut second = Stream::open(port, &id).await;
        let lowered = first.next_rate(&id).await;
        lower.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(lowered < whole, "{lowered} < {whole}");
        second.next_rate(&id).await;
        drop(second);
    }
    percentiles(&format!("{store}: first report to assignment"), assign);
    percentiles(
        &format!("{store}: second Envoy's report to the first's lowered share"),
        lower,
    );
    drop(first);
    serving.stop().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let samples: usize = std::env::var("BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
        .max(1);
    println!("| store: what | samples | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    measure("in-memory", None, samples).await;
    let redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server");
    measure("Redis", Some(redis.url()), samples).await;
}
