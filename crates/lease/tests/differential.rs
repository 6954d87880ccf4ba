//! The Lua scripts and the in-memory store answer alike: the same pseudo-random sequences of
//! checks (some of them reservations), lease acquires and returns (valid, duplicate, excessive),
//! slot releases, debits and settlements run against both, and every count and decision must
//! match.
//!
//! Both stores read this host's wall clock (Redis `TIME` and the system clock), and the limits
//! are slow (a token per 1000 s) or long (1-hour windows, entered with minutes to spare), so
//! the few milliseconds between the two runs cannot change any answer. Durations are compared
//! within a tolerance for the same reason. Seeds are pinned; a failing seed becomes a case here.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::Backend;
use tollgate_lease::{
    BucketKey, CheckItem, CheckRequest, DebitItem, DebitRequest, LeaseAsk, LeaseId, LeaseRequest,
    LeaseReturn, LeaseStore, Limit, MemoryConfig, MemoryStore, ReturnRequest, SettleItem,
    SettleRequest, SlotId, SlotRelease, Store, SystemClock,
};

const SEEDS: [u64; 12] = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233];
const OPS_PER_SEED: usize = 80;
const TOLERANCE: Duration = Duration::from_secs(2);

fn limits() -> Vec<(&'static str, Limit)> {
    let hour = Duration::from_secs(3600);
    vec![
        ("tb", Limit::token_bucket(20, 0.001).expect("l")),
        ("gcra", Limit::gcra(18, 0.001).expect("l")),
        (
            "leaky",
            Limit::leaky_bucket(3, Duration::from_secs(3000), Some(16)).expect("l"),
        ),
        ("fw", Limit::fixed_window(15, hour).expect("l")),
        ("sw", Limit::sliding_window(12, hour).expect("l")),
        ("log", Limit::sliding_window_log(10, hour).expect("l")),
        ("conc", Limit::concurrency(5, hour).expect("l")),
    ]
}

/// What a lease or slot is called in each store.
#[derive(Clone)]
struct Pair<T> {
    memory: T,
    redis: T,
    bucket: usize,
    units: u64,
}

struct Run {
    memory: Store,
    redis: Store,
    keys: Vec<(BucketKey, Limit)>,
    leases: Vec<Pair<LeaseId>>,
    slots: Vec<Pair<SlotId>>,
    /// Reservations made (the same nonce in both stores): nonce, and (bucket, estimate) per item.
    reservations: Vec<(String, Vec<(usize, u64)>)>,
}

fn close(a: Duration, b: Duration) -> bool {
    a.abs_diff(b) <= TOLERANCE
}

