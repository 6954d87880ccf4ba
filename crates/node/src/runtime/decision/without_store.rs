//! A hit decided without the store: the fail policy (`../fail_modes.rs`, pure) carried out.
//! An OPEN rule's share of the store's last answer taken, a LOCAL rule's tokens from the key's
//! own fallback bucket (or one of `runtime/fallbacks.rs`), a CLOSED rule's retry; what is
//! owed to a store that was only late recorded.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::Micros;

use crate::runtime::decision::attempt::Taken;
use crate::runtime::fail_modes::{self, Cause, Fallback};
use crate::runtime::fallbacks::Fallbacks;
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::local::LocalBucket;
use crate::runtime::matching::Hit;
use crate::runtime::outcome::Outcome;
use crate::runtime::shared::Shared;
use crate::runtime::store_health::breaker::BreakerState;
use crate::runtime::verdict::{Denial, RuleStatus};

/// Decides `hit`, whose store call did not answer for `cause`, at `now`, as the fail policy
/// ([`fail_modes::fallback`]) says; `bucket` is the bucket this node holds for it, if any.
/// Returns its status and what was taken for it, in order (given back if the request is
/// denied elsewhere). What is admitted while the store had stalled is owed to it (debited when
/// it answers); what is admitted while it is down (unreachable, its breaker open) is not.
pub(crate) fn decide(
    shared: &Shared,
    fallbacks: &Fallbacks,
    hit: &Hit,
    bucket: Option<&Arc<Bucket>>,
    cause: Cause,
    now: Micros,
) -> (RuleStatus, Vec<Taken>) {
    let does = fail_modes::fallback(hit.rule.fail_mode, cause, bucket.is_some());
    if does == Fallback::LastAnswer
        && let Some(bucket) = bucket
    {
        return by_last_answer(shared, hit, bucket, now);
    }
    let mut took = vec![];
    let status = match does {
        Fallback::LastAnswer | Fallback::Admit => {
            hit.admitted(Outcome::FailedOpen, 0, Duration::ZERO)
        }
        Fallback::Deny => hit.denied(
            Outcome::FailedClosed,
            Denial::StoreUnavailable,
            store_retry(shared, hit, now),
            Duration::ZERO,
        ),
        Fallback::Local => match bucket
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
    tracing::debug!(rule = %hit.rule.id, ?cause, outcome = ?status.outcome, "store failed; the rule's fail mode decided");
    if status.allowed
        && fail_modes::owed(cause, bucket.is_some())
        && let Some(bucket) = bucket
    {
        // The store was late, not down: it is owed this (given back if the request is
        // denied), and debited when it answers.
        bucket.last.admitted_without_store(hit.cost, now);
        took.push(Taken::Owed(bucket.clone(), hit.cost));
    }
    (status, took)
}

/// An OPEN rule's hit while the store is only late: this node's share of the store's last
/// answer decides (see [`LastAnswer::decide_while_slow`]), and what it admits is owed.
///
/// [`LastAnswer::decide_while_slow`]: crate::runtime::keys::last_answer::LastAnswer::decide_while_slow
fn by_last_answer(
    shared: &Shared,
    hit: &Hit,
    bucket: &Arc<Bucket>,
    now: Micros,
) -> (RuleStatus, Vec<Taken>) {
    shared.metrics.slow_store_decisions.inc();
    tracing::debug!(rule = %hit.rule.id, "the store is late: this node's share of its last answer decides");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::FailMode;
    use crate::{NodeBuilder, Request};

    const MODES: [FailMode; 3] = [FailMode::Open, FailMode::Closed, FailMode::Local];

    /// Every fail mode × cause, on a key this node has decided before (its bucket holds the
    /// store's last answer) and on one it has not: what the rule says, and what is owed.
    #[tokio::test]
    async fn every_mode_and_cause_decides_as_the_table_says() {
        let mut rules = String::from("domain: d\nrules:\n");
        for mode in MODES {
            let name = format!("{mode:?}").to_lowercase();
            rules.push_str(&format!(
                "  - {{id: {name}, match: {{mode: {name}, user: '*'}}, algorithm: TOKEN_BUCKET, \
                 capacity: 10, refillPerSecond: 1, failMode: {}}}\n",
                name.to_uppercase()
            ));
        }
        let node = NodeBuilder::new()
            .rules_text(rules)
            .start()
            .await
            .expect("node");
        let request = |mode: FailMode, user: &str| {
            Request::new("d").descriptor(vec![
                ("mode", format!("{mode:?}").to_lowercase()),
                ("user", user.to_owned()),
            ])
        };
        // (mode, cause, known key) → (allowed, outcome, units owed to the store)
        use Cause::{Down, Stalled};
        use FailMode::{Closed, Local, Open};
        let table = [
            (Open, Stalled, true, true, Outcome::Allowed, 1),
            (Open, Stalled, false, true, Outcome::FailedOpen, 0),
            (Open, Down, true, true, Outcome::FailedOpen, 0),
            (Open, Down, false, true, Outcome::FailedOpen, 0),
            (Closed, Stalled, true, false, Outcome::FailedClosed, 0),
            (Closed, Stalled, false, false, Outcome::FailedClosed, 0),
            (Closed, Down, true, false, Outcome::FailedClosed, 0),
            (Closed, Down, false, false, Outcome::FailedClosed, 0),
            (Local, Stalled, true, true, Outcome::LocalFallback, 1),
            (Local, Stalled, false, true, Outcome::LocalFallback, 0),
            (Local, Down, true, true, Outcome::LocalFallback, 0),
            (Local, Down, false, true, Outcome::LocalFallback, 0),
        ];
        for (i, (mode, cause, known, allowed, outcome, owed)) in table.into_iter().enumerate() {
            let user = format!("u{i}");
            if known {
                // A key earns a bucket (and an actor) when it is seen again.
                for _ in 0..2 {
                    assert!(
                        node.check(&request(mode, &user))
                            .await
                            .expect("valid")
                            .allowed
                    );
                }
            }
            let decided = node.decide_without_store(&request(mode, &user), cause);
            let [(status, took)] = &decided[..] else {
                panic!("one rule matched: {decided:?}");
            };
            let case = format!("{mode:?} × {cause:?}, key known: {known}");
            assert_eq!(status.allowed, allowed, "{case}");
            assert_eq!(status.outcome, Some(outcome), "{case}");
            let owed_units: u64 = took
                .iter()
                .filter_map(|t| match t {
                    crate::runtime::decision::attempt::Taken::Owed(_, units) => Some(*units),
                    _ => None,
                })
                .sum();
            assert_eq!(owed_units, owed, "{case}: owed");
        }
        node.shutdown().await;
    }
}
