//! The decision runtime: per-key lease actors, the local pre-limit, the circuit breaker and
//! fail modes, and the node that ties them together.
//!
//! # Layout
//! - [`node`]: the node; matches requests and decides them, all or nothing.
//! - [`prepared`]: a request resolved once, decided from leases with atomics only.
//! - [`request`], [`verdict`]: what goes in and what comes out.
//! - [`bucket`]: one bucket's state on this node (the atomic lease counter of the hot path).
//! - [`actor`]: the per-key actor that leases, refills and returns.
//! - [`supervisor`]: spawns key actors and cleans up after a failed one.
//! - [`registry`]: buckets and actors by key, bounded.
//! - [`guarded`]: the store behind the circuit breaker, with metrics.
//! - [`breaker`], [`sizing`], [`local`]: the pure pieces (breaker states, lease sizes, GCRA).
//! - [`shared`]: settings and what every part shares.

pub mod actor;
pub mod breaker;
pub mod bucket;
pub mod guarded;
pub mod local;
pub mod node;
pub mod prepared;
pub mod registry;
pub mod request;
pub mod shared;
pub mod sizing;
pub mod supervisor;
pub mod verdict;

pub use node::{MAX_OVERRIDE_RULES, Node};
pub use prepared::{Decision, Prepared};
pub use request::{Descriptor, LimitOverride, Matching, Request, RequestError};
pub use shared::RuntimeConfig;
pub use verdict::{HeldSlot, RuleStatus, Verdict};
