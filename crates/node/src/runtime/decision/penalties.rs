//! What deciding tells the penalty box (`runtime/penalties.rs`): a denial under a rule with a
//! penalty counted and flushed to the store (one flush at a time, the blocks the store answers
//! with learnt), a denial by a known block counted, and a block the peer region started
//! imposed here.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use tollgate_lease::BucketKey;

use crate::metrics::{PenaltyLabels, RuleLabels, UncountedDenialsLabels};
use crate::rules::{CompiledRule, Mode};
use crate::runtime::penalties::{MAX_PENDING_BYTES, Penalties, Pending, footprint};
use crate::runtime::shared::Shared;

/// Store calls one flush keeps in flight.
const FLUSH_CONCURRENCY: usize = 64;

impl Penalties {
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
