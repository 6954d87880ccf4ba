//! Store checks made directly, without a lease: keys without a bucket (first seen, past the
//! actor cap, shutting down), peeks and concurrency slots; and the store's word on when a
//! request the pre-limit denied would fit.

use std::time::Duration;

use std::sync::Arc;

use tollgate_lease::{Algorithm, CheckItem, CheckOutcome, CheckRequest, StoreError};

use super::{Decider, Route};
use crate::runtime::decision::attempt::{Attempt, Taken};
use crate::runtime::fail_modes::{self, Cause};
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::matching::Hit;
use crate::runtime::outcome::Outcome;
use crate::runtime::shared::Shared;
use crate::runtime::store_health::background::{self, hand_off};
use crate::runtime::store_health::debts::Debt;
use crate::runtime::store_health::guarded::Waited;
use crate::runtime::store_health::lateness::{Late, Wait};
use crate::runtime::verdict::{Denial, HeldSlot, RuleStatus};
use std::collections::HashMap;
use tollgate_lease::{BucketKey, SlotRelease};

impl Decider {
    /// Decides hits by one store check (their buckets share an identity; a request charges a
    /// bucket once, so each bucket is one item).
    pub(super) async fn check_directly(
        &self,
        hits: &[Hit],
        group: &[usize],
        attempt: &mut Attempt,
        route: Route<'_>,
    ) -> bool {
        let mut items: Vec<CheckItem> = vec![];
        let mut item_of = Vec::with_capacity(group.len());
        for &i in group {
            let hit = &hits[i];
            let (Some(limit), Ok(key)) = (hit.rule.limit(), hit.bucket_id().store_key()) else {
                item_of.push(None);
                continue;
            };
            item_of.push(Some(items.len()));
            items.push(CheckItem {
                key,
                limit,
                cost: hit.cost,
                allowance: self.shared.allowance_of(&hit.rule, &limit),
                penalized: hit.rule.enforces_penalty(),
            });
        }
        let request = match CheckRequest::new(items).and_then(|r| match route {
            Route::Reserve(reserve) => r.reserve(&reserve.nonce, reserve.ttl),
            _ => Ok(r),
        }) {
            Ok(r) => r,
            Err(e) => {
                // Only a cost above a bucket's capacity is refused here: it can never fit.
                tracing::debug!(error = %e, "a request cannot be admitted");
                let i = group[0];
                attempt.record(
                    i,
                    hits[i].denied(
                        Outcome::Denied,
                        Denial::CostExceedsLimit,
                        Duration::ZERO,
                        Duration::ZERO,
                    ),
                );
                return false;
            }
        };
        // A request under a CLOSED rule waits through a stall: one late call must not deny a
        // real user. So does a draw, which no request waits on (a reservation is a request).
        let wait = if route == Route::Store
            || group
                .iter()
                .any(|&i| fail_modes::waits_through(hits[i].rule.fail_mode, Late::Stalled))
        {
            Wait::UntilDown
        } else {
            Wait::UntilStall
        };
        let answer = match self.check_or_hand_off(&request, wait) {
            Ok(answer) => answer.await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(outcome) => {
                self.record_checked(hits, group, &item_of, &request, outcome, attempt, route)
            }
            Err(error) => group
                .iter()
                .all(|&i| self.decide_by_fail_mode(&hits[i], i, None, Cause::of(&error), attempt)),
        }
    }

    /// What the store answered for `group`'s check, recorded: each hit's status (a denial by
    /// a block learnt and counted, a refused draw's room), and when it admitted, the region's
    /// consumption and the concurrency slots taken. Whether it admitted.
    #[allow(clippy::too_many_arguments)]
    fn record_checked(
        &self,
        hits: &[Hit],
        group: &[usize],
        item_of: &[Option<usize>],
        request: &CheckRequest,
        outcome: CheckOutcome,
        attempt: &mut Attempt,
        route: Route<'_>,
    ) -> bool {
        let allowed = outcome.allowed();
        for (&i, &at) in group.iter().zip(item_of) {
            let Some(at) = at else { continue };
            let b = &outcome.buckets[at];
            attempt.record(
                i,
                if b.allowed {
                    hits[i].admitted(Outcome::Allowed, b.remaining, b.reset_after)
                } else if !b.blocked_for.is_zero() {
                    let shared = &self.shared;
                    shared.penalties.learn(
                        request.items()[at].key.clone(),
                        b.blocked_for,
                        shared.clock.now_micros(),
                    );
                    crate::runtime::decision::penalties::count_penalized(shared, &hits[i].rule);
                    hits[i].denied(
                        Outcome::Denied,
                        Denial::Penalized,
                        b.retry_after,
                        b.retry_after,
                    )
                } else if route == Route::Store {
                    // A refused draw learns what the bucket holds, for a smaller one.
                    RuleStatus {
                        remaining: b.remaining,
                        ..hits[i].over_limit(b.retry_after, b.reset_after)
                    }
                } else {
                    hits[i].over_limit(b.retry_after, b.reset_after)
                },
            );
        }
        if allowed {
            // What the store admitted directly is this region's consumption.
            let now = self.shared.clock.now_micros();
            for hit in group.iter().map(|&i| &hits[i]) {
                if let Some(limit) = hit.rule.limit() {
                    self.shared
                        .record_for_peer(&hit.rule, &hit.identity, &limit, hit.cost, now);
                }
            }
            for (item, b) in request.items().iter().zip(outcome.buckets) {
                if let Some(slot) = b.slot {
                    self.shared.metrics.slots_taken.inc();
                    attempt.took(Taken::Slot(HeldSlot {
                        key: item.key.clone(),
                        slot,
                    }));
                }
            }
        }
        allowed
    }

