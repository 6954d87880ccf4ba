//! A hit decided by the node's lease, in the order it is tried: the local pre-limit, the lease
//! taken with one atomic (`Bucket::take_local`), a refill on its way waited for, and, when the
//! lease cannot serve, one call per identity to the key's actor, which leases more. A hit with
//! no bucket to lease from (a peek, a slot, a key past the actor cap, a node stopping) goes to
//! the store itself (`store.rs`).

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use tollgate_lease::Algorithm;

use super::without_store;
use super::{Decider, Route};
use crate::runtime::decision::attempt::{Attempt, Taken};
use crate::runtime::fail_modes::Cause;
use crate::runtime::keys::bucket::{AcquireOutcome, KeyMsg, Want};
use crate::runtime::keys::bucket::{Bucket, LocalTake, RefillOutcome};
use crate::runtime::matching::{Hit, group_by_identity};
use crate::runtime::outcome::Outcome;
use crate::runtime::verdict::Denial;

/// Where one hit's decision stands after the node's lease was tried.
enum Leased {
    /// Decided and recorded: admitted (by the lease, or a fail mode), or nothing to decide.
    Decided,
    /// Decided and recorded: denied. The request is denied.
    Refused,
    /// The lease could not serve it: its actor leases more.
    ToActor(Arc<Bucket>),
    /// No lease decides it: the store itself does.
    ToStore,
}

impl Decider {
    /// Reserves every hit in `indices` on this region's store, or returns false having
    /// recorded the status of the hit that denied: first each hit's lease, then one actor call
    /// per identity for those the lease could not serve, then a store check per identity for
    /// those no lease decides.
    pub(super) async fn reserve_local(
        &self,
        hits: &[Hit],
        indices: &[usize],
        attempt: &mut Attempt,
        now: u64,
        route: Route<'_>,
    ) -> bool {
        let mut to_actor: Vec<(usize, Arc<Bucket>)> = vec![];
        let mut to_store: Vec<usize> = vec![];
        for &i in indices {
            match self.take_from_lease(hits, i, attempt, now, route).await {
                Leased::Decided => {}
                Leased::Refused => return false,
                Leased::ToActor(bucket) => to_actor.push((i, bucket)),
                Leased::ToStore => to_store.push(i),
            }
        }
        if !self
            .acquire_from_actors(hits, to_actor, attempt, &mut to_store)
            .await
        {
            return false;
        }
        // Peeks, slots, and buckets without an actor (cap reached, or shutting down): a direct
        // check per identity, all or nothing within it.
        for group in group_by_identity(hits, &to_store) {
            if !self.check_directly(hits, &group, attempt, route).await {
                return false;
            }
        }
        true
    }

    /// Hit `i` tried on the node's lease: taken at once, denied by the pre-limit or by a
    /// recent denial from the store, or taken after the refill on its way.
    async fn take_from_lease(
        &self,
        hits: &[Hit],
        i: usize,
        attempt: &mut Attempt,
        now: u64,
        route: Route<'_>,
    ) -> Leased {
        let shared = &self.shared;
        let hit = &hits[i];
        let Some(limit) = hit.rule.limit() else {
            return Leased::Decided;
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
            return Leased::Refused;
        }
        // Peeks and concurrency slots are store checks; so is everything while stopping, and
        // everything routed to the store.
        if route.to_store()
            || hit.cost == 0
            || limit.algorithm() == Algorithm::Concurrency
            || self.stopping()
        {
            return Leased::ToStore;
        }
        let Some(bucket) = self
            .keys()
            .bucket(&hit.rule, &hit.identity, limit, now)
            .await
        else {
            return Leased::ToStore;
        };
        let refill = |granted, left| shared.config.lease.should_refill(granted, left);
        let took = match bucket.take_local(hit.cost, now, refill) {
            took @ (LocalTake::Took | LocalTake::Dry) => took,
            LocalTake::Prelimited(wait) => {
                shared.metrics.prelimit_denied.inc();
                let wait = wait.max(self.store_wait(&bucket, hit.cost, now, wait).await);
                attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                return Leased::Refused;
            }
            // The store said it has no room for what the lease lacks: answered here.
            LocalTake::Denied(wait) => {
                attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                return Leased::Refused;
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
            return Leased::Decided;
        }
        // The lease ran dry: wait for the refill that is on its way (or queue one).
        shared.metrics.lease_waits.inc();
        let clock = &shared.clock;
        match bucket
            .take_after_refill(hit.cost, self.actor_wait, || clock.now_micros())
            .await
        {
            RefillOutcome::Took => {
                shared.metrics.lease_hits.inc();
                attempt.took(Taken::Lease(bucket.clone(), hit.cost));
                attempt.record(i, hit.leased(&bucket, now));
                Leased::Decided
            }
            RefillOutcome::Denied(wait) => {
                attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                Leased::Refused
            }
            RefillOutcome::Failed { late } => {
                // Not late but failed: the refill call failed (the store down).
                let cause = late.map_or(Cause::Down, Cause::from);
                if self.decide_by_fail_mode(hit, i, Some(&bucket), cause, attempt) {
                    Leased::Decided
                } else {
                    Leased::Refused
                }
            }
            RefillOutcome::Missed => Leased::ToActor(bucket),
        }
    }

    /// The hits the lease could not serve, one actor call per identity (the actor leases for
    /// all of its buckets at once). A hit whose actor stopped meanwhile joins `to_store`.
    /// False when one was denied (its status recorded).
    async fn acquire_from_actors(
        &self,
        hits: &[Hit],
        mut to_actor: Vec<(usize, Arc<Bucket>)>,
        attempt: &mut Attempt,
        to_store: &mut Vec<usize>,
    ) -> bool {
        let shared = &self.shared;
        while !to_actor.is_empty() {
            let actor = to_actor[0].1.actor.clone();
            let (group, rest): (Vec<_>, Vec<_>) = to_actor
                .into_iter()
                .partition(|(_, b)| b.actor.get_id() == actor.get_id());
            to_actor = rest;
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
                    Some(self.actor_wait),
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
                        to_store.push(*i);
                    }
                    continue;
                }
            };
            let now = shared.clock.now_micros();
            match outcome {
                AcquireOutcome::Reserved => {
                    for (i, b) in &group {
                        attempt.took(Taken::Lease(b.clone(), hits[*i].cost));
                        attempt.record(*i, hits[*i].leased(b, now));
                    }
                }
                AcquireOutcome::Denied { index, retry_after } => {
                    let (i, b) = &group[index];
                    attempt.record(*i, hits[*i].over_limit(retry_after, b.reset_after(now)));
                    return false;
                }
                AcquireOutcome::Failed(cause) => {
                    for (i, b) in &group {
                        if !self.decide_by_fail_mode(&hits[*i], *i, Some(b), cause, attempt) {
                            return false;
                        }
                    }
                }
            }
        }
        true
    }

    /// Hit `i` decided by its rule's fail mode, the store not having answered for `cause`;
    /// false when it denies.
    pub(super) fn decide_by_fail_mode(
        &self,
        hit: &Hit,
        i: usize,
        bucket: Option<&Arc<Bucket>>,
        cause: Cause,
        attempt: &mut Attempt,
    ) -> bool {
        attempt.record_taken(
            i,
            without_store::decide(
                &self.shared,
                &self.fallbacks,
                hit,
                bucket,
                cause,
                self.shared.clock.now_micros(),
            ),
        )
    }
}
