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

mod bucket;

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::algorithm::entry_log::member_units;
use crate::algorithm::zset::ZSet;
use crate::algorithm::{EXPIRY_MARGIN_MS, once_marks, ttl_ms};
use crate::clock::{Micros, SharedClock, SystemClock};
use crate::error::StoreError;
use crate::key::BucketKey;
use crate::limit::{Kind, Limit};
use crate::ops::allowance::{Allowance, Demand, DemandRequest, share_of};
use crate::ops::check::{BucketStatus, CheckOutcome, CheckRequest, is_slot_bucket};
use crate::ops::debit::DebitRequest;
use crate::ops::lease::{LeaseGrant, LeaseId, LeaseRequest, ReturnRequest};
use crate::ops::slot::{SlotId, SlotRelease, SlotRenew};
use crate::store::{LeaseStore, state_key};
use bucket::{Bucket, Keys, Value};

/// Settings of the in-memory store.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// Number of shards (rounded up to a power of two).
    pub shards: usize,
    /// The most bytes held at once (keys, values and their entries, as counted by the store),
    /// all shards together.
    pub max_bytes: usize,
    /// Where lease and slot ids start: None draws from the OS; a simulation pins it so a run
    /// can be repeated (ids are unique within one store either way).
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
    hasher: RandomState,
    clock: SharedClock,
    max_bytes: usize,
    max_bytes_per_shard: usize,
    /// Live keys evicted to make room, since the start.
    evictions: std::sync::atomic::AtomicU64,
    /// The next lease or slot id (a counter, scrambled).
    ids: std::sync::atomic::AtomicU64,
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
                hasher: RandomState::new(),
                clock,
                max_bytes: config.max_bytes,
                max_bytes_per_shard,
                evictions: Default::default(),
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
            inner.hasher.hash_one(key.identity_prefix()) as usize & (inner.shards.len() - 1);
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
                    .fetch_add(evicted as u64, std::sync::atomic::Ordering::Relaxed);
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

fn us(d: u64) -> Duration {
    Duration::from_micros(d)
}

