//! Applying the same batches in any order, any number of times, leaves the receiving region's
//! store in the same state: the sum over origins of each origin's largest total, per bucket.
//! And what a peer sends is bounded by what its rule's limit admits: an absurd total is not
//! applied, a demand report cannot outlive a few of this region's sync intervals.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use proptest::prelude::*;
use tollgate_lease::{
    BucketKey, CheckRequest, LeaseStore, Limit, ManualClock, MemoryConfig, MemoryStore, Store,
};
use tollgate_regionsync::consumption::epoch_until;
use tollgate_regionsync::messages::{
    Batch, DemandBatch, DemandItem, Entry, ForwardReply, ForwardRequest, Origin,
};
use tollgate_regionsync::metrics::RegionMetrics;
use tollgate_regionsync::receiver::Receiver;
use tollgate_regionsync::{ForwardError, RegionHost};

const NOW: u64 = 1_800_000_000_000_000;
const RULES: [&str; 2] = ["window", "bucket"];
const KEYS: [&str; 3] = ["a", "b", "c"];

fn limit(rule: &str) -> Limit {
    match rule {
        "window" => Limit::fixed_window(1_000_000, Duration::from_secs(3600)),
        _ => Limit::token_bucket(1_000_000, 0.01),
    }
    .expect("limit")
}

struct Host;

impl RegionHost for Host {
    fn synced_limit(&self, rule: &str) -> Option<Limit> {
        RULES.contains(&rule).then(|| limit(rule))
    }

    fn decide_forwarded(
        &self,
        request: ForwardRequest,
    ) -> BoxFuture<'static, Result<ForwardReply, ForwardError>> {
        Box::pin(async move { Err(ForwardError::NotHeld(request.rule)) })
    }
}

fn receiver() -> (Receiver, MemoryStore) {
    let clock = Arc::new(ManualClock::new(NOW));
    let store = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    let receiver = Receiver::new(
        Store::Memory(store.clone()),
        Arc::new(Host),
        RegionMetrics::default(),
        Origin {
            region: "eu".into(),
            incarnation: 99,
        },
        "us".into(),
        clock,
        Duration::from_secs(2),
    );
    (receiver, store)
}

async fn spent(store: &MemoryStore, rule: &str, key: &str) -> u64 {
    let key = BucketKey::new(key.as_bytes(), rule).expect("key");
    let peek = CheckRequest::single(key, limit(rule), 0).expect("peek");
    1_000_000 - store.check(&peek).await.expect("check").buckets[0].remaining
}

/// Every event adds units to one origin's bucket; after it, that origin sends a batch with its
/// running totals for every bucket it has touched.
fn batches(events: &[(u64, usize, usize, u64)]) -> (Vec<Batch>, HashMap<(usize, usize), u64>) {
    let mut totals: HashMap<(u64, usize, usize), u64> = HashMap::new();
    let mut out = vec![];
    for (seq, &(origin, rule, key, units)) in events.iter().enumerate() {
        *totals.entry((origin, rule, key)).or_default() += units;
        let entries = totals
            .iter()
            .filter(|((o, _, _), _)| *o == origin)
            .map(|(&(_, r, k), &total)| Entry {
                rule: RULES[r].into(),
                identity: KEYS[k].as_bytes().to_vec(),
                until: epoch_until(&limit(RULES[r]), NOW),
                total,
                at: NOW,
            })
            .collect();
        out.push(Batch {
            origin: Origin {
                region: "us".into(),
                incarnation: origin,
            },
            seq: seq as u64,
            sent_at: NOW,
            entries,
        });
    }
    let mut expected: HashMap<(usize, usize), u64> = HashMap::new();
    for ((_, r, k), total) in totals {
        *expected.entry((r, k)).or_default() += total;
    }
    (out, expected)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn any_order_and_any_repetition_give_the_same_state(
        events in prop::collection::vec((0u64..3, 0usize..2, 0usize..3, 1u64..50), 1..30),
        order in prop::collection::vec(any::<prop::sample::Index>(), 1..90),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        runtime.block_on(async {
            let (batches, expected) = batches(&events);
            let (in_order, store_a) = receiver();
            for batch in &batches {
                in_order.apply(batch.clone()).await.expect("applies");
            }
            // Any sequence drawn from the batches (repeats, reorderings, omissions), followed
            // by each batch once more in reverse so every one arrives at least once.
            let (shuffled, store_b) = receiver();
            for index in &order {
                shuffled.apply(index.get(&batches).clone()).await.expect("applies");
            }
            for batch in batches.iter().rev() {
                shuffled.apply(batch.clone()).await.expect("applies");
            }
            for (r, rule) in RULES.iter().enumerate() {
                for (k, key) in KEYS.iter().enumerate() {
                    let want = expected.get(&(r, k)).copied().unwrap_or(0);
                    prop_assert_eq!(spent(&store_a, rule, key).await, want);
                    prop_assert_eq!(spent(&store_b, rule, key).await, want);
                }
            }
            Ok(())
        })?;
    }
}

fn peer() -> Origin {
    Origin {
        region: "us".into(),
        incarnation: 7,
    }
}

/// A total of more than twice what the rule admits over an epoch is not consumption: it is
/// not applied (it would zero this region's bucket for the epoch); the other entries are.
#[tokio::test]
async fn an_absurd_total_is_not_applied() {
    let (receiver, store) = receiver();
    let entry = |key: &str, total: u64| Entry {
        rule: "bucket".into(),
        identity: key.as_bytes().to_vec(),
        until: epoch_until(&limit("bucket"), NOW),
        total,
        at: NOW,
    };
    // The bucket: 1,000,000 + 0.01/s; over its 60 s epoch at most 1,000,001, so 2,000,002.
    let ack = receiver
        .apply(Batch {
            origin: peer(),
            seq: 1,
            sent_at: NOW,
            entries: vec![entry("a", 2_000_003), entry("b", 2_000_002), entry("c", 10)],
        })
        .await
        .expect("applied");
    assert_eq!(ack.skipped, 1);
    assert_eq!(spent(&store, "bucket", "a").await, 0);
    assert_eq!(spent(&store, "bucket", "b").await, 1_000_000);
    assert_eq!(spent(&store, "bucket", "c").await, 10);
}

/// A demand report that would live an hour (this region syncs every 2 s) is refused; one
/// within four intervals is recorded, its units taken as at most what the limit admits.
#[tokio::test]
async fn a_demand_report_cannot_outlive_a_few_intervals() {
    let (receiver, _) = receiver();
    let batch = |interval_us: u64, units: u64| DemandBatch {
        origin: peer(),
        interval_us,
        items: vec![DemandItem {
            rule: "bucket".into(),
            identity: b"a".to_vec(),
            units,
        }],
    };
    let hour = 3_600_000_000;
    let refused = receiver.record_demand(batch(hour, 5)).await;
    assert_eq!(
        refused.expect_err("an hour").code(),
        tonic::Code::InvalidArgument
    );
    assert!(receiver.record_demand(batch(0, 5)).await.is_err());
    let ack = receiver
        .record_demand(batch(8_000_000, 1_000_000_000_000))
        .await
        .expect("four intervals");
    assert_eq!(ack.recorded, 1);
}
