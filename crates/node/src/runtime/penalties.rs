//! The penalty box on a node (`docs/penalty-box.md`): the blocks it knows of, and the
//! denials it has handed out under rules with a penalty, on their way to the store.
//!
//! - **Counting.** Every denial of a request by a rule with a penalty (by the store, by a
//!   lease's memory of a store denial, by the pre-limit) is counted here and added to the
//!   identity's count in the store (`note_denials`) by one flush at a time, so the count is
//!   one total over every node and a node that denies from memory counts too. Denials that
//!   arrive while a flush is out ride on the next one.
//! - **Knowing.** A block is learnt from the store: the flush that started it, or any check or
//!   lease the store refused because of it. From then on this node denies the identity from
//!   memory, without a store call, until the block ends. The node whose flush started a block
//!   tells the peer region, which holds it in its own store (`impose`).
//! - **Bounds, in bytes.** The blocks held take at most [`MAX_BLOCK_BYTES`] (past it, an
//!   eighth of them go, those nearest their end; the store still refuses those identities'
//!   leases) and the identities waiting to be counted at most [`MAX_PENDING_BYTES`] (past it, a
//!   new identity's denials are not counted until a flush makes room): nothing a client sends
//!   grows them without bound, however long its identities (an identity is at most 512 bytes
//!   before it is kept as a digest, `rules::identity`).
//! - **Flushes** (`decision/penalties.rs`, with the counting) call the store directly (not through the circuit breaker): each call is
//!   bounded by the store's budget, at most 64 are out at once, and a failed one drops its
//!   counts.
//! - **Lifts.** A lift or reset starts a new *lift epoch* of the identity in the store. The
//!   denials a node holds carry the epoch it last heard from the store for that identity (0
//!   when it heard none), and the store counts a flush only under its current epoch: denials
//!   handed out before a lift, flushed after it by a node that had not heard of it, count
//!   nothing, and the answer tells the node the new epoch. What is not counted shows in
//!   `tollgate_penalty_denials_uncounted_total`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tollgate_lease::{BucketKey, Micros};

use crate::rules::CompiledRule;

/// The most memory the blocks a node holds may take: 16 MiB, some 100,000 blocks of API keys
/// (a block of a 40-byte key takes about 150 bytes; of a 512-byte one, about 1.7 KB).
pub const MAX_BLOCK_BYTES: usize = 16 << 20;
/// The most memory the identities waiting to be counted may take.
pub const MAX_PENDING_BYTES: usize = 16 << 20;
/// The most memory the lift epochs a node remembers may take (only identities lifted or reset
/// within a day have one). Past it they are all forgotten: a flush under a forgotten epoch
/// counts nothing and the store's answer teaches it again.
pub const MAX_EPOCH_BYTES: usize = 4 << 20;
/// What a map entry costs besides its key's text: the hash map's slot, the key's allocation,
/// the value (a block's end; a pending count's rule and identity).
const ENTRY_BYTES: usize = 96;

/// The memory a block or pending count of `key` takes.
pub(crate) fn footprint(key: &BucketKey) -> usize {
    key.as_str().len() + ENTRY_BYTES
}

/// What a node knows of its rules' penalty boxes.
#[derive(Debug, Default)]
pub struct Penalties {
    /// Bucket → when its block ends (node clock).
    blocks: Mutex<Sized<Micros>>,
    /// `blocks.len()`, read without the lock: most decisions find no block at all.
    held: AtomicUsize,
    /// Denials not yet counted in the store, per bucket.
    pub(crate) pending: Mutex<Sized<Pending>>,
    /// Whether a flush is out.
    pub(crate) flushing: AtomicBool,
    /// Buckets whose denials a flush has sent and the store has not answered for yet.
    pub(crate) noting: Mutex<HashSet<BucketKey>>,
    /// Told each time the store answers (or fails) a flush's call.
    pub(crate) noted: tokio::sync::Notify,
    /// Bucket → the lift epoch the store last said, for identities whose epoch is not 0.
    epochs: Mutex<Sized<u64>>,
    /// `epochs.len()`, read without the lock: most identities were never lifted.
    epochs_held: AtomicUsize,
}