impl Run {
    async fn step(&mut self, rng: &mut StdRng, step: usize) {
        let ctx = format!("step {step}");
        match rng.random_range(0..11) {
            0..=3 => {
                let mut items = vec![];
                for (i, (key, limit)) in self.keys.iter().enumerate() {
                    if rng.random_bool(0.5) || (i == self.keys.len() - 1 && items.is_empty()) {
                        items.push(CheckItem {
                            key: key.clone(),
                            limit: *limit,
                            cost: rng.random_range(0..=4),
                            allowance: None,
                            penalized: false,
                        });
                    }
                }
                let mut req = CheckRequest::new(items).expect("valid");
                // Sometimes a reservation (none on the concurrency bucket).
                let slots = req
                    .items()
                    .iter()
                    .any(|i| i.limit.algorithm() == tollgate_lease::Algorithm::Concurrency);
                if !slots && rng.random_bool(0.4) {
                    let nonce = format!("n{step}");
                    let made = req
                        .items()
                        .iter()
                        .map(|i| {
                            let bucket = self.keys.iter().position(|(k, _)| *k == i.key);
                            (bucket.expect("bucket"), i.cost)
                        })
                        .collect();
                    req = req
                        .reserve(&nonce, Duration::from_secs(600))
                        .expect("valid");
                    self.reservations.push((nonce, made));
                }
                let (m, r) = (
                    self.memory.check(&req).await.expect("m"),
                    self.redis.check(&req).await.expect("r"),
                );
                assert_eq!(m.allowed(), r.allowed(), "{ctx}: {m:?} vs {r:?}");
                for ((mb, rb), item) in m.buckets.iter().zip(&r.buckets).zip(req.items()) {
                    assert_eq!(
                        (mb.allowed, mb.remaining),
                        (rb.allowed, rb.remaining),
                        "{ctx}: {mb:?} vs {rb:?}"
                    );
                    assert!(
                        close(mb.retry_after, rb.retry_after),
                        "{ctx}: {mb:?} vs {rb:?}"
                    );
                    assert!(
                        close(mb.reset_after, rb.reset_after),
                        "{ctx}: {mb:?} vs {rb:?}"
                    );
                    assert_eq!(mb.slot.is_some(), rb.slot.is_some(), "{ctx}");
                    if let (Some(ms), Some(rs)) = (&mb.slot, &rb.slot) {
                        let bucket = self
                            .keys
                            .iter()
                            .position(|(k, _)| *k == item.key)
                            .expect("bucket");
                        self.slots.push(Pair {
                            memory: ms.clone(),
                            redis: rs.clone(),
                            bucket,
                            units: item.cost,
                        });
                    }
                }
            }
            4..=5 => {
                let bucket = rng.random_range(0..self.keys.len() - 1); // not the concurrency bucket
                let (key, limit) = self.keys[bucket].clone();
                let want = rng.random_range(1..=8);
                let ask = LeaseAsk {
                    key,
                    limit,
                    want,
                    min: rng.random_range(1..=want),
                    max_share: [0.25, 0.5, 1.0][rng.random_range(0..3)],
                    allowance: None,
                    penalized: false,
                };
                let req = LeaseRequest::new(vec![ask], Duration::from_secs(600)).expect("valid");
                let m = self.memory.acquire_leases(&req).await.expect("m").remove(0);
                let r = self.redis.acquire_leases(&req).await.expect("r").remove(0);
                assert_eq!(
                    (m.units, m.remaining),
                    (r.units, r.remaining),
                    "{ctx}: {m:?} vs {r:?}"
                );
                assert!(
                    close(m.valid_for, r.valid_for) && close(m.retry_after, r.retry_after),
                    "{ctx}"
                );
                if let (Some(ml), Some(rl)) = (m.lease, r.lease) {
                    self.leases.push(Pair {
                        memory: ml,
                        redis: rl,
                        bucket,
                        units: m.units,
                    });
                }
            }
            6..=7 if !self.leases.is_empty() => {
                // Sometimes a lease returned before (a duplicate), sometimes more than granted.
                let pair = self.leases[rng.random_range(0..self.leases.len())].clone();
                let (key, limit) = self.keys[pair.bucket].clone();
                let unspent = rng.random_range(0..=pair.units + 2);
                let ret = |lease| {
                    ReturnRequest::new(vec![LeaseReturn {
                        key: key.clone(),
                        limit,
                        lease,
                        unspent,
                        allowance: None,
                    }])
                    .expect("valid")
                };
                let m = self
                    .memory
                    .return_leases(&ret(pair.memory))
                    .await
                    .expect("m");
                let r = self.redis.return_leases(&ret(pair.redis)).await.expect("r");
                assert_eq!(m, r, "{ctx}: credited");
            }
            10 if !self.reservations.is_empty() => {
                // Any reservation (denied ones too: unknown), any of its buckets, settled at
                // less, as much or more than the estimate; sometimes twice.
                let (nonce, made) =
                    self.reservations[rng.random_range(0..self.reservations.len())].clone();
                let (bucket, estimate) = made[rng.random_range(0..made.len())];
                let (key, limit) = self.keys[bucket].clone();
                let req = SettleRequest::new(vec![SettleItem {
                    key,
                    limit,
                    nonce,
                    actual: rng.random_range(0..=estimate + 3),
                }])
                .expect("valid");
                let m = self.memory.settle(&req).await.expect("m");
                let r = self.redis.settle(&req).await.expect("r");
                assert_eq!(m, r, "{ctx}: settled");
            }
            8 if !self.slots.is_empty() => {
                let pair = self.slots[rng.random_range(0..self.slots.len())].clone();
                let (key, limit) = self.keys[pair.bucket].clone();
                let rel = |slot| SlotRelease::new(vec![(key.clone(), limit, slot)]).expect("valid");
                let m = self
                    .memory
                    .release_slots(&rel(pair.memory))
                    .await
                    .expect("m");
                let r = self.redis.release_slots(&rel(pair.redis)).await.expect("r");
                assert_eq!(m, r, "{ctx}: released");
            }
            _ => {
                let bucket = rng.random_range(0..self.keys.len() - 1);
                let (key, limit) = self.keys[bucket].clone();
                let req = DebitRequest::new(vec![DebitItem {
                    key,
                    limit,
                    units: rng.random_range(0..=5),
                    consumed_at: None,
                    once: None,
                }])
                .expect("valid");
                let m = self.memory.debit(&req).await.expect("m");
                let r = self.redis.debit(&req).await.expect("r");
                assert_eq!(m, r, "{ctx}: debited");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_redis_agree_on_random_operation_sequences() {
    let redis = Backend::redis().await;
    redis
        .room_in_window(Duration::from_secs(3600), Duration::from_secs(120))
        .await;
    let memory = Store::Memory(MemoryStore::with_clock(
        Arc::new(SystemClock),
        MemoryConfig::default(),
    ));
    for seed in SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let identity = format!("seed-{seed}-{}", rng.random::<u32>());
        let keys = limits()
            .into_iter()
            .map(|(rule, limit)| (redis.key(&identity, rule), limit))
            .collect();
        let mut run = Run {
            memory: memory.clone(),
            redis: redis.store.clone(),
            keys,
            leases: vec![],
            slots: vec![],
            reservations: vec![],
        };
        for step in 0..OPS_PER_SEED {
            run.step(&mut rng, step).await;
        }
        eprintln!(
            "seed {seed}: {OPS_PER_SEED} operations agree ({} leases, {} slots)",
            run.leases.len(),
            run.slots.len()
        );
    }
}