impl LeaseStore for MemoryStore {
    async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        let items = req.items();
        let slot_nonce = if items.iter().any(|i| is_slot_bucket(&i.limit)) {
            self.nonce()
        } else {
            String::new()
        };
        let state_keys: Vec<_> = items.iter().map(|i| state_key(&i.key, &i.limit)).collect();
        let extra = allowance_keys(items.iter().map(|i| &i.key), req.allowances());
        let creates: Vec<&str> = state_keys
            .iter()
            .map(|k| k.as_ref())
            .chain(extra.iter().map(String::as_str))
            .collect();
        self.with_shard(&items[0].key, &creates, |keys, now| {
            let buckets: Vec<(std::borrow::Cow<str>, Bucket, Option<Allowed>)> = items
                .iter()
                .zip(req.allowances())
                .map(|(i, a)| {
                    let k = state_key(&i.key, &i.limit);
                    let b = Bucket::load(keys, &k, &i.limit, now);
                    let allowed = a
                        .as_ref()
                        .map(|a| Allowed::load(keys, &i.key, &i.limit, a, now));
                    (k, b, allowed)
                })
                .collect();
            // Per item: whether the view admits, whether the allowance does.
            let admits: Vec<(bool, bool)> = items
                .iter()
                .zip(&buckets)
                .map(|(i, (_, b, a))| {
                    (
                        b.admits(&i.limit, now, i.cost),
                        a.as_ref()
                            .is_none_or(|a| a.bucket.admits(&a.limit, now, i.cost)),
                    )
                })
                .collect();
            let all = admits.iter().all(|(v, a)| *v && *a);
            let mut out = Vec::with_capacity(items.len());
            for ((item, (k, mut b, mut allowance)), (view_ok, allowance_ok)) in
                items.iter().zip(buckets).zip(admits)
            {
                let consume = all && item.cost > 0 && !req.is_peek();
                let entry = if consume {
                    b.consume(&item.limit, now, item.cost, &slot_nonce)
                } else {
                    None
                };
                let mut status = BucketStatus {
                    allowed: view_ok,
                    remaining: b.available(&item.limit, now),
                    retry_after: us(if view_ok {
                        0
                    } else {
                        b.retry_after(&item.limit, now, item.cost)
                    }),
                    reset_after: us(b.reset_after(&item.limit, now)),
                    slot: entry
                        .filter(|_| is_slot_bucket(&item.limit))
                        .map(|s| SlotId(s.into())),
                };
                if let Some(a) = allowance.as_mut() {
                    if consume {
                        a.bucket.consume(&a.limit, now, item.cost, "");
                    }
                    status.allowed &= allowance_ok;
                    status.remaining = status.remaining.min(a.bucket.available(&a.limit, now));
                    if !allowance_ok {
                        status.retry_after = status
                            .retry_after
                            .max(us(a.bucket.retry_after(&a.limit, now, item.cost)));
                    }
                    status.reset_after = status
                        .reset_after
                        .max(us(a.bucket.reset_after(&a.limit, now)));
                }
                out.push(status);
                if consume {
                    b.store(keys, &k, &item.limit, now);
                } else {
                    b.restore(keys, &k);
                }
                if let Some(a) = allowance {
                    a.store(keys, consume, now);
                }
            }
            CheckOutcome { buckets: out }
        })
    }

    async fn acquire_leases(&self, req: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        let asks = req.asks();
        let ttl_us = req.ttl().as_micros() as u64;
        let nonce = self.nonce();
        let names: Vec<String> = asks
            .iter()
            .flat_map(|a| [state_key(&a.key, &a.limit).into_owned(), a.key.lease_key()])
            .collect();
        let extra = allowance_keys(asks.iter().map(|a| &a.key), req.allowances());
        let creates: Vec<&str> = names
            .iter()
            .chain(extra.iter())
            .map(String::as_str)
            .collect();
        self.with_shard(&asks[0].key, &creates, |keys, now| {
            asks.iter()
                .zip(req.allowances())
                .enumerate()
                .map(|(position, (ask, allowance))| {
                    let lease_key = ask.key.lease_key();
                    let mut leases = keys.take_sorted(&lease_key, now);
                    leases.remove_up_to(now);
                    let k = state_key(&ask.key, &ask.limit);
                    let mut b = Bucket::load(keys, &k, &ask.limit, now);
                    let mut allowance = allowance
                        .as_ref()
                        .map(|a| Allowed::load(keys, &ask.key, &ask.limit, a, now));
                    let view_available = b.available(&ask.limit, now);
                    let available = match &allowance {
                        Some(a) => view_available.min(a.bucket.available(&a.limit, now)),
                        None => view_available,
                    };
                    let grant = grant_size(available, ask.want, ask.min, ask.max_share);
                    if grant == 0 {
                        let live_leases = leases.len() as u64;
                        store_leases(keys, &lease_key, leases, now);
                        let mut retry = if view_available < ask.min {
                            b.retry_after(&ask.limit, now, ask.min)
                        } else {
                            0
                        };
                        let mut reset = b.reset_after(&ask.limit, now);
                        if let Some(a) = &allowance {
                            if a.bucket.available(&a.limit, now) < ask.min {
                                retry = retry.max(a.bucket.retry_after(&a.limit, now, ask.min));
                            }
                            reset = reset.max(a.bucket.reset_after(&a.limit, now));
                        }
                        let refusal = LeaseGrant {
                            units: 0,
                            lease: None,
                            valid_for: Duration::ZERO,
                            remaining: available,
                            retry_after: us(retry),
                            reset_after: us(reset),
                            live_leases,
                        };
                        b.restore(keys, &k);
                        if let Some(a) = allowance {
                            a.store(keys, false, now);
                        }
                        return refusal;
                    }
                    let entry = b.consume(&ask.limit, now, grant, "");
                    let (valid_for, ws) = lease_validity(&ask.limit, &b, now, ttl_us);
                    let mut code = ask.limit.algorithm().script_code();
                    let (mut remaining, mut reset) =
                        (b.available(&ask.limit, now), b.reset_after(&ask.limit, now));
                    if let Some(a) = allowance.as_mut() {
                        a.bucket.consume(&a.limit, now, grant, "");
                        code += ALLOWANCE_CODE;
                        remaining = remaining.min(a.bucket.available(&a.limit, now));
                        reset = reset.max(a.bucket.reset_after(&a.limit, now));
                    }
                    if let Some(a) = allowance {
                        a.store(keys, true, now);
                    }
                    let tail = format!(":{ws}:{code}:{nonce}");
                    let id = match entry {
                        // The log's lease is named after its entry (`<id>:<units>`); other
                        // leases after the time and the ask's position (the nonce tells
                        // requests apart).
                        Some(member) => member,
                        None => format!("{now}.{}:{grant}", position + 1),
                    };
                    let lease = format!("{id}{tail}");
                    leases.add(now + valid_for, lease.clone());
                    let live_leases = leases.len() as u64;
                    let out = LeaseGrant {
                        units: grant,
                        lease: Some(LeaseId(lease.into())),
                        valid_for: us(valid_for),
                        remaining,
                        retry_after: Duration::ZERO,
                        reset_after: us(reset),
                        live_leases,
                    };
                    b.store(keys, &k, &ask.limit, now);
                    store_leases(keys, &lease_key, leases, now);
                    out
                })
                .collect()
        })
    }

    async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        self.with_shard(&items[0].key, &[], |keys, now| {
            items
                .iter()
                .zip(req.allowances())
                .map(|(item, allowance)| {
                    let lease_key = item.key.lease_key();
                    let mut leases = keys.take_sorted(&lease_key, now);
                    let Some(expiry) = leases.score(item.lease.as_str()) else {
                        keys.restore_sorted(&lease_key, leases);
                        return 0;
                    };
                    leases.remove(item.lease.as_str());
                    store_leases(keys, &lease_key, leases, now);
                    let Some(lease) = ParsedLease::parse(item.lease.as_str()) else {
                        return 0;
                    };
                    let code = item.limit.algorithm().script_code();
                    if expiry <= now || lease.algorithm % ALLOWANCE_CODE != code {
                        return 0;
                    }
                    let credit = item.unspent.min(lease.units);
                    // A lease taken under an allowance gives its units back to it too (at the
                    // share in force now; the used tokens are what carries over).
                    if let Some(a) = allowance
                        .as_ref()
                        .filter(|_| lease.algorithm > ALLOWANCE_CODE)
                    {
                        let mut allowed = Allowed::load(keys, &item.key, &item.limit, a, now);
                        let back =
                            credit_bucket(&mut allowed.bucket, &allowed.limit, credit, lease.ws);
                        allowed.store(keys, back > 0, now);
                    }
                    let k = state_key(&item.key, &item.limit);
                    let mut b = Bucket::load(keys, &k, &item.limit, now);
                    let credited = match &mut b {
                        Bucket::TokenBucket(_)
                        | Bucket::FixedWindow(_)
                        | Bucket::SlidingWindow(_) => {
                            credit_bucket(&mut b, &item.limit, credit, lease.ws)
                        }
                        Bucket::Log(log) => match log.remove(&lease.entry) {
                            Some((score, units)) => {
                                let c = credit.min(units);
                                if units > c {
                                    log.entries
                                        .add(score, format!("{}:{}", lease.id, units - c));
                                    log.used += units - c;
                                }
                                c
                            }
                            None => 0,
                        },
                        _ => 0,
                    };
                    if credited > 0 {
                        b.store(keys, &k, &item.limit, now);
                    } else {
                        b.restore(keys, &k);
                    }
                    credited
                })
                .collect()
        })
    }

    async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        let items = req.items();
        self.with_shard(&items[0].0, &[], |keys, now| {
            items
                .iter()
                .map(|(key, slot)| {
                    let k = format!("{key}:slots");
                    let mut slots = keys.take_sorted(&k, now);
                    slots.remove_up_to(now);
                    let released = slots.remove(slot.as_str());
                    keys.restore_sorted(&k, slots);
                    released
                })
                .collect()
        })
    }

    async fn renew_slots(&self, req: &SlotRenew) -> Result<Vec<bool>, StoreError> {
        let items = req.items();
        self.with_shard(&items[0].0, &[], |keys, now| {
            items
                .iter()
                .zip(req.ttls())
                .map(|((key, slot), ttl)| {
                    let k = format!("{key}:slots");
                    let mut slots = keys.take_sorted(&k, now);
                    slots.remove_up_to(now);
                    let held = slots.score(slot.as_str()).is_some();
                    if held {
                        slots.add(now + ttl.as_micros() as u64, slot.as_str().to_owned());
                    }
                    store_leases(keys, &k, slots, now);
                    held
                })
                .collect()
        })
    }

    async fn report_demand(&self, req: &DemandRequest) -> Result<(), StoreError> {
        let reports = req.reports();
        let names: Vec<String> = reports.iter().map(|r| r.key.demand_key()).collect();
        let creates: Vec<&str> = names.iter().map(String::as_str).collect();
        self.with_shard(&reports[0].key, &creates, |keys, now| {
            for (r, key) in reports.iter().zip(&names) {
                let mut demand = load_demand(keys, key, now);
                demand.report(r, now);
                let expires_at = demand.expires_at(0, now);
                keys.put(key, Value::Demand(demand), expires_at);
            }
        })
    }

    async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        let state_keys: Vec<_> = items.iter().map(|i| state_key(&i.key, &i.limit)).collect();
        let remote_keys: Vec<String> = items
            .iter()
            .filter(|i| i.once.is_some())
            .map(|i| i.key.remote_key())
            .collect();
        let creates: Vec<&str> = state_keys
            .iter()
            .map(|k| k.as_ref())
            .chain(remote_keys.iter().map(String::as_str))
            .collect();
        self.with_shard(&items[0].key, &creates, |keys, now| {
            items
                .iter()
                .map(|item| {
                    let units = match &item.once {
                        None => item.units,
                        Some(once) => {
                            let remote = item.key.remote_key();
                            let mut marks = match keys.get(&remote, now) {
                                Some(Value::Marks(m)) => m.clone(),
                                _ => Default::default(),
                            };
                            let excess = once_marks::apply(
                                &mut marks,
                                &once.origin,
                                once.until,
                                item.units,
                                now,
                            );
                            if excess > 0 {
                                let expires_at = once_marks::last_until(&marks)
                                    .saturating_add(EXPIRY_MARGIN_MS * 1000);
                                keys.put(&remote, Value::Marks(marks), expires_at);
                            }
                            excess
                        }
                    };
                    if units == 0 {
                        return 0;
                    }
                    let at = item.consumed_at.unwrap_or(now).min(now);
                    let k = state_key(&item.key, &item.limit);
                    let mut b = Bucket::load(keys, &k, &item.limit, now);
                    let applied = match (&mut b, item.limit.kind()) {
                        (Bucket::TokenBucket(tb), _) => {
                            tb.debit(units, item.limit.capacity());
                            units
                        }
                        (Bucket::FixedWindow(fw), Kind::FixedWindow { window_us, .. })
                            if fw.counts_at(window_us, at) =>
                        {
                            fw.count += units;
                            units
                        }
                        (Bucket::SlidingWindow(sw), Kind::SlidingWindow { window_us, .. }) => {
                            sw.debit(window_us, at, units)
                        }
                        (Bucket::Log(log), Kind::SlidingWindowLog { window_us, .. })
                            if at > now.saturating_sub(window_us) =>
                        {
                            log.add(at, at, units, "");
                            units
                        }
                        _ => 0,
                    };
                    if applied > 0 {
                        b.store(keys, &k, &item.limit, now);
                    } else {
                        b.restore(keys, &k);
                    }
                    applied
                })
                .collect()
        })
    }
}

