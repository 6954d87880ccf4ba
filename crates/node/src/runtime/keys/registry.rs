//! The buckets and key actors alive on this node, found by the decision path without locks
//! held across awaits. Their number is bounded: past the cap, new keys are decided by a direct
//! store call and leave nothing behind, so a flood of new keys cannot exhaust memory.
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

use dashmap::DashMap;
use ractor::ActorRef;

use crate::runtime::keys::bucket::Bucket;
use crate::runtime::keys::messages::KeyMsg;

/// A bucket's registry key: the rule's uid, then the identity.
pub fn bucket_key(uid: u64, identity: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + identity.len());
    key.extend_from_slice(&uid.to_le_bytes());
    key.extend_from_slice(identity);
    key
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
    max_actors: usize,
    /// When keys without a bucket were last decided (µs), by a hash of their bucket key.
    seen: DashMap<u64, u64, Fast>,
    seen_hasher: Fast,
    max_seen: usize,
    seen_swept: AtomicU64,
}

impl Registry {
    /// An empty registry holding at most `max_actors` key actors.
    pub fn new(max_actors: usize) -> Self {
        Self {
            buckets: DashMap::with_hasher(Fast::default()),
            actors: DashMap::with_hasher(Fast::default()),
            live: AtomicUsize::new(0),
            max_actors,
            seen: DashMap::with_hasher(Fast::default()),
            seen_hasher: Fast::default(),
            max_seen: max_actors.saturating_mul(10).max(1024),
            seen_swept: AtomicU64::new(0),
        }
    }

    /// Whether the bucket under `key` was decided within `within` µs before `now` (it comes
    /// back: worth a bucket and an actor), recording this decision. A key seen for the first
    /// time, or not for `within`, is decided by a store check. When the map is full it is
    /// swept of keys older than `within` (at most once per `within`); a key that still finds
    /// no room is not recorded (decided directly until there is room).
    pub fn seen_again(&self, key: &[u8], now: u64, within: u64) -> bool {
        let hash = self.seen_hasher.hash_one(key);
        if let Some(mut at) = self.seen.get_mut(&hash) {
            // Kept after it comes back: requests that find no bucket while the first of them
            // spawns its actor go that way too. Swept when the map is full.
            let again = now.saturating_sub(*at) <= within;
            *at = now;
            return again;
        }
        if self.seen.len() >= self.max_seen {
            let last = self.seen_swept.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= within
                && self
                    .seen_swept
                    .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                self.seen.retain(|_, at| now.saturating_sub(*at) <= within);
            }
            if self.seen.len() >= self.max_seen {
                return false;
            }
        }
        self.seen.insert(hash, now);
        false
    }

    /// Keys decided without a bucket and remembered (see [`Registry::seen_again`]).
    pub fn seen_keys(&self) -> usize {
        self.seen.len()
    }

    /// The bucket under `key` ([`bucket_key`]).
    pub fn bucket(&self, key: &[u8]) -> Option<Arc<Bucket>> {
        self.buckets.get(key).map(|b| b.clone())
    }

    /// Adds a bucket, or returns the one another request added first.
    pub fn insert_bucket(&self, key: Vec<u8>, bucket: Arc<Bucket>) -> Arc<Bucket> {
        self.buckets.entry(key).or_insert(bucket).clone()
    }

    /// Drops a bucket.
    pub fn remove_bucket(&self, key: &[u8]) {
        self.buckets.remove(key);
    }

    /// The actor of `identity`.
    pub fn actor(&self, identity: &[u8]) -> Option<ActorRef<KeyMsg>> {
        self.actors.get(identity).map(|a| a.clone())
    }

    /// Reserves room for one more actor, if the cap allows.
    pub fn reserve_actor(&self) -> bool {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_actors).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back a reservation that was not used.
    pub fn unreserve_actor(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
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
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Forgets every bucket whose actor is `actor` (after a crash, when the actor could not).
    pub fn remove_buckets_of(&self, actor: &ActorRef<KeyMsg>) {
        self.buckets
            .retain(|_, b| b.actor.get_id() != actor.get_id());
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
