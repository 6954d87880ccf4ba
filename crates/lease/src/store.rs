//! The store trait every decision goes through, and [`Store`], the backend chosen at run time.

use crate::error::StoreError;
use crate::key::BucketKey;
#[cfg(feature = "linked")]
use crate::link::LinkedStore;
use crate::memory::MemoryStore;
use crate::ops::allowance::DemandRequest;
use crate::ops::check::{CheckOutcome, CheckRequest};
use crate::ops::counter::HeldLeases;
use crate::ops::debit::DebitRequest;
use crate::ops::lease::{LeaseGrant, LeaseRequest, ReturnRequest};
use crate::ops::penalty::{Lift, Penalty, PenaltyState};
use crate::ops::slot::{SlotRelease, SlotRenew};
use crate::redis::RedisStore;

pub use crate::lease_store::LeaseStore;

/// The store a node runs on, chosen by configuration.
#[derive(Debug, Clone)]
pub enum Store {
    /// In process (single node, tests, simulations).
    Memory(MemoryStore),
    /// Redis, single or cluster.
    Redis(RedisStore),
    /// The in-memory store behind a link that can be slowed, stalled or cut (the chaos
    /// simulations' store; with the `linked` feature).
    #[cfg(feature = "linked")]
    Linked(LinkedStore),
}

impl Store {
    /// The in-memory store underneath (itself, or behind the chaos link); None on Redis.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            Store::Memory(memory) => Some(memory),
            #[cfg(feature = "linked")]
            Store::Linked(linked) => Some(linked.memory()),
            Store::Redis(_) => None,
        }
    }

    /// The in-memory store a node owns, and so sweeps of expired keys (None behind the chaos
    /// link: a simulation shares one store among many nodes and sweeps it once itself).
    pub fn owned_memory(&self) -> Option<&MemoryStore> {
        match self {
            Store::Memory(memory) => Some(memory),
            _ => None,
        }
    }

    /// The same store with another budget per call (see [`RedisStore::with_budget`]; the
    /// in-memory store answers at once whatever the budget).
    pub fn with_budget(&self, budget: std::time::Duration) -> Store {
        match self {
            Store::Memory(s) => Store::Memory(s.clone()),
            Store::Redis(s) => Store::Redis(s.with_budget(budget)),
            #[cfg(feature = "linked")]
            Store::Linked(s) => Store::Linked(s.with_budget(budget)),
        }
    }

    /// Makes the next call cost one round trip (see [`RedisStore::warm_up`]); the in-memory
    /// store is always ready, a linked one as its node's session says
    /// (`LinkedStore::warm_up`).
    pub async fn warm_up(&self, timeout: std::time::Duration) -> Result<(), StoreError> {
        match self {
            Store::Memory(_) => Ok(()),
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.warm_up(timeout).await,
            Store::Redis(s) => s.warm_up(timeout).await,
        }
    }

    /// Lets the runtime run what is queued before the calling task, twice (a batched call's
    /// answer takes two hops to its caller): how long it takes says how long the node's
    /// runnable tasks queue. A linked store's node has a simulated CPU in place of a run queue
    /// (`LinkedStore::yield_to_runtime`).
    pub async fn yield_to_runtime(&self) {
        match self {
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.yield_to_runtime().await,
            Store::Memory(_) | Store::Redis(_) => {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
            }
        }
    }

    /// How the batching of store calls went so far (None when the store does not batch:
    /// batching off, or an in-memory store, which has no round trip to share).
    pub fn batch_counts(&self) -> Option<crate::BatchCounts> {
        match self {
            Store::Redis(s) => s.batch_counts(),
            Store::Memory(_) => None,
            #[cfg(feature = "linked")]
            Store::Linked(_) => None,
        }
    }

    /// How a Redis Cluster fails, as one of its nodes said last (None otherwise).
    pub fn cluster_settings(&self) -> Option<crate::redis::ClusterSettings> {
        match self {
            Store::Redis(s) => s.cluster_settings(),
            Store::Memory(_) => None,
            #[cfg(feature = "linked")]
            Store::Linked(_) => None,
        }
    }

    /// Every shard, as [`Store::shard_of`] names them.
    pub fn shards(&self) -> Vec<u16> {
        match self {
            Store::Memory(_) => vec![0],
            #[cfg(feature = "linked")]
            Store::Linked(_) => vec![0],
            Store::Redis(s) => s.shards(),
        }
    }

    /// The shard `key` lives on (0 unless a Redis Cluster has several): failures of one shard
    /// say nothing of the others.
    pub fn shard_of(&self, key: &BucketKey) -> u16 {
        match self {
            Store::Memory(_) => 0,
            #[cfg(feature = "linked")]
            Store::Linked(_) => 0,
            Store::Redis(s) => s.shard_of(key),
        }
    }
}

