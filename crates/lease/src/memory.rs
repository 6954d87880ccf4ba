//! The in-memory store: the same semantics as the Redis scripts, in process.
//!
//! It is the embedded default of a single node and the engine of the simulations. Keys are
//! spread over shards by identity, each behind its own mutex, so all of one identity's buckets
//! are judged under one lock (atomic, as one script is in Redis) and different identities
//! rarely contend. Time comes from an injected [`Clock`](crate::clock::Clock).
//!
//! Memory is bounded in bytes: each shard counts what its keys hold, drops expired keys as it
//! grows, and when a write would take it past its share it evicts from the rule holding the
//! most bytes, keys that expire soonest first (see `docs/memory-bounds.md`): a flood of new
//! keys under one rule evicts that rule's keys, and a new key under another rule is still
//! decided. Only an identity whose own state fills a whole shard is refused, with a transient
//! [`StoreError::Full`].
//!
//! # Layout
//! - `bucket`: the keys a shard holds, and one bucket loaded from them.
//! - `ops`: the store's operations, each under the shard lock of its identity.
//! - `lease`: what a lease is here: its size, how long it lives, its id, what it gives back.
//! - `allowance`: a bucket's regional allowance, loaded for one call, and its demand record.

mod allowance;
mod bucket;
mod lease;
mod ops;

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::{Micros, SharedClock, SystemClock};
use crate::error::StoreError;
use crate::key::BucketKey;
use bucket::{Keys, Value};

/// Settings of the in-memory store.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// Number of shards (rounded up to a power of two).
    pub shards: usize,
    /// The most bytes held at once (keys, values and their entries, as counted by the store),
    /// all shards together.
    pub max_bytes: usize,
    /// Where lease and slot ids start, and how identities are spread over shards: None draws
    /// both from the OS; a simulation pins them so a run can be repeated (ids are unique within
    /// one store either way).
    pub id_seed: Option<u64>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            shards: 64,
            max_bytes: DEFAULT_MAX_BYTES,
            id_seed: None,
        }
    }
}

/// The default [`MemoryConfig::max_bytes`]: 256 MiB (about a million keys of short
/// identities), which fits a 1 GiB pod beside the node's own key state.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// The in-memory lease store. Cloning shares the same state.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: ShardHasher,
    clock: SharedClock,
    max_bytes: usize,
    max_bytes_per_shard: usize,
    /// Live keys evicted to make room, since the start.
    evictions: std::sync::atomic::AtomicU64,
    /// Evictions per bucket (`rl:{tag}:rule`), when kept ([`MemoryStore::keep_eviction_record`]).
    eviction_record: Mutex<Option<std::collections::HashMap<String, u64>>>,
    /// The next lease or slot id (a counter, scrambled).
    ids: std::sync::atomic::AtomicU64,
}

/// How an identity picks its shard: keyed at random in a node (so no client can aim its
/// identities at one shard), from the seed in a simulation (so a run that evicts can be
/// repeated: which keys share a shard decides which are evicted).
#[derive(Debug)]
enum ShardHasher {
    Random(RandomState),
    Seeded(u64),
}

impl ShardHasher {
    fn shard_of(&self, identity: &str) -> u64 {
        match self {
            ShardHasher::Random(state) => state.hash_one(identity),
            ShardHasher::Seeded(seed) => {
                let mut h = std::hash::DefaultHasher::new();
                std::hash::Hasher::write_u64(&mut h, *seed);
                std::hash::Hash::hash(identity, &mut h);
                std::hash::Hasher::finish(&h)
            }
        }
    }
}

#[derive(Debug, Default)]
struct Shard {
    keys: Keys,
    /// Sweep expired keys when the shard reaches this size.
    sweep_at: usize,
}

const MIN_SWEEP: usize = 64;

