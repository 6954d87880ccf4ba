//! One bucket (a rule applied to one identity) as this node holds it: the units leased and not
//! yet spent, in one atomic the decision path takes from without a lock, a mailbox hop or a
//! clock read (token buckets); plus the local pre-limit, the LOCAL fallback and what the store
//! last said.
//!
//! Only the key's actor adds units, replaces the spending deadline and reclaims units; the
//! decision path only takes and gives back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use ractor::ActorRef;
use tollgate_lease::{Algorithm, BucketKey, Limit, Micros};

use crate::rules::CompiledRule;
use crate::runtime::keys::messages::KeyMsg;
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
    observed_at: AtomicU64,
    full_at: AtomicU64,
    /// The coarse per-node pre-limit (None: disabled).
    pub prelimit: Option<LocalBucket>,
    /// The LOCAL fail mode's bucket: the limit divided by the node count.
    pub fallback: Arc<LocalBucket>,
    /// Wakes requests waiting for a refill that is on its way.
    arrived: tokio::sync::Notify,
    /// The last lease call for this bucket failed (the store could not answer).
    failed: AtomicBool,
    /// Units requests waiting for a refill need, together.
    waiting: AtomicU64,
    /// Until when the store's last answer (`global_remaining`) may decide while it is slow.
    trusted_until: AtomicU64,
    /// The store had room for `room_need` units; trusted until `room_until`.
    room_need: AtomicU64,
    room_until: AtomicU64,
    /// Whether the lease call out for this bucket is past the store budget (an actor has one
    /// call out at a time).
    late: AtomicBool,
    /// Units fail modes admitted without the store since its last answer: charged to the next
    /// grant, forgiven if a lease call fails first.
    owed: AtomicU64,
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
    /// The store could not answer (`late`: the call is out past the budget; the store may
    /// only be slow).
    Failed {
        /// Whether the call is past its budget rather than failed.
        late: bool,
    },
    /// Nothing conclusive (the refill was smaller than needed, or took too long).
    Missed,
}

impl Bucket {
    /// A bucket holding nothing yet; `fallback` is its LOCAL fail mode's bucket (the one
    /// the key had before it had a bucket, if any, so an outage's count carries over).
    pub fn new(
        key: BucketKey,
        rule: Arc<CompiledRule>,
        limit: Limit,
        actor: ActorRef<KeyMsg>,
        prelimit_factor: Option<f64>,
        fallback: Arc<LocalBucket>,
    ) -> Self {
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
            observed_at: AtomicU64::new(0),
            full_at: AtomicU64::new(0),
            arrived: tokio::sync::Notify::new(),
            failed: AtomicBool::new(false),
            waiting: AtomicU64::new(0),
            trusted_until: AtomicU64::new(0),
            room_need: AtomicU64::new(0),
            room_until: AtomicU64::new(0),
            late: AtomicBool::new(false),
            owed: AtomicU64::new(0),
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
            if self.is_late() {
                break RefillOutcome::Failed { late: true };
            }
            if waited && self.failed.load(Ordering::Acquire) && !self.refill_pending() {
                break RefillOutcome::Failed { late: false };
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
        (self.store_estimate(now) as i64 + self.units() - self.owed.load(Ordering::Acquire) as i64)
            .clamp(0, self.limit.capacity() as i64) as u64
    }

    /// Estimated time until the bucket is full.
    pub fn reset_after(&self, now: Micros) -> Duration {
        Duration::from_micros(self.full_at.load(Ordering::Relaxed).saturating_sub(now))
    }

    /// Whether a lease call for this bucket is out past the store budget.
    pub fn is_late(&self) -> bool {
        self.late.load(Ordering::Acquire)
    }

    /// A fail mode admitted `cost` without the store: the next grant pays for it (a store that
    /// was only slow then counts every admission), unless a lease call fails first (an outage:
    /// the store never counted them). At most a bucket's capacity is owed.
    pub fn admitted_without_store(&self, cost: u64) {
        let capacity = self.limit.capacity();
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                Some((owed + cost).min(capacity))
            });
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

    /// The lease call out for this bucket passed the store budget.
    pub(crate) fn set_late(&self) {
        self.late.store(true, Ordering::Release);
    }

