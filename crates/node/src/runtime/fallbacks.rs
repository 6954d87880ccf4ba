//! The LOCAL fail mode's buckets for keys that have no bucket on this node (no actor), held
//! in bytes: a key's entry costs [`FALLBACK_BYTES`] plus its key. When the map is full,
//! buckets idle for the idle timeout are swept (at most once a second), as an actor's would
//! be; if it is still full, the key shares its rule's overflow bucket with the other keys past
//! the bound, so the rule still limits (it never fails open for want of room) and memory does
//! not grow with the keys a client makes up.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;

use crate::runtime::local::LocalBucket;

/// What one fallback entry costs beside its key: the bucket and its `Arc`, the time it was
/// last used, the map's entry and the key's `Vec` header (an estimate, rounded up).
pub const FALLBACK_BYTES: usize = 160;

#[derive(Debug)]
struct Fallback {
    bucket: Arc<LocalBucket>,
    used: AtomicU64,
}

/// Fallback buckets by bucket key, and one overflow bucket per rule.
#[derive(Debug)]
pub struct Fallbacks {
    map: DashMap<Vec<u8>, Fallback>,
    overflow: DashMap<u64, Arc<LocalBucket>>,
    bytes: AtomicUsize,
    max_bytes: usize,
    swept: AtomicU64,
}

fn cost(key: &[u8]) -> usize {
    FALLBACK_BYTES + key.len()
}

impl Fallbacks {
    /// An empty map holding at most `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            map: DashMap::new(),
            overflow: DashMap::new(),
            bytes: AtomicUsize::new(0),
            max_bytes,
            swept: AtomicU64::new(0),
        }
    }

    /// The bucket of `key` (a [`crate::runtime::keys::registry::bucket_key`] of rule `uid`),
    /// made by `fresh` when new; its rule's overflow bucket when there is no room even after
    /// sweeping buckets idle for `idle_us` before `now`.
    pub fn bucket(
        &self,
        key: Vec<u8>,
        uid: u64,
        now: u64,
        idle_us: u64,
        fresh: impl Fn() -> Arc<LocalBucket>,
    ) -> Arc<LocalBucket> {
        if let Some(found) = self.map.get(&key) {
            found.used.store(now, Ordering::Relaxed);
            return found.bucket.clone();
        }
        let needed = cost(&key);
        if self.bytes.load(Ordering::Relaxed) + needed > self.max_bytes {
            self.sweep(now, idle_us);
            if self.bytes.load(Ordering::Relaxed) + needed > self.max_bytes {
                return self.overflow.entry(uid).or_insert_with(&fresh).clone();
            }
        }
        let entry = self.map.entry(key).or_insert_with(|| {
            self.bytes.fetch_add(needed, Ordering::Relaxed);
            Fallback {
                bucket: fresh(),
                used: AtomicU64::new(now),
            }
        });
        entry.bucket.clone()
    }

    /// Drops buckets idle for `idle_us`, at most once a second.
    fn sweep(&self, now: u64, idle_us: u64) {
        let last = self.swept.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 1_000_000
            || self
                .swept
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.map.retain(|key, f| {
            let keep = now.saturating_sub(f.used.load(Ordering::Relaxed)) < idle_us;
            if !keep {
                self.bytes.fetch_sub(cost(key), Ordering::Relaxed);
            }
            keep
        });
    }

    /// Takes `key`'s bucket out (its key now has a bucket of its own, which carries the count
    /// on).
    pub fn take(&self, key: &[u8]) -> Option<Arc<LocalBucket>> {
        let (key, taken) = self.map.remove(key)?;
        self.bytes.fetch_sub(cost(&key), Ordering::Relaxed);
        Some(taken.bucket)
    }

    /// Buckets held, and overflow buckets (one per rule that overflowed).
    pub fn counts(&self) -> (usize, usize) {
        (self.map.len(), self.overflow.len())
    }

    /// Bytes held, as counted against the bound.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Arc<LocalBucket> {
        Arc::new(LocalBucket::new(10.0, 1.0))
    }

    #[test]
    fn bounded_in_bytes_swept_when_idle_and_overflowing_per_rule() {
        let key = |i: u32| {
            let mut k = 7u64.to_le_bytes().to_vec();
            k.extend_from_slice(format!("identity-{i:04}").as_bytes());
            k
        };
        let each = cost(&key(0));
        let map = Fallbacks::new(10 * each);
        for i in 0..10 {
            map.bucket(key(i), 7, 0, 2_000_000, fresh);
        }
        assert_eq!(map.counts(), (10, 0));
        assert_eq!(map.bytes(), 10 * each);
        // Full, nothing idle yet: the eleventh key shares the rule's overflow bucket.
        let a = map.bucket(key(10), 7, 1_500_000, 2_000_000, fresh);
        let b = map.bucket(key(11), 7, 1_500_000, 2_000_000, fresh);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(map.counts(), (10, 1));
        // Later, the idle ones are swept and a new key gets its own bucket.
        map.bucket(key(12), 7, 5_000_000, 2_000_000, fresh);
        assert_eq!(map.counts(), (1, 1));
        assert_eq!(map.bytes(), each);
        assert!(map.take(&key(12)).is_some());
        assert_eq!(map.bytes(), 0);
    }
}
