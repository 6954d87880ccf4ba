//! The store as the node sees it, through `node.store()`: its breakers, each shard's health,
//! how long ago it last answered, a Redis Cluster's settings, how it answered at start. What
//! `/readyz`, the metrics and the tests read; never a way to call the store (every call goes
//! through the guard, `runtime/store_health/guarded.rs`).

use std::time::Duration;

use super::Node;
use crate::runtime::WarmUp;
use crate::runtime::store_health::breaker::BreakerState;
use crate::runtime::store_health::guarded::ShardHealth;

/// The store's health as a node knows it: borrowed from the node by `Node::store`.
#[derive(Debug, Clone, Copy)]
pub struct StoreView<'a> {
    node: &'a Node,
}

impl Node {
    /// The store as this node sees it.
    pub fn store(&self) -> StoreView<'_> {
        StoreView { node: self }
    }
}

impl StoreView<'_> {
    /// The circuit breaker's state: the worst over the shards.
    pub fn breaker_state(&self) -> BreakerState {
        self.node.inner.decider.shared.store.breaker_state()
    }

    /// Each shard's circuit breaker (those that have seen calls), by shard.
    pub fn breaker_states(&self) -> Vec<(u16, BreakerState)> {
        self.node.inner.decider.shared.store.breaker_states()
    }

    /// Each shard that has seen calls: its breaker, last answer and outage, by shard (times
    /// on the node's clock: [`Node::now_micros`]).
    pub fn shards(&self) -> Vec<ShardHealth> {
        self.node.inner.decider.shared.store.shard_health()
    }

    /// How long ago the store last answered (the shard that answered longest ago); None for
    /// the in-memory store (it cannot fail, and is not asked while idle) or before any answer.
    pub fn last_answer_age(&self) -> Option<Duration> {
        let shared = &self.node.inner.decider.shared;
        if shared.store.memory().is_some() {
            return None;
        }
        let now = shared.clock.now_micros();
        shared
            .store
            .shard_health()
            .iter()
            .filter(|s| s.last_answer > 0)
            .map(|s| Duration::from_micros(now.saturating_sub(s.last_answer)))
            .max()
    }

    /// A Redis Cluster's settings, as the node last read them (None for any other store).
    pub fn cluster_settings(&self) -> Option<tollgate_lease::ClusterSettings> {
        self.node.inner.decider.shared.store.cluster_settings()
    }

    /// How the store answered when the node started (None: it was not warmed up).
    pub fn warm_up(&self) -> Option<&WarmUp> {
        self.node.inner.decider.shared.warm_up.get()
    }
}