impl MemoryStore {
    /// A store on the system clock with default settings.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock), MemoryConfig::default())
    }

    /// A store reading time from `clock`.
    pub fn with_clock(clock: SharedClock, config: MemoryConfig) -> Self {
        let shards = config.shards.max(1).next_power_of_two();
        let max_bytes_per_shard = config.max_bytes.div_ceil(shards).max(1);
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| {
                        Mutex::new(Shard {
                            keys: Keys::default(),
                            sweep_at: MIN_SWEEP,
                        })
                    })
                    .collect(),
                hasher: match config.id_seed {
                    Some(seed) => ShardHasher::Seeded(seed),
                    None => ShardHasher::Random(RandomState::new()),
                },
                clock,
                max_bytes: config.max_bytes,
                max_bytes_per_shard,
                evictions: Default::default(),
                eviction_record: Mutex::new(None),
                ids: std::sync::atomic::AtomicU64::new(config.id_seed.unwrap_or_else(rand::random)),
            }),
        }
    }

    /// Keys held, expired or not (expired keys are swept lazily).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.lock().keys.len()).sum()
    }

    /// About how many bytes the keys hold (as counted against [`MemoryConfig::max_bytes`]).
    pub fn bytes(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().keys.bytes())
            .sum()
    }

    /// Live keys evicted to make room for others, since the store started.
    pub fn evictions(&self) -> u64 {
        self.inner
            .evictions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keeps, from now on, how many times each bucket lost a key to eviction (what a simulation
    /// needs to tell a bucket that started full again from one that over-admitted).
    pub fn keep_eviction_record(&self) {
        self.inner
            .eviction_record
            .lock()
            .get_or_insert_with(Default::default);
    }

    /// How many times the bucket `key` (`rl:{tag}:rule`, as [`BucketKey::as_str`](crate::key::BucketKey::as_str)) lost a key
    /// to eviction since the record was kept (0 when it is not kept).
    pub fn evictions_of(&self, key: &str) -> u64 {
        self.inner
            .eviction_record
            .lock()
            .as_ref()
            .and_then(|r| r.get(key).copied())
            .unwrap_or(0)
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every key, live or not: every bucket starts full again (a failover to a
    /// replica that has none of the state).
    pub fn clear(&self) {
        for shard in self.inner.shards.iter() {
            let mut shard = shard.lock();
            shard.keys.clear();
            shard.sweep_at = MIN_SWEEP;
        }
    }

    /// A new lease or slot id: unique in this store (a counter through splitmix64, so ids
    /// look random and never repeat).
    fn nonce(&self) -> String {
        let mut z = self
            .inner
            .ids
            .fetch_add(0x9e37_79b9_7f4a_7c15, std::sync::atomic::Ordering::Relaxed);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        format!("{:016x}", z ^ (z >> 31))
    }

    /// Drops every expired key now.
    pub fn purge_expired(&self) {
        let now = self.inner.clock.now_micros();
        for shard in self.inner.shards.iter() {
            shard.lock().keys.purge_expired(now);
        }
    }

    /// Runs `op` on the shard of `key`'s identity, under its lock, at the current time.
    /// `creates` lists the keys the operation may create; if the shard has no room for the
    /// ones that do not exist yet, it drops expired keys, then evicts others' live keys (see
    /// [`bucket::Keys::evict_to`]); only when the identity's own keys fill the shard does the
    /// call fail as full.
    fn with_shard<T>(
        &self,
        key: &BucketKey,
        creates: &[&str],
        op: impl FnOnce(&mut Keys, Micros) -> T,
    ) -> Result<T, StoreError> {
        let inner = &*self.inner;
        let index =
            inner.hasher.shard_of(key.identity_prefix()) as usize & (inner.shards.len() - 1);
        let mut shard = inner.shards[index].lock();
        let now = inner.clock.now_micros();
        if shard.keys.len() >= shard.sweep_at {
            shard.keys.purge_expired(now);
            shard.sweep_at = (shard.keys.len() * 2).max(MIN_SWEEP);
        }
        let needed = |keys: &Keys| -> usize {
            creates
                .iter()
                .filter(|k| keys.get(k, now).is_none())
                .map(|k| bucket::ENTRY_OVERHEAD + k.len() + NEW_VALUE_BYTES)
                .sum()
        };
        let budget = inner.max_bytes_per_shard;
        if shard.keys.bytes() + needed(&shard.keys) > budget {
            shard.keys.purge_expired(now);
            let needed = needed(&shard.keys);
            if shard.keys.bytes() + needed > budget {
                // A tenth under the budget: one eviction makes room for many writes.
                let target = (budget - budget / 10).saturating_sub(needed);
                let evicted = shard.keys.evict_to(target, key.identity_prefix());
                inner
                    .evictions
                    .fetch_add(evicted.len() as u64, std::sync::atomic::Ordering::Relaxed);
                if let Some(record) = inner.eviction_record.lock().as_mut() {
                    for key in evicted {
                        *record
                            .entry(bucket::bucket_of(&key).to_owned())
                            .or_default() += 1;
                    }
                }
                if shard.keys.bytes() + needed > budget {
                    return Err(StoreError::Full(format!(
                        "the in-memory store's {} bytes are all held by this identity",
                        inner.max_bytes
                    )));
                }
            }
        }
        Ok(op(&mut shard.keys, now))
    }
}

/// What a new key's value is counted as before it is written (a counter's state; sorted sets
/// are counted as they grow, so one write may go past the budget by what it adds to one).
const NEW_VALUE_BYTES: usize = std::mem::size_of::<Value>();

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}
