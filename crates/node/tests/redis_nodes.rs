//! Several nodes sharing one real Redis (and a real Redis Cluster), all hammering one hot key:
//! never more admitted than the limit, units conserved (admitted + what Redis holds = the
//! limit once the nodes stop and return their leases), few false denials, and far fewer store
//! calls than decisions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_lease::{
    BucketKey, CheckRequest, LeaseStore, Limit, RedisConfig, SharedClock, Store, TokioClock,
};
use tollgate_node::test_support::{node_on, redis_store};
use tollgate_node::{Node, Request, RuntimeConfig};
use tollgate_testkit::{RedisCluster, RedisServer};

const NODES: usize = 4;
const TASKS_PER_NODE: usize = 6;
const CHECKS_PER_TASK: usize = 250;
/// Budget of a store call in these tests: the default a user gets (a loaded machine must not
/// turn a healthy store's late answer into a fail-mode decision: the node judges a late call
/// by whether the store still answers).
const BUDGET: Duration = Duration::from_millis(5);
/// The test's own look at the store (not a node's): patient, it only observes.
const OBSERVER_BUDGET: Duration = Duration::from_secs(2);

struct Run {
    admitted: u64,
    denied: u64,
    false_denials: u64,
    store_calls: u64,
    left_in_store: u64,
}

