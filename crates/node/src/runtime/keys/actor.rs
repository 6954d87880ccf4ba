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

use crate::runtime::node::region::allowance_of;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tollgate_lease::{
    BucketKey, LeaseAsk, LeaseGrant, LeaseId, LeaseRequest, LeaseReturn, Micros, ReturnRequest,
    StoreError,
};

use crate::rules::FailMode;
use crate::runtime::background;
use crate::runtime::debts::Debt;
use crate::runtime::keys::bucket::{AcquireOutcome, Ask, KeyMsg, Want};
use crate::runtime::keys::bucket::{Bucket, NO_DEADLINE};
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::keys::last_answer::holders_of;
use crate::runtime::keys::registry::EVICTABLE_AFTER;
use crate::runtime::lateness::Late;
use crate::runtime::shared::Shared;
use crate::runtime::sizing::Demand;

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

#[derive(Debug)]
struct HeldLease {
    id: LeaseId,
    units: u64,
    granted_at: Micros,
    expires_at: Micros,
}

/// Units going back to the store under one lease.
#[derive(Debug)]
struct Return {
    bucket: Arc<Bucket>,
    lease: LeaseId,
    units: u64,
    /// When the lease was granted (its consumption was recorded for the peer then).
    granted_at: Micros,
    /// Whether the grant was recorded for the peer region (so the return is taken back).
    recorded: bool,
}

/// Which leases: a rule definition's bucket. When a rule changes, the old definition's
/// leases are kept apart under their own key, never spent again, and returned when they end.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HeldKey {
    /// The rule definition.
    uid: u64,
    /// The bucket's store key.
    key: BucketKey,
}

impl HeldKey {
    fn of(bucket: &Bucket) -> Self {
        HeldKey {
            uid: bucket.rule.uid,
            key: bucket.key.clone(),
        }
    }
}

