//! The buckets and key actors alive on this node, found by the decision path without locks
//! held across awaits. What they hold is bounded in bytes (see `docs/memory-bounds.md`): an
//! actor is charged [`ACTOR_BYTES`] and its identity, a bucket [`BUCKET_BYTES`] and its keys.
//! Past the budget, new keys are decided by a direct store call and leave nothing behind, and
//! actors idle for a second are asked to stop: a flood of new keys cannot exhaust memory, and
//! pushes out only keys that stopped coming.
//!
//! A key gets a bucket and an actor only when it comes back within a quarter of a lease
//! lifetime (its demand would then lease more than one unit): until
//! then each decision is one store check, as a one-unit lease would be, and the key costs one
//! entry in a bounded map of when keys were last seen (a hash and a time, not an actor of
//! several kilobytes). Many keys that come once or rarely (a scan, a uniform spread over a
//! million keys) stay that cheap.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use ractor::ActorRef;

use crate::runtime::keys::bucket::Bucket;
use crate::runtime::keys::bucket::KeyMsg;

/// What a key actor costs beside its identity, measured with `cargo bench --bench key_flood`
/// (RSS over live actors) and accounted as: the ractor cell and its four channels (each
/// unbounded channel allocates its first block of 32 slots at once; the supervision channel's
/// 32 events of 80 bytes are 2.5 KB), the actor's task and its state, the task and timer of
/// its next tick, and its entries here.
pub const ACTOR_BYTES: usize = 10 * 1024;

/// What a bucket costs beside its keys: the bucket (272 bytes), its `Arc`, its LOCAL fallback
/// and the registry's entry, rounded up.
pub const BUCKET_BYTES: usize = 512;

/// What one key remembered in the keys-seen map costs (a hash, a time, the map's share).
pub const SEEN_BYTES: usize = 32;

/// How often the keys-seen map forgets keys it no longer needs.
pub const SEEN_SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How long an actor must have been idle before pressure on the budget stops it.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// What an actor serving `identity_len` bytes of identity is charged (the identity is held
/// twice: the registry's key, the actor's state).
pub fn actor_cost(identity_len: usize) -> usize {
    ACTOR_BYTES + 2 * identity_len
}

/// What a bucket is charged: its registry key (uid and identity) and its store key.
pub fn bucket_cost(identity_len: usize, store_key_len: usize) -> usize {
    BUCKET_BYTES + 8 + identity_len + store_key_len
}

/// A fast hasher for keys the node makes itself (rule uids, identities): the maps are sharded
/// and bounded, and a flood of keys is capped before it could matter.
type Fast = foldhash::fast::RandomState;

/// Buckets and actors by key.
#[derive(Debug)]
pub struct Registry {
    buckets: DashMap<Vec<u8>, Arc<Bucket>, Fast>,
    actors: DashMap<Vec<u8>, ActorRef<KeyMsg>, Fast>,
    live: AtomicUsize,
    /// Bytes charged for actors and buckets, and the most that may be.
    held: AtomicUsize,
    max_bytes: usize,
    /// When the budget last asked idle actors to stop (µs), and where in the map it stopped.
    pressed_at: AtomicU64,
    press_from: AtomicUsize,
    /// When keys without a bucket were last decided (µs), by a hash of their bucket key.
    seen: DashMap<u64, u64, Fast>,
    seen_hasher: Fast,
    max_seen: usize,
    seen_swept: AtomicU64,
}