/// Added to a lease's algorithm code when the lease was also taken from an allowance.
const ALLOWANCE_CODE: u8 = 10;

/// Gives `credit` units back to a counting bucket (the window's only if the lease was taken
/// in it); returns what was credited.
fn credit_bucket(b: &mut Bucket, limit: &Limit, credit: u64, ws: Micros) -> u64 {
    match b {
        Bucket::TokenBucket(tb) => {
            tb.credit(credit, limit.capacity());
            credit
        }
        Bucket::FixedWindow(fw) if fw.ws == ws => {
            let c = credit.min(fw.count);
            fw.count -= c;
            c
        }
        Bucket::SlidingWindow(sw) if sw.ws == ws => {
            let c = credit.min(sw.cur);
            sw.cur -= c;
            c
        }
        _ => 0,
    }
}

/// The allowance and demand keys a request may create.
fn allowance_keys<'a>(
    keys: impl Iterator<Item = &'a BucketKey>,
    allowances: &[Option<Allowance>],
) -> Vec<String> {
    keys.zip(allowances)
        .filter(|(_, a)| a.is_some())
        .flat_map(|(k, _)| [k.allowance_key(), k.demand_key()])
        .collect()
}

/// The demand record at `key` (empty if none).
fn load_demand(keys: &Keys, key: &str, now: Micros) -> Demand {
    match keys.get(key, now) {
        Some(Value::Demand(d)) => d.clone(),
        _ => Demand::default(),
    }
}

