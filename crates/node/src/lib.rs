//! The Tollgate node: the runtime a gateway links as a library. The `tollgate` binary that
//! serves it is `tollgate-server`; the PostgreSQL rule store and admin API are
//! `tollgate-control`.
//!
//! # Layout
//! - [`rules`]: rule formats (Tollgate's, envoyproxy/ratelimit's), the compiled set, reloads.
//! - [`runtime`]: per-key lease actors, pre-limit, breaker, fail modes, the decision path.
//! - [`headers`]: `RateLimit`, `RateLimit-Policy`, `X-RateLimit-*` and `Retry-After`.
//! - [`metrics`]: Prometheus metrics.
//! - [`telemetry`]: the spans of a decision (exported by the process that enables them).
//! - [`builder`]: a node built in-process, for gateways that link this crate.
//! - `test_support` (feature `test-support`): nodes on a store with inline rules, for tests.

pub mod builder;
pub mod headers;
pub mod metrics;
pub mod rules;
pub mod runtime;
pub mod telemetry;
#[cfg(feature = "test-support")]
pub mod test_support;

pub use builder::NodeBuilder;
pub use runtime::{
    Decision, Descriptor, Matching, Node, Prepared, Request, RuntimeConfig, Verdict,
};
