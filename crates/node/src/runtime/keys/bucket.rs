//! One bucket (a rule applied to one identity) as this node holds it: the units leased and not
//! yet spent, in one atomic the decision path takes from without a lock, a mailbox hop or a
//! clock read (token buckets); plus the local pre-limit, the LOCAL fallback and what the store
//! last said.
//!
//! Only the key's actor adds units, replaces the spending deadline and reclaims units; the
//! decision path only takes and gives back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use ractor::ActorRef;
use tollgate_lease::{Algorithm, BucketKey, Limit, Micros};

use crate::rules::{CompiledRule, FailMode};
use crate::runtime::keys::messages::KeyMsg;
use crate::runtime::lateness::Late;
use crate::runtime::local::LocalBucket;

/// No deadline: token bucket units may be spent whenever (they were taken from the global
/// bucket when leased; spending them late never over-admits).
pub const NO_DEADLINE: u64 = u64::MAX;

/// A bucket held by this node.
#[derive(Debug)]
pub struct Bucket {
    /// The bucket's store key.
    pub key: BucketKey,
    /// The rule it was made for.
    pub rule: Arc<CompiledRule>,
    /// The rule's limit.
    pub limit: Limit,
    /// The identity's actor.
    pub actor: ActorRef<KeyMsg>,
    /// Leased units not yet spent.
    units: AtomicI64,
    /// Window leases: units may be spent only before this time (node clock, µs).
    spend_before: AtomicU64,
    /// Size of the latest grant (decides when to refill ahead).
    last_grant: AtomicU64,
    /// Set while a refill-ahead is queued, so only one is.
    refill_queued: AtomicBool,
    /// The store said no room for `denied_cost` units until `denied_until`: answered locally
    /// until `recheck_at` (larger costs where the algorithm says, see `Limit::retry_for_more`).
    denied_until: AtomicU64,
    denied_cost: AtomicU64,
    /// When the recorded denial stops being believed (the store is asked again).
    recheck_at: AtomicU64,
    /// What the store said remains globally, when it said so, and when the bucket would be
    /// full (node clock, µs).
    global_remaining: AtomicU64,
    /// How many nodes hold leases of the bucket, this one included, as the store last told
    /// (at least `min_holders`): a node deciding on the store's last answer takes its share
    /// of it.
    holders: AtomicU64,
    /// The nodes said to share the limits (`--cluster-nodes`): a node that answered first, when
    /// the others had not yet asked, still divides by them.
    min_holders: u64,
    observed_at: AtomicU64,
    full_at: AtomicU64,
    /// The coarse per-node pre-limit (None: disabled).
    pub prelimit: Option<LocalBucket>,
    /// The LOCAL fail mode's bucket: the limit divided by the node count.
    pub fallback: Arc<LocalBucket>,
    /// Wakes requests waiting for a refill that is on its way.
    arrived: tokio::sync::Notify,
    /// How the last lease call for this bucket failed: 0 it did not, [`FAILED_LATE`] the store
    /// did not answer within the patience, [`FAILED_DOWN`] it could not be reached.
    failed: AtomicU8,
    /// Units requests waiting for a refill need, together.
    waiting: AtomicU64,
    /// The store had room for `room_need` units; trusted until `room_until`.
    room_need: AtomicU64,
    room_until: AtomicU64,
    /// Whether the lease call out for this bucket is late, and how (0: not late, else a
    /// [`Late`] as `late_code`): an actor has one call out at a time.
    late: AtomicU8,
    /// Units admitted while the store had stalled (by a fail mode, or on its last answer),
    /// not yet debited in the store; and when the latest of them was admitted (node clock, µs:
    /// a window's debit lands in the window they were admitted in).
    owed: AtomicU64,
    owed_at: AtomicU64,
}

/// [`Bucket`]'s `failed`: the store did not answer within the patience.
const FAILED_LATE: u8 = 1;
/// [`Bucket`]'s `failed`: the store could not be reached.
const FAILED_DOWN: u8 = 2;

fn late_code(late: Option<Late>) -> u8 {
    match late {
        None => 0,
        Some(Late::Stalled) => 1,
        Some(Late::Down) => 2,
    }
}

