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
//! - **Flushes** call the store directly (not through the circuit breaker): each call is
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

use futures::StreamExt;
use parking_lot::Mutex;
use tollgate_lease::{BucketKey, Micros};

use crate::metrics::{PenaltyLabels, RuleLabels, UncountedDenialsLabels};
use crate::rules::{CompiledRule, Mode};
use crate::runtime::shared::Shared;

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
fn footprint(key: &BucketKey) -> usize {
    key.as_str().len() + ENTRY_BYTES
}
/// Store calls one flush keeps in flight.
const FLUSH_CONCURRENCY: usize = 64;

/// What a node knows of its rules' penalty boxes.
#[derive(Debug, Default)]
pub struct Penalties {
    /// Bucket → when its block ends (node clock).
    blocks: Mutex<Sized<Micros>>,
    /// `blocks.len()`, read without the lock: most decisions find no block at all.
    held: AtomicUsize,
    /// Denials not yet counted in the store, per bucket.
    pending: Mutex<Sized<Pending>>,
    /// Whether a flush is out.
    flushing: AtomicBool,
    /// Buckets whose denials a flush has sent and the store has not answered for yet.
    noting: Mutex<HashSet<BucketKey>>,
    /// Told each time the store answers (or fails) a flush's call.
    noted: tokio::sync::Notify,
    /// Bucket → the lift epoch the store last said, for identities whose epoch is not 0.
    epochs: Mutex<Sized<u64>>,
    /// `epochs.len()`, read without the lock: most identities were never lifted.
    epochs_held: AtomicUsize,
}

