//! A busy store is not a dead store: two nodes on a real Redis Cluster (3 primaries, 3
//! replicas) with the default store budget (5 ms), started as a gateway starts them and loaded
//! from their first decision (nobody warms anything up), 64 API keys on a token bucket of
//! 20 + 2/s, and a load that saturates this machine. With no fault, every key stays within its
//! exact bound, counting every admission (the store's, and any made without its answer), the
//! breaker never opens and fail-open decisions stay under 1 %. With the slot-0 primary killed
//! mid-run, each way the cluster may be set: with `cluster-require-full-coverage no`, keys on
//! the other shards stay within their bounds (one shard's failure opens that shard's breaker
//! only); on Redis's default (yes), the node said beforehand what would happen, and every
//! shard's keys go without the store while the slot is uncovered. Either way every key is
//! decided by the store again within 5 s of the replica's promotion.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_lease::RedisConfig;
use tollgate_node::runtime::Outcome;
use tollgate_node::{Node, NodeBuilder, Request};
use tollgate_testkit::RedisCluster;

const KEYS: usize = 64;
const CAPACITY: f64 = 20.0;
const RATE: f64 = 2.0;
const RUN: Duration = Duration::from_secs(12);
/// With a failover: the kill at 4 s, the promotion a few seconds later, then 5 s to tell.
const RUN_WITH_FAILOVER: Duration = Duration::from_secs(15);
/// Client tasks per node: far more than the two cores can serve at once.
const TASKS_PER_NODE: usize = 32;

const RULES: &str = "domain: api\nrules:\n  - {id: keys, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 20, refillPerSecond: 2}\n";

fn key(i: usize) -> String {
    format!("k{i:02}")
}

fn request(i: usize) -> Request {
    Request::new("api").descriptor([("api_key", key(i))])
}

/// The store key of `key(i)`'s bucket (for finding its cluster shard).
fn store_key(i: usize) -> String {
    tollgate_lease::BucketKey::new(key(i).as_bytes(), "keys")
        .expect("key")
        .as_str()
        .to_owned()
}

#[derive(Default)]
struct Tally {
    admitted: Vec<AtomicU64>,
    /// Per key, admissions made without the store's answer: on its last answer while it was
    /// slow (owed to the next grant, forgiven if the call then fails) or by the OPEN fail mode.
    without_store: Vec<AtomicU64>,
    failed_open: AtomicU64,
    decisions: AtomicU64,
    /// When (ms since the start) the failed shard's replica was promoted (0: not yet).
    promoted_at: AtomicU64,
    /// Per key, the first store-backed decision (ms since the start) after the promotion.
    back_after_promotion: Vec<AtomicU64>,
}

impl Tally {
    fn new() -> Arc<Self> {
        Arc::new(Tally {
            admitted: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            without_store: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            back_after_promotion: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            ..Tally::default()
        })
    }
}

/// A node on the cluster as a gateway links one: the default store budget, started by the
/// builder (which warms the store up: connected to every shard, scripts loaded), and loaded
/// from its first decision on.
async fn cluster_node(urls: Vec<String>) -> Node {
    NodeBuilder::new()
        .rules_text(RULES)
        .redis(RedisConfig::cluster(urls))
        .start()
        .await
        .expect("node starts")
}