/// The memory a value holds beyond its entry's (heap it owns).
pub(crate) trait Held {
    fn held(&self) -> usize;
}

impl Held for Micros {
    fn held(&self) -> usize {
        0
    }
}

impl Held for Pending {
    fn held(&self) -> usize {
        self.identity.len()
    }
}

/// A map by bucket, and the memory its entries take ([`footprint`] and what each value holds).
#[derive(Debug)]
pub(crate) struct Sized<V> {
    pub(crate) map: HashMap<BucketKey, V>,
    pub(crate) bytes: usize,
}

impl<V> Default for Sized<V> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            bytes: 0,
        }
    }
}

impl<V: Held> Sized<V> {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(crate) fn get(&self, key: &BucketKey) -> Option<&V> {
        self.map.get(key)
    }

    pub(crate) fn contains_key(&self, key: &BucketKey) -> bool {
        self.map.contains_key(key)
    }

    pub(crate) fn insert(&mut self, key: BucketKey, value: V) {
        let key_bytes = footprint(&key);
        self.bytes += key_bytes + value.held();
        if let Some(old) = self.map.insert(key, value) {
            self.bytes -= key_bytes + old.held();
        }
    }

    pub(crate) fn remove(&mut self, key: &BucketKey) -> Option<V> {
        let (key, value) = self.map.remove_entry(key)?;
        self.bytes -= footprint(&key) + value.held();
        Some(value)
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&BucketKey, &mut V) -> bool) {
        let mut freed = 0;
        self.map.retain(|k, v| {
            let kept = keep(k, v);
            if !kept {
                freed += footprint(k) + v.held();
            }
            kept
        });
        self.bytes -= freed;
    }

    pub(crate) fn take(&mut self) -> HashMap<BucketKey, V> {
        self.bytes = 0;
        std::mem::take(&mut self.map)
    }
}

#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) rule: Arc<CompiledRule>,
    pub(crate) identity: Vec<u8>,
    pub(crate) denials: u64,
    /// The lift epoch the node knew when it handed them out.
    pub(crate) epoch: u64,
}

