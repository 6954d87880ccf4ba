//! The per-key actor: one per identity active on this node. It holds the identity's leases,
//! refills them (before they run dry), returns what is unspent when they end or when the node
//! stops, and stops itself once the key has been idle.
//!
//! The decision path talks to it only when a lease cannot serve a request (a cold key, a lease
//! run dry, a window ended), or to ask for a refill ahead of time. Lease calls run in spawned
//! tasks that report back as messages: requests that arrive meanwhile queue as waiters and are
//! served together when the lease arrives, or failed together if the store fails or the call
//! passes its budget (none waits behind another's timeout). Returns of unspent units run in
//! spawned tasks too: the actor never awaits the store. A return that must reach the store
//! before the next lease call (a superseded definition's units, or units given back to ask
//! for all of a request at once) rides in front of that call, in the same task.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tollgate_lease::{LeaseGrant, Micros, StoreError};

use crate::runtime::fail_modes::Cause;
use crate::runtime::keys::book::{HeldLease, LeaseBook, Return};
use crate::runtime::keys::bucket::{AcquireOutcome, Ask, KeyMsg};
use crate::runtime::keys::bucket::{Bucket, NO_DEADLINE};
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::keys::calls;
use crate::runtime::keys::last_answer::holders_of;
use crate::runtime::keys::registry::EVICTABLE_AFTER;
use crate::runtime::keys::waiters::{Need, Waiters, waits_through};
use crate::runtime::shared::Shared;
use crate::runtime::store_health::background;
use crate::runtime::store_health::debts::Debt;
use crate::runtime::store_health::lateness::Late;

/// The actor's behaviour (stateless; state lives in [`KeyState`]).
#[derive(Debug)]
pub struct KeyActor;

/// Startup arguments.
#[derive(Debug)]
pub struct KeyArgs {
    /// The identity (hash tag) this actor serves.
    pub identity: Vec<u8>,
    /// Runtime-wide pieces.
    pub shared: Arc<Shared>,
}

/// A refill the decision path asked for, waiting for the call out to land.
#[derive(Debug)]
struct PendingRefill {
    bucket: Arc<Bucket>,
    /// Fewest units worth taking.
    min: u64,
    /// When the decision path first asked.
    asked_at: Micros,
}

/// The actor's state.
#[derive(Debug)]
pub struct KeyState {
    identity: Vec<u8>,
    shared: Arc<Shared>,
    book: LeaseBook,
    waiters: Waiters,
    in_flight: bool,
    /// The call out is late: the store stalled (requests that do not fail closed are not kept
    /// waiting on it), or is down (no request is).
    late: Option<Late>,
    /// Refills asked for while a store call was out: sent when it lands (bucket, min).
    refills: Vec<PendingRefill>,
    last_active: Micros,
    next_tick: Option<Micros>,
    /// A shutdown waiting for the lease call in flight, whose units must be returned too.
    stopping: Option<RpcReplyPort<()>>,
    /// Returns that must reach the store before the next lease call goes out: they ride in
    /// front of it, or go alone when no call follows (see [`KeyState::flush_returns`]).
    returns_first: Vec<Return>,
}

