//! Building a node in-process, for a gateway that links `tollgate-node` and decides requests
//! directly (no gRPC hop).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_node::{NodeBuilder, Request};
//!
//! let node = NodeBuilder::new().rules_file("deploy/rules/example.yaml").start().await?;
//! let request = Request::new("public-api")
//!     .descriptor([("api_key", "k_123"), ("plan", "gold")])
//!     .descriptor([("route", "POST /orders")]);
//! let verdict = node.check(&request).await?;
//! if !verdict.allowed {
//!     // 429 with Retry-After: verdict.retry_after
//! }
//! # Ok(()) }
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{
    MemoryConfig, MemoryStore, RedisConfig, RedisStore, SharedClock, Store, TokioClock,
};

use crate::metrics::Metrics;
use crate::rules::source::{self, LoadedRules};
use crate::rules::watch::ActiveRules;
use crate::runtime::node::Node;
use crate::runtime::shared::RuntimeConfig;

/// Why a node could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A rule file is invalid.
    #[error("{0}")]
    Rules(#[from] crate::rules::RulesError),
    /// The store could not be set up.
    #[error("store: {0}")]
    Store(#[from] tollgate_lease::StoreError),
    /// The runtime's actors could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] ractor::SpawnErr),
}

/// Builds a [`Node`].
#[derive(Debug, Default)]
pub struct NodeBuilder {
    files: Vec<PathBuf>,
    texts: Vec<String>,
    redis: Option<RedisConfig>,
    runtime: RuntimeConfig,
    clock: Option<SharedClock>,
    envoy_fail_modes: crate::rules::EnvoyFailModes,
}

impl NodeBuilder {
    /// A node on the in-memory store, with no rules yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule file or directory (Tollgate rules or envoyproxy/ratelimit YAML).
    pub fn rules_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.files.push(path.into());
        self
    }

    /// Adds rules given as YAML text.
    pub fn rules_text(mut self, yaml: impl Into<String>) -> Self {
        self.texts.push(yaml.into());
        self
    }

    /// The fail mode of rules in envoyproxy/ratelimit's format, which has no field for one
    /// (OPEN unless set): e.g. `EnvoyFailModes::parse("public-api=CLOSED")`.
    pub fn envoy_fail_modes(mut self, modes: crate::rules::EnvoyFailModes) -> Self {
        self.envoy_fail_modes = modes;
        self
    }

    /// Keeps state in Redis (single or cluster) instead of in memory.
    pub fn redis(mut self, config: RedisConfig) -> Self {
        self.redis = Some(config);
        self
    }

    /// Runtime settings (leases, pre-limit, breaker, node count, actor cap).
    pub fn runtime(mut self, config: RuntimeConfig) -> Self {
        self.runtime = config;
        self
    }

    /// The clock (the default follows tokio's, so a node runs on paused time in tests).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Loads the rules, starts the node and warms its store up (connected, scripts loaded, one
    /// round trip) before returning, waiting up to the start-up patience
    /// ([`RuntimeConfig::startup_patience`]). Must run inside a tokio runtime.
    pub async fn start(self) -> Result<Node, BuildError> {
        let metrics = Metrics::new();
        let rules = ActiveRules::new(metrics.clone());
        rules.set_envoy_fail_modes(self.envoy_fail_modes.clone());
        let mut loaded = source::load(&self.files)?;
        for (i, text) in self.texts.iter().enumerate() {
            loaded.extend(source::parse(
                text,
                &PathBuf::from(format!("<rules text {i}>")),
            )?);
        }
        install(&rules, &loaded, self.files.first())?;
        rules.set_source("files", true);
        let clock = self.clock.unwrap_or_else(|| Arc::new(TokioClock::new()));
        let (store, timeout) = match &self.redis {
            Some(redis) => (Store::Redis(RedisStore::open(redis)?), redis.call_timeout),
            None => (
                Store::Memory(MemoryStore::with_clock(
                    clock.clone(),
                    MemoryConfig::default(),
                )),
                Duration::from_millis(5),
            ),
        };
        let node = Node::start(store, rules, self.runtime, clock, metrics, timeout).await?;
        // Before the node decides anything: its store connected and its scripts loaded (up to
        // the start-up patience; past it, the node decides by fail modes until the store
        // answers).
        node.warm_up().await;
        Ok(node)
    }
}

fn install(
    rules: &ActiveRules,
    loaded: &LoadedRules,
    file: Option<&PathBuf>,
) -> Result<(), BuildError> {
    rules.install(loaded).map_err(|error| {
        BuildError::Rules(crate::rules::RulesError {
            file: file.cloned().unwrap_or_default(),
            line: None,
            message: error.to_string(),
        })
    })?;
    Ok(())
}
