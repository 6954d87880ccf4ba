//! The penalty box (docs/penalty-box.md), on two nodes sharing one real Redis and on the
//! in-memory store: a client hammering one node past its limit is blocked once its denials,
//! counted over every node, reach the rule's `after`; the other node denies it at its next
//! decision; a blocked client's requests spend nothing and make no store call once the node
//! knows; the block ends on time; a SHADOW rule's penalty counts and blocks nobody.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{check, memory_node, node_on, redis_store};
use tokio::time::{Instant, sleep};
use tollgate_lease::{
    BucketKey, CheckRequest, LeaseStore, Limit, RedisConfig, SharedClock, Store, TokioClock,
};
use tollgate_node::runtime::verdict::Denial;
use tollgate_node::{Node, Request, RuntimeConfig, Verdict};
use tollgate_testkit::RedisServer;

/// Capacity 5, refilled at 100/s: a client sending as fast as it can is denied often, and the
/// bucket is full again 50 ms after it stops (so a request that spent would show).
const RULES: &str = "domain: auth\nrules:
  - {id: login, match: {ip: '*'}, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: 100,
     penalty: {after: 10, within: 1m, block: 4s}}
";

fn client(ip: &str) -> Request {
    Request::new("auth").descriptor([("ip", ip)])
}

fn penalized(v: &Verdict) -> bool {
    !v.allowed && v.denial() == Some(Denial::Penalized)
}

/// What the store holds of `ip`'s bucket, peeked (nothing spent).
async fn remaining(store: &Store, ip: &str) -> u64 {
    let key = BucketKey::new(ip.as_bytes(), "login").expect("key");
    let limit = Limit::token_bucket(5, 100.0).expect("limit");
    let peek = CheckRequest::single(key, limit, 0).expect("peek");
    store.check(&peek).await.expect("peek").buckets[0].remaining
}

/// Hammers `node` until it denies `ip` as penalized; the decisions that took, and how many of
/// them were denials. Panics if no block comes within `within`.
async fn hammer_until_blocked(node: &Node, ip: &str, within: Duration) -> (usize, usize) {
    let start = Instant::now();
    let (mut decisions, mut denials) = (0, 0);
    loop {
        let v = check(node, &client(ip)).await;
        decisions += 1;
        if penalized(&v) {
            return (decisions, denials);
        }
        if !v.allowed {
            denials += 1;
        }
        assert!(
            start.elapsed() < within,
            "no block after {decisions} decisions ({denials} denied) in {within:?}"
        );
        // A client retrying at once, as abusive ones do (and a chance for the node's other
        // tasks to run on a busy machine).
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_blocked_on_one_node_is_blocked_on_the_other_spends_nothing_and_comes_back_on_time()
 {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let clock: SharedClock = Arc::new(TokioClock::new());
    let budget = RedisConfig::default().call_timeout;
    let open = || redis_store(RedisConfig::single(redis.url()), budget);
    let a = node_on(open(), RULES, RuntimeConfig::default(), clock.clone()).await;
    let b = node_on(open(), RULES, RuntimeConfig::default(), clock.clone()).await;
    let observer = redis_store(RedisConfig::single(redis.url()), Duration::from_secs(2));

    // Node a: the client spends its burst, then is denied until its denials reach 10.
    let (decisions, denials) =
        hammer_until_blocked(&a, "203.0.113.7", Duration::from_secs(2)).await;
    assert!(
        denials >= 10,
        "blocked after {denials} denials ({decisions} decisions): the penalty says 10"
    );
    let blocked_at = Instant::now();

    // Node b never saw the client: its first decision already knows.
    let first = check(&b, &client("203.0.113.7")).await;
    assert!(penalized(&first), "{first:?}");
    assert!(
        first.retry_after > Duration::from_secs(3) && first.retry_after <= Duration::from_secs(4),
        "Retry-After is the block's time left: {:?}",
        first.retry_after
    );
    // Another client of the same rule is not blocked.
    assert!(check(&b, &client("198.51.100.1")).await.allowed);

    // Once the leases the hammering held have expired or come back, the bucket is full: the
    // blocked client's requests, on both nodes, take nothing from it and call no store.
    sleep(Duration::from_millis(1_500)).await;
    assert_eq!(remaining(&observer, "203.0.113.7").await, 5);
    let calls = (a.metrics().store_calls.get(), b.metrics().store_calls.get());
    for node in [&a, &b] {
        for _ in 0..200 {
            let v = check(node, &client("203.0.113.7")).await;
            assert!(penalized(&v), "{v:?}");
        }
    }
    assert_eq!(
        (a.metrics().store_calls.get(), b.metrics().store_calls.get()),
        calls,
        "a known block is decided without the store"
    );
    assert_eq!(
        remaining(&observer, "203.0.113.7").await,
        5,
        "nothing spent"
    );

    // The block ends on time: a request before its end is denied, one after is admitted.
    let left = check(&a, &client("203.0.113.7")).await.retry_after;
    let ends = Instant::now() + left;
    assert!(
        ends.duration_since(blocked_at) <= Duration::from_millis(4_100),
        "the block lasts 4 s from when it started: {:?}",
        ends.duration_since(blocked_at)
    );
    sleep(left.saturating_sub(Duration::from_millis(200))).await;
    assert!(penalized(&check(&b, &client("203.0.113.7")).await));
    sleep(Duration::from_millis(300)).await;
    assert!(
        check(&a, &client("203.0.113.7")).await.allowed,
        "the block ended"
    );
    assert!(
        check(&b, &client("203.0.113.7")).await.allowed,
        "on both nodes"
    );
    let rendered = a.metrics().render();
    assert!(
        rendered.contains(
            "tollgate_penalties_total{domain=\"auth\",rule=\"login\",outcome=\"blocked\"} 1"
        ),
        "{rendered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_penalty_counts_and_blocks_nobody() {
    let rules = RULES.replace("penalty:", "mode: SHADOW, penalty:");
    let (node, _) = memory_node(&rules, RuntimeConfig::default()).await;
    let started = Instant::now();
    let mut decisions = 0;
    loop {
        let v = check(&node, &client("203.0.113.9")).await;
        decisions += 1;
        assert!(v.allowed, "a SHADOW rule denies nobody: {v:?}");
        if node.metrics().render().contains(
            "tollgate_penalties_total{domain=\"auth\",rule=\"login\",outcome=\"shadow\"} 1",
        ) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no shadow penalty after {decisions} decisions"
        );
        tokio::task::yield_now().await;
    }
    assert!(
        decisions >= 15,
        "5 admitted, then 10 shadow denials at least: {decisions}"
    );
    for _ in 0..100 {
        assert!(check(&node, &client("203.0.113.9")).await.allowed);
    }
}