async fn hammer(config: RedisConfig, limit: Limit, rule_yaml: &str) -> Run {
    let clock: SharedClock = Arc::new(TokioClock::new());
    let yaml = format!(
        "domain: api\nrules:\n  - {{id: hot, match: {{api_key: '*'}}, {rule_yaml}, failMode: CLOSED}}\n"
    );
    let mut nodes: Vec<Node> = vec![];
    for _ in 0..NODES {
        nodes.push(
            node_on(
                redis_store(config.clone(), BUDGET),
                &yaml,
                RuntimeConfig::default(),
                clock.clone(),
            )
            .await,
        );
    }
    let observer = redis_store(config, OBSERVER_BUDGET);
    let key = BucketKey::new(b"hot-key", "hot").expect("key");
    let (admitted, denied, false_denials) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = vec![];
    for node in &nodes {
        for _ in 0..TASKS_PER_NODE {
            let (node, observer, key) = (node.clone(), observer.clone(), key.clone());
            let (admitted, denied, false_denials) =
                (admitted.clone(), denied.clone(), false_denials.clone());
            tasks.push(tokio::spawn(async move {
                let request = Request::new("api").descriptor([("api_key", "hot-key")]);
                for _ in 0..CHECKS_PER_TASK {
                    if node.check(&request).await.expect("valid").allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    } else {
                        denied.fetch_add(1, Ordering::Relaxed);
                        // A false denial: the store still had units nobody had leased.
                        let peek = observer
                            .check(&CheckRequest::single(key.clone(), limit, 0).expect("peek"))
                            .await
                            .expect("peek");
                        if peek.buckets[0].remaining > 0 {
                            false_denials.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let store_calls = nodes.iter().map(|n| n.metrics().store_calls.get()).sum();
    for node in &nodes {
        node.shutdown().await;
    }
    let peek = observer
        .check(&CheckRequest::single(key, limit, 0).expect("peek"))
        .await
        .expect("peek");
    Run {
        admitted: admitted.load(Ordering::Relaxed),
        denied: denied.load(Ordering::Relaxed),
        false_denials: false_denials.load(Ordering::Relaxed),
        store_calls,
        left_in_store: peek.buckets[0].remaining,
    }
}

fn report(name: &str, limit: u64, run: &Run) {
    let decisions = run.admitted + run.denied;
    eprintln!(
        "{name}: {decisions} decisions on {NODES} nodes, {} admitted (limit {limit}), {} denied of which {} false \
         ({:.2}%), {} store calls ({:.4} per decision), {} units left in the store after shutdown",
        run.admitted,
        run.denied,
        run.false_denials,
        100.0 * run.false_denials as f64 / decisions as f64,
        run.store_calls,
        run.store_calls as f64 / decisions as f64,
        run.left_in_store,
    );
    assert!(
        run.admitted <= limit,
        "over-admitted: {} > {limit}",
        run.admitted
    );
    assert_eq!(
        run.admitted + run.left_in_store,
        limit,
        "units were lost or created"
    );
    assert!(
        run.false_denials * 100 <= decisions,
        "more than 1% false denials"
    );
    assert!(
        run.store_calls * 5 <= decisions,
        "leases should make store calls a small fraction of decisions"
    );
}

async fn redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_on_one_redis_admits_exactly_the_limit() {
    let server = redis().await;
    let limit = Limit::token_bucket(1000, 0.001).expect("limit");
    let run = hammer(
        RedisConfig::single(server.url()),
        limit,
        "algorithm: TOKEN_BUCKET, capacity: 1000, refillPerSecond: 0.001",
    )
    .await;
    report("token bucket, single Redis", 1000, &run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_on_one_redis_admits_exactly_its_burst() {
    let server = redis().await;
    let limit = Limit::gcra(1000, 0.001).expect("limit");
    let run = hammer(
        RedisConfig::single(server.url()),
        limit,
        "algorithm: GCRA, burst: 1000, ratePerSecond: 0.001",
    )
    .await;
    report("GCRA, single Redis", 1000, &run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_bucket_on_a_redis_cluster_admits_exactly_its_burst() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("join")
        .expect("cluster");
    let limit = Limit::leaky_bucket(1, Duration::from_secs(3600), Some(1000)).expect("limit");
    let run = hammer(
        RedisConfig::cluster(cluster.urls()),
        limit,
        "algorithm: LEAKY_BUCKET, limit: 1, duration: 1h, burst: 1000",
    )
    .await;
    report("leaky bucket, Redis Cluster", 1000, &run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_on_one_redis_admits_exactly_the_limit() {
    let server = redis().await;
    // An hour-long window: the run cannot straddle a boundary unless it starts in the last
    // minute of an hour, when it waits for the next window instead.
    let now = tollgate_lease::Clock::now_micros(&tollgate_lease::SystemClock);
    let into_hour = now % 3_600_000_000;
    if into_hour > 3_540_000_000 {
        tokio::time::sleep(Duration::from_micros(3_600_000_000 - into_hour + 1000)).await;
    }
    let limit = Limit::fixed_window(1000, Duration::from_secs(3600)).expect("limit");
    let run = hammer(
        RedisConfig::single(server.url()),
        limit,
        "algorithm: FIXED_WINDOW, limit: 1000, window: 1h",
    )
    .await;
    report("fixed window, single Redis", 1000, &run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_on_a_redis_cluster_admits_exactly_the_limit() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("join")
        .expect("cluster");
    let limit = Limit::token_bucket(1000, 0.001).expect("limit");
    let run = hammer(
        RedisConfig::cluster(cluster.urls()),
        limit,
        "algorithm: TOKEN_BUCKET, capacity: 1000, refillPerSecond: 0.001",
    )
    .await;
    report("token bucket, Redis Cluster", 1000, &run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_puts_unspent_leased_units_back_in_redis() {
    let server = redis().await;
    let clock: SharedClock = Arc::new(TokioClock::new());
    let yaml = "domain: api\nrules:\n  - {id: r, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000, refillPerSecond: 0.001}\n";
    let config = RuntimeConfig {
        prelimit_factor: None,
        ..RuntimeConfig::default()
    };
    let node = node_on(
        redis_store(RedisConfig::single(server.url()), BUDGET),
        yaml,
        config,
        clock,
    )
    .await;
    let request = Request::new("api").descriptor([("api_key", "k")]);
    for _ in 0..120 {
        assert!(node.check(&request).await.expect("valid").allowed);
    }
    let observer: Store = redis_store(RedisConfig::single(server.url()), OBSERVER_BUDGET);
    let key = BucketKey::new(b"k", "r").expect("key");
    let limit = Limit::token_bucket(1000, 0.001).expect("limit");
    let peek = |observer: Store, key: BucketKey| async move {
        observer
            .check(&CheckRequest::single(key, limit, 0).expect("peek"))
            .await
            .expect("peek")
            .buckets[0]
            .remaining
    };
    // The node leases ahead of demand: its refill is asynchronous, so the one the 120th
    // request set off may still be on its way to Redis (seen once on a busy CI machine, 880
    // left); it lands within a store call.
    let asked = tokio::time::Instant::now();
    let before = loop {
        let left = peek(observer.clone(), key.clone()).await;
        if left < 880 || asked.elapsed() > Duration::from_secs(1) {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        before < 880,
        "the node holds leased units ahead of demand: {before} left in Redis"
    );
    node.shutdown().await;
    assert_eq!(
        peek(observer, key).await,
        880,
        "everything not spent is back in Redis"
    );
}