/// What the bucket's own state says about a request's units, without the store or the
/// actor: the hot path of [`crate::runtime::Node::check`] and of
/// [`crate::runtime::Prepared::try_check`] alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalTake {
    /// Taken from the pre-limit and the lease (a refill was queued if the lease runs low).
    Took,
    /// The pre-limit refused, with its own wait; nothing was taken.
    Prelimited(Duration),
    /// The lease cannot cover the units and the store recently said it has no room until
    /// this long from now; nothing was taken.
    Denied(Duration),
    /// The lease cannot cover the units and the store must be asked. The pre-limit's tokens
    /// stay taken: the caller gives them back if it does not go on.
    Dry,
}

/// What waiting for a refill gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefillOutcome {
    /// The units were taken.
    Took,
    /// The store has no room: retry after this long.
    Denied(Duration),
    /// The store could not answer: the call out is late (the store stalled, or is down), or
    /// it failed (None).
    Failed {
        /// How the call out is late; None: it failed.
        late: Option<Late>,
    },
    /// Nothing conclusive (the refill was smaller than needed, or took too long).
    Missed,
}

impl Bucket {
    /// A bucket holding nothing yet; `fallback` is its LOCAL fail mode's bucket (the one
    /// the key had before it had a bucket, if any, so an outage's count carries over);
    /// `nodes` the nodes said to share the limits.
    pub fn new(
        key: BucketKey,
        rule: Arc<CompiledRule>,
        limit: Limit,
        actor: ActorRef<KeyMsg>,
        prelimit_factor: Option<f64>,
        fallback: Arc<LocalBucket>,
        nodes: u32,
    ) -> Self {
        let min_holders = u64::from(nodes.max(1));
        Self {
            prelimit: prelimit_factor.map(|f| LocalBucket::prelimit(&limit, f)),
            fallback,
            key,
            rule,
            limit,
            actor,
            units: AtomicI64::new(0),
            spend_before: AtomicU64::new(0),
            last_grant: AtomicU64::new(0),
            refill_queued: AtomicBool::new(false),
            denied_until: AtomicU64::new(0),
            denied_cost: AtomicU64::new(u64::MAX),
            recheck_at: AtomicU64::new(0),
            global_remaining: AtomicU64::new(limit.capacity()),
            holders: AtomicU64::new(min_holders),
            min_holders,
            observed_at: AtomicU64::new(0),
            full_at: AtomicU64::new(0),
            arrived: tokio::sync::Notify::new(),
            failed: AtomicU8::new(0),
            waiting: AtomicU64::new(0),
            room_need: AtomicU64::new(0),
            room_until: AtomicU64::new(0),
            late: AtomicU8::new(0),
            owed: AtomicU64::new(0),
            owed_at: AtomicU64::new(0),
        }
    }

    /// Whether leased units of this bucket must be spent before a deadline (windows).
    pub fn has_deadline(&self) -> bool {
        !matches!(self.limit.algorithm(), Algorithm::TokenBucket)
    }

    /// Takes `cost` leased units, if there are that many (and, for windows, their window has
    /// not ended at `now`). Never blocks; a compare-and-swap loop on one atomic.
    pub fn try_take(&self, cost: u64, now: impl Fn() -> Micros) -> bool {
        let spend_before = self.spend_before.load(Ordering::Acquire);
        if spend_before != NO_DEADLINE && now() >= spend_before {
            return false;
        }
        let cost = cost as i64;
        let mut units = self.units.load(Ordering::Acquire);
        loop {
            if units < cost {
                return false;
            }
            match self.units.compare_exchange_weak(
                units,
                units - cost,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => units = actual,
            }
        }
    }

    /// Gives back units taken for a request that was denied elsewhere.
    pub fn give_back(&self, cost: u64) {
        self.units.fetch_add(cost as i64, Ordering::AcqRel);
    }

    /// Leased units left.
    pub fn units(&self) -> i64 {
        self.units.load(Ordering::Acquire)
    }

