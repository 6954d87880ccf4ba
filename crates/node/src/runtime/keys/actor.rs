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

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tollgate_lease::Micros;

use crate::runtime::keys::book::{LeaseBook, Return};
use crate::runtime::keys::bucket::{Bucket, KeyMsg};
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::keys::waiters::Waiters;
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
mod messages;
#[cfg(test)]
mod tests;
