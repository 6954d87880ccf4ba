//! One RLS request, from the gRPC handler to the answer, for counting the source files it runs
//! through (docs/node-runtime.md). Run under callgrind collecting only inside
//! `one_request`: `scripts/path-files` does, for a request served from a live lease (`hit`)
//! and one whose lease ran out, which its key's actor leases again from the store (`miss`).
//!
//! `cargo run -p tollgate-server --example path_files -- hit|miss`

use std::time::Duration;

use tollgate_node::NodeBuilder;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use tollgate_server::grpc::rls::Rls;

/// One rule, far from its limit: every request is admitted, by a lease or by the store.
const RULES: &str = "domain: api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000000, refillPerSecond: 100000}\n";

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".into(),
                value: b"k_123".to_vec(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// The request whose files are counted: everything it runs, on this thread's runtime, until
/// its answer is ready.
#[inline(never)]
fn one_request(runtime: &tokio::runtime::Runtime, rls: &Rls) -> bool {
    let answer = runtime
        .block_on(rls.should_rate_limit(tonic::Request::new(request())))
        .expect("an answer");
    answer.into_inner().overall_code == 1
}

fn main() {
    let miss = match std::env::args().nth(1).as_deref() {
        Some("hit") => false,
        Some("miss") => true,
        _ => {
            eprintln!("usage: path_files hit|miss");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let node = runtime
        .block_on(NodeBuilder::new().rules_text(RULES).start())
        .expect("the node starts");
    let rls = Rls::new(node);
    // The key earns its actor and a lease, and its refills land.
    for _ in 0..20 {
        let answer = runtime
            .block_on(rls.should_rate_limit(tonic::Request::new(request())))
            .expect("an answer");
        assert_eq!(answer.into_inner().overall_code, 1, "admitted");
    }
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    if miss {
        // Its leases end (a lease lives a second) and are given back: the next request finds
        // the bucket and its actor, and no units.
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(1_500)).await });
    }
    assert!(one_request(&runtime, &rls), "admitted");
}
