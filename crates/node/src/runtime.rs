//! The decision runtime: per-key lease actors, the local pre-limit, the circuit breaker and
//! fail modes, and the node that ties them together.
//!
//! # Layout
//! - [`node`]: the node a gateway calls (check, prepare, draw, slots), with its faces for the
//!   operator, the store's health and the region link.
//! - [`matching`]: what a request matches (rules, identities, costs; limit overrides).
//! - `decision`: the one owner of a decision: a request's matched rules in, a verdict out,
//!   all or nothing (the lease, the store, the fail modes, the region placement; what a
//!   request took, rolled back).
//! - [`prepared`]: a request resolved once, decided from leases with atomics only.
//! - [`request`], [`verdict`]: what goes in and what comes out; [`outcome`]: what happened at
//!   one rule, and why it denied.
//! - [`fail_modes`]: what a rule does when the store cannot answer (OPEN, its last answer,
//!   CLOSED, LOCAL); [`fallbacks`]: the LOCAL buckets of keys without a bucket, bounded.
//! - [`keys`]: the keys this node decides: buckets (the atomic lease counter of the hot
//!   path), the per-identity actors that lease, refill and return, their messages, their
//!   supervisor and the registry that finds them.
//! - [`store_health`]: the store's one way in and what it knows of the store's health: the
//!   guard (every call behind its shard's circuit breaker, with metrics, and the prober), the
//!   breaker itself, what a late call is, what was admitted while the store had stalled, and
//!   the calls that outlive their request.
//! - [`sizing`], [`local`]: the pure pieces (lease sizes, GCRA);
//!   [`top_denied`]: the most-denied keys, in fixed memory.
//! - [`penalties`]: the penalty box on a node: blocks it knows, denials on their way to the
//!   store.
//! - [`shared`]: settings and what every part shares.

pub(crate) mod decision;
pub(crate) mod fail_modes;
pub mod fallbacks;
pub mod keys;
pub mod local;
pub mod matching;
pub mod node;
pub mod outcome;
pub mod penalties;
pub mod prepared;
pub mod request;
pub mod shared;
pub mod sizing;
pub mod store_health;
pub mod top_denied;
pub mod verdict;

pub use matching::{Charge, MAX_OVERRIDE_RULES};
pub use node::Node;
pub use prepared::{Decision, Prepared};
pub use request::{Descriptor, LimitOverride, Matching, Request, RequestError};
pub use shared::{RuntimeConfig, WarmUp};
pub use store_health::lateness::Late;
pub use verdict::{HeldSlot, Outcome, RuleStatus, Verdict};
