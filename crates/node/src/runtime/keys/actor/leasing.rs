//! The key actor's leasing: asks sized and sent, grants installed, leases expired and
//! returned, what was owed settled, the next tick scheduled.

use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tollgate_lease::{LeaseGrant, Micros};

use super::{KeyState, PendingRefill};
use crate::runtime::fail_modes::Cause;
use crate::runtime::keys::book::{HeldLease, Return};
use crate::runtime::keys::bucket::{Ask, Bucket, KeyMsg, NO_DEADLINE};
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::keys::calls;
use crate::runtime::keys::last_answer::holders_of;
use crate::runtime::keys::waiters::Need;
use crate::runtime::store_health::background;
use crate::runtime::store_health::debts::Debt;
use std::time::Duration;
impl KeyState {
    /// A lease is consumption as far as this region's store is concerned: under a rule that
    /// syncs, the peer region learns of it now, not as the units are spent (units returned
    /// unspent stay counted there until the window ends: under-admission, never over).
    pub(super) fn record_for_peer(&self, bucket: &Bucket, units: u64, now: Micros) {
        self.shared
            .record_for_peer(&bucket.rule, &self.identity, &bucket.limit, units, now);
    }

    /// Settles the leases an older definition of `bucket`'s rule holds on the same key (see
    /// [`LeaseBook::supersede`]): their unspent units go back before the next lease call,
    /// and the decision path no longer finds their buckets.
    pub(super) fn settle_superseded(&mut self, bucket: &Arc<Bucket>, now: Micros) {
        let old_waited_on = self.waiters.on_older_definition_of(bucket);
        let superseded = self.book.supersede(bucket, old_waited_on, now);
        for old in &superseded.dropped {
            self.shared
                .registry
                .remove_bucket(&BucketId::new(&old.rule, &self.identity).local_key());
        }
        self.returns_first.extend(superseded.returns);
    }

    /// Asks the store for what the waiting requests need, unless a call is already out.
    pub(super) fn request_for_waiters(&mut self, myself: &ActorRef<KeyMsg>, now: Micros) {
        if self.in_flight || self.waiters.is_empty() {
            return;
        }
        // Per bucket: units all waiters need beyond what is held, at least the first one's.
        let mut asks = vec![];
        for Need {
            bucket,
            total,
            first,
        } in self.waiters.needs()
        {
            let held = bucket.units().max(0) as u64;
            if total <= held {
                continue;
            }
            let min = first.saturating_sub(held);
            asks.push(self.ask(bucket, min, total - held, now));
        }
        if !asks.is_empty() {
            self.send_request(myself, asks);
        }
    }

    /// Starts the refills asked for (one lease call for all of them), unless a call is out:
    /// they wait for it to land.
    pub(super) fn send_refills(&mut self, myself: &ActorRef<KeyMsg>, now: Micros) {
        if self.in_flight || self.refills.is_empty() {
            return;
        }
        let mut asks = vec![];
        for PendingRefill {
            bucket,
            min,
            asked_at,
        } in std::mem::take(&mut self.refills)
        {
            // A definition superseded (and settled) meanwhile leases nothing more: its units
            // would be credited back under the old limit after the new one had leased.
            if !self.is_current(&bucket) {
                bucket.refill_done();
                continue;
            }
            let mut ask = self.ask(bucket, min, min, now);
            ask.asked_at = asked_at.min(now);
            asks.push(ask);
        }
        if !asks.is_empty() {
            self.send_request(myself, asks);
        }
    }

    /// An ask of at least `min` units of `bucket` (at least 1, at most its capacity), sized by
    /// the key's demand to cover `need`.
    pub(super) fn ask(&mut self, bucket: Arc<Bucket>, min: u64, need: u64, now: Micros) -> Ask {
        let capacity = bucket.limit.capacity();
        let min = min.clamp(1, capacity);
        let policy = self.shared.config.lease.clone();
        let demand = self.book.demand(&bucket);
        demand.on_refill(now);
        let want = policy.want(demand, need, capacity).max(min);
        Ask {
            bucket,
            min,
            want,
            returned: 0,
            asked_at: now,
        }
    }

    /// Whether `bucket` is still the one the decision path finds (not superseded by a
    /// changed rule and settled, nor dropped).
    pub(super) fn is_current(&self, bucket: &Arc<Bucket>) -> bool {
        self.shared
            .registry
            .bucket(&BucketId::new(&bucket.rule, &self.identity).local_key())
            .is_some_and(|b| Arc::ptr_eq(&b, bucket))
    }

    /// Starts one lease call for `asks`, with the returns that must precede it; its result
    /// comes back as a message.
    pub(super) fn send_request(&mut self, myself: &ActorRef<KeyMsg>, asks: Vec<Ask>) {
        self.in_flight = true;
        for ask in &asks {
            ask.bucket.last.asking(ask.want);
        }
        let returns = std::mem::take(&mut self.returns_first);
        calls::lease(&self.shared, myself, &self.identity, asks, returns);
    }

    /// Whether requests wait on `bucket` for more than the units it holds, some of which it
    /// holds (so a denial must say when all of it fits: see [`KeyState::consolidate`]). A
    /// refill ahead of need finds no such request, and consolidates nothing.
    pub(super) fn waiting_beyond_held(&self, bucket: &Arc<Bucket>) -> bool {
        let held = bucket.units().max(0) as u64;
        let need = self.waiters.largest_need_of(bucket).max(bucket.waiting());
        held > 0 && need > held
    }