    /// The lease call out for this bucket ended.
    pub(crate) fn call_done(&self) {
        self.late.store(false, Ordering::Release);
    }

    /// The late call failed: the store never counted what was admitted meanwhile.
    pub(crate) fn forgive_owed(&self) {
        self.owed.store(0, Ordering::Release);
    }

    /// Wakes requests waiting on a refill (they look again: a late call fails them over).
    pub(crate) fn wake_waiters(&self) {
        self.arrived.notify_waiters();
    }

    /// Adds a grant's units, less what was admitted without the store since it last answered
    /// (owed: charged before any waiter can spend the grant); how many units were owed. Units
    /// of a window that has ended are dropped first (and what was owed in it: the store does
    /// not count it in the new window either).
    pub(crate) fn install(&self, units: u64, spend_before: u64, now: Micros) -> u64 {
        let old = self.spend_before.load(Ordering::Acquire);
        let mut owed = self.owed.swap(0, Ordering::AcqRel);
        if old != NO_DEADLINE && now >= old {
            self.units.store(0, Ordering::Release);
            owed = 0;
        }
        self.units
            .fetch_add(units as i64 - owed as i64, Ordering::AcqRel);
        self.spend_before.store(spend_before, Ordering::Release);
        self.last_grant.store(units, Ordering::Relaxed);
        self.failed.store(false, Ordering::Release);
        self.arrived.notify_waiters();
        owed
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

    /// Records what the store said about the bucket; it is trusted to decide by for `trust`
    /// (while the store is slow; see [`Bucket::decide_while_slow`]), never past a fixed
    /// window's end.
    pub(crate) fn observe(
        &self,
        remaining: u64,
        reset_after: Duration,
        trust: Duration,
        now: Micros,
    ) {
        self.global_remaining.store(remaining, Ordering::Relaxed);
        self.observed_at.store(now, Ordering::Relaxed);
        self.full_at
            .store(now + reset_after.as_micros() as u64, Ordering::Relaxed);
        let trust = match self.limit.algorithm() {
            Algorithm::FixedWindow => trust.min(reset_after),
            _ => trust,
        };
        self.trusted_until
            .store(now + trust.as_micros() as u64, Ordering::Release);
    }

    /// What the store last said remains of this bucket (units held by nodes not counted),
    /// a token bucket refilled since at its rate.
    fn store_estimate(&self, now: Micros) -> u64 {
        let mut store = self.global_remaining.load(Ordering::Relaxed);
        if let Some(rate) = self.limit.refill_per_second() {
            let since = now.saturating_sub(self.observed_at.load(Ordering::Relaxed));
            store = store.saturating_add((rate * since as f64 / 1e6).floor() as u64);
        }
        store.min(self.limit.capacity())
    }

    /// Decides `cost` while the store is slow (a lease call past its budget, or this node too
    /// busy to wait for one) but answered recently: admitted if what the store last said
    /// remains (refilled since) covers it and everything admitted so without it; owed, so the
    /// next grant pays for it. A slow store is not a dead one: an overloaded node degrades
    /// towards the limit, not into admitting everything. None when the store has not answered
    /// recently enough to be believed (then the rule's fail mode decides); else the decision,
    /// with the wait until the estimate covers the cost when denied.
    pub fn decide_while_slow(&self, cost: u64, now: Micros) -> Option<Result<(), Duration>> {
        if now >= self.trusted_until.load(Ordering::Acquire) {
            return None;
        }
        let estimate = self.store_estimate(now);
        let taken = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                (owed + cost <= estimate).then_some(owed + cost)
            });
        match taken {
            Ok(_) => Some(Ok(())),
            Err(owed) => {
                let missing = (owed + cost).saturating_sub(estimate);
                let wait = match self.limit.refill_per_second() {
                    Some(rate) => Duration::from_secs_f64(missing as f64 / rate),
                    None => self.reset_after(now),
                };
                Some(Err(wait.max(Duration::from_millis(1))))
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

    /// A lease call for this bucket failed.
    pub(crate) fn lease_failed(&self) {
        self.failed.store(true, Ordering::Release);
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
