//! Store calls batched per shard, against a real Redis and a real Redis Cluster: calls made at
//! the same instant share batches and count exactly as calls made one by one; one request's
//! error stays its own; a request waiting for a batch keeps its budget; a cluster's batches
//! span the slots of one node. (Every conformance case also runs on a busy Redis, where its
//! calls go in batches: `conformance.rs`, `redis_busy`.)

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::check1;
use tollgate_lease::{
    BatchConfig, BucketKey, LeaseAsk, LeaseRequest, LeaseStore, Limit, RedisConfig, RedisStore,
    StoreError,
};
use tollgate_testkit::{RedisCluster, RedisServer};

/// Generous: these tests are about what batches do, not how fast (`faults.rs` tests budgets).
const BUDGET: Duration = Duration::from_secs(3);

fn open(config: RedisConfig) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::open(&RedisConfig {
            call_timeout: BUDGET,
            ..config
        })
        .expect("open"),
    )
}

async fn start_redis() -> RedisServer {
    tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server starts")
}

fn key(identity: &str) -> BucketKey {
    BucketKey::new(identity.as_bytes(), "batch").expect("key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_at_the_same_instant_share_batches_and_count_exactly() {
    let server = start_redis().await;
    let store = open(RedisConfig::single(server.url()));
    // 400 checks of one bucket that admits 150, and 400 lease asks of 400 buckets of 10 each,
    // all at once.
    let shared = key("shared");
    let window = Limit::fixed_window(150, Duration::from_secs(3600)).expect("limit");
    let bucket = Limit::token_bucket(10, 0.001).expect("limit");
    let mut checks = Vec::new();
    let mut leases = Vec::new();
    for n in 0..400 {
        let request = check1(&shared, window, 1);
        let checker = store.clone();
        checks.push(tokio::spawn(async move { checker.check(&request).await }));
        let lessee = store.clone();
        let ask = LeaseRequest::new(
            vec![LeaseAsk {
                key: key(&format!("lessee-{n}")),
                limit: bucket,
                want: 6,
                min: 1,
                max_share: 1.0,
                allowance: None,
                penalized: false,
            }],
            Duration::from_secs(60),
        )
        .expect("lease request");
        leases.push(tokio::spawn(
            async move { lessee.acquire_leases(&ask).await },
        ));
    }
    let mut admitted = 0;
    for check in checks {
        if check.await.expect("join").expect("check").allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 150, "the bucket admits exactly its limit");
    for lease in leases {
        let grant = lease.await.expect("join").expect("lease").remove(0);
        assert_eq!(grant.units, 6, "{grant:?}");
        assert_eq!(grant.remaining, 4, "{grant:?}");
        assert!(grant.lease.is_some());
    }
    let counts = store.batch_counts().expect("batching is on by default");
    assert!(
        counts.batches > 0,
        "800 calls at once formed no batch: {counts:?}"
    );
    assert_eq!(
        counts.batched_requests + counts.alone,
        800,
        "every call was sent exactly once: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_batching_off_every_call_goes_alone() {
    let server = start_redis().await;
    let store = open(RedisConfig {
        batch: BatchConfig {
            max_batch: 1,
            ..BatchConfig::default()
        },
        ..RedisConfig::single(server.url())
    });
    let limit = Limit::token_bucket(1_000, 1.0).expect("limit");
    let calls: Vec<_> = (0..100)
        .map(|n| {
            let store = store.clone();
            let request = check1(&key(&format!("alone-{n}")), limit, 1);
            tokio::spawn(async move { store.check(&request).await })
        })
        .collect();
    for call in calls {
        assert!(call.await.expect("join").expect("check").allowed());
    }
    assert_eq!(store.batch_counts(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_requests_error_is_its_own() {
    let server = start_redis().await;
    let store = open(RedisConfig::single(server.url()));
    // A bucket whose key holds a string: its script fails with WRONGTYPE.
    let broken = key("broken");
    server
        .cli(&["SET", broken.as_str(), "not a bucket"])
        .expect("set");
    let limit = Limit::token_bucket(5, 1.0).expect("limit");
    for round in 0..5 {
        let before = store.batch_counts().expect("batching on");
        let mut calls = Vec::new();
        for n in 0..100 {
            let checker = store.clone();
            let request = check1(&key(&format!("fine-{round}-{n}")), limit, 1);
            calls.push(tokio::spawn(async move { checker.check(&request).await }));
            if n == 50 {
                let store = store.clone();
                let request = check1(&broken, limit, 1);
                calls.push(tokio::spawn(async move { store.check(&request).await }));
            }
        }
        let mut errors = Vec::new();
        for call in calls {
            match call.await.expect("join") {
                Ok(outcome) => assert!(outcome.allowed()),
                Err(e) => errors.push(e),
            }
        }
        assert_eq!(errors.len(), 1, "only the broken bucket fails: {errors:?}");
        assert!(
            matches!(&errors[0], StoreError::Rejected(m) if m.contains("WRONGTYPE")),
            "{errors:?}"
        );
        let after = store.batch_counts().expect("batching on");
        assert!(after.batches > before.batches, "round {round}: no batch");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_call_keeps_its_budget_and_the_queue_recovers() {
    let mut server = start_redis().await;
    let budget = Duration::from_millis(20);
    let store = Arc::new(
        RedisStore::open(&RedisConfig {
            call_timeout: budget,
            ..RedisConfig::single(server.url())
        })
        .expect("open"),
    );
    let limit = Limit::token_bucket(1_000, 1.0).expect("limit");
    server.pause().expect("SIGSTOP");
    let started = tokio::time::Instant::now();
    let calls: Vec<_> = (0..50)
        .map(|n| {
            let store = store.clone();
            let request = check1(&key(&format!("paused-{n}")), limit, 1);
            tokio::spawn(async move {
                let start = tokio::time::Instant::now();
                (store.check(&request).await, start.elapsed())
            })
        })
        .collect();
    for call in calls {
        let (result, took) = call.await.expect("join");
        assert!(
            matches!(result, Err(StoreError::Timeout { .. })),
            "{result:?}"
        );
        assert!(took < Duration::from_millis(250), "a call waited {took:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    server.resume().expect("SIGCONT");
    // The batch that went out while Redis was stopped is answered late; new calls succeed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let request = check1(&key("after"), limit, 1);
        match store.check(&request).await {
            Ok(outcome) => {
                assert!(outcome.allowed());
                break;
            }
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                assert!(tokio::time::Instant::now() < deadline, "no recovery: {e}");
            }
        }
    }
    let calls: Vec<_> = (0..50)
        .map(|n| {
            let store = store.clone();
            let request = check1(&key(&format!("resumed-{n}")), limit, 1);
            tokio::spawn(async move { store.check(&request).await })
        })
        .collect();
    let mut answered = 0;
    for call in calls {
        if call.await.expect("join").is_ok() {
            answered += 1;
        }
    }
    assert!(answered > 0, "the queue is stuck after Redis came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_batches_span_the_slots_of_one_node() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("join")
        .expect("cluster starts");
    let store = open(RedisConfig::cluster(cluster.urls()));
    // 300 identities (about 100 per node, each of its own slot), one unit each: the first
    // round admits every one, the second none. The first burst comes cold, before the store
    // has read the slot map: those calls may go alone, unbatched, but must count exactly.
    let limit = Limit::fixed_window(1, Duration::from_secs(3600)).expect("limit");
    let burst = |prefix: &'static str, round: u32, admit: bool| {
        let store = store.clone();
        async move {
            let calls: Vec<_> = (0..300)
                .map(|n| {
                    let store = store.clone();
                    let request = check1(&key(&format!("{prefix}-{n}")), limit, 1);
                    tokio::spawn(async move { store.check(&request).await })
                })
                .collect();
            for call in calls {
                let outcome = call.await.expect("join").expect("check");
                assert_eq!(outcome.allowed(), admit, "{prefix} round {round}");
            }
        }
    };
    burst("cold", 1, true).await;
    burst("cold", 2, false).await;
    // Nobody warmed the store up: it reads the slot map itself when it opens, and calls to
    // one node go together from then on.
    assert_eq!(store.shards().len(), 3, "{:?}", store.shards());
    burst("spread", 1, true).await;
    burst("spread", 2, false).await;
    let counts = store.batch_counts().expect("batching on");
    assert!(counts.batches > 0, "{counts:?}");
    assert_eq!(counts.batched_requests + counts.alone, 1200, "{counts:?}");
}

/// Moves `slot` (empty) from the primary on `from` to the one on `to` as a resharding tool
/// does: the new owner IMPORTING, the old one MIGRATING, then the new owner takes the slot
/// (which bumps its config epoch, so that gossip cannot bring the old owner's claim back: a
/// bare `SETSLOT NODE` on every node was undone by gossip now and then on a busy machine,
/// and calls bounced between the two owners), then the old owner and the others are told.
fn move_slot(cluster: &mut RedisCluster, slot: u16, from: u16, to: u16) {
    let id_of = |cluster: &mut RedisCluster, port: u16| {
        cluster
            .node(port)
            .expect("node")
            .cli(&["CLUSTER", "MYID"])
            .expect("myid")
            .trim()
            .to_owned()
    };
    let (from_id, to_id) = (id_of(cluster, from), id_of(cluster, to));
    let others: Vec<u16> = cluster
        .ports()
        .into_iter()
        .filter(|p| *p != from && *p != to)
        .collect();
    let slot = slot.to_string();
    let mut setslot = |port: u16, args: &[&str]| {
        let mut command = vec!["CLUSTER", "SETSLOT", slot.as_str()];
        command.extend_from_slice(args);
        let answer = cluster
            .node(port)
            .expect("node")
            .cli(&command)
            .expect("setslot");
        assert!(answer.trim() == "OK", "{command:?} on {port}: {answer}");
    };
    setslot(to, &["IMPORTING", &from_id]);
    setslot(from, &["MIGRATING", &to_id]);
    setslot(to, &["NODE", &to_id]);
    setslot(from, &["NODE", &to_id]);
    for port in others {
        setslot(port, &["NODE", &to_id]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_slot_moved_goes_again_alone_and_counts_once() {
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .expect("join")
        .expect("cluster starts");
    let store = open(RedisConfig::cluster(cluster.urls()));
    // Nobody warms the store up: it reads the slot map itself when it opens, and the move
    // below makes that map stale.
    let limit = Limit::fixed_window(1, Duration::from_secs(3600)).expect("limit");
    // The store reads the slot map every 2 s: one that read it between the move and the burst
    // would batch correctly and take no detour, so the move is tried again, each time with a
    // fresh identity whose slot holds no keys yet (an owner holding keys refuses to give its
    // slot away without a migration, and earlier attempts leave keys behind).
    for attempt in 0..5 {
        let moved = (0..)
            .map(|n| {
                BucketKey::new(format!("moved-{attempt}-{n}").as_bytes(), "rule").expect("key")
            })
            .find(|candidate| {
                let owner = cluster.primary_for(candidate.as_str()).expect("primary");
                let node = cluster.node(owner).expect("node");
                let slot = node
                    .cli(&["CLUSTER", "KEYSLOT", candidate.as_str()])
                    .expect("keyslot");
                node.cli(&["CLUSTER", "COUNTKEYSINSLOT", slot.trim()])
                    .expect("countkeysinslot")
                    .trim()
                    == "0"
            })
            .expect("an empty slot");
        let from = cluster.primary_for(moved.as_str()).expect("primary");
        let to = cluster
            .ports()
            .into_iter()
            .find(|p| *p != from)
            .expect("another primary");
        let slot: u16 = cluster
            .node(from)
            .expect("node")
            .cli(&["CLUSTER", "KEYSLOT", moved.as_str()])
            .expect("keyslot")
            .trim()
            .parse()
            .expect("slot");
        move_slot(&mut cluster, slot, from, to);
        // A burst over many identities (a third of them on the old owner, so its shard has
        // calls in flight and queues), with two checks of the moved bucket in the middle:
        // exactly one is admitted, and nothing fails.
        let before = store.batch_counts().expect("batching on");
        let mut calls = Vec::new();
        for n in 0..300 {
            let checker = store.clone();
            let request = check1(&key(&format!("burst-{attempt}-{n}")), limit, 1);
            calls.push(tokio::spawn(async move { checker.check(&request).await }));
        }
        let moved_calls: Vec<_> = (0..2)
            .map(|_| {
                let checker = store.clone();
                let request = check1(&moved, limit, 1);
                tokio::spawn(async move { checker.check(&request).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.expect("join").expect("check").allowed());
        }
        let mut admitted = 0;
        for call in moved_calls {
            if call
                .await
                .expect("join")
                .expect("the moved bucket's check")
                .allowed()
            {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 1, "attempt {attempt}");
        assert_eq!(
            cluster.primary_for(moved.as_str()).expect("primary"),
            to,
            "the bucket lives where its slot went"
        );
        let after = store.batch_counts().expect("batching on");
        if after.sent_again > before.sent_again {
            return;
        }
        eprintln!("attempt {attempt}: the moved requests took no detour: {after:?}");
    }
    panic!("in 5 attempts no request found its slot moved under a batch");
}
