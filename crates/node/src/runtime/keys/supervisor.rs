//! The supervisor of the key actors: it spawns them (linked, so it hears of their end) and
//! cleans the registry after one fails, since a crashed actor cannot clean up after itself.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::runtime::keys::actor::{KeyActor, KeyArgs};
use crate::runtime::keys::bucket::KeyMsg;
use crate::runtime::shared::Shared;

/// Messages of the supervisor.
#[derive(Debug)]
pub enum SupervisorMsg {
    /// Spawn the actor of an identity.
    Spawn {
        /// The identity.
        identity: Vec<u8>,
        /// The new actor, or None if it could not start.
        reply: RpcReplyPort<Option<ActorRef<KeyMsg>>>,
    },
}

/// The supervisor's behaviour.
#[derive(Debug)]
pub struct KeySupervisor;

impl Actor for KeySupervisor {
    type Msg = SupervisorMsg;
    type State = Arc<Shared>;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _: ActorRef<SupervisorMsg>,
        shared: Arc<Shared>,
    ) -> Result<Arc<Shared>, ActorProcessingErr> {
        Ok(shared)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        shared: &mut Arc<Shared>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Spawn { identity, reply } => {
                let args = KeyArgs {
                    identity,
                    shared: shared.clone(),
                };
                let spawned = Actor::spawn_linked(None, KeyActor, args, myself.get_cell()).await;
                let _ = reply.send(spawned.ok().map(|(actor, _)| actor));
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        shared: &mut Arc<Shared>,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, error) = event {
            tracing::error!(%error, "a key actor failed; its leases expire on their own");
            let actor: ActorRef<KeyMsg> = cell.into();
            shared.registry.remove_buckets_of(&actor);
            if let Some(identity) = shared.registry.identity_of(&actor) {
                shared.registry.remove_actor(&identity, &actor);
            }
            shared.metrics.key_actors.dec();
        }
        Ok(())
    }
}
