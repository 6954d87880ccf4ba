//! Reserving a request's buckets: HOME_REGION hits forwarded to the peer region, the
//! rest decided here per bucket: the lease fast path (`Bucket::take_local`), a refill waited
//! for together, one actor call per identity, and a direct store check for keys without a
//! bucket.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::rpc::CallResult;
use tollgate_lease::Algorithm;

use super::{Node, Route};
use crate::runtime::attempt::{Attempt, Taken};
use crate::runtime::fail_modes::{self, Cause};
use crate::runtime::keys::bucket::{AcquireOutcome, KeyMsg, Want};
use crate::runtime::keys::bucket::{Bucket, LocalTake, RefillOutcome};
use crate::runtime::keys::lookup::Keys;
use crate::runtime::matching::{Hit, group_by_identity};
use crate::runtime::outcome::Outcome;
use crate::runtime::verdict::Denial;

impl Node {
    /// Where the decision path finds (or makes) the buckets of its hits.
    pub(super) fn keys(&self) -> Keys<'_> {
        Keys {
            shared: &self.inner.shared,
            supervisor: &self.inner.supervisor,
            fallbacks: &self.inner.fallbacks,
        }
    }

    /// Reserves every hit in `indices`, or returns false having filled the status of the hit
    /// that denied (what was reserved stays in `attempt` for the caller to roll back). Hits of
    /// HOME_REGION rules homed in the peer region are decided there, after the local ones
    /// (what the home region admits cannot be given back); when it cannot answer, here.
    pub(super) async fn reserve(
        &self,
        hits: &[Hit],
        indices: &[usize],
        attempt: &mut Attempt,
        now: u64,
        route: Route<'_>,
    ) -> bool {
        let Some(region) = self.inner.shared.region.get() else {
            return self.reserve_local(hits, indices, attempt, now, route).await;
        };
        let (forwarded, local): (Vec<usize>, Vec<usize>) = indices
            .iter()
            .partition(|&&i| hits[i].rule.forwarded() && hits[i].cost > 0);
        if !self.reserve_local(hits, &local, attempt, now, route).await {
            return false;
        }
        let mut unanswered = vec![];
        for i in forwarded {
            let hit = &hits[i];
            match region.forward(&hit.rule.key, &hit.identity, hit.cost).await {
                Some(reply) => {
                    // The home region decided on the whole limit: the answer is measured
                    // against it, not against this region's fallback share.
                    let mut status = if reply.allowed {
                        hit.admitted(Outcome::Allowed, reply.remaining, Duration::ZERO)
                    } else {
                        hit.denied(
                            Outcome::Denied,
                            Denial::OverLimit,
                            Duration::from_micros(reply.retry_after_us),
                            Duration::ZERO,
                        )
                    };
                    status.limit = hit.rule.whole;
                    status.reset_after = Duration::from_micros(reply.reset_after_us);
                    attempt.record(i, status);
                    if !reply.allowed {
                        return false;
                    }
                }
                None => unanswered.push(i),
            }
        }
        unanswered.is_empty()
            || self
                .reserve_local(hits, &unanswered, attempt, now, route)
                .await
    }

    /// [`Node::reserve`] for hits decided on this region's store.
    pub(super) async fn reserve_local(
        &self,
        hits: &[Hit],
        indices: &[usize],
        attempt: &mut Attempt,
        now: u64,
        route: Route<'_>,
    ) -> bool {
        let shared = &self.inner.shared;
        let mut slow: Vec<(usize, Arc<Bucket>)> = vec![];
        let mut direct: Vec<usize> = vec![];
        for &i in indices {
            let hit = &hits[i];
            let Some(limit) = hit.rule.limit() else {
                continue;
            };
            if hit.cost > limit.capacity() {
                // Can never fit: refused as such, without asking anyone.
                attempt.record(
                    i,
                    hit.denied(
                        Outcome::Denied,
                        Denial::CostExceedsLimit,
                        Duration::ZERO,
                        Duration::ZERO,
                    ),
                );
                return false;
            }
            // Peeks and concurrency slots are store checks; so is everything while stopping, and
            // everything routed to the store.
            if route.to_store()
                || hit.cost == 0
                || limit.algorithm() == Algorithm::Concurrency
                || self.inner.stopping.load(Ordering::Acquire)
            {
                direct.push(i);
                continue;
            }
            let Some(bucket) = self
                .keys()
                .bucket(&hit.rule, &hit.identity, limit, now)
                .await
            else {
                direct.push(i);
                continue;
            };
            let refill = |granted, left| shared.config.lease.should_refill(granted, left);
            let took = match bucket.take_local(hit.cost, now, refill) {
                took @ (LocalTake::Took | LocalTake::Dry) => took,
                LocalTake::Prelimited(wait) => {
                    shared.metrics.prelimit_denied.inc();
                    let wait = wait.max(self.store_wait(&bucket, hit.cost, now, wait).await);
                    attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                    return false;
                }
                // The store said it has no room for what the lease lacks: answered here.
                LocalTake::Denied(wait) => {
                    attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                    return false;
                }
            };
            // Both keep the pre-limit's tokens (given back if the request ends up denied).
            if bucket.prelimit.is_some() {
                attempt.took(Taken::Prelimit(bucket.clone(), hit.cost));
            }
            if took == LocalTake::Took {
                shared.metrics.lease_hits.inc();
                attempt.took(Taken::Lease(bucket.clone(), hit.cost));
                attempt.record(i, hit.leased(&bucket, now));
                continue;
            }
            // The lease ran dry: wait for the refill that is on its way (or queue one).
            shared.metrics.lease_waits.inc();
            let clock = &shared.clock;
            match bucket
                .take_after_refill(hit.cost, self.inner.actor_wait, || clock.now_micros())
                .await
            {
                RefillOutcome::Took => {
                    shared.metrics.lease_hits.inc();
                    attempt.took(Taken::Lease(bucket.clone(), hit.cost));
                    attempt.record(i, hit.leased(&bucket, now));
                }
                RefillOutcome::Denied(wait) => {
                    attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                    return false;
                }
                RefillOutcome::Failed { late } => {
                    // Not late but failed: the refill call failed (the store down).
                    let cause = late.map_or(Cause::Down, Cause::from);
                    if !attempt.record_taken(
                        i,
                        fail_modes::decide(
                            &self.inner.shared,
                            &self.inner.fallbacks,
                            hit,
                            Some(&bucket),
                            cause,
                            self.inner.shared.clock.now_micros(),
                        ),
                    ) {
                        return false;
                    }
                }
                RefillOutcome::Missed => slow.push((i, bucket)),
            }
        }
        // Per identity, one actor call for every bucket that needs the store.
        while !slow.is_empty() {
            let actor = slow[0].1.actor.clone();
            let (group, rest): (Vec<_>, Vec<_>) = slow
                .into_iter()
                .partition(|(_, b)| b.actor.get_id() == actor.get_id());
            slow = rest;
            shared.metrics.lease_misses.inc_by(group.len() as u64);
            let wants: Vec<Want> = group
                .iter()
                .map(|(i, b)| Want {
                    bucket: b.clone(),
                    cost: hits[*i].cost,
                })
                .collect();
            let outcome = match actor
                .call(
                    |reply| KeyMsg::Acquire { wants, reply },
                    Some(self.inner.actor_wait),
                )
                .await
            {
                Ok(CallResult::Success(outcome)) => outcome,
                // The actor did not answer in time: late, not known down.
                Ok(CallResult::Timeout) => AcquireOutcome::Failed(Cause::Stalled),
                Ok(CallResult::SenderError) | Err(_) => {
                    // The actor stopped (idle) after the bucket was looked up: forget it and
                    // decide these directly.
                    for (i, _) in &group {
                        shared
                            .registry
                            .remove_bucket(&hits[*i].bucket_id().local_key());
                        direct.push(*i);
                    }
                    continue;
                }
            };
            match outcome {
                AcquireOutcome::Reserved => {
                    let now = self.inner.shared.clock.now_micros();
                    for (i, b) in &group {
                        attempt.took(Taken::Lease(b.clone(), hits[*i].cost));
                        attempt.record(*i, hits[*i].leased(b, now));
                    }
                }
                AcquireOutcome::Denied { index, retry_after } => {
                    let (i, b) = &group[index];
                    attempt.record(
                        *i,
                        hits[*i].over_limit(
                            retry_after,
                            b.reset_after(self.inner.shared.clock.now_micros()),
                        ),
                    );
                    return false;
                }
                AcquireOutcome::Failed(cause) => {
                    for (i, b) in &group {
                        if !attempt.record_taken(
                            *i,
                            fail_modes::decide(
                                &self.inner.shared,
                                &self.inner.fallbacks,
                                &hits[*i],
                                Some(b),
                                cause,
                                self.inner.shared.clock.now_micros(),
                            ),
                        ) {
                            return false;
                        }
                    }
                }
            }
        }
        // Peeks, slots, and buckets without an actor (cap reached, or shutting down): a direct
        // check per identity, all or nothing within it.
        for group in group_by_identity(hits, &direct) {
            if !self.check_directly(hits, &group, attempt, route).await {
                return false;
            }
        }
        true
    }
}
