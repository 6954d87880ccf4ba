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
//! - **Bounds.** At most [`MAX_BLOCKS`] blocks are held (past it, an eighth of them go,
//!   those nearest their end; the store still refuses those identities' leases) and at most
//!   [`MAX_PENDING`] identities wait to be counted (past it, a new identity's denials are not
//!   counted until a flush makes room): nothing a client sends grows them without bound.
//! - **Flushes** call the store directly (not through the circuit breaker): each call is
//!   bounded by the store's budget, at most 64 are out at once, and a failed one drops its
//!   counts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use parking_lot::Mutex;
use tollgate_lease::{BucketKey, LeaseStore, Micros};

use crate::metrics::{PenaltyLabels, RuleLabels};
use crate::rules::{CompiledRule, Mode};
use crate::runtime::shared::Shared;

/// The most blocks a node holds.
pub const MAX_BLOCKS: usize = 65_536;
/// The most identities whose denials wait to be counted in the store.
pub const MAX_PENDING: usize = 65_536;
/// Store calls one flush keeps in flight.
const FLUSH_CONCURRENCY: usize = 64;

/// What a node knows of its rules' penalty boxes.
#[derive(Debug, Default)]
pub struct Penalties {
    /// Bucket → when its block ends (node clock).
    blocks: Mutex<HashMap<BucketKey, Micros>>,
    /// `blocks.len()`, read without the lock: most decisions find no block at all.
    held: AtomicUsize,
    /// Denials not yet counted in the store, per bucket.
    pending: Mutex<HashMap<BucketKey, Pending>>,
    /// Whether a flush is out.
    flushing: AtomicBool,
    /// Buckets whose denials a flush has sent and the store has not answered for yet.
    noting: Mutex<HashSet<BucketKey>>,
    /// Told each time the store answers (or fails) a flush's call.
    noted: tokio::sync::Notify,
}

#[derive(Debug)]
struct Pending {
    rule: Arc<CompiledRule>,
    identity: Vec<u8>,
    denials: u64,
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
        if blocks.len() >= MAX_BLOCKS && !blocks.contains_key(&key) {
            // Full: the ended blocks go, then an eighth of the map, those nearest their end
            // (one pass makes room for many blocks, so a flood pays it rarely).
            blocks.retain(|_, end| *end > now);
            let over = blocks.len().saturating_sub(MAX_BLOCKS - MAX_BLOCKS / 8);
            if over > 0 {
                let mut ends: Vec<Micros> = blocks.values().copied().collect();
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
        {
            let mut pending = self.pending.lock();
            if pending.len() >= MAX_PENDING && !pending.contains_key(&key) {
                return;
            }
            pending
                .entry(key)
                .or_insert_with(|| Pending {
                    rule: rule.clone(),
                    identity: identity.to_vec(),
                    denials: 0,
                })
                .denials += 1;
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
            let batch = std::mem::take(&mut *pending);
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
    match shared
        .store
        .inner()
        .note_denials(&key, &penalty, pending.denials)
        .await
    {
        Ok(state) => {
            let rule = &pending.rule;
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
            tracing::debug!(error = %e, rule = %pending.rule.id, "denials not counted towards a penalty");
        }
    }
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
    // The peer's block as a penalty of one denial lasting its time left: one denial starts it,
    // and a block already held here is kept as it is.
    let Ok(one) = tollgate_lease::Penalty::new(1, penalty.within(), left) else {
        return false;
    };
    match shared.store.inner().note_denials(&key, &one, 1).await {
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
