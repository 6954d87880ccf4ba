//! What a client is told, against a node on a real Redis: large limits hold, a cost that can
//! never fit is refused as such, SHADOW rules stay out of answers, and limit, remaining and
//! reset tell one story.

mod support;

use support::{Served, rls_request};
use tollgate_node::config::Settings;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
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
        store_timeout_ms: Some(200),
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
