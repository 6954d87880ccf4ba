//! The penalty box (docs/penalty-box.md), on two nodes sharing one real Redis and on the
//! in-memory store: a client hammering one node past its limit is blocked once its denials,
//! counted over every node, reach the rule's `after`; the other node denies it at its next
//! decision; a blocked client's requests spend nothing and make no store call once the node
//! knows; the block ends on time; a SHADOW rule's penalty counts and blocks nobody; a lift is
//! not undone by denials another node handed out before it and counted after it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tollgate_lease::{
    BucketKey, CheckRequest, LeaseStore, Limit, RedisConfig, SharedClock, Store, TokioClock,
};
use tollgate_node::runtime::verdict::Denial;
use tollgate_node::test_support::{check, memory_node, node_on, redis_store};
use tollgate_node::{Node, Request, RuntimeConfig, Verdict};
use tollgate_testkit::{RedisServer, TcpProxy};

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

/// Denials node b handed out before a lift on node a, and counted in the store after it (b's
/// link to Redis stalled meanwhile, as on a busy machine or a congested route), must not block
/// the client the lift set free: they were part of the block lifted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_from_before_a_lift_on_another_node_do_not_block_again() {
    // Both cores busy throughout, as on a shared CI machine.
    let _busy = tollgate_testkit::BusyCores::all();
    // Refilled at one token every 10 s: once spent, the bucket denies for the whole test, and
    // a node that heard the store deny remembers it for a lease TTL (1 s) without asking.
    const SLOW: &str = "domain: auth\nrules:
  - {id: login, match: {ip: '*'}, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: 0.1,
     penalty: {after: 10, within: 1m, block: 60s}}
";
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let link = TcpProxy::start().expect("proxy");
    link.set_target(([127, 0, 0, 1], redis.port()).into());
    let clock: SharedClock = Arc::new(TokioClock::new());
    // A budget long enough that b's stalled calls are answered, not failed, once the link
    // moves again.
    let patient = Duration::from_secs(5);
    let a = node_on(
        redis_store(RedisConfig::single(redis.url()), patient),
        SLOW,
        RuntimeConfig::default(),
        clock.clone(),
    )
    .await;
    let b = node_on(
        redis_store(
            RedisConfig::single(format!("redis://{}", link.addr())),
            patient,
        ),
        SLOW,
        RuntimeConfig::default(),
        clock.clone(),
    )
    .await;
    let observer = redis_store(RedisConfig::single(redis.url()), Duration::from_secs(2));
    let key = BucketKey::new(b"203.0.113.7", "login").expect("key");
    let penalty =
        tollgate_lease::Penalty::new(10, Duration::from_secs(60), Duration::from_secs(60))
            .expect("penalty");
    let standing = || async {
        observer
            .penalty_standing(&key, &penalty)
            .await
            .expect("read")
    };

    // b: the burst, then the store's first denial.
    let mut admitted = 0;
    loop {
        let v = check(&b, &client("203.0.113.7")).await;
        if !v.allowed {
            break;
        }
        admitted += 1;
        assert!(admitted <= 5, "capacity 5");
    }
    // b's link stalls; b goes on denying from what the store said, 9 more times, and holds
    // those denials for the store.
    link.hold();
    for _ in 0..9 {
        let v = tokio::time::timeout(
            Duration::from_millis(500),
            check(&b, &client("203.0.113.7")),
        )
        .await
        .expect("denied from what the store said, without it");
        assert!(!v.allowed && !penalized(&v), "{v:?}");
    }
    // Meanwhile an operator lifts the client's penalty on a.
    a.operator()
        .lift_penalties(&client("203.0.113.7"), None)
        .await
        .expect("lifted");
    link.release();

    // b's denials reach the store after the lift: counted nothing, and said so.
    let uncounted = "tollgate_penalty_denials_uncounted_total{domain=\"auth\",rule=\"login\",reason=\"lifted\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rendered = b.metrics().render();
        let refused: u64 = rendered
            .lines()
            .find_map(|l| l.strip_prefix(uncounted))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let state = standing().await;
        if refused >= 9 || state.blocked() || state.denials >= 9 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's denials never reached the store: {refused} refused, {state:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let state = standing().await;
    assert!(
        !state.blocked() && state.denials == 0,
        "the client the lift set free is counted for denials from before it: {state:?}"
    );
    assert!(
        !penalized(&check(&a, &client("203.0.113.7")).await),
        "blocked again by denials from before the lift"
    );

    // The penalty still holds after the lift: fresh denials block at the 10th.
    let (decisions, denials) =
        hammer_until_blocked(&a, "203.0.113.7", Duration::from_secs(5)).await;
    assert!(
        denials >= 9,
        "blocked after {denials} fresh denials ({decisions} decisions): the penalty says 10"
    );
}