    /// Takes `cost` units from the pre-limit and the lease, if they can (see [`LocalTake`]).
    /// `refill` (granted, left) says when to queue a refill ahead of need.
    pub fn take_local(
        self: &Arc<Self>,
        cost: u64,
        now: Micros,
        refill: impl FnOnce(u64, i64) -> bool,
    ) -> LocalTake {
        if let Some(pre) = &self.prelimit
            && let Err(wait) = pre.take(cost, now)
        {
            return LocalTake::Prelimited(wait);
        }
        if self.try_take(cost, || now) {
            if self.should_queue_refill(refill) {
                let _ = self.actor.cast(KeyMsg::Refill {
                    bucket: self.clone(),
                    min: 1,
                    asked_at: now,
                });
            }
            return LocalTake::Took;
        }
        match self.denied_for(cost, now) {
            Some(wait) => {
                if let Some(pre) = &self.prelimit {
                    pre.refund(cost);
                }
                LocalTake::Denied(wait)
            }
            None => LocalTake::Dry,
        }
    }

    /// Whether the decision path should ask the actor to refill ahead, given `refill`
    /// (granted, left) → bool. Returns true once until the refill is done.
    pub fn should_queue_refill(&self, refill: impl FnOnce(u64, i64) -> bool) -> bool {
        refill(self.last_grant.load(Ordering::Relaxed), self.units()) && self.queue_refill()
    }

    /// Whether a refill is on its way (queued with the actor, or its store call in flight).
    pub fn refill_pending(&self) -> bool {
        self.refill_queued.load(Ordering::Acquire)
    }

    /// Queues a refill unless one is pending; true if this call queued it.
    pub fn queue_refill(&self) -> bool {
        !self.refill_queued.swap(true, Ordering::AcqRel)
    }