impl Penalties {
    /// The time left of `key`'s block, if this node knows of one.
    pub fn blocked_for(&self, key: &BucketKey, now: Micros) -> Option<Duration> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut blocks = self.blocks.lock();
        match blocks.get(key) {
            Some(&until) if until > now => Some(Duration::from_micros(until - now)),
            Some(_) => {
                blocks.remove(key);
                self.held.store(blocks.len(), Ordering::Relaxed);
                None
            }
            None => None,
        }
    }

    /// Learns that `key` is blocked for `left` from `now`.
    pub fn learn(&self, key: BucketKey, left: Duration, now: Micros) {
        let until = now + left.as_micros() as u64;
        let mut blocks = self.blocks.lock();
        if blocks.bytes + footprint(&key) > MAX_BLOCK_BYTES && !blocks.contains_key(&key) {
            // Full: the ended blocks go, then an eighth of the map, those nearest their end
            // (one pass makes room for many blocks, so a flood pays it rarely).
            blocks.retain(|_, end| *end > now);
            let over = if blocks.bytes + footprint(&key) > MAX_BLOCK_BYTES - MAX_BLOCK_BYTES / 8 {
                (blocks.len() / 8).max(1)
            } else {
                0
            };
            if over > 0 {
                let mut ends: Vec<Micros> = blocks.map.values().copied().collect();
                let (_, cut, _) = ends.select_nth_unstable(over - 1);
                let cut = *cut;
                let mut left = over;
                blocks.retain(|_, end| {
                    let goes = left > 0 && *end <= cut;
                    left -= usize::from(goes);
                    !goes
                });
            }
        }
        blocks.insert(key, until);
        self.held.store(blocks.len(), Ordering::Relaxed);
    }

    /// The lift epoch the store last said for `key` (0: none heard).
    pub(crate) fn epoch(&self, key: &BucketKey) -> u64 {
        if self.epochs_held.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.epochs.lock().get(key).copied().unwrap_or(0)
    }

    /// Remembers the lift epoch the store said for `key`: denials handed out from now on
    /// carry it.
    pub fn learn_epoch(&self, key: &BucketKey, epoch: u64) {
        if epoch == self.epoch(key) {
            return;
        }
        let mut epochs = self.epochs.lock();
        if epoch == 0 {
            epochs.remove(key);
        } else {
            if epochs.bytes + footprint(key) > MAX_EPOCH_BYTES {
                epochs.take();
            }
            epochs.insert(key.clone(), epoch);
        }
        self.epochs_held.store(epochs.len(), Ordering::Relaxed);
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Forgets `key`'s block (its counters were reset).
    pub fn forget(&self, key: &BucketKey) {
        let mut blocks = self.blocks.lock();
        blocks.remove(key);
        self.held.store(blocks.len(), Ordering::Relaxed);
        drop(blocks);
        // Denials handed out before the lift, not yet counted: flushed after it, they would
        // count towards a block that was just lifted (and start it again).
        self.pending.lock().remove(key);
    }

    /// Waits until no denials of `key` this node has sent are on their way to the store: a
    /// lift that lands after them is not undone by them (they count towards the block being
    /// lifted, not a fresh one). Each call is bounded by the store's budget.
    pub async fn settled(&self, key: &BucketKey) {
        loop {
            let notified = std::pin::pin!(self.noted.notified());
            let mut notified = notified;
            notified.as_mut().enable();
            if !self.noting.lock().contains(key) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize, len: usize) -> BucketKey {
        let mut identity = format!("{i}-").into_bytes();
        identity.resize(len, b'x');
        BucketKey::new(&identity, "rule").expect("a key")
    }

    #[test]
    fn blocks_held_stay_within_their_bytes_whatever_the_identities() {
        let penalties = Penalties::default();
        let now = 1_000_000;
        // 512-byte identities: the longest kept as they are (a longer one is a digest).
        let per = footprint(&key(0, 512));
        let fit = MAX_BLOCK_BYTES / per;
        for i in 0..fit * 3 {
            penalties.learn(key(i, 512), Duration::from_secs(60 + i as u64), now);
            assert!(penalties.blocks.lock().bytes <= MAX_BLOCK_BYTES);
        }
        let held = penalties.blocks();
        assert!(
            held <= fit && held >= fit / 2,
            "{held} blocks of {per} bytes held, {fit} fit"
        );
        // Those nearest their end went; the latest stays known.
        let last = key(fit * 3 - 1, 512);
        assert!(penalties.blocked_for(&last, now).is_some());
        // Forgetting gives its bytes back.
        let before = penalties.blocks.lock().bytes;
        penalties.forget(&last);
        assert_eq!(penalties.blocks.lock().bytes, before - per);
    }

    #[test]
    fn the_bytes_of_a_map_follow_its_entries() {
        let mut map: Sized<Pending> = Sized::default();
        let rule = Arc::new(
            crate::rules::CompiledRule::for_override(1, Duration::from_secs(1), Default::default())
                .expect("a rule"),
        );
        let pending = |identity: &[u8]| Pending {
            rule: rule.clone(),
            identity: identity.to_vec(),
            denials: 1,
            epoch: 0,
        };
        map.insert(key(1, 40), pending(&[1; 40]));
        map.insert(key(2, 40), pending(&[2; 40]));
        assert_eq!(map.bytes, 2 * (footprint(&key(1, 40)) + 40));
        map.insert(key(2, 40), pending(&[2; 10]));
        assert_eq!(
            map.bytes,
            2 * footprint(&key(1, 40)) + 50,
            "a replaced entry"
        );
        map.retain(|k, _| *k == key(1, 40));
        assert_eq!(map.bytes, footprint(&key(1, 40)) + 40);
        assert_eq!(map.take().len(), 1);
        assert_eq!(map.bytes, 0);
    }
}
