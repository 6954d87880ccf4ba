//! Helpers for the node's integration tests: nodes on the in-memory store or a real Redis,
//! with rules given inline.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{MemoryConfig, MemoryStore, RedisConfig, RedisStore, SharedClock, Store, TokioClock};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::source;
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::{Node, Request, RuntimeConfig, Verdict};

/// Rules from YAML text.
pub fn rules(yaml: &str, metrics: &Arc<Metrics>) -> Arc<ActiveRules> {
    let active = ActiveRules::new(metrics.clone());
    let loaded = source::parse(yaml, Path::new("test-rules.yaml")).expect("valid rules");
    active.install(&loaded).expect("compiles");
    active
}

/// A node on `store` with `yaml` rules.
pub async fn node_on(store: Store, yaml: &str, config: RuntimeConfig, clock: SharedClock) -> Node {
    let metrics = Metrics::new();
    let rules = rules(yaml, &metrics);
    Node::start(store, rules, config, clock, metrics, Duration::from_millis(50)).await.expect("node starts")
}

/// A node on its own in-memory store.
pub async fn memory_node(yaml: &str, config: RuntimeConfig) -> (Node, MemoryStore) {
    let clock: SharedClock = Arc::new(TokioClock::new());
    let memory = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    (node_on(Store::Memory(memory.clone()), yaml, config, clock).await, memory)
}

/// A Redis store with a given call budget.
pub fn redis_store(config: RedisConfig, budget: Duration) -> Store {
    Store::Redis(RedisStore::open(&RedisConfig { call_timeout: budget, ..config }).expect("redis store"))
}

/// Checks `request` `n` times; how many were allowed.
pub async fn allowed(node: &Node, request: &Request, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        if node.check(request).await.expect("valid request").allowed {
            count += 1;
        }
    }
    count
}

/// One check.
pub async fn check(node: &Node, request: &Request) -> Verdict {
    node.check(request).await.expect("valid request")
}