impl Registry {
    /// An empty registry whose key state holds at most `max_bytes`: fifteen sixteenths for
    /// actors and buckets, a sixteenth for the keys-seen map.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            buckets: DashMap::with_hasher(Fast::default()),
            actors: DashMap::with_hasher(Fast::default()),
            live: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            max_bytes: max_bytes - max_bytes / 16,
            pressed_at: AtomicU64::new(0),
            press_from: AtomicUsize::new(0),
            seen: DashMap::with_hasher(Fast::default()),
            seen_hasher: Fast::default(),
            max_seen: (max_bytes / 16 / SEEN_BYTES).max(64),
            seen_swept: AtomicU64::new(0),
        }
    }

    /// Charges `bytes` to the budget, if they fit.
    pub fn reserve(&self, bytes: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= self.max_bytes).then_some(held + bytes)
            })
            .is_ok()
    }

    /// Gives `bytes` back to the budget.
    pub fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes charged for actors and buckets, plus the keys-seen map's.
    pub fn bytes(&self) -> usize {
        self.held.load(Ordering::Acquire) + self.seen.len() * SEEN_BYTES
    }

    /// The budget is short: at most once per [`EVICTABLE_AFTER`] / 4, up to `sample` actors
    /// (taken in turn around the map) are handed to `ask`, which asks them to stop if they
    /// have been idle for [`EVICTABLE_AFTER`]. Returns how many were asked.
    pub fn press(&self, now: u64, sample: usize, ask: impl Fn(&ActorRef<KeyMsg>)) -> usize {
        let last = self.pressed_at.load(Ordering::Relaxed);
        let every = EVICTABLE_AFTER.as_micros() as u64 / 4;
        if now.saturating_sub(last) < every
            || self
                .pressed_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return 0;
        }
        let live = self.actors.len().max(1);
        let from = self.press_from.load(Ordering::Relaxed) % live;
        let mut asked = 0;
        for actor in self.actors.iter().skip(from).take(sample) {
            ask(actor.value());
            asked += 1;
        }
        self.press_from.store(from + asked, Ordering::Relaxed);
        asked
    }

    /// Whether the bucket under `key` was decided within `within` µs before `now` (it comes
    /// back: worth a bucket and an actor), recording this decision. A key seen for the first
    /// time, or not for `within`, is decided by a store check. The map is swept of keys older
    /// than `within` every [`SEEN_SWEEP_EVERY`] (so it holds the keys of the last second or
    /// so, not every key since the map last filled), and when it is full (at most once per
    /// `within`); a key that still finds no room is not recorded (decided directly until there
    /// is room).
    pub fn seen_again(&self, key: &[u8], now: u64, within: u64) -> bool {
        let last = self.seen_swept.load(Ordering::Relaxed);
        let since = now.saturating_sub(last);
        if since >= within.max(SEEN_SWEEP_EVERY.as_micros() as u64) {
            self.sweep_seen(last, now, within);
        }
        let hash = self.seen_hasher.hash_one(key);
        if let Some(mut at) = self.seen.get_mut(&hash) {
            // Kept after it comes back: requests that find no bucket while the first of them
            // spawns its actor go that way too.
            let again = now.saturating_sub(*at) <= within;
            *at = now;
            return again;
        }
        if self.seen.len() >= self.max_seen {
            let last = self.seen_swept.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= within {
                self.sweep_seen(last, now, within);
            }
            if self.seen.len() >= self.max_seen {
                return false;
            }
        }
        self.seen.insert(hash, now);
        false
    }

    /// Forgets the keys not seen within `within` before `now`, unless another caller swept
    /// since `last`. A key older than that answers as a new one would: forgetting it changes
    /// no decision.
    fn sweep_seen(&self, last: u64, now: u64, within: u64) {
        if self
            .seen_swept
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.seen.retain(|_, at| now.saturating_sub(*at) <= within);
        }
    }

    /// Keys decided without a bucket and remembered (see [`Registry::seen_again`]).
    pub fn seen_keys(&self) -> usize {
        self.seen.len()
    }

    /// The bucket under `key` ([`bucket_key`]).
    pub fn bucket(&self, key: &[u8]) -> Option<Arc<Bucket>> {
        self.buckets.get(key).map(|b| b.clone())
    }

    /// Adds a bucket whose [`bucket_cost`] the caller reserved, or returns the one another
    /// request added first (and gives the reservation back).
    pub fn insert_bucket(&self, key: Vec<u8>, bucket: Arc<Bucket>) -> Arc<Bucket> {
        let cost = bucket_cost(key.len() - 8, bucket.key.as_str().len());
        let kept = self.buckets.entry(key).or_insert(bucket.clone()).clone();
        if !Arc::ptr_eq(&kept, &bucket) {
            self.release(cost);
        }
        kept
    }

    /// Drops a bucket.
    pub fn remove_bucket(&self, key: &[u8]) {
        if let Some((key, bucket)) = self.buckets.remove(key) {
            self.release(bucket_cost(key.len() - 8, bucket.key.as_str().len()));
        }
    }

    /// The actor of `identity`.
    pub fn actor(&self, identity: &[u8]) -> Option<ActorRef<KeyMsg>> {
        self.actors.get(identity).map(|a| a.clone())
    }

    /// Reserves room for one more actor serving `identity_len` bytes of identity, if the
    /// budget allows.
    pub fn reserve_actor(&self, identity_len: usize) -> bool {
        let reserved = self.reserve(actor_cost(identity_len));
        if reserved {
            self.live.fetch_add(1, Ordering::AcqRel);
        }
        reserved
    }

    /// Gives back a reservation that was not used.
    pub fn unreserve_actor(&self, identity_len: usize) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        self.release(actor_cost(identity_len));
    }

    /// Records `identity`'s actor, or returns the one another request recorded first.
    pub fn insert_actor(&self, identity: Vec<u8>, actor: ActorRef<KeyMsg>) -> ActorRef<KeyMsg> {
        self.actors.entry(identity).or_insert(actor).clone()
    }

    /// Forgets `identity`'s actor if it is still `actor`, and frees its place.
    pub fn remove_actor(&self, identity: &[u8], actor: &ActorRef<KeyMsg>) {
        if self
            .actors
            .remove_if(identity, |_, a| a.get_id() == actor.get_id())
            .is_some()
        {
            self.unreserve_actor(identity.len());
        }
    }

    /// Forgets every bucket whose actor is `actor` (after a crash, when the actor could not).
    pub fn remove_buckets_of(&self, actor: &ActorRef<KeyMsg>) {
        self.buckets.retain(|key, b| {
            let keep = b.actor.get_id() != actor.get_id();
            if !keep {
                self.release(bucket_cost(key.len() - 8, b.key.as_str().len()));
            }
            keep
        });
    }

    /// The identity `actor` serves.
    pub fn identity_of(&self, actor: &ActorRef<KeyMsg>) -> Option<Vec<u8>> {
        self.actors
            .iter()
            .find(|a| a.value().get_id() == actor.get_id())
            .map(|a| a.key().clone())
    }

    /// Actors alive.
    pub fn live_actors(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Every actor (for shutdown).
    pub fn actors(&self) -> Vec<ActorRef<KeyMsg>> {
        self.actors.iter().map(|a| a.value().clone()).collect()
    }

    /// Buckets held.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}