    /// The store had no room for what a request lacked while this node held part of it: give
    /// what this node holds back, and ask for all of it, so the store alone decides, from its
    /// own count, whether the request fits and, if not, when it will. (Asking only for the
    /// lacking part would be told a retry-after that assumes the held units survive, and a
    /// window's units die with their window.)
    pub(super) fn consolidate(&mut self, asks: Vec<Ask>, now: Micros) -> Vec<Ask> {
        let mut returns = vec![];
        let mut out = Vec::with_capacity(asks.len());
        for mut ask in asks {
            let given = self.book.give_back(&ask.bucket, now);
            let units: u64 = given.iter().map(|r| r.units).sum();
            returns.extend(given);
            let capacity = ask.bucket.limit.capacity();
            ask.min = (ask.min + units).min(capacity);
            ask.want = ask.want.max(ask.min);
            ask.returned = units.max(1);
            ask.asked_at = now;
            out.push(ask);
        }
        self.returns_first.extend(returns);
        out
    }

    pub(super) fn install(
        &mut self,
        myself: &ActorRef<KeyMsg>,
        ask: &Ask,
        grant: LeaseGrant,
        now: Micros,
    ) {
        let (bucket, min) = (&ask.bucket, ask.min);
        // This node's live leases of the bucket once this grant is held: the store's count
        // less these is the other holders'.
        let own = self.book.leases_of(bucket) + u64::from(grant.units > 0);
        bucket.last.observe(
            grant.remaining,
            grant.reset_after,
            holders_of(grant.live_leases, own),
            now,
        );
        let Some(id) = grant.lease.filter(|_| grant.units > 0) else {
            if !grant.blocked_for.is_zero() {
                // Every later decision for the identity is denied from memory, until the
                // block ends.
                self.shared
                    .penalties
                    .learn(bucket.key.clone(), grant.blocked_for, now);
            }
            bucket.deny_until(min, grant.retry_after, self.shared.config.lease.ttl, now);
            bucket.refill_done();
            return;
        };
        let valid = grant.valid_for.as_micros() as u64;
        let spend_before = if bucket.has_deadline() {
            now + valid
        } else {
            NO_DEADLINE
        };
        bucket.clear_denial();
        // What was admitted on this node's share while the call was out is paid from the
        // grant first (a window's, only if admitted in the grant's window; the others are
        // debited in their own).
        let paid = bucket
            .last
            .pay_owed_from_grant(grant.units, grant.reset_after, now);
        if paid > 0 {
            self.shared.metrics.owed_units.inc_by(paid);
            self.shared.metrics.owed_units_paid_by_grant.inc_by(paid);
        }
        bucket.install(grant.units - paid, spend_before, now);
        bucket.refill_done();
        let metrics = &self.shared.metrics;
        metrics.leases_acquired.inc();
        metrics.lease_units_acquired.inc_by(grant.units);
        self.record_for_peer(bucket, grant.units, now);
        let expires_at = now + valid;
        let lease = HeldLease {
            id,
            units: grant.units,
            granted_at: now,
            expires_at,
        };
        self.book.granted(bucket, lease, ask.asked_at);
        let margin = self.book.return_margin();
        self.schedule_tick(myself, expires_at.saturating_sub(margin), now);
    }

    /// Debits in the store what this identity's buckets admitted while it had stalled (see
    /// `runtime/store_health/debts.rs`): the store answers again.
    pub(super) fn settle_owed(&mut self) {
        let now = self.shared.clock.now_micros();
        let owed: Vec<Debt> = self
            .book
            .buckets()
            .filter_map(|bucket| {
                let (units, admitted_at) = bucket.last.take_owed()?;
                // Consumption as far as the peer region is concerned, as a grant is.
                self.record_for_peer(bucket, units, now);
                Some(Debt {
                    key: bucket.key.clone(),
                    limit: bucket.limit,
                    units,
                    admitted_at,
                })
            })
            .collect();
        background::settle(self.shared.clone(), owed);
    }

    /// Returns leases shortly before they end (see [`LeaseBook::expire`]).
    pub(super) fn expire_leases(&mut self, now: Micros) {
        let returns = self.book.expire(now);
        // Not ordered with lease calls: these go now.
        self.spawn_returns(returns, None);
    }

    /// Returns everything unspent and stops; `reply` is answered once the store has the
    /// units back (or could not take them).
    pub(super) fn finish_shutdown(
        &mut self,
        myself: &ActorRef<KeyMsg>,
        reply: Option<RpcReplyPort<()>>,
        now: Micros,
    ) {
        let mut returns = std::mem::take(&mut self.returns_first);
        returns.extend(self.book.give_back_all(now));
        self.waiters.fail_all(Cause::Down);
        self.spawn_returns(returns, reply);
        myself.stop(Some("shutdown".into()));
    }

    /// Sends the returns that wait for the next lease call alone, when no call is out (a call
    /// out carries them when the next one goes).
    pub(super) fn flush_returns(&mut self) {
        if !self.in_flight && !self.returns_first.is_empty() {
            let returns = std::mem::take(&mut self.returns_first);
            self.spawn_returns(returns, None);
        }
    }

    /// Gives `returns` back to the store in a task of their own; `done` is answered after.
    pub(super) fn spawn_returns(&self, returns: Vec<Return>, done: Option<RpcReplyPort<()>>) {
        calls::give_back(&self.shared, &self.identity, returns, done);
    }

    pub(super) fn schedule_tick(&mut self, myself: &ActorRef<KeyMsg>, at: Micros, now: Micros) {
        // Ticks are coarse (half the return margin at most): a hot key holding thousands of
        // leases expires them in batches, not one timer each.
        let at = at.max(now + self.book.return_margin() / 2);
        if self.next_tick.is_some_and(|t| t <= at) {
            return;
        }
        self.next_tick = Some(at);
        myself.send_after(Duration::from_micros(at.saturating_sub(now)), || {
            KeyMsg::Tick
        });
    }
}