    /// Queues a refill (unless one is on its way), waits at most `wait` for it to land, and
    /// takes `cost`. Requests that find a lease just emptied wait here together instead of
    /// each sending the actor a message.
    pub async fn take_after_refill(
        self: &Arc<Self>,
        cost: u64,
        wait: Duration,
        now: impl Fn() -> Micros,
    ) -> RefillOutcome {
        let deadline = tokio::time::Instant::now() + wait;
        self.waiting.fetch_add(cost, Ordering::AcqRel);
        // Only a refill this request waited on can tell it the store failed: a failure seen
        // before (an outage since over) is not a reason not to ask again.
        let mut waited = false;
        let outcome = loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.try_take(cost, &now) {
                break RefillOutcome::Took;
            }
            if let Some(retry) = self.denied_for(cost, now()) {
                break RefillOutcome::Denied(retry);
            }
            // A late call decides those that do not wait for it: every rule when the store is
            // down, and rules that do not fail closed when it stalled (a CLOSED rule waits for
            // the answer, up to the patience: one late call must not deny a real user).
            match self.lateness() {
                Some(Late::Down) => {
                    break RefillOutcome::Failed {
                        late: Some(Late::Down),
                    };
                }
                Some(Late::Stalled) if self.rule.fail_mode != FailMode::Closed => {
                    break RefillOutcome::Failed {
                        late: Some(Late::Stalled),
                    };
                }
                _ => {}
            }
            if waited && !self.refill_pending() {
                match self.failed.load(Ordering::Acquire) {
                    // Not answered within the patience: a store that is late, not one known
                    // to be down (what is admitted now is owed to it).
                    FAILED_LATE => {
                        break RefillOutcome::Failed {
                            late: Some(Late::Stalled),
                        };
                    }
                    FAILED_DOWN => break RefillOutcome::Failed { late: None },
                    _ => {}
                }
            }
            // Queue a refill unless one is on its way: at least what this request lacks, so a
            // denial says when this request fits.
            let need = cost.saturating_sub(self.units().max(0) as u64).max(1);
            if self.queue_refill()
                && self
                    .actor
                    .cast(KeyMsg::Refill {
                        bucket: self.clone(),
                        min: need,
                        asked_at: now(),
                    })
                    .is_err()
            {
                self.refill_queued.store(false, Ordering::Release);
                break RefillOutcome::Missed;
            }
            waited = true;
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break if self.try_take(cost, &now) {
                    RefillOutcome::Took
                } else {
                    RefillOutcome::Missed
                };
            }
        };
        self.waiting.fetch_sub(cost, Ordering::AcqRel);
        outcome
    }

    /// Units requests waiting for a refill of this bucket need, together.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Leased units that can still be spent at `at` (a window's units die with it).
    pub fn held_at(&self, at: Micros) -> u64 {
        let spend_before = self.spend_before.load(Ordering::Acquire);
        if spend_before != NO_DEADLINE && at >= spend_before {
            return 0;
        }
        self.units().max(0) as u64
    }

    /// The store recently said it has no room for what `cost` needs beyond the units this
    /// node holds: how long until it has, when that follows from what the store said (its
    /// retry-after for the cost it was asked, and the algorithm). None: ask the store.
    pub fn denied_for(&self, cost: u64, now: Micros) -> Option<Duration> {
        self.store_denies(cost.saturating_sub(self.held_at(now)), now)
    }

    /// [`Bucket::denied_for`] for `need` units from the store.
    pub fn store_denies(&self, need: u64, now: Micros) -> Option<Duration> {
        let until = self.denied_until.load(Ordering::Acquire);
        if now >= until || now >= self.recheck_at.load(Ordering::Acquire) || need == 0 {
            return None;
        }
        let denied = self.denied_cost.load(Ordering::Acquire);
        self.limit
            .retry_for_more(denied, Duration::from_micros(until - now), need)
    }

    /// Whether the store was seen to have room for `need` recently enough (see
    /// [`Bucket::saw_room`]).
    pub fn room_seen(&self, need: u64, now: Micros) -> bool {
        now < self.room_until.load(Ordering::Acquire)
            && need <= self.room_need.load(Ordering::Acquire)
    }

    /// Records that the store had room for `need`, trusted until `until` (a pre-limit denial
    /// asks the store once per wait, not once per denied request).
    pub(crate) fn saw_room(&self, need: u64, until: Micros) {
        self.room_need.store(need, Ordering::Release);
        self.room_until.store(until, Ordering::Release);
    }

    /// Estimated units left globally at `now`: what the store last said (a token bucket
    /// refilled since), plus what this node holds, less what was admitted without the store
    /// since; at most the capacity.
    pub fn remaining(&self, now: Micros) -> u64 {
        (self.refilled_estimate(now) as i64 + self.units()
            - self.owed.load(Ordering::Acquire) as i64)
            .clamp(0, self.limit.capacity() as i64) as u64
    }

    /// What the store last said remains, a token bucket refilled since at its rate (what a
    /// client is told remains).
    fn refilled_estimate(&self, now: Micros) -> u64 {
        let mut store = self.global_remaining.load(Ordering::Relaxed);
        if let Some(rate) = self.limit.refill_per_second() {
            let since = now.saturating_sub(self.observed_at.load(Ordering::Relaxed));
            store = store.saturating_add((rate * since as f64 / 1e6).floor() as u64);
        }
        store.min(self.limit.capacity())
    }

    /// Estimated time until the bucket is full.
    pub fn reset_after(&self, now: Micros) -> Duration {
        Duration::from_micros(self.full_at.load(Ordering::Relaxed).saturating_sub(now))
    }

    /// Whether the lease call out for this bucket is late, and how.
    pub fn lateness(&self) -> Option<Late> {
        match self.late.load(Ordering::Acquire) {
            0 => None,
            1 => Some(Late::Stalled),
            _ => Some(Late::Down),
        }
    }

    /// A fail mode admitted `cost` while the store had stalled: owed to the store, and debited
    /// there when it answers (see the key actor's `settle_owed`).
    pub fn admitted_without_store(&self, cost: u64, now: Micros) {
        self.owed.fetch_add(cost, Ordering::AcqRel);
        self.owed_at.fetch_max(now, Ordering::AcqRel);
    }

    /// Gives back units owed for a request that was denied elsewhere.
    pub fn refund_owed(&self, cost: u64) {
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                Some(owed.saturating_sub(cost))
            });
    }

    // ---- for the actor only ----------------------------------------------------------------

    /// The lease call out for this bucket is late (a stall, or the store down, whichever was
    /// told last).
    pub(crate) fn set_late(&self, late: Late) {
        self.late.store(late_code(Some(late)), Ordering::Release);
    }

    /// The lease call out for this bucket ended.
    pub(crate) fn call_done(&self) {
        self.late.store(late_code(None), Ordering::Release);
    }

    /// The store could not be reached (down, not late): what was admitted without it is
    /// forgiven; how many units.
    pub(crate) fn forgive_owed(&self) -> u64 {
        self.owed.swap(0, Ordering::AcqRel)
    }

    /// Takes what is owed to the store, to debit it: the units and when the latest of them
    /// was admitted. What the store last said remains no longer counts them.
    pub(crate) fn take_owed(&self) -> Option<(u64, Micros)> {
        let units = self.owed.swap(0, Ordering::AcqRel);
        if units == 0 {
            return None;
        }
        let _ = self
            .global_remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(units))
            });
        Some((units, self.owed_at.load(Ordering::Acquire)))
    }

    /// Wakes requests waiting on a refill (they look again: a late call fails them over).
    pub(crate) fn wake_waiters(&self) {
        self.arrived.notify_waiters();
    }

    /// Adds a grant's units (what was admitted without the store meanwhile is debited in the
    /// store, not taken from the grant: see the key actor's `settle_owed`). Units of a window
    /// that has ended are dropped first.
    pub(crate) fn install(&self, units: u64, spend_before: u64, now: Micros) {
        let old = self.spend_before.load(Ordering::Acquire);
        if old != NO_DEADLINE && now >= old {
            self.units.store(0, Ordering::Release);
        }
        self.units.fetch_add(units as i64, Ordering::AcqRel);
        self.spend_before.store(spend_before, Ordering::Release);
        self.last_grant.store(units, Ordering::Relaxed);
        self.failed.store(0, Ordering::Release);
        self.arrived.notify_waiters();
    }

    /// Takes up to `units` back (a lease's unspent share, to return it); how many it took.
    pub(crate) fn reclaim_up_to(&self, units: u64) -> u64 {
        let mut taken = 0;
        let _ = self
            .units
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                taken = (held.max(0) as u64).min(units);
                Some(held - taken as i64)
            });
        taken
    }

    /// Takes every unit back (to return them to the store): only what is held; a debt (units
    /// admitted without the store, charged to a grant) stays for the next grants to repay.
    pub(crate) fn reclaim(&self) -> u64 {
        self.units
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u > 0).then_some(0)
            })
            .map_or(0, |held| held as u64)
    }

    /// Records what the store said about the bucket, and how many nodes hold leases of it
    /// (`holders`, this one included): what the node decides by while the store has stalled
    /// (see [`Bucket::decide_while_slow`]).
    pub(crate) fn observe(&self, remaining: u64, reset_after: Duration, holders: u64, now: Micros) {
        self.global_remaining.store(remaining, Ordering::Relaxed);
        self.holders
            .store(holders.max(self.min_holders), Ordering::Relaxed);
        self.observed_at.store(now, Ordering::Relaxed);
        self.full_at
            .store(now + reset_after.as_micros() as u64, Ordering::Relaxed);
    }

    /// What this node takes to remain of the bucket in the store while the store does not
    /// answer: what the store last said (units held by nodes not counted), with no refill
    /// since (refill is shared with every other node, and another region's nodes refill their
    /// own views at the same rate: credited to this node, it would be spent twice); the whole
    /// capacity once the bucket would be full again or when the store never said (for a rule
    /// the two regions share, half of it: the peer spends on the same limit). Others' spending
    /// since can only make it less.
    fn stalled_estimate(&self, now: Micros) -> u64 {
        if now >= self.full_at.load(Ordering::Relaxed) {
            let capacity = self.limit.capacity();
            return if self.rule.synced() {
                capacity / 2
            } else {
                capacity
            };
        }
        self.global_remaining
            .load(Ordering::Relaxed)
            .min(self.limit.capacity())
    }

    /// Decides `cost` while the store has stalled (or did not answer within the patience):
    /// admitted if this node's share of the most that can remain in the store (see
    /// [`Bucket::stalled_estimate`]) covers it and everything admitted so without the store;
    /// owed, and debited in the store when it answers. The share is that remainder divided by
    /// the nodes holding leases of the bucket (see [`share_of`]): nodes deciding on the same
    /// answer do not each spend all of it, so a stalled store gives an undershoot, never an
    /// N-fold overshoot. Denied, the wait until the share covers the cost.
    pub fn decide_while_slow(&self, cost: u64, now: Micros) -> Result<(), Duration> {
        let holders = self.holders.load(Ordering::Relaxed);
        let share = share_of(self.stalled_estimate(now), holders);
        let taken = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                (owed + cost <= share).then_some(owed + cost)
            });
        match taken {
            Ok(_) => {
                self.owed_at.fetch_max(now, Ordering::AcqRel);
                Ok(())
            }
            Err(owed) => {
                let missing = (owed + cost).saturating_sub(share);
                let wait = match self.limit.refill_per_second() {
                    // This node's share of the refill covers what is missing.
                    Some(rate) => Duration::from_secs_f64(missing as f64 * holders as f64 / rate),
                    None => self.reset_after(now),
                };
                Err(wait.max(Duration::from_millis(1)))
            }
        }
    }

    /// Records that the store had no room for `cost` until `now + retry_after`.
    /// The denial is believed for at most `recheck` (then the store is asked again: units
    /// other nodes return, or a debit's window ending, can make room before the retry-after a
    /// window gives), and says `retry_after` until then.
    pub(crate) fn deny_until(
        &self,
        cost: u64,
        retry_after: Duration,
        recheck: Duration,
        now: Micros,
    ) {
        self.denied_cost.store(cost, Ordering::Release);
        self.denied_until
            .store(now + retry_after.as_micros() as u64, Ordering::Release);
        self.recheck_at.store(
            now + retry_after.min(recheck).as_micros() as u64,
            Ordering::Release,
        );
    }

    /// A lease call for this bucket failed: `late`, the store did not answer within the
    /// patience; else it could not be reached.
    pub(crate) fn lease_failed(&self, late: bool) {
        let how = if late { FAILED_LATE } else { FAILED_DOWN };
        self.failed.store(how, Ordering::Release);
        self.refill_done();
    }

    /// The refill the decision path queued is done (or failed, or will not be made).
    pub(crate) fn refill_done(&self) {
        self.refill_queued.store(false, Ordering::Release);
        self.arrived.notify_waiters();
    }

    /// Forgets a recorded denial (new units arrived).
    pub(crate) fn clear_denial(&self) {
        self.denied_until.store(0, Ordering::Release);
    }
}