/// A bucket's allowance as loaded for one call (the demand record is written as it loads:
/// asking is demand, whatever the answer).
struct Allowed {
    key: String,
    limit: Limit,
    bucket: Bucket,
}

impl Allowed {
    fn load(keys: &mut Keys, key: &BucketKey, limit: &Limit, a: &Allowance, now: Micros) -> Self {
        let demand_key = key.demand_key();
        let mut demand = load_demand(keys, &demand_key, now);
        let share = demand.share(a, now);
        let expires_at = demand.expires_at(a.horizon_us(), now);
        keys.put(&demand_key, Value::Demand(demand), expires_at);
        let limit = share_of(limit, share);
        let key = key.allowance_key();
        let mut bucket = Bucket::load(keys, &key, &limit, now);
        if let Bucket::TokenBucket(tb) = &mut bucket {
            tb.cap = limit.capacity();
        }
        Self { key, limit, bucket }
    }

    fn store(self, keys: &mut Keys, changed: bool, now: Micros) {
        // A token bucket whose capacity moved is written even when nothing was taken, so the
        // next call measures the move from here.
        if changed || matches!(self.bucket, Bucket::TokenBucket(_)) {
            self.bucket.store(keys, &self.key, &self.limit, now);
        } else {
            self.bucket.restore(keys, &self.key);
        }
    }
}

