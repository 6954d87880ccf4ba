//! What every part of a node's runtime shares: the store, the registry, the clock, the
//! metrics and the settings.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{Algorithm, Allowance, Limit, Micros, SharedClock};

use crate::metrics::Metrics;
use crate::rules::CompiledRule;
use crate::runtime::keys::registry::Registry;
use crate::runtime::sizing::LeasePolicy;
use crate::runtime::store_health::breaker::BreakerConfig;
use crate::runtime::store_health::debts::Debts;
use crate::runtime::store_health::guarded::GuardedStore;

/// The default [`RuntimeConfig::store_patience`].
pub const DEFAULT_STORE_PATIENCE: Duration = Duration::from_millis(250);
/// The default [`RuntimeConfig::max_key_state_bytes`]: 256 MiB (about 20,500 key actors of
/// short identities, far more keys decided without one), which fits a 1 GiB pod beside the
/// in-memory store's default.
pub const DEFAULT_MAX_KEY_STATE_BYTES: usize = 256 << 20;
/// The default [`RuntimeConfig::startup_patience`].
pub const DEFAULT_STARTUP_PATIENCE: Duration = Duration::from_secs(5);

/// Settings of the decision runtime.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Lease sizes and lifetimes.
    pub lease: LeasePolicy,
    /// The local pre-limit per bucket, as a multiple of the rule's limit (None: off). At 1.0
    /// one node admits at most what the whole limit allows, so it never denies a request the
    /// global limit would admit from this node alone.
    pub prelimit_factor: Option<f64>,
    /// The store's circuit breaker.
    pub breaker: BreakerConfig,
    /// The longest a store call is waited for while the store answers (a queue at a busy
    /// store, or a node too busy to read its answers in time): a request's decision waits
    /// this long at most, and a late grant is still used. A store that answers nothing is
    /// waited for only the store budget (`--store-timeout-ms`): it has stalled.
    pub store_patience: Duration,
    /// How long a node starting up waits for its store to answer (connected, scripts
    /// loaded) before it serves; past it, it serves anyway, by its rules' fail modes.
    pub startup_patience: Duration,
    /// How often a shard no call has reached for that long is asked whether it answers, so
    /// that an outage shows at any traffic (None: never).
    pub store_heartbeat: Option<Duration>,
    /// Nodes sharing the limits (the LOCAL fail mode gives each node `limit / nodes`).
    pub cluster_nodes: u32,
    /// The most bytes of key state held at once: key actors and their buckets, the keys-seen
    /// map and the LOCAL fallback buckets (see `docs/memory-bounds.md`).
    pub max_key_state_bytes: usize,
    /// A key actor with no leases stops after this long without requests.
    pub idle_timeout: Duration,
    /// Where the runtime's own randomness (the breaker's cooldown jitter) comes from: None
    /// draws a seed from the OS; a simulation pins it so a run can be repeated.
    pub seed: Option<u64>,
    /// How the most-denied keys show identities.
    pub top_denied: crate::runtime::top_denied::IdentityShown,
    /// Whether a request may set its own limit for a descriptor (Envoy's `RateLimitOverride`,
    /// as envoyproxy/ratelimit takes it): a caller that can reach the gRPC port can then raise
    /// its own limit, so only trusted gateways may; false refuses such requests.
    pub descriptor_overrides: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            lease: LeasePolicy::default(),
            prelimit_factor: Some(1.0),
            breaker: BreakerConfig::default(),
            store_patience: DEFAULT_STORE_PATIENCE,
            startup_patience: DEFAULT_STARTUP_PATIENCE,
            store_heartbeat: Some(Duration::from_secs(1)),
            cluster_nodes: 1,
            max_key_state_bytes: DEFAULT_MAX_KEY_STATE_BYTES,
            idle_timeout: Duration::from_secs(10),
            seed: None,
            top_denied: Default::default(),
            descriptor_overrides: true,
        }
    }
}

/// Runtime-wide pieces, shared by the node and its actors.
#[derive(Debug)]
pub struct Shared {
    /// The store behind its breaker.
    pub store: GuardedStore,
    /// Buckets and actors.
    pub registry: Registry,
    /// The node clock.
    pub clock: SharedClock,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub config: RuntimeConfig,
    /// Region sync, when the node runs in one of two regions.
    pub region: std::sync::OnceLock<Arc<tollgate_regionsync::RegionSync>>,
    /// What this node owes the store (units admitted while it had stalled).
    pub debts: Debts,
    /// How the node's start-up warm-up of its store went (None: not tried).
    pub warm_up: std::sync::OnceLock<WarmUp>,
    /// The penalty boxes: blocks known, denials being counted.
    pub penalties: crate::runtime::penalties::Penalties,
}

impl Shared {
    /// The regional allowance a store call for `rule`'s bucket carries: ASYNC_SYNC rules of
    /// the counting algorithms, while region sync says the allowances are in force.
    pub(crate) fn allowance_of(&self, rule: &CompiledRule, limit: &Limit) -> Option<Allowance> {
        if !rule.synced()
            || matches!(
                limit.algorithm(),
                Algorithm::SlidingWindowLog | Algorithm::Concurrency
            )
        {
            return None;
        }
        self.region.get()?.allowance()
    }

    /// Records `units` of `rule` for `identity` as consumed, for the peer region, under a rule
    /// that syncs (a lease is consumption as far as this region's store is concerned: the
    /// peer learns of it when it is granted, not as its units are spent).
    pub(crate) fn record_for_peer(
        &self,
        rule: &CompiledRule,
        identity: &[u8],
        limit: &Limit,
        units: u64,
        now: Micros,
    ) {
        if rule.synced()
            && let Some(region) = self.region.get()
        {
            region.record(&rule.key, identity, limit, units, now);
        }
    }
}

/// How a node's store answered when the node started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmUp {
    /// It answered after this long: the node served with its store ready.
    Answered(Duration),
    /// It did not answer within the start-up patience: the node served anyway, deciding by
    /// its rules' fail modes until it does. Why, in the store's words.
    Unanswered(String),
}
