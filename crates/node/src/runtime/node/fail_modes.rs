//! What a rule does when the store cannot answer: OPEN (or, when the store is only slow, its
//! last answer), CLOSED, LOCAL (a per-node share, per key, bounded and swept).

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::StoreError;

use super::Node;
use crate::rules::FailMode;
use crate::runtime::Outcome;
use crate::runtime::attempt::{Attempt, Taken};
use crate::runtime::breaker::BreakerState;
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::local::LocalBucket;
use crate::runtime::matching::Hit;
use crate::runtime::verdict::{Denial, RuleStatus};

impl Node {
    /// How long a request that failed closed should wait: until the breaker of its shard lets
    /// the node try the store again, and at least a second (headers carry whole seconds).
    pub(super) fn store_retry(&self, hit: &Hit, now: u64) -> Duration {
        let state = hit
            .bucket_id()
            .store_key()
            .map(|key| self.inner.shared.store.breaker_state_of(&key))
            .unwrap_or(BreakerState::Closed);
        let probe = match state {
            BreakerState::Open { until } => Duration::from_micros(until.saturating_sub(now)),
            _ => Duration::ZERO,
        };
        probe.max(Duration::from_secs(1))
    }

    /// Decides a hit the store could not answer; false if it denies. Under an OPEN rule, a
    /// store that has stalled (a timeout: it answered nothing for a budget, or not within the
    /// patience) is not down: this node's share of its last answer decides (see
    /// [`LastAnswer::decide_while_slow`](crate::runtime::keys::last_answer::LastAnswer::decide_while_slow)), rather than admitting everything. Otherwise the rule's
    /// fail mode decides: OPEN admits, CLOSED denies, LOCAL takes its local share. What is
    /// admitted while the store had stalled is owed to it (debited when it answers); what is
    /// admitted while it is down (unreachable, its breaker open) is not.
    pub(super) fn fail_mode(
        &self,
        index: usize,
        hit: &Hit,
        bucket: Option<&Arc<Bucket>>,
        error: &StoreError,
        attempt: &mut Attempt,
    ) -> bool {
        let now = self.now();
        if hit.rule.fail_mode == FailMode::Open
            && matches!(error, StoreError::Timeout { .. })
            && let Some(bucket) = bucket
        {
            self.inner.shared.metrics.slow_store_decisions.inc();
            tracing::debug!(rule = %hit.rule.id, %error, "the store is late: this node's share of its last answer decides");
            let status = match bucket.last.decide_while_slow(hit.cost, now) {
                Ok(()) => {
                    attempt.took(Taken::Owed(bucket.clone(), hit.cost));
                    hit.admitted(
                        Outcome::Allowed,
                        bucket.remaining(now),
                        bucket.reset_after(now),
                    )
                }
                Err(wait) => hit.over_limit(wait, bucket.reset_after(now)),
            };
            let status = RuleStatus {
                on_last_answer: true,
                ..status
            };
            let allowed = status.allowed;
            attempt.record(index, status);
            return allowed;
        }
        let status = match hit.rule.fail_mode {
            FailMode::Open => hit.admitted(Outcome::FailedOpen, 0, Duration::ZERO),
            FailMode::Closed => hit.denied(
                Outcome::FailedClosed,
                Denial::StoreUnavailable,
                self.store_retry(hit, now),
                Duration::ZERO,
            ),
            FailMode::Local => match bucket
                .map(|b| b.fallback.clone())
                .or_else(|| self.fallback_for(hit))
            {
                Some(local) => match local.take(hit.cost, now) {
                    Ok(()) => {
                        attempt.took(Taken::Fallback(local, hit.cost));
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
        let allowed = status.allowed;
        if allowed
            && matches!(error, StoreError::Timeout { .. })
            && let Some(bucket) = bucket
        {
            // The store was late, not down: it is owed this (given back if the request is
            // denied), and debited when it answers.
            bucket.last.admitted_without_store(hit.cost, now);
            attempt.took(Taken::Owed(bucket.clone(), hit.cost));
        }
        attempt.record(index, status);
        allowed
    }

    /// The LOCAL fallback bucket of a key that has no bucket on this node (see
    /// [`crate::runtime::fallbacks`]).
    pub(super) fn fallback_for(&self, hit: &Hit) -> Option<Arc<LocalBucket>> {
        let limit = hit.rule.limit()?;
        let inner = &self.inner;
        let nodes = f64::from(inner.shared.config.cluster_nodes.max(1));
        Some(inner.fallbacks.bucket(
            hit.bucket_id().local_key(),
            hit.rule.uid,
            self.now(),
            inner.shared.config.idle_timeout.as_micros() as u64,
            || Arc::new(LocalBucket::for_limit(&limit, 1.0 / nodes)),
        ))
    }

    /// LOCAL fallback buckets held for keys without an actor, and overflow buckets (per rule).
    pub fn fallback_buckets(&self) -> (usize, usize) {
        self.inner.fallbacks.counts()
    }
}