#[derive(Debug)]
struct Held {
    bucket: Arc<Bucket>,
    leases: VecDeque<HeldLease>,
    demand: Demand,
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

#[derive(Debug)]
struct Waiter {
    wants: Vec<Want>,
    reply: RpcReplyPort<AcquireOutcome>,
}

/// The actor's state.
#[derive(Debug)]
pub struct KeyState {
    identity: Vec<u8>,
    shared: Arc<Shared>,
    held: HashMap<HeldKey, Held>,
    waiters: VecDeque<Waiter>,
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
            shared: args.shared,
            held: HashMap::new(),
            waiters: VecDeque::new(),
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
                    let _ = reply.send(AcquireOutcome::Failed(late_error(&state.shared, late)));
                    return Ok(());
                }
                for want in &wants {
                    state.settle_superseded(&want.bucket, now);
                    state.hold(&want.bucket);
                }
                state.waiters.push_back(Waiter { wants, reply });
                state.serve(now);
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
                let error = late_error(&state.shared, late);
                let (stay, decided): (VecDeque<_>, VecDeque<_>) = state
                    .waiters
                    .drain(..)
                    .partition(|w| waits_through(late, &w.wants));
                state.waiters = stay;
                for waiter in decided {
                    let _ = waiter.reply.send(AcquireOutcome::Failed(error.clone()));
                }
                for bucket in &buckets {
                    bucket.wake_waiters();
                }
            }
            KeyMsg::Granted { asks, result } => {
                state.in_flight = false;
                state.late = None;
                for ask in &asks {
                    ask.bucket.call_done();
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
                            state.serve(now);
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
                        for waiter in state.waiters.drain(..) {
                            let _ = waiter.reply.send(AcquireOutcome::Failed(e.clone()));
                        }
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
                let holding = state.held.values().any(|h| !h.leases.is_empty());
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
        for held in state.held.values() {
            // Anything still held is returned by Shutdown; an idle actor holds nothing.
            state
                .shared
                .registry
                .remove_bucket(&BucketId::new(&held.bucket.rule, &state.identity).local_key());
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
        if bucket.rule.synced()
            && let Some(region) = self.shared.region.get()
        {
            region.record(&bucket.rule.key, &self.identity, &bucket.limit, units, now);
        }
    }

    /// The leases of `bucket`, keyed by rule definition and key: when a rule changes, the old
    /// definition's leases are kept apart, never spent again, and returned when they end.
    fn hold(&mut self, bucket: &Arc<Bucket>) -> &mut Held {
        self.held
            .entry(HeldKey::of(bucket))
            .or_insert_with(|| Held {
                bucket: bucket.clone(),
                leases: VecDeque::new(),
                demand: Demand::default(),
            })
    }

    /// Settles the leases an older definition of `bucket`'s rule holds on the same key: what
    /// they hold unspent goes back to the store (credited under the definition it was taken
    /// under) before the new definition leases anything, so a changed limit starts from the
    /// key's true count: neither the units spent under the old definition nor the ones held
    /// unspent are lost or counted twice.
    fn settle_superseded(&mut self, bucket: &Arc<Bucket>, now: Micros) {
        let uid = bucket.rule.uid;
        let superseded: Vec<HeldKey> = self
            .held
            .keys()
            .filter(|k| k.key == bucket.key && k.uid != uid)
            .cloned()
            .collect();
        if superseded.is_empty() {
            return;
        }
        let mut returns = vec![];
        for name in superseded {
            let waited_on = self
                .waiters
                .iter()
                .flat_map(|w| &w.wants)
                .any(|w| w.bucket.key == bucket.key && w.bucket.rule.uid != uid);
            let held = if waited_on {
                // A request still on the old definition waits for it: keep the entry, empty.
                self.held.get_mut(&name).expect("listed above")
            } else {
                let held = self.held.remove(&name).expect("listed above");
                self.shared
                    .registry
                    .remove_bucket(&BucketId::new(&held.bucket.rule, &self.identity).local_key());
                returns.extend(unspent_returns(held.bucket.clone(), held.leases, now));
                continue;
            };
            let leases = std::mem::take(&mut held.leases);
            returns.extend(unspent_returns(held.bucket.clone(), leases, now));
        }
        self.returns_first.extend(returns);
    }

    /// Serves every waiter that the leases (or a recorded denial) can answer now.
    fn serve(&mut self, now: Micros) {
        let mut still = VecDeque::with_capacity(self.waiters.len());
        while let Some(waiter) = self.waiters.pop_front() {
            // The decision path stopped waiting (and decided without these units): taking
            // them now would strand them.
            if waiter.reply.is_closed() {
                continue;
            }
            if let Some((index, retry_after)) = waiter
                .wants
                .iter()
                .enumerate()
                .find_map(|(i, w)| w.bucket.denied_for(w.cost, now).map(|r| (i, r)))
            {
                let _ = waiter
                    .reply
                    .send(AcquireOutcome::Denied { index, retry_after });
            } else if take_all(&waiter.wants, now) {
                if waiter.reply.send(AcquireOutcome::Reserved).is_err() {
                    for want in &waiter.wants {
                        want.bucket.give_back(want.cost);
                    }
                }
            } else {
                still.push_back(waiter);
            }
        }
        self.waiters = still;
    }

    /// Asks the store for what the waiting requests need, unless a call is already out.
    fn request_for_waiters(&mut self, myself: &ActorRef<KeyMsg>, now: Micros) {
        if self.in_flight || self.waiters.is_empty() {
            return;
        }
        // Per bucket: units all waiters need beyond what is held, and the first one's need.
        let mut needs: Vec<(Arc<Bucket>, u64, u64)> = vec![];
        for waiter in &self.waiters {
            for want in &waiter.wants {
                match needs
                    .iter_mut()
                    .find(|(b, _, _)| Arc::ptr_eq(b, &want.bucket))
                {
                    Some(entry) => entry.1 += want.cost,
                    None => needs.push((want.bucket.clone(), want.cost, want.cost)),
                }
            }
        }
        let mut asks = vec![];
        for (bucket, total, first) in needs {
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
        let held = self.hold(&bucket);
        held.demand.on_refill(now);
        let want = policy.want(&held.demand, need, capacity).max(min);
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

    /// Starts one lease call for `asks`; its result comes back as a message.
    fn send_request(&mut self, myself: &ActorRef<KeyMsg>, asks: Vec<Ask>) {
        self.in_flight = true;
        let policy = &self.shared.config.lease;
        let lease_asks = asks
            .iter()
            .map(|a| LeaseAsk {
                key: a.bucket.key.clone(),
                limit: a.bucket.limit,
                want: a.want,
                min: a.min,
                max_share: policy.max_share,
            })
            .collect();
        let allowances = asks
            .iter()
            .map(|a| allowance_of(&self.shared, &a.bucket.rule, &a.bucket.limit))
            .collect();
        let request =
            LeaseRequest::new(lease_asks, policy.ttl).and_then(|r| r.with_allowances(allowances));
        let shared = self.shared.clone();
        let myself = myself.clone();
        // Returns that must precede this call go first, in the same task.
        let returns = std::mem::take(&mut self.returns_first);
        let identity = self.identity.clone();
        tokio::spawn(async move {
            give_back(&shared, &identity, returns).await;
            let result = match request {
                Ok(req) => {
                    let buckets: Vec<Arc<Bucket>> = asks.iter().map(|a| a.bucket.clone()).collect();
                    let told = myself.clone();
                    shared
                        .store
                        .acquire_leases(&req, move |late| {
                            for bucket in &buckets {
                                bucket.set_late(late);
                            }
                            let _ = told.cast(KeyMsg::Late {
                                late,
                                buckets: buckets.clone(),
                            });
                        })
                        .await
                }
                Err(e) => Err(StoreError::Invalid(e)),
            };
            let _ = myself.cast(KeyMsg::Granted { asks, result });
        });
    }

    /// Whether requests wait on `bucket` for more than the units it holds, some of which it
    /// holds (so a denial must say when all of it fits: see [`KeyState::consolidate`]). A
    /// refill ahead of need finds no such request, and consolidates nothing.
    fn waiting_beyond_held(&self, bucket: &Arc<Bucket>) -> bool {
        let held = bucket.units().max(0) as u64;
        let queued: u64 = self
            .waiters
            .iter()
            .flat_map(|w| &w.wants)
            .filter(|w| Arc::ptr_eq(&w.bucket, bucket))
            .map(|w| w.cost)
            .max()
            .unwrap_or(0);
        let need = queued.max(bucket.waiting());
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
            let held = self.hold(&ask.bucket);
            let leases = std::mem::take(&mut held.leases);
            let given = unspent_returns(ask.bucket.clone(), leases, now);
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
        let own = self.hold(bucket).leases.len() as u64 + u64::from(grant.units > 0);
        bucket.last.observe(
            grant.remaining,
            grant.reset_after,
            holders_of(grant.live_leases, own),
            now,
        );
        let Some(id) = grant.lease.filter(|_| grant.units > 0) else {
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
        bucket.install(grant.units, spend_before, now);
        bucket.refill_done();
        let metrics = &self.shared.metrics;
        metrics.leases_acquired.inc();
        metrics.lease_units_acquired.inc_by(grant.units);
        self.record_for_peer(bucket, grant.units, now);
        let expires_at = now + valid;
        let held = self.hold(bucket);
        held.demand.on_grant(now, grant.units, ask.asked_at);
        held.leases.push_back(HeldLease {
            id,
            units: grant.units,
            granted_at: now,
            expires_at,
        });
        let margin = self.return_margin();
        self.schedule_tick(myself, expires_at.saturating_sub(margin), now);
    }

    /// Debits in the store what this identity's buckets admitted while it had stalled (see
    /// `runtime/debts.rs`): the store answers again.
    fn settle_owed(&mut self) {
        let now = self.shared.clock.now_micros();
        let owed: Vec<Debt> = self
            .held
            .values()
            .filter_map(|h| {
                let (units, admitted_at) = h.bucket.last.take_owed()?;
                // Consumption as far as the peer region is concerned, as a grant is.
                self.record_for_peer(&h.bucket, units, now);
                Some(Debt {
                    key: h.bucket.key.clone(),
                    limit: h.bucket.limit,
                    units,
                    admitted_at,
                })
            })
            .collect();
        background::settle(self.shared.clone(), owed);
    }

    /// Returns leases shortly before they end (older ones are spent first, so what is unspent
    /// belongs to the newest), and a window's units die with the window.
    fn expire_leases(&mut self, now: Micros) {
        let margin = self.return_margin();
        let mut returns = vec![];
        for held in self.held.values_mut() {
            // Units are spent oldest lease first, so what is unspent belongs to the newest
            // leases: an ending lease's share is what the unspent units exceed the leases
            // after it by, at most its grant. That share goes back under its id.
            let mut after: u64 = held.leases.iter().map(|l| l.units).sum();
            while let Some(front) = held.leases.front() {
                if front.expires_at > now + margin {
                    break;
                }
                let lease = held.leases.pop_front().expect("front exists");
                after -= lease.units;
                let unspent = held.bucket.units().max(0) as u64;
                let share = unspent.saturating_sub(after).min(lease.units);
                let taken = held.bucket.reclaim_up_to(share);
                if taken > 0 && lease.expires_at > now {
                    returns.push(Return {
                        bucket: held.bucket.clone(),
                        lease: lease.id,
                        units: taken,
                        granted_at: lease.granted_at,
                        recorded: true,
                    });
                }
            }
        }
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
        for held in self.held.values_mut() {
            let leases = std::mem::take(&mut held.leases);
            returns.extend(unspent_returns(held.bucket.clone(), leases, now));
        }
        for waiter in self.waiters.drain(..) {
            let _ = waiter
                .reply
                .send(AcquireOutcome::Failed(StoreError::Unavailable(
                    "node shutting down".into(),
                )));
        }
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
        if returns.is_empty() {
            if let Some(done) = done {
                let _ = done.send(());
            }
            return;
        }
        let shared = self.shared.clone();
        let identity = self.identity.clone();
        tokio::spawn(async move {
            give_back(&shared, &identity, returns).await;
            if let Some(done) = done {
                let _ = done.send(());
            }
        });
    }

    fn next_expiry(&self) -> Option<Micros> {
        let margin = self.return_margin();
        self.held
            .values()
            .filter_map(|h| {
                h.leases
                    .front()
                    .map(|l| l.expires_at.saturating_sub(margin))
            })
            .min()
    }

    /// How long before a lease ends its unspent units are returned.
    fn return_margin(&self) -> u64 {
        (self.shared.config.lease.ttl.as_micros() as u64 / 10).min(100_000)
    }

    fn schedule_tick(&mut self, myself: &ActorRef<KeyMsg>, at: Micros, now: Micros) {
        // Ticks are coarse (half the return margin at most): a hot key holding thousands of
        // leases expires them in batches, not one timer each.
        let at = at.max(now + self.return_margin() / 2);
        if self.next_tick.is_some_and(|t| t <= at) {
            return;
        }
        self.next_tick = Some(at);
        myself.send_after(Duration::from_micros(at.saturating_sub(now)), || {
            KeyMsg::Tick
        });
    }
}

/// Gives `returns` back to the store, and takes what it credits back from the peer region's
/// count.
async fn give_back(shared: &Shared, identity: &[u8], returns: Vec<Return>) {
    if returns.is_empty() {
        return;
    }
    let items = returns
        .iter()
        .map(|r| LeaseReturn {
            key: r.bucket.key.clone(),
            limit: r.bucket.limit,
            lease: r.lease.clone(),
            unspent: r.units,
        })
        .collect();
    let allowances = returns
        .iter()
        .map(|r| allowance_of(shared, &r.bucket.rule, &r.bucket.limit))
        .collect();
    let Ok(req) = ReturnRequest::new(items).and_then(|r| r.with_allowances(allowances)) else {
        return;
    };
    match shared.store.return_leases(&req).await {
        Ok(credited) => {
            let metrics = &shared.metrics;
            for (r, units) in returns.iter().zip(credited) {
                if units == 0 {
                    continue;
                }
                metrics.leases_returned.inc();
                metrics.lease_units_returned.inc_by(units);
                // Back in this region's store: not the peer's to count any more.
                if r.recorded
                    && r.bucket.rule.synced()
                    && let Some(region) = shared.region.get()
                {
                    region.unrecord(
                        &r.bucket.rule.key,
                        identity,
                        &r.bucket.limit,
                        units,
                        r.granted_at,
                    );
                }
            }
        }
        // Unreturned units stay consumed until the lease expires: under-admission only.
        Err(e) => tracing::debug!(error = %e, "lease return failed"),
    }
}

/// Takes back what `bucket` holds unspent and spreads it over `leases` for return, newest
/// first (its grant is the most likely to cover what is unspent); ended leases are skipped.
fn unspent_returns(
    bucket: Arc<Bucket>,
    mut leases: VecDeque<HeldLease>,
    now: Micros,
) -> Vec<Return> {
    let mut left = bucket.reclaim();
    let mut returns = vec![];
    while let Some(lease) = leases.pop_back() {
        let give = left.min(lease.units);
        if give > 0 && lease.expires_at > now {
            returns.push(Return {
                bucket: bucket.clone(),
                lease: lease.id,
                units: give,
                granted_at: lease.granted_at,
                recorded: true,
            });
            left -= give;
        }
    }
    returns
}

/// Takes every want's units, or none.
pub fn take_all(wants: &[Want], now: Micros) -> bool {
    for (i, want) in wants.iter().enumerate() {
        if !want.bucket.try_take(want.cost, || now) {
            for taken in &wants[..i] {
                taken.bucket.give_back(taken.cost);
            }
            return false;
        }
    }
    true
}

/// Whether a request for `wants` waits through a late call: every request when the store is
/// down does not; when it stalled, those under a CLOSED rule do (one late call must not deny a
/// real user: they wait for the answer, up to the patience, or until the store is down).
fn waits_through(late: Late, wants: &[Want]) -> bool {
    late == Late::Stalled
        && wants
            .iter()
            .any(|w| w.bucket.rule.fail_mode == FailMode::Closed)
}

/// What a request that does not wait through a late call is told.
fn late_error(shared: &Shared, late: Late) -> StoreError {
    match late {
        Late::Stalled => StoreError::Timeout {
            budget: shared.store.budget(),
        },
        Late::Down => StoreError::Unavailable("circuit breaker open".into()),
    }
}
