//! One bucket (a rule applied to one identity) as this node holds it: the units leased and not
//! yet spent, in one atomic the decision path takes from without a lock, a mailbox hop or a
//! clock read (token buckets); plus the local pre-limit, the LOCAL fallback and what the store
//! last said (`keys/last_answer.rs`).
//!
//! Only the key's actor adds units, replaces the spending deadline and reclaims units; the
//! decision path only takes and gives back, and asks the actor for refills: the messages they
//! say to each other ([`KeyMsg`]) are here too, since a bucket names its actor and a message
//! its buckets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use tollgate_lease::{BucketKey, LeaseGrant, Limit, Micros, StoreError};

use crate::rules::CompiledRule;
use crate::runtime::fail_modes::{self, Cause};
use crate::runtime::keys::last_answer::LastAnswer;
use crate::runtime::local::LocalBucket;
use crate::runtime::store_health::lateness::Late;

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
    /// What the store last said of the bucket, and what was admitted without it since.
    pub last: LastAnswer,
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
/// actor: the hot path of [`crate::runtime::node::Node::check`] and of
/// [`crate::runtime::prepared::Prepared::try_check`] alike.
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
        Self {
            last: LastAnswer::new(limit, rule.synced(), nodes),
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
            arrived: tokio::sync::Notify::new(),
            failed: AtomicU8::new(0),
            waiting: AtomicU64::new(0),
            room_need: AtomicU64::new(0),
            room_until: AtomicU64::new(0),
            late: AtomicU8::new(0),
        }
    }

    /// Whether leased units of this bucket must be spent before a deadline (windows).
    pub fn has_deadline(&self) -> bool {
        !self.limit.algorithm().refills()
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
            // the answer, up to the patience: one late call must not deny a real user). A
            // bucket the store never answered for waits too: there is no last answer to take a
            // share of yet.
            if let Some(late) = self.lateness()
                && !fail_modes::waits_through(self.rule.fail_mode, late)
                && (late == Late::Down || self.last.heard())
            {
                break RefillOutcome::Failed { late: Some(late) };
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

    /// Estimated units left globally at `now` (see [`LastAnswer::remaining`]).
    pub fn remaining(&self, now: Micros) -> u64 {
        self.last.remaining(self.units(), now)
    }

    /// Estimated time until the bucket is full.
    pub fn reset_after(&self, now: Micros) -> Duration {
        self.last.reset_after(now)
    }

    /// Whether the lease call out for this bucket is late, and how.
    pub fn lateness(&self) -> Option<Late> {
        match self.late.load(Ordering::Acquire) {
            0 => None,
            1 => Some(Late::Stalled),
            _ => Some(Late::Down),
        }
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

// ---- what the decision path and a key actor say to each other ------------------------------

/// Units of one bucket a request needs.
#[derive(Debug, Clone)]
pub struct Want {
    /// The bucket.
    pub bucket: Arc<Bucket>,
    /// Units.
    pub cost: u64,
}

/// One bucket's part in a lease call.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The bucket.
    pub bucket: Arc<Bucket>,
    /// Fewest units worth taking (what the first waiting request lacks; after
    /// the actor's `consolidate`, that plus the units given back).
    pub min: u64,
    /// Units wanted (sized by demand).
    pub want: u64,
    /// Units this node held and gave back before asking (see the actor's `consolidate`).
    pub returned: u64,
    /// When the ask was made (node clock, µs): how long refills take is part of a lease's
    /// size.
    pub asked_at: Micros,
}

/// What the actor did for a request.
#[derive(Debug)]
pub enum AcquireOutcome {
    /// The units were taken from the leases, for this request.
    Reserved,
    /// The store has no room in `wants[index]` for now.
    Denied {
        /// Which want.
        index: usize,
        /// When it will, as the store says.
        retry_after: Duration,
    },
    /// The store could not answer, for this cause.
    Failed(Cause),
}

/// Messages of the key actor.
#[derive(Debug)]
pub enum KeyMsg {
    /// Reserve every want's units for one request, or none.
    Acquire {
        /// The units needed.
        wants: Vec<Want>,
        /// Where the outcome goes.
        reply: RpcReplyPort<AcquireOutcome>,
    },
    /// The decision path saw a lease running low, or requests wait on it: refill it with at
    /// least `min` units (what a waiting request lacks; 1 to refill ahead).
    Refill {
        /// The bucket.
        bucket: Arc<Bucket>,
        /// Fewest units worth taking.
        min: u64,
        /// When the decision path asked (node clock, µs): a refill's time includes its wait
        /// in this mailbox.
        asked_at: Micros,
    },
    /// A lease call is late: the store stalled, or is down. The requests waiting on it that do
    /// not wait through it are decided by their fail modes now; the call goes on, its grant is
    /// used when it comes, and what they admitted is debited in the store then.
    Late {
        /// How.
        late: Late,
        /// The call's buckets.
        buckets: Vec<Arc<Bucket>>,
    },
    /// A store call finished.
    Granted {
        /// What was asked.
        asks: Vec<Ask>,
        /// The store's answer, one grant per ask.
        result: Result<Vec<LeaseGrant>, StoreError>,
    },
    /// Time to look at lease expiries and idleness.
    Tick,
    /// The key state budget is short: stop (returning what the leases hold) if idle for
    /// [`crate::runtime::keys::registry::EVICTABLE_AFTER`].
    Evict,
    /// The bucket's counter was reset in the store: give back what this node holds of it
    /// (leases from before the reset credit nothing, their records went with the bucket;
    /// leases since are credited) and forget what it owed and remembered.
    Forget {
        /// The bucket.
        bucket: Arc<Bucket>,
    },
    /// Return everything and stop.
    Shutdown(RpcReplyPort<()>),
}

#[cfg(test)]
mod tests;