/// One node's share of `remaining` units when `holders` nodes (at least 1) may spend them on
/// the same answer: rounded down, so that the shares never add up to more than there is.
pub fn share_of(remaining: u64, holders: u64) -> u64 {
    remaining / holders.max(1)
}

/// How many nodes hold leases of a bucket, this one included, from the store's count of live
/// leases (`live_leases`, each node holding at least one, some several) and this node's own
/// (`own`): the other nodes hold at most `live_leases - own`. Counting a node that holds two
/// leases twice undershoots; never counting one too few keeps the shares within the remainder.
pub fn holders_of(live_leases: u64, own: u64) -> u64 {
    1 + live_leases.saturating_sub(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_a_last_answer_never_add_up_to_more_than_it() {
        for remaining in 0..200 {
            for holders in 1..12 {
                let share = share_of(remaining, holders);
                assert!(share * holders <= remaining, "{remaining} over {holders}");
                assert!(
                    remaining - share * holders < holders,
                    "{remaining} over {holders}"
                );
            }
        }
        assert_eq!(share_of(50, 0), 50, "at least this node holds it");
    }

    #[test]
    fn the_other_holders_are_counted_from_the_live_leases_less_this_nodes_own() {
        // Alone with two live leases of its own.
        assert_eq!(holders_of(2, 2), 1);
        // Three others, one lease each, beside this node's one.
        assert_eq!(holders_of(4, 1), 4);
        // A node that holds two leases counts twice: an undershoot, never an overshoot.
        assert_eq!(holders_of(3, 1), 3);
        // A store that counted fewer than this node holds (a lease just expired there).
        assert_eq!(holders_of(1, 2), 1);
    }
}