/// How many units one grant takes: at most `want`, at most `max_share` of what is available
/// (but never less than `min`), and nothing unless `min` units are available.
pub(crate) fn grant_size(available: u64, want: u64, min: u64, max_share: f64) -> u64 {
    if available < min {
        return 0;
    }
    let share = (available as f64 * max_share).floor() as u64;
    want.min(share.max(min))
}

/// How long a lease lives, and the window it belongs to (0 for token buckets; the entry's
/// time for the log). A lease never outlives its window.
fn lease_validity(limit: &Limit, bucket: &Bucket, now: Micros, ttl_us: u64) -> (u64, Micros) {
    match (bucket, limit.kind()) {
        (Bucket::FixedWindow(b), Kind::FixedWindow { window_us, .. }) => {
            (ttl_us.min(b.until_end(window_us, now)), b.ws)
        }
        (Bucket::SlidingWindow(b), Kind::SlidingWindow { window_us, .. }) => {
            (ttl_us.min((b.ws + window_us).saturating_sub(now)), b.ws)
        }
        (Bucket::Log(_), Kind::SlidingWindowLog { window_us, .. }) => (ttl_us.min(window_us), now),
        _ => (ttl_us, 0),
    }
}

fn store_leases(keys: &mut Keys, lease_key: &str, leases: ZSet, now: Micros) {
    match leases.max_score() {
        None => {
            keys.remove(lease_key);
        }
        Some(last) => {
            let expires_at = now + ttl_ms(last.saturating_sub(now)) * 1000;
            keys.put(lease_key, Value::Sorted(leases), expires_at);
        }
    }
}

/// The fields of a lease id: `<id>:<units>:<ws>:<algorithm>:<nonce>`.
struct ParsedLease<'a> {
    id: &'a str,
    entry: String,
    units: u64,
    ws: Micros,
    algorithm: u8,
}

impl<'a> ParsedLease<'a> {
    fn parse(text: &'a str) -> Option<Self> {
        let mut parts = text.split(':');
        let id = parts.next()?;
        let units_text = parts.next()?;
        let ws = parts.next()?.parse().ok()?;
        let algorithm = parts.next()?.parse().ok()?;
        parts.next()?;
        let entry = format!("{id}:{units_text}");
        Some(Self {
            id,
            units: member_units(&entry),
            entry,
            ws,
            algorithm,
        })
    }
}