impl Actor for KeyActor {
    type Msg = KeyMsg;
    type State = KeyState;
    type Arguments = KeyArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<KeyMsg>,
        args: KeyArgs,
    ) -> Result<KeyState, ActorProcessingErr> {
        let now = args.shared.clock.now_micros();
        args.shared.metrics.key_actors.inc();
        let mut state = KeyState {
            identity: args.identity,
            book: LeaseBook::new(args.shared.config.lease.ttl),
            shared: args.shared,
            waiters: Waiters::default(),
            in_flight: false,
            late: None,
            refills: vec![],
            last_active: now,
            next_tick: None,
            stopping: None,
            returns_first: vec![],
        };
        let idle = state.shared.config.idle_timeout;
        state.schedule_tick(&myself, now + idle.as_micros() as u64, now);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<KeyMsg>,
        msg: KeyMsg,
        state: &mut KeyState,
    ) -> Result<(), ActorProcessingErr> {
        let now = state.shared.clock.now_micros();
        match msg {
            KeyMsg::Acquire { wants, reply } => {
                state.last_active = now;
                if let Some(late) = state.late
                    && !waits_through(late, &wants)
                {
                    // A call is out and late: only requests that wait through it queue on it.
                    let _ = reply.send(AcquireOutcome::Failed(late.into()));
                    return Ok(());
                }
                for want in &wants {
                    state.settle_superseded(&want.bucket, now);
                    state.book.open(&want.bucket);
                }
                state.waiters.push(wants, reply);
                state.waiters.serve(now);
                state.request_for_waiters(&myself, now);
            }
            KeyMsg::Refill {
                bucket,
                min,
                asked_at,
            } => {
                state.last_active = now;
                state.settle_superseded(&bucket, now);
                match state
                    .refills
                    .iter_mut()
                    .find(|p| Arc::ptr_eq(&p.bucket, &bucket))
                {
                    Some(pending) => {
                        pending.min = pending.min.max(min);
                        pending.asked_at = pending.asked_at.min(asked_at);
                    }
                    None => state.refills.push(PendingRefill {
                        bucket,
                        min,
                        asked_at,
                    }),
                }
                if !state.in_flight {
                    state.send_refills(&myself, now);
                }
            }
            KeyMsg::Late { late, buckets } => {
                // No other call can go out before this one ends: the requests waiting on this
                // identity that do not wait through it are decided now, and new ones are until
                // it ends.
                state.late = Some(late);
                state.waiters.fail_those_not_waiting_through(late);
                for bucket in &buckets {
                    bucket.wake_waiters();
                }
            }
            KeyMsg::Granted { asks, result } => {
                state.in_flight = false;
                state.late = None;
                for ask in &asks {
                    ask.bucket.call_done();
                    ask.bucket.last.asked_done();
                }
                match result {
                    Ok(grants) => {
                        let mut again = vec![];
                        let mut stale = vec![];
                        for (ask, grant) in asks.into_iter().zip(grants) {
                            if !state.is_current(&ask.bucket) {
                                // Granted to a definition superseded while the call was out:
                                // given back at once, before the new definition leases (a
                                // credit under the old limit after that would add units).
                                if let Some(id) = grant.lease.filter(|_| grant.units > 0) {
                                    stale.push(Return {
                                        bucket: ask.bucket.clone(),
                                        lease: id,
                                        units: grant.units,
                                        granted_at: now,
                                        recorded: false,
                                    });
                                }
                                ask.bucket.refill_done();
                            } else if grant.units == 0
                                && grant.blocked_for.is_zero()
                                && ask.returned == 0
                                && state.waiting_beyond_held(&ask.bucket)
                            {
                                again.push(ask);
                            } else {
                                state.install(&myself, &ask, grant, now);
                            }
                        }
                        state.returns_first.extend(stale);
                        // The store answers: what was admitted while it had stalled is owed
                        // to it, and debited now.
                        state.settle_owed();
                        if again.is_empty() {
                            state.waiters.serve(now);
                            state.request_for_waiters(&myself, now);
                            state.send_refills(&myself, now);
                        } else {
                            let asks = state.consolidate(again, now);
                            state.send_request(&myself, asks);
                        }
                    }
                    Err(e) => {
                        if matches!(e, StoreError::Timeout { .. }) {
                            // The store may have granted the lease after all: for the peer
                            // region, count what was asked (under-admission, never over).
                            for ask in &asks {
                                state.record_for_peer(&ask.bucket, ask.want, now);
                            }
                        }
                        // Refills asked for meanwhile would fail alike: the breaker decides
                        // when the store is tried again, not a queue of refills. Units admitted
                        // while the store had stalled are forgiven when the call then finds
                        // the store unreachable (it was down, not late, and never counted
                        // them); a call the store did not answer within the patience leaves
                        // them owed, for its next answer.
                        let late = matches!(e, StoreError::Timeout { .. });
                        let pending = state.refills.drain(..).map(|p| p.bucket);
                        let metrics = &state.shared.metrics;
                        for bucket in asks.into_iter().map(|a| a.bucket).chain(pending) {
                            if !late {
                                let forgiven = bucket.last.forgive_owed();
                                metrics.owed_units.inc_by(forgiven);
                                metrics.owed_units_forgiven.inc_by(forgiven);
                            }
                            bucket.lease_failed(late);
                        }
                        state.waiters.fail_all(Cause::of(&e));
                    }
                }
                if let Some(reply) = state.stopping.take() {
                    state.finish_shutdown(&myself, Some(reply), now);
                }
            }
            KeyMsg::Tick => {
                state.next_tick = None;
                state.expire_leases(now);
                if !state.in_flight {
                    // Owed units of a key that made no lease call since: debited now.
                    state.settle_owed();
                }
                let idle_for = Duration::from_micros(now.saturating_sub(state.last_active));
                let holding = state.book.holds_leases();
                if !holding
                    && state.waiters.is_empty()
                    && !state.in_flight
                    && idle_for >= state.shared.config.idle_timeout
                {
                    myself.stop(Some("idle".into()));
                    return Ok(());
                }
                let idle_check =
                    state.last_active + state.shared.config.idle_timeout.as_micros() as u64;
                let next = state
                    .book
                    .next_expiry()
                    .map_or(idle_check, |e| e.min(idle_check));
                state.schedule_tick(&myself, next, now);
            }
            KeyMsg::Shutdown(reply) => {
                if state.in_flight {
                    // The lease on its way must be returned too: finish when it lands.
                    state.stopping = Some(reply);
                } else {
                    state.finish_shutdown(&myself, Some(reply), now);
                }
            }
            KeyMsg::Forget { bucket } => {
                let returns = state.book.give_back(&bucket, now);
                state.returns_first.extend(returns);
                // Owed to a bucket the store forgot: nothing left to debit it from.
                let forgiven = bucket.last.forgive_owed();
                state.shared.metrics.owed_units.inc_by(forgiven);
                state.shared.metrics.owed_units_forgiven.inc_by(forgiven);
                bucket.clear_denial();
                if let Some(prelimit) = &bucket.prelimit {
                    prelimit.fill();
                }
                bucket.fallback.fill();
            }
            KeyMsg::Evict => {
                let idle_for = now.saturating_sub(state.last_active);
                if idle_for >= EVICTABLE_AFTER.as_micros() as u64
                    && !state.in_flight
                    && state.waiters.is_empty()
                    && state.refills.is_empty()
                    && state.stopping.is_none()
                {
                    state.shared.metrics.key_actors_evicted.inc();
                    state.finish_shutdown(&myself, None, now);
                    return Ok(());
                }
            }
        }
        state.flush_returns();
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<KeyMsg>,
        state: &mut KeyState,
    ) -> Result<(), ActorProcessingErr> {
        for bucket in state.book.buckets() {
            // Anything still held is returned by Shutdown; an idle actor holds nothing.
            state
                .shared
                .registry
                .remove_bucket(&BucketId::new(&bucket.rule, &state.identity).local_key());
        }
        state.shared.registry.remove_actor(&state.identity, &myself);
        state.shared.metrics.key_actors.dec();
        Ok(())
    }
}

