//! What a rule does when the store cannot answer: OPEN (or, when the store is only slow, this
//! node's share of its last answer), CLOSED, LOCAL (a per-node share, per key, bounded and
//! swept: `runtime/fallbacks.rs`). One function: it takes the hit, what the node holds of it
//! and the store's error, and returns the rule's status and what it took.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{Micros, StoreError};

use crate::rules::FailMode;
use crate::runtime::attempt::Taken;
use crate::runtime::breaker::BreakerState;
use crate::runtime::fallbacks::Fallbacks;
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::local::LocalBucket;
use crate::runtime::matching::Hit;
use crate::runtime::outcome::Outcome;
use crate::runtime::shared::Shared;
use crate::runtime::verdict::{Denial, RuleStatus};

/// Decides `hit`, whose store call failed with `error`, at `now`; `bucket` is the bucket this
/// node holds for it, if any. Returns its status and what was taken for it, in order (given
/// back if the request is denied elsewhere).
///
/// Under an OPEN rule, a store that has stalled (a timeout: it answered nothing for a budget,
/// or not within the patience) is not down: this node's share of its last answer decides (see
/// [`LastAnswer::decide_while_slow`]), rather than admitting everything. Otherwise the rule's
/// fail mode decides: OPEN admits, CLOSED denies, LOCAL takes its local share. What is
/// admitted while the store had stalled is owed to it (debited when it answers); what is
/// admitted while it is down (unreachable, its breaker open) is not.
///
/// [`LastAnswer::decide_while_slow`]: crate::runtime::keys::last_answer::LastAnswer::decide_while_slow
pub(crate) fn decide(
    shared: &Shared,
    fallbacks: &Fallbacks,
    hit: &Hit,
    bucket: Option<&Arc<Bucket>>,
    error: &StoreError,
    now: Micros,
) -> (RuleStatus, Vec<Taken>) {
    let late = matches!(error, StoreError::Timeout { .. });
    if hit.rule.fail_mode == FailMode::Open
        && late
        && let Some(bucket) = bucket
    {
        shared.metrics.slow_store_decisions.inc();
        tracing::debug!(rule = %hit.rule.id, %error, "the store is late: this node's share of its last answer decides");
        let (status, took) = match bucket.last.decide_while_slow(hit.cost, now) {
            Ok(()) => (
                hit.admitted(
                    Outcome::Allowed,
                    bucket.remaining(now),
                    bucket.reset_after(now),
                ),
                vec![Taken::Owed(bucket.clone(), hit.cost)],
            ),
            Err(wait) => (hit.over_limit(wait, bucket.reset_after(now)), vec![]),
        };
        let status = RuleStatus {
            on_last_answer: true,
            ..status
        };
        return (status, took);
    }
    let mut took = vec![];
    let status = match hit.rule.fail_mode {
        FailMode::Open => hit.admitted(Outcome::FailedOpen, 0, Duration::ZERO),
        FailMode::Closed => hit.denied(
            Outcome::FailedClosed,
            Denial::StoreUnavailable,
            store_retry(shared, hit, now),
            Duration::ZERO,
        ),
        FailMode::Local => match bucket
            .map(|b| b.fallback.clone())
            .or_else(|| fallback_for(shared, fallbacks, hit, now))
        {
            Some(local) => match local.take(hit.cost, now) {
                Ok(()) => {
                    took.push(Taken::Fallback(local, hit.cost));
                    hit.admitted(Outcome::LocalFallback, 0, Duration::ZERO)
                }
                Err(wait) => hit.denied(
                    Outcome::LocalFallback,
                    Denial::OverLimit,
                    wait,
                    Duration::ZERO,
                ),
            },
            // A rule without a limit has nothing to fall back to.
            None => hit.admitted(Outcome::FailedOpen, 0, Duration::ZERO),
        },
    };
    tracing::debug!(rule = %hit.rule.id, %error, outcome = ?status.outcome, "store failed; the rule's fail mode decided");
    if status.allowed
        && late
        && let Some(bucket) = bucket
    {
        // The store was late, not down: it is owed this (given back if the request is
        // denied), and debited when it answers.
        bucket.last.admitted_without_store(hit.cost, now);
        took.push(Taken::Owed(bucket.clone(), hit.cost));
    }
    (status, took)
}

/// How long a request that failed closed should wait: until the breaker of its shard lets the
/// node try the store again, and at least a second (headers carry whole seconds).
fn store_retry(shared: &Shared, hit: &Hit, now: Micros) -> Duration {
    let state = hit
        .bucket_id()
        .store_key()
        .map(|key| shared.store.breaker_state_of(&key))
        .unwrap_or(BreakerState::Closed);
    let probe = match state {
        BreakerState::Open { until } => Duration::from_micros(until.saturating_sub(now)),
        _ => Duration::ZERO,
    };
    probe.max(Duration::from_secs(1))
}

/// The LOCAL fallback bucket of a key that has no bucket on this node.
fn fallback_for(
    shared: &Shared,
    fallbacks: &Fallbacks,
    hit: &Hit,
    now: Micros,
) -> Option<Arc<LocalBucket>> {
    let limit = hit.rule.limit()?;
    let nodes = f64::from(shared.config.cluster_nodes.max(1));
    Some(fallbacks.bucket(
        hit.bucket_id().local_key(),
        hit.rule.uid,
        now,
        shared.config.idle_timeout.as_micros() as u64,
        || Arc::new(LocalBucket::for_limit(&limit, 1.0 / nodes)),
    ))
}
