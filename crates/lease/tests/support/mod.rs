//! Backends for the lease store's integration tests: the in-memory store on a manual clock, a
//! real single Redis, and a real Redis Cluster, each started fresh for the test.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this module

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_lease::{
    BucketKey, CheckRequest, Clock, LeaseStore, Limit, ManualClock, MemoryConfig, MemoryStore,
    Micros, RedisConfig, RedisStore, Store, SystemClock,
};
use tollgate_testkit::{RedisCluster, RedisServer};

/// Where the manual clock starts: a whole minute (and hour) since the epoch, plus a little.
pub const MEMORY_EPOCH: Micros = 1_800_000_000_000_000 + 123;

/// Conformance calls are about semantics, not latency: a loaded CI machine must not turn them
/// into timeouts. The fault tests use limiter-sized budgets.
pub const GENEROUS_BUDGET: Duration = Duration::from_secs(3);

pub struct Backend {
    pub name: &'static str,
    pub store: Store,
    clock: Option<ManualClock>,
    pub redis: Option<RedisServer>,
    pub cluster: Option<RedisCluster>,
    prefix: String,
    counter: AtomicU64,
    /// Calls kept in flight beside the test's own (see [`Backend::busy`]), stopped on drop.
    noise: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        for task in &self.noise {
            task.abort();
        }
    }
}

impl Backend {
    fn new(name: &'static str, store: Store, clock: Option<ManualClock>) -> Self {
        Self {
            name,
            store,
            clock,
            redis: None,
            cluster: None,
            prefix: format!("t{:x}", rand_u32()),
            counter: AtomicU64::new(0),
            noise: Vec::new(),
        }
    }

    /// The same store kept busy: `loops` tasks each keep a check of their own identity in
    /// flight, one after another, so the test's calls find calls in flight on their shard and
    /// go in batches with them (a Redis store batches only under load). Identities are spread
    /// over the hash slots, so every shard of a cluster is busy.
    pub fn busy(mut self, loops: usize) -> Self {
        self.name = match self.name {
            "redis" => "redis-busy",
            "redis-cluster" => "redis-cluster-busy",
            other => other,
        };
        for n in 0..loops {
            let store = self.store.clone();
            let key = self.key(&format!("noise{n}"), "noise");
            let limit = Limit::token_bucket(1_000_000_000, 1_000_000_000.0).expect("limit");
            let request = check1(&key, limit, 1);
            self.noise.push(tokio::spawn(async move {
                loop {
                    if store.check(&request).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }));
        }
        self
    }

    /// The in-memory store on a manual clock: time moves only in [`Backend::advance`].
    pub fn memory() -> Self {
        let clock = ManualClock::new(MEMORY_EPOCH);
        let store =
            MemoryStore::with_clock(std::sync::Arc::new(clock.clone()), MemoryConfig::default());
        Self::new("memory", Store::Memory(store), Some(clock))
    }

    /// The in-memory store on a manual clock behind a [`tollgate_lease::LinkedStore`] that
    /// adds no latency (the simulations' store answers as the memory store does).
    pub fn linked() -> Self {
        let clock = ManualClock::new(MEMORY_EPOCH);
        let store =
            MemoryStore::with_clock(std::sync::Arc::new(clock.clone()), MemoryConfig::default());
        let linked = tollgate_lease::LinkedStore::new(
            store,
            tollgate_lease::Latency::fixed(Duration::ZERO),
            1,
        );
        linked.keep_ledger();
        Self::new("linked", Store::Linked(linked), Some(clock))
    }

    /// A fresh single `redis-server`.
    pub async fn redis() -> Self {
        let server = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .expect("join")
            .expect("redis-server starts");
        let config = RedisConfig {
            call_timeout: GENEROUS_BUDGET,
            ..RedisConfig::single(server.url())
        };
        let store = RedisStore::open(&config).expect("open");
        let mut backend = Self::new("redis", Store::Redis(store), None);
        backend.redis = Some(server);
        backend
    }

    /// A fresh cluster of 3 primaries, each with a replica.
    pub async fn cluster() -> Self {
        let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
            .await
            .expect("join")
            .expect("cluster starts");
        let config = RedisConfig {
            call_timeout: GENEROUS_BUDGET,
            ..RedisConfig::cluster(cluster.urls())
        };
        let store = RedisStore::open(&config).expect("open");
        let mut backend = Self::new("redis-cluster", Store::Redis(store), None);
        backend.cluster = Some(cluster);
        backend
    }

    /// Whether time moves only when the test says so.
    pub fn exact_time(&self) -> bool {
        self.clock.is_some()
    }

    /// Lets `d` pass: the manual clock jumps; against Redis, real time passes.
    pub async fn advance(&self, d: Duration) {
        match &self.clock {
            Some(clock) => clock.advance(d),
            None => tokio::time::sleep(d).await,
        }
    }

    /// The store's notion of now (Redis runs on this host's clock).
    pub fn now(&self) -> Micros {
        match &self.clock {
            Some(clock) => clock.now_micros(),
            None => SystemClock.now_micros(),
        }
    }

    /// Moves to `offset` after the start of the next window of length `window`, so a test
    /// never straddles a boundary by accident.
    pub async fn start_of_window(&self, window: Duration, offset: Duration) {
        let w = window.as_micros() as u64;
        let now = self.now();
        let target = now - now % w + w + offset.as_micros() as u64;
        self.advance(Duration::from_micros(target - now)).await;
    }

    /// Makes sure at least `room` is left in the current window of length `window` (moving
    /// to the next window if not), for cases that must not straddle a boundary.
    pub async fn room_in_window(&self, window: Duration, room: Duration) {
        let w = window.as_micros() as u64;
        let now = self.now();
        if w - now % w < room.as_micros() as u64 {
            self.start_of_window(window, Duration::from_millis(1)).await;
        }
    }

    /// A bucket key of an identity unique to this test run (so cases sharing a cluster never
    /// see each other's state).
    pub fn key(&self, identity: &str, rule: &str) -> BucketKey {
        BucketKey::new(format!("{}-{identity}", self.prefix).as_bytes(), rule).expect("key")
    }

    /// A fresh identity's key.
    pub fn fresh_key(&self, rule: &str) -> BucketKey {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.key(&format!("id{n}"), rule)
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id()) as u32
}

pub fn check1(key: &BucketKey, limit: Limit, cost: u64) -> CheckRequest {
    CheckRequest::single(key.clone(), limit, cost).expect("valid request")
}