    /// Checks `request` in the store, waiting as `wait` says. When the caller stops waiting
    /// (the store stalled, or is down), the call goes on in a task of its own: if its late
    /// answer says the store had no room, what the fail modes admitted meanwhile was never
    /// counted there, and is debited (when it has room, the check itself counted it).
    fn check_or_hand_off(
        &self,
        request: &CheckRequest,
        wait: Wait,
    ) -> Result<impl std::future::Future<Output = Result<CheckOutcome, StoreError>>, StoreError>
    {
        let shared = self.shared.clone();
        let (mut call, mut future) = shared.store.begin_check(request)?;
        let request = request.clone();
        Ok(async move {
            match shared
                .store
                .wait(&mut call, future.as_mut(), |late| wait.stops_at(late))
                .await
            {
                Waited::Answered(result) => {
                    shared.store.end(call, &result);
                    result
                }
                // Stopped at a stall (a CLOSED rule's request waits through those): the fail
                // modes decide now, and the late answer settles what they admitted.
                Waited::Stopped(error @ StoreError::Timeout { .. }) if wait == Wait::UntilStall => {
                    let decided_at = shared.clock.now_micros();
                    hand_off(shared.clone(), call, future, move |shared, late| {
                        settle_late_check(shared, &request, late, decided_at);
                    });
                    Err(error)
                }
                Waited::Stopped(error) => Err(error),
            }
        })
    }

    /// When the store can admit `cost` of `bucket`, as far as a retry after `at_least` is
    /// concerned: the retry of a request the pre-limit denied must find room in the store
    /// too. Known from a recent denial, else asked with a peek for what the units held at
    /// retry time leave; the answer is kept (a denial until it ends, room for the wait), so a
    /// flood past the pre-limit stays off the store. Zero when the store has room or cannot
    /// say.
    pub(super) async fn store_wait(
        &self,
        bucket: &Bucket,
        cost: u64,
        now: u64,
        at_least: Duration,
    ) -> Duration {
        let after = |wait: Duration| now + wait.max(at_least).as_micros() as u64;
        // What the store must provide at the retry: the cost less the units held then.
        let need = cost.saturating_sub(bucket.held_at(after(Duration::ZERO)));
        let wait = self
            .store_wait_for(bucket, need, after(Duration::ZERO), now)
            .await;
        if need < cost && bucket.held_at(after(wait)) < cost - need {
            // The held units die (with their window) before that retry: it needs all of it.
            return self.store_wait_for(bucket, cost, after(wait), now).await;
        }
        wait
    }

    /// When the store has room for `need` of `bucket`: from a recent denial, else a peek
    /// (whose answer is kept: a denial until it ends, room until `retry_at`).
    pub(super) async fn store_wait_for(
        &self,
        bucket: &Bucket,
        need: u64,
        retry_at: u64,
        now: u64,
    ) -> Duration {
        if let Some(wait) = bucket.store_denies(need, now) {
            return wait;
        }
        if need == 0 || bucket.room_seen(need, now) {
            return Duration::ZERO;
        }
        let allowance = self.shared.allowance_of(&bucket.rule, &bucket.limit);
        let item = CheckItem::new(bucket.key.clone(), bucket.limit, need).with_allowance(allowance);
        let Ok(peek) = CheckRequest::new(vec![item]) else {
            return Duration::ZERO;
        };
        match self
            .shared
            .store
            .check(&peek.peek(), Wait::UntilStall)
            .await
        {
            Ok(outcome) if outcome.allowed() => {
                bucket.saw_room(need, retry_at);
                Duration::ZERO
            }
            Ok(outcome) => {
                let retry = outcome.buckets[0].retry_after;
                bucket.deny_until(need, retry, self.shared.config.lease.ttl, now);
                retry
            }
            Err(_) => Duration::ZERO,
        }
    }
}

/// A direct check answered after its request was decided without it, at a stall. Admitted
/// by the store, its units are counted there; refused, nothing was counted, and what the fail
/// modes admitted for it is owed. The request's outcome is not known here, so this errs
/// towards the limit: the costs are debited whenever the late answer refused (a request the
/// fail modes denied anyway, by a LOCAL rule's bucket, is rare).
fn settle_late_check(
    shared: &Arc<Shared>,
    request: &CheckRequest,
    late: Result<CheckOutcome, StoreError>,
    decided_at: u64,
) {
    let Ok(outcome) = late else {
        // Not answered: the store was down, not late.
        return;
    };
    if outcome.allowed() || request.is_peek() {
        return;
    }
    let owed: Vec<Debt> = request
        .items()
        .iter()
        .filter(|item| item.limit.algorithm() != Algorithm::Concurrency)
        .map(|item| Debt {
            key: item.key.clone(),
            limit: item.limit,
            units: item.cost,
            admitted_at: decided_at,
        })
        .collect();
    background::settle(shared.clone(), owed);
}

/// Releases concurrency slots (idempotent). Returns how many were still held.
pub(crate) async fn release_slots(
    shared: &Shared,
    slots: &[HeldSlot],
) -> Result<usize, StoreError> {
    let mut by_identity: HashMap<&str, Vec<(BucketKey, tollgate_lease::SlotId)>> = HashMap::new();
    for s in slots {
        by_identity
            .entry(s.key.identity_prefix())
            .or_default()
            .push((s.key.clone(), s.slot.clone()));
    }
    let mut released = 0;
    let metrics = &shared.metrics;
    for (_, items) in by_identity {
        let req = SlotRelease::of_keys(items)?;
        for held in shared.store.release_slots(&req).await? {
            if held {
                released += 1;
                metrics.slots_released.inc();
            } else {
                metrics.slots_release_missed.inc();
            }
        }
    }
    Ok(released)
}