/// The memory a value holds beyond its entry's (heap it owns).
trait Held {
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
struct Sized<V> {
    map: HashMap<BucketKey, V>,
    bytes: usize,
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
    fn len(&self) -> usize {
        self.map.len()
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn get(&self, key: &BucketKey) -> Option<&V> {
        self.map.get(key)
    }

    fn contains_key(&self, key: &BucketKey) -> bool {
        self.map.contains_key(key)
    }

    fn insert(&mut self, key: BucketKey, value: V) {
        let key_bytes = footprint(&key);
        self.bytes += key_bytes + value.held();
        if let Some(old) = self.map.insert(key, value) {
            self.bytes -= key_bytes + old.held();
        }
    }

    fn remove(&mut self, key: &BucketKey) -> Option<V> {
        let (key, value) = self.map.remove_entry(key)?;
        self.bytes -= footprint(&key) + value.held();
        Some(value)
    }

    fn retain(&mut self, mut keep: impl FnMut(&BucketKey, &mut V) -> bool) {
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

    fn take(&mut self) -> HashMap<BucketKey, V> {
        self.bytes = 0;
        std::mem::take(&mut self.map)
    }
}

#[derive(Debug)]
struct Pending {
    rule: Arc<CompiledRule>,
    identity: Vec<u8>,
    denials: u64,
    /// The lift epoch the node knew when it handed them out.
    epoch: u64,
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
    fn epoch(&self, key: &BucketKey) -> u64 {
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

    /// Counts one denial of `key`'s identity by `rule` (which has a penalty), and starts a
    /// flush to the store unless one is out.
    pub(crate) fn count(
        &self,
        shared: &Arc<Shared>,
        rule: &Arc<CompiledRule>,
        identity: &[u8],
        key: BucketKey,
    ) {
        let epoch = self.epoch(&key);
        {
            let mut pending = self.pending.lock();
            match pending.map.get_mut(&key) {
                Some(p) if p.epoch == epoch => p.denials += 1,
                Some(p) => {
                    // Handed out before a lift the node has heard of since: the store would
                    // refuse them.
                    uncounted(shared, rule, "lifted", p.denials);
                    (p.denials, p.epoch) = (1, epoch);
                }
                None => {
                    if pending.bytes + footprint(&key) + identity.len() > MAX_PENDING_BYTES {
                        drop(pending);
                        uncounted(shared, rule, "pending_full", 1);
                        return;
                    }
                    pending.insert(
                        key,
                        Pending {
                            rule: rule.clone(),
                            identity: identity.to_vec(),
                            denials: 1,
                            epoch,
                        },
                    );
                }
            }
        }
        if !self.flushing.swap(true, Ordering::AcqRel) {
            tokio::spawn(flush(shared.clone()));
        }
    }
}

/// Adds the pending denials to the store's counts until none are left; learns the blocks the
/// store answers with.
async fn flush(shared: Arc<Shared>) {
    let penalties = &shared.penalties;
    loop {
        // Taken and marked on their way under one lock: a lift that finds them in neither
        // (between the two) would not wait for them.
        let batch = {
            let mut pending = penalties.pending.lock();
            let batch = pending.take();
            penalties.noting.lock().extend(batch.keys().cloned());
            batch
        };
        if batch.is_empty() {
            penalties.flushing.store(false, Ordering::Release);
            // A denial counted between the take and the store above found a flush out.
            if penalties.pending.lock().is_empty()
                || penalties.flushing.swap(true, Ordering::AcqRel)
            {
                return;
            }
            continue;
        }
        futures::stream::iter(batch)
            .for_each_concurrent(FLUSH_CONCURRENCY, |(key, pending)| {
                note(&shared, key, pending)
            })
            .await;
    }
}

async fn note(shared: &Shared, key: BucketKey, pending: Pending) {
    let noting = key.clone();
    note_one(shared, key, pending).await;
    shared.penalties.noting.lock().remove(&noting);
    shared.penalties.noted.notify_waiters();
}

async fn note_one(shared: &Shared, key: BucketKey, pending: Pending) {
    let Some(penalty) = pending.rule.penalty else {
        return;
    };
    let enforced = pending.rule.mode == Mode::Enforce;
    // A SHADOW rule counts in a record of its own, which nothing enforces.
    let penalty = if enforced {
        penalty
    } else {
        penalty.shadowed()
    };
    let (denials, under) = (pending.denials, pending.epoch);
    match shared
        .store
        .note_denials(&key, &penalty, denials, Some(under))
        .await
    {
        Ok(state) => {
            let rule = &pending.rule;
            if state.epoch != under {
                // Handed out before a lift or reset this node had not heard of: the store
                // counted nothing, and said the epoch the next ones count under.
                if !state.blocked() {
                    uncounted(shared, rule, "lifted", denials);
                }
                shared.penalties.learn_epoch(&key, state.epoch);
            }
            if state.started {
                shared
                    .metrics
                    .penalties
                    .get_or_create(&PenaltyLabels {
                        domain: rule.domain.clone(),
                        rule: rule.id.clone(),
                        outcome: if enforced { "blocked" } else { "shadow" }.into(),
                    })
                    .inc();
                if enforced {
                    tracing::info!(rule = %rule.id, block_s = penalty.block().as_secs(), "an identity entered the penalty box");
                    if let Some(region) = shared.region.get() {
                        region.share_block(&rule.key, &pending.identity, state.blocked_for);
                    }
                } else {
                    tracing::info!(rule = %rule.id, "a SHADOW penalty would have blocked an identity");
                }
            }
            if state.blocked() && enforced {
                shared
                    .penalties
                    .learn(key, state.blocked_for, shared.clock.now_micros());
            }
        }
        Err(e) => {
            // The count lags by these denials; the limit itself still holds.
            uncounted(shared, &pending.rule, "store_failed", denials);
            tracing::debug!(error = %e, rule = %pending.rule.id, "denials not counted towards a penalty");
        }
    }
}

/// Counts `denials` of `rule` its penalty did not count, and why.
fn uncounted(shared: &Shared, rule: &CompiledRule, reason: &str, denials: u64) {
    shared
        .metrics
        .penalty_denials_uncounted
        .get_or_create(&UncountedDenialsLabels {
            domain: rule.domain.clone(),
            rule: rule.id.clone(),
            reason: reason.into(),
        })
        .inc_by(denials);
}

/// Counts a request a known block denied.
pub(crate) fn count_penalized(shared: &Shared, rule: &CompiledRule) {
    shared
        .metrics
        .penalized_requests
        .get_or_create(&RuleLabels {
            domain: rule.domain.clone(),
            rule: rule.id.clone(),
        })
        .inc();
}

/// Holds a block the peer region started: `identity` blocked under the rule keyed `rule_key`
/// for `left`, in this region's store and on this node. False when the rule has no enforced
/// penalty here, the block is under a second (not worth a store call), or the store failed.
pub(crate) async fn impose(
    shared: &Shared,
    rule: &CompiledRule,
    identity: &[u8],
    left: Duration,
) -> bool {
    let Some(penalty) = rule.penalty.filter(|_| rule.enforces_penalty()) else {
        return false;
    };
    let Ok(key) = BucketKey::new(identity, &rule.key) else {
        return false;
    };
    // Never longer than this region's rule blocks for, whatever the peer says (its rule may
    // differ while a change rolls out, and a peer's word is not a reason to block for a week).
    let left = left.min(penalty.block());
    // The peer's block as a penalty of one denial lasting its time left: one denial starts it,
    // and a block already held here is kept as it is.
    let Ok(one) = tollgate_lease::Penalty::new(1, penalty.within(), left) else {
        return false;
    };
    match shared.store.note_denials(&key, &one, 1, None).await {
        Ok(state) if state.blocked() => {
            shared
                .penalties
                .learn(key, state.blocked_for, shared.clock.now_micros());
            true
        }
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(error = %e, rule = %rule.id, "the peer region's block is not held here");
            false
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