impl KeyState {
    /// A lease is consumption as far as this region's store is concerned: under a rule that
    /// syncs, the peer region learns of it now, not as the units are spent (units returned
    /// unspent stay counted there until the window ends: under-admission, never over).
    fn record_for_peer(&self, bucket: &Bucket, units: u64, now: Micros) {
        self.shared
            .record_for_peer(&bucket.rule, &self.identity, &bucket.limit, units, now);
    }

    /// Settles the leases an older definition of `bucket`'s rule holds on the same key (see
    /// [`LeaseBook::supersede`]): their unspent units go back before the next lease call,
    /// and the decision path no longer finds their buckets.
    fn settle_superseded(&mut self, bucket: &Arc<Bucket>, now: Micros) {
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
    fn request_for_waiters(&mut self, myself: &ActorRef<KeyMsg>, now: Micros) {
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
    fn send_refills(&mut self, myself: &ActorRef<KeyMsg>, now: Micros) {
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
    fn ask(&mut self, bucket: Arc<Bucket>, min: u64, need: u64, now: Micros) -> Ask {
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
    fn is_current(&self, bucket: &Arc<Bucket>) -> bool {
        self.shared
            .registry
            .bucket(&BucketId::new(&bucket.rule, &self.identity).local_key())
            .is_some_and(|b| Arc::ptr_eq(&b, bucket))
    }

    /// Starts one lease call for `asks`, with the returns that must precede it; its result
    /// comes back as a message.
    fn send_request(&mut self, myself: &ActorRef<KeyMsg>, asks: Vec<Ask>) {
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
    fn waiting_beyond_held(&self, bucket: &Arc<Bucket>) -> bool {
        let held = bucket.units().max(0) as u64;
        let need = self.waiters.largest_need_of(bucket).max(bucket.waiting());
        held > 0 && need > held
    }

    /// The store had no room for what a request lacked while this node held part of it: give
    /// what this node holds back, and ask for all of it, so the store alone decides, from its
    /// own count, whether the request fits and, if not, when it will. (Asking only for the
    /// lacking part would be told a retry-after that assumes the held units survive, and a
    /// window's units die with their window.)
    fn consolidate(&mut self, asks: Vec<Ask>, now: Micros) -> Vec<Ask> {
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

    fn install(&mut self, myself: &ActorRef<KeyMsg>, ask: &Ask, grant: LeaseGrant, now: Micros) {
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
    fn settle_owed(&mut self) {
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
    fn expire_leases(&mut self, now: Micros) {
        let returns = self.book.expire(now);
        // Not ordered with lease calls: these go now.
        self.spawn_returns(returns, None);
    }

    /// Returns everything unspent and stops; `reply` is answered once the store has the
    /// units back (or could not take them).
    fn finish_shutdown(
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
    fn flush_returns(&mut self) {
        if !self.in_flight && !self.returns_first.is_empty() {
            let returns = std::mem::take(&mut self.returns_first);
            self.spawn_returns(returns, None);
        }
    }

    /// Gives `returns` back to the store in a task of their own; `done` is answered after.
    fn spawn_returns(&self, returns: Vec<Return>, done: Option<RpcReplyPort<()>>) {
        calls::give_back(&self.shared, &self.identity, returns, done);
    }

    fn schedule_tick(&mut self, myself: &ActorRef<KeyMsg>, at: Micros, now: Micros) {
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
