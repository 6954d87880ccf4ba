//! Store checks made directly, without a lease: keys without a bucket (first seen, past the
//! actor cap, shutting down), peeks and concurrency slots; and the store's word on when a
//! request the pre-limit denied would fit.

use super::region::allowance_of;
use std::time::Duration;

use tollgate_lease::{BucketKey, CheckItem, CheckRequest};

use super::Node;
use crate::runtime::Outcome;
use crate::runtime::attempt::{Attempt, Taken};
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::matching::Hit;
use crate::runtime::verdict::{Denial, HeldSlot};

impl Node {
    /// Decides hits by one store check (their buckets share an identity; a request charges a
    /// bucket once, so each bucket is one item).
    pub(super) async fn check_directly(
        &self,
        hits: &[Hit],
        group: &[usize],
        attempt: &mut Attempt,
    ) -> bool {
        let mut items: Vec<CheckItem> = vec![];
        let mut item_of = Vec::with_capacity(group.len());
        for &i in group {
            let hit = &hits[i];
            let (Some(limit), Ok(key)) = (
                hit.rule.limit(),
                BucketKey::new(&hit.identity, &hit.rule.key),
            ) else {
                item_of.push(None);
                continue;
            };
            item_of.push(Some(items.len()));
            items.push(CheckItem {
                key,
                limit,
                cost: hit.cost,
            });
        }
        let allowances = group
            .iter()
            .zip(&item_of)
            .filter(|(_, item)| item.is_some())
            .map(|(&i, _)| {
                let hit = &hits[i];
                hit.rule
                    .limit()
                    .and_then(|l| allowance_of(&self.inner.shared, &hit.rule, &l))
            })
            .collect();
        let request = match CheckRequest::new(items).and_then(|r| r.with_allowances(allowances)) {
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
        match self.inner.shared.store.check(&request).await {
            Ok(outcome) => {
                let allowed = outcome.allowed();
                for (&i, at) in group.iter().zip(item_of) {
                    let Some(at) = at else { continue };
                    let b = &outcome.buckets[at];
                    attempt.record(
                        i,
                        if b.allowed {
                            hits[i].admitted(Outcome::Allowed, b.remaining, b.reset_after)
                        } else {
                            hits[i].over_limit(b.retry_after, b.reset_after)
                        },
                    );
                }
                if allowed {
                    // What the store admitted directly is this region's consumption.
                    let now = self.now();
                    for &i in group {
                        if hits[i].rule.synced() {
                            self.record_consumption(
                                &hits[i].rule,
                                &hits[i].identity,
                                hits[i].cost,
                                now,
                            );
                        }
                    }
                    for (item, b) in request.items().iter().zip(outcome.buckets) {
                        if let Some(slot) = b.slot {
                            self.inner.shared.metrics.slots_taken.inc();
                            attempt.took(Taken::Slot(HeldSlot {
                                key: item.key.clone(),
                                slot,
                            }));
                        }
                    }
                }
                allowed
            }
            Err(error) => group
                .iter()
                .all(|&i| self.fail_mode(i, &hits[i], None, &error, attempt)),
        }
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
        let allowance = allowance_of(&self.inner.shared, &bucket.rule, &bucket.limit);
        let Ok(peek) = CheckRequest::single(bucket.key.clone(), bucket.limit, need)
            .and_then(|r| r.with_allowances(vec![allowance]))
        else {
            return Duration::ZERO;
        };
        match self.inner.shared.store.check(&peek.peek()).await {
            Ok(outcome) if outcome.allowed() => {
                bucket.saw_room(need, retry_at);
                Duration::ZERO
            }
            Ok(outcome) => {
                let retry = outcome.buckets[0].retry_after;
                bucket.deny_until(need, retry, self.inner.shared.config.lease.ttl, now);
                retry
            }
            Err(_) => Duration::ZERO,
        }
    }
}
