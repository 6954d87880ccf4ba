//! Helpers for the node library's tests (its own in `crates/node/tests`, and the server's):
//! nodes on the in-memory store, a linked one or a real Redis, with rules given inline.
//! Behind the `test-support` feature.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{
    MemoryConfig, MemoryStore, RedisConfig, RedisStore, SharedClock, Store, TokioClock,
};

use crate::metrics::Metrics;
use crate::rules::source;
use crate::rules::watch::ActiveRules;
use crate::{Node, Request, RuntimeConfig, Verdict};

/// Rules from YAML text.
pub fn rules(yaml: &str, metrics: &Arc<Metrics>) -> Arc<ActiveRules> {
    let active = ActiveRules::new(metrics.clone());
    let loaded = source::parse(yaml, Path::new("test-rules.yaml")).expect("valid rules");
    active.install(&loaded).expect("compiles");
    active
}

/// A node on `store` with `yaml` rules, started as the builder and the binary start one: its
/// store warmed up (up to the start-up patience) before it decides anything.
pub async fn node_on(store: Store, yaml: &str, config: RuntimeConfig, clock: SharedClock) -> Node {
    let metrics = Metrics::new();
    let rules = rules(yaml, &metrics);
    // The store budget a Redis store was opened with (as the binary passes
    // `--store-timeout-ms`), else the default.
    let budget = match &store {
        Store::Redis(redis) => redis.call_timeout(),
        _ => RedisConfig::default().call_timeout,
    };
    let node = Node::start(store, rules, config, clock, metrics, budget)
        .await
        .expect("node starts");
    node.warm_up().await;
    node
}

/// A node on its own in-memory store.
pub async fn memory_node(yaml: &str, config: RuntimeConfig) -> (Node, MemoryStore) {
    let clock: SharedClock = Arc::new(TokioClock::new());
    let memory = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    (
        node_on(Store::Memory(memory.clone()), yaml, config, clock).await,
        memory,
    )
}

/// A Redis store with a given call budget.
pub fn redis_store(config: RedisConfig, budget: Duration) -> Store {
    Store::Redis(
        RedisStore::open(&RedisConfig {
            call_timeout: budget,
            ..config
        })
        .expect("redis store"),
    )
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
