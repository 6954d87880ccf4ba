//! The decision runtime: per-key lease actors, the local pre-limit, the circuit breaker and
//! fail modes, and the node that ties them together.
//!
//! # Layout
//! - [`node`]: the node; decides what a request matched, all or nothing.
//! - [`matching`]: what a request matches (rules, identities, costs; limit overrides).
//! - [`attempt`]: one request's statuses and what it took, rolled back all or nothing.
//! - [`prepared`]: a request resolved once, decided from leases with atomics only.
//! - [`request`], [`verdict`]: what goes in and what comes out; [`outcome`]: what happened at
//!   one rule, and why it denied.
//! - [`fail_modes`]: what a rule does when the store cannot answer (OPEN, its last answer,
//!   CLOSED, LOCAL); [`fallbacks`]: the LOCAL buckets of keys without a bucket, bounded.
//! - [`keys`]: the keys this node decides: buckets (the atomic lease counter of the hot
//!   path), the per-identity actors that lease, refill and return, their messages, their
//!   supervisor and the registry that finds them.
//! - [`guarded`]: the store behind the circuit breaker, with metrics; [`lateness`]: what a
//!   late store call is (a busy store or node, a stalled store, a store down); [`debts`]:
//!   what was admitted while the store had stalled; [`background`]: store calls that outlive
//!   their request (a late call handed off, debts debited when the store answers).
//! - [`breaker`], [`sizing`], [`local`]: the pure pieces (breaker states, lease sizes, GCRA);
//!   [`top_denied`]: the most-denied keys, in fixed memory.
//! - [`penalties`]: the penalty box on a node: blocks it knows, denials on their way to the
//!   store.
//! - [`shared`]: settings and what every part shares.

pub mod attempt;
pub(crate) mod background;
pub mod breaker;
pub mod debts;
pub(crate) mod fail_modes;
pub mod fallbacks;
pub mod guarded;
pub mod keys;
pub mod lateness;
pub mod local;
pub mod matching;
pub mod node;
pub mod outcome;
pub mod penalties;
pub mod prepared;
pub mod request;
pub mod shared;
pub mod sizing;
pub mod top_denied;
pub mod verdict;

pub use lateness::Late;
pub use matching::{Charge, MAX_OVERRIDE_RULES};
pub use node::Node;
pub use prepared::{Decision, Prepared};
pub use request::{Descriptor, LimitOverride, Matching, Request, RequestError};
pub use shared::{RuntimeConfig, WarmUp};
pub use verdict::{HeldSlot, Outcome, RuleStatus, Verdict};