impl LeaseStore for Store {
    async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        match self {
            Store::Memory(s) => s.check(req).await,
            Store::Redis(s) => s.check(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.check(req).await,
        }
    }

    async fn acquire_leases(&self, req: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        match self {
            Store::Memory(s) => s.acquire_leases(req).await,
            Store::Redis(s) => s.acquire_leases(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.acquire_leases(req).await,
        }
    }

    async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        match self {
            Store::Memory(s) => s.return_leases(req).await,
            Store::Redis(s) => s.return_leases(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.return_leases(req).await,
        }
    }

    async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        match self {
            Store::Memory(s) => s.release_slots(req).await,
            Store::Redis(s) => s.release_slots(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.release_slots(req).await,
        }
    }

    async fn renew_slots(&self, req: &SlotRenew) -> Result<Vec<bool>, StoreError> {
        match self {
            Store::Memory(s) => s.renew_slots(req).await,
            Store::Redis(s) => s.renew_slots(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.renew_slots(req).await,
        }
    }

    async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        match self {
            Store::Memory(s) => s.debit(req).await,
            Store::Redis(s) => s.debit(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.debit(req).await,
        }
    }

    async fn report_demand(&self, req: &DemandRequest) -> Result<(), StoreError> {
        match self {
            Store::Memory(s) => s.report_demand(req).await,
            Store::Redis(s) => s.report_demand(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.report_demand(req).await,
        }
    }

    async fn held_leases(&self, key: &BucketKey) -> Result<HeldLeases, StoreError> {
        match self {
            Store::Memory(s) => s.held_leases(key).await,
            Store::Redis(s) => s.held_leases(key).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.held_leases(key).await,
        }
    }

    async fn reset(&self, key: &BucketKey) -> Result<bool, StoreError> {
        match self {
            Store::Memory(s) => s.reset(key).await,
            Store::Redis(s) => s.reset(key).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.reset(key).await,
        }
    }

    async fn note_denials(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
        denials: u64,
        epoch: Option<u64>,
    ) -> Result<PenaltyState, StoreError> {
        match self {
            Store::Memory(s) => s.note_denials(key, penalty, denials, epoch).await,
            Store::Redis(s) => s.note_denials(key, penalty, denials, epoch).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.note_denials(key, penalty, denials, epoch).await,
        }
    }

    async fn settle(
        &self,
        req: &crate::ops::reservation::SettleRequest,
    ) -> Result<Vec<crate::ops::reservation::Settlement>, StoreError> {
        match self {
            Store::Memory(s) => s.settle(req).await,
            Store::Redis(s) => s.settle(req).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.settle(req).await,
        }
    }

    async fn lift_block(&self, key: &BucketKey) -> Result<Lift, StoreError> {
        match self {
            Store::Memory(s) => s.lift_block(key).await,
            Store::Redis(s) => s.lift_block(key).await,
            #[cfg(feature = "linked")]
            Store::Linked(s) => s.lift_block(key).await,
        }
    }
}