/// Hammers every key through both nodes for `length`; `during` runs alongside.
async fn run(
    nodes: &[Node],
    tally: &Arc<Tally>,
    length: Duration,
    during: impl std::future::Future<Output = ()>,
) -> Duration {
    let start = tokio::time::Instant::now();
    let deadline = start + length;
    let mut tasks = vec![];
    for node in nodes {
        for t in 0..TASKS_PER_NODE {
            let (node, tally) = (node.clone(), tally.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = t;
                while tokio::time::Instant::now() < deadline {
                    let k = i % KEYS;
                    i += 1;
                    let verdict = node.check(&request(k)).await.expect("valid");
                    tally.decisions.fetch_add(1, Ordering::Relaxed);
                    match verdict.statuses[0].outcome {
                        Some(Outcome::FailedOpen) => {
                            tally.failed_open.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(Outcome::Allowed | Outcome::Denied) => {
                            let now = start.elapsed().as_millis() as u64;
                            let promoted = tally.promoted_at.load(Ordering::Relaxed);
                            if promoted > 0 && now >= promoted {
                                let _ = tally.back_after_promotion[k].compare_exchange(
                                    0,
                                    now,
                                    Ordering::Relaxed,
                                    Ordering::Relaxed,
                                );
                            }
                        }
                        _ => {}
                    }
                    if verdict.allowed {
                        tally.admitted[k].fetch_add(1, Ordering::Relaxed);
                        let status = &verdict.statuses[0];
                        if status.on_last_answer || status.outcome == Some(Outcome::FailedOpen) {
                            tally.without_store[k].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    during.await;
    for task in tasks {
        task.await.expect("client task");
    }
    start.elapsed()
}

/// The most a token bucket of 20 + 2/s admits over `elapsed`.
fn bound(elapsed: Duration) -> u64 {
    (CAPACITY + RATE * elapsed.as_secs_f64()).floor() as u64
}

/// Every key within its exact bound, counting every admission: what the store granted, and
/// what was admitted without its answer (a stall's fail mode, or a share of its last answer),
/// which is debited in the store when it answers.
fn assert_within_bounds(tally: &Tally, keys: &[usize], elapsed: Duration, what: &str) {
    let bound = bound(elapsed);
    for &i in keys {
        let admitted = tally.admitted[i].load(Ordering::Relaxed);
        let unanswered = tally.without_store[i].load(Ordering::Relaxed);
        assert!(
            admitted <= bound,
            "{} {what}: {admitted} admitted ({unanswered} of them without the store's answer); \
             bound {bound}",
            key(i),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_node_on_a_healthy_cluster_keeps_every_key_within_its_bound() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .expect("join")
        .expect("cluster");
    let nodes = [
        cluster_node(cluster.urls()).await,
        cluster_node(cluster.urls()).await,
    ];
    let tally = Tally::new();
    let elapsed = run(&nodes, &tally, RUN, async {}).await;
    let decisions = tally.decisions.load(Ordering::Relaxed);
    let failed_open = tally.failed_open.load(Ordering::Relaxed);
    let late: u64 = nodes.iter().map(|n| n.metrics().late_leases.get()).sum();
    let owed: u64 = nodes.iter().map(|n| n.metrics().owed_units.get()).sum();
    let opened: u64 = nodes.iter().map(|n| n.metrics().breaker_opened.get()).sum();
    let worst = tally
        .admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    eprintln!(
        "healthy cluster, saturated: {decisions} decisions in {elapsed:?}; failed open {failed_open} \
         ({:.3} %); late leases {late}, owed units {owed}, breaker opened {opened}; \
         most admitted for one key {worst} (bound {})",
        100.0 * failed_open as f64 / decisions.max(1) as f64,
        bound(elapsed)
    );
    let keys: Vec<usize> = (0..KEYS).collect();
    assert_within_bounds(&tally, &keys, elapsed, "on a healthy cluster");
    assert_eq!(opened, 0, "the breaker opened on a healthy cluster");
    assert!(
        failed_open * 100 <= decisions,
        "{failed_open} of {decisions} decisions failed open on a healthy cluster (over 1 %)"
    );
    for node in &nodes {
        node.shutdown().await;
    }
}

/// With `cluster-require-full-coverage no`, the setting docs/operations.md asks of operators:
/// one failed primary fails its own shard only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_shard_opens_its_own_breaker_and_its_keys_come_back_after_promotion() {
    failover(false).await;
}

/// On Redis's defaults (`cluster-require-full-coverage yes`, as `redis-cli --cluster create`
/// leaves it): the node says before anything fails what one failed primary will do (log,
/// `/readyz`, metric), and then it does it: while the slot-0 primary is down, every node
/// refuses every key, and keys on the healthy shards are decided without the store too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_defaults_one_failed_primary_stops_every_shard_and_the_node_said_so() {
    failover(true).await;
}

async fn failover(full_coverage: bool) {
    let cluster = tokio::task::spawn_blocking(move || {
        if full_coverage {
            RedisCluster::start(3, 1)
        } else {
            RedisCluster::start_with(3, 1, &["--cluster-require-full-coverage", "no"])
        }
    })
    .await
    .expect("join")
    .expect("cluster");
    let cluster = Arc::new(parking_lot::Mutex::new(cluster));
    let (slot0, on_shard) = {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || {
            let c = c.lock();
            let slot0 = c.primary_for_slot(0).expect("slot 0 primary");
            let on: Vec<bool> = (0..KEYS)
                .map(|i| c.primary_for(&store_key(i)).expect("primary") == slot0)
                .collect();
            (slot0, on)
        })
        .await
        .expect("join")
    };
    assert!(on_shard.iter().any(|b| *b) && on_shard.iter().any(|b| !*b));
    let urls = cluster.lock().urls();
    let nodes = [cluster_node(urls.clone()).await, cluster_node(urls).await];
    // Said before anything fails: each node read the cluster's setting.
    for node in &nodes {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let settings = loop {
            if let Some(settings) = node.store().cluster_settings() {
                break settings;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the node read the cluster's settings"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            settings,
            tollgate_lease::redis::ClusterSettings::Read {
                require_full_coverage: full_coverage,
                node_timeout_ms: Some(tollgate_testkit::redis::CLUSTER_NODE_TIMEOUT_MS),
            }
        );
        assert_eq!(settings.warning().is_some(), full_coverage);
        node.operator().refresh_figures();
        assert_eq!(
            node.metrics().store_cluster_full_coverage_required.get(),
            i64::from(full_coverage)
        );
    }
    let tally = Tally::new();
    let slot_reads_before = {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.lock().slot_reads())
            .await
            .expect("join")
    };
    let start = tokio::time::Instant::now();
    let during = {
        let (cluster, tally) = (cluster.clone(), tally.clone());
        async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            tokio::task::spawn_blocking(move || {
                let mut c = cluster.lock();
                c.node(slot0).expect("slot 0 primary").kill();
                // Promoted when another live node serves slot 0 (each look is a redis-cli).
                for _ in 0..5_000 {
                    if c.primary_for_slot(0).is_ok_and(|p| p != slot0) {
                        let at = (start.elapsed().as_millis() as u64).max(1);
                        tally.promoted_at.store(at, Ordering::Relaxed);
                        return;
                    }
                }
            })
            .await
            .expect("join");
        }
    };
    let elapsed = run(&nodes, &tally, RUN_WITH_FAILOVER, during).await;
    let slot_reads = {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.lock().slot_reads())
            .await
            .expect("join")
    };
    // The dead primary's own count is lost with it: a lower bound.
    eprintln!(
        "CLUSTER SLOTS served by the live nodes during the run: at least {} (two nodes, {:?})",
        slot_reads.saturating_sub(slot_reads_before),
        elapsed
    );
    let promoted = tally.promoted_at.load(Ordering::Relaxed);
    assert!(promoted > 0, "the replica was promoted");
    let failed_open = tally.failed_open.load(Ordering::Relaxed);
    let slowest = (0..KEYS)
        .filter(|&i| on_shard[i])
        .map(|i| tally.back_after_promotion[i].load(Ordering::Relaxed))
        .map(|at| if at == 0 { u64::MAX } else { at - promoted })
        .max()
        .unwrap_or(0);
    eprintln!(
        "slot-0 primary killed at 4 s, replica promoted at {promoted} ms; {} decisions, \
         {failed_open} failed open; the failed shard's keys store-backed again at most {slowest} ms \
         after the promotion",
        tally.decisions.load(Ordering::Relaxed)
    );
    let healthy: Vec<usize> = (0..KEYS).filter(|&i| !on_shard[i]).collect();
    eprintln!(
        "keys on healthy shards: most admitted {} (bound {}), {} without the store",
        healthy
            .iter()
            .map(|&i| tally.admitted[i].load(Ordering::Relaxed))
            .max()
            .unwrap_or(0),
        bound(elapsed),
        healthy
            .iter()
            .map(|&i| tally.without_store[i].load(Ordering::Relaxed))
            .sum::<u64>()
    );
    assert!(
        elapsed.as_millis() as u64 >= promoted + 5_000,
        "the run must last 5 s past the promotion to tell (promoted at {promoted} ms)"
    );
    for (i, &on) in on_shard.iter().enumerate() {
        if on {
            let back = tally.back_after_promotion[i].load(Ordering::Relaxed);
            assert!(
                back > 0 && back <= promoted + 5_000,
                "{}: first store-backed decision at {back} ms, promoted at {promoted} ms",
                key(i)
            );
        }
    }
    if full_coverage {
        let unanswered: u64 = healthy
            .iter()
            .map(|&i| tally.without_store[i].load(Ordering::Relaxed))
            .sum();
        eprintln!(
            "{}: healthy shards' decisions without the store while the slot was uncovered: \
             {unanswered}",
            tollgate_testkit::redis::server_binary()
        );
        // Redis 7 refuses every key on every node while a slot is uncovered: the healthy
        // shards' keys were decided without the store too. (Valkey 9.1, which the suite runs
        // these tests on as well, was seen to keep serving them: the node's warning is about
        // the setting, and holds for both.)
        if tollgate_testkit::redis::server_binary() == "redis-server" {
            assert!(
                unanswered > 0,
                "with full coverage required, the healthy shards' keys went without the store too"
            );
        }
    } else {
        assert_within_bounds(&tally, &healthy, elapsed, "on a healthy shard");
    }
    for node in &nodes {
        node.shutdown().await;
    }
}
