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

//!
//! Here: the actor and what it does with each message (one method per message);
//! `actor/leasing.rs`: how it sizes, sends and installs leases, and gives units back.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tollgate_lease::{LeaseGrant, Micros, StoreError};

use crate::runtime::fail_modes::Cause;
use crate::runtime::keys::book::{LeaseBook, Return};
use crate::runtime::keys::bucket::{AcquireOutcome, Ask, Bucket, KeyMsg, Want};
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::keys::registry::EVICTABLE_AFTER;
use crate::runtime::keys::waiters::{Waiters, waits_through};
use crate::runtime::shared::Shared;
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
        let me = &myself;
        match msg {
            KeyMsg::Acquire { wants, reply } => state.on_acquire(me, wants, reply, now),
            KeyMsg::Refill {
                bucket,
                min,
                asked_at,
            } => state.on_refill(me, bucket, min, asked_at, now),
            KeyMsg::Late { late, buckets } => state.on_late(late, &buckets),
            KeyMsg::Granted { asks, result } => state.on_granted(me, asks, result, now),
            KeyMsg::Tick => {
                if state.on_tick(me, now) == Next::Stop {
                    return Ok(());
                }
            }
            KeyMsg::Shutdown(reply) => state.on_shutdown(me, reply, now),
            KeyMsg::Forget { bucket } => state.on_forget(&bucket, now),
            KeyMsg::Evict => {
                if state.on_evict(me, now) == Next::Stop {
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

/// Whether the actor goes on after a message, or has stopped itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Go,
    Stop,
}

mod leasing;
#[cfg(test)]
mod tests;

impl KeyState {
    /// A request the lease could not serve: queued as a waiter and served as soon as a lease
    /// holds it (now, or when the lease call it starts lands). While a call is out and late,
    /// only requests that wait through it queue on it; the others fail at once.
    fn on_acquire(
        &mut self,
        myself: &ActorRef<KeyMsg>,
        wants: Vec<Want>,
        reply: RpcReplyPort<AcquireOutcome>,
        now: Micros,
    ) {
        self.last_active = now;
        if let Some(late) = self.late
            && !waits_through(late, &wants)
        {
            let _ = reply.send(AcquireOutcome::Failed(late.into()));
            return;
        }
        for want in &wants {
            self.settle_superseded(&want.bucket, now);
            self.book.open(&want.bucket);
        }
        self.waiters.push(wants, reply);
        self.waiters.serve(now);
        self.request_for_waiters(myself, now);
    }

    /// A refill the decision path asked for ahead of need: one per bucket (the largest `min`,
    /// the first ask), sent at once unless a call is out.
    fn on_refill(
        &mut self,
        myself: &ActorRef<KeyMsg>,
        bucket: Arc<Bucket>,
        min: u64,
        asked_at: Micros,
        now: Micros,
    ) {
        self.last_active = now;
        self.settle_superseded(&bucket, now);
        match self
            .refills
            .iter_mut()
            .find(|p| Arc::ptr_eq(&p.bucket, &bucket))
        {
            Some(pending) => {
                pending.min = pending.min.max(min);
                pending.asked_at = pending.asked_at.min(asked_at);
            }
            None => self.refills.push(PendingRefill {
                bucket,
                min,
                asked_at,
            }),
        }
        if !self.in_flight {
            self.send_refills(myself, now);
        }
    }

    /// The call out is late. No other call can go out before this one ends: the requests
    /// waiting on this identity that do not wait through it are decided now, and new ones are
    /// until it ends.
    fn on_late(&mut self, late: Late, buckets: &[Arc<Bucket>]) {
        self.late = Some(late);
        self.waiters.fail_those_not_waiting_through(late);
        for bucket in buckets {
            bucket.wake_waiters();
        }
    }

    /// The lease call landed: its grants installed (or asked again, or given back when their
    /// definition was superseded meanwhile), or its failure told to every waiter.
    fn on_granted(
        &mut self,
        myself: &ActorRef<KeyMsg>,
        asks: Vec<Ask>,
        result: Result<Vec<LeaseGrant>, StoreError>,
        now: Micros,
    ) {
        self.in_flight = false;
        self.late = None;
        for ask in &asks {
            ask.bucket.call_done();
            ask.bucket.last.asked_done();
        }
        match result {
            Ok(grants) => self.granted(myself, asks, grants, now),
            Err(e) => self.lease_failed(asks, &e, now),
        }
        if let Some(reply) = self.stopping.take() {
            self.finish_shutdown(myself, Some(reply), now);
        }
    }

    fn granted(
        &mut self,
        myself: &ActorRef<KeyMsg>,
        asks: Vec<Ask>,
        grants: Vec<LeaseGrant>,
        now: Micros,
    ) {
        let mut again = vec![];
        let mut stale = vec![];
        for (ask, grant) in asks.into_iter().zip(grants) {
            if !self.is_current(&ask.bucket) {
                // Granted to a definition superseded while the call was out: given back at
                // once, before the new definition leases (a credit under the old limit after
                // that would add units).
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
                && self.waiting_beyond_held(&ask.bucket)
            {
                again.push(ask);
            } else {
                self.install(myself, &ask, grant, now);
            }
        }
        self.returns_first.extend(stale);
        // The store answers: what was admitted while it had stalled is owed to it, and
        // debited now.
        self.settle_owed();
        if again.is_empty() {
            self.waiters.serve(now);
            self.request_for_waiters(myself, now);
            self.send_refills(myself, now);
        } else {
            let asks = self.consolidate(again, now);
            self.send_request(myself, asks);
        }
    }

    fn lease_failed(&mut self, asks: Vec<Ask>, e: &StoreError, now: Micros) {
        let late = matches!(e, StoreError::Timeout { .. });
        if late {
            // The store may have granted the lease after all: for the peer region, count
            // what was asked (under-admission, never over).
            for ask in &asks {
                self.record_for_peer(&ask.bucket, ask.want, now);
            }
        }
        // Refills asked for meanwhile would fail alike: the breaker decides when the store is
        // tried again, not a queue of refills. Units admitted while the store had stalled are
        // forgiven when the call then finds the store unreachable (it was down, not late, and
        // never counted them); a call the store did not answer within the patience leaves
        // them owed, for its next answer.
        let pending = self.refills.drain(..).map(|p| p.bucket);
        let metrics = &self.shared.metrics;
        for bucket in asks.into_iter().map(|a| a.bucket).chain(pending) {
            if !late {
                let forgiven = bucket.last.forgive_owed();
                metrics.owed_units.inc_by(forgiven);
                metrics.owed_units_forgiven.inc_by(forgiven);
            }
            bucket.lease_failed(late);
        }
        self.waiters.fail_all(Cause::of(e));
    }

    /// Leases that ended are expired, owed units of a key that made no call since debited;
    /// an actor idle past the idle timeout, holding nothing, stops.
    fn on_tick(&mut self, myself: &ActorRef<KeyMsg>, now: Micros) -> Next {
        self.next_tick = None;
        self.expire_leases(now);
        if !self.in_flight {
            self.settle_owed();
        }
        let idle_for = Duration::from_micros(now.saturating_sub(self.last_active));
        let holding = self.book.holds_leases();
        if !holding
            && self.waiters.is_empty()
            && !self.in_flight
            && idle_for >= self.shared.config.idle_timeout
        {
            myself.stop(Some("idle".into()));
            return Next::Stop;
        }
        let idle_check = self.last_active + self.shared.config.idle_timeout.as_micros() as u64;
        let next = self
            .book
            .next_expiry()
            .map_or(idle_check, |e| e.min(idle_check));
        self.schedule_tick(myself, next, now);
        Next::Go
    }

    /// The node stops: unspent units go back (a lease on its way too, when it lands).
    fn on_shutdown(&mut self, myself: &ActorRef<KeyMsg>, reply: RpcReplyPort<()>, now: Micros) {
        if self.in_flight {
            self.stopping = Some(reply);
        } else {
            self.finish_shutdown(myself, Some(reply), now);
        }
    }

    /// The store forgot the bucket (an operator's reset): what it holds is given back, what it
    /// owed forgiven, and its local state (a recorded denial, the pre-limit, the LOCAL
    /// fallback) starts full.
    fn on_forget(&mut self, bucket: &Arc<Bucket>, now: Micros) {
        let returns = self.book.give_back(bucket, now);
        self.returns_first.extend(returns);
        // Owed to a bucket the store forgot: nothing left to debit it from.
        let forgiven = bucket.last.forgive_owed();
        self.shared.metrics.owed_units.inc_by(forgiven);
        self.shared.metrics.owed_units_forgiven.inc_by(forgiven);
        bucket.clear_denial();
        if let Some(prelimit) = &bucket.prelimit {
            prelimit.fill();
        }
        bucket.fallback.fill();
    }

    /// The registry is over its budget: an actor idle long enough, with nothing in flight,
    /// gives back what it holds and stops.
    fn on_evict(&mut self, myself: &ActorRef<KeyMsg>, now: Micros) -> Next {
        let idle_for = now.saturating_sub(self.last_active);
        if idle_for >= EVICTABLE_AFTER.as_micros() as u64
            && !self.in_flight
            && self.waiters.is_empty()
            && self.refills.is_empty()
            && self.stopping.is_none()
        {
            self.shared.metrics.key_actors_evicted.inc();
            self.finish_shutdown(myself, None, now);
            return Next::Stop;
        }
        Next::Go
    }
}
