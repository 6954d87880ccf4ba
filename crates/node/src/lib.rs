//! The Tollgate node: the runtime gateway pods link as a library, and the `tollgate` binary
//! that serves it over gRPC (Envoy's rate limit service and Tollgate's own API) and HTTP
//! (health and Prometheus metrics).
//!
//! # Layout
//! - [`rules`]: rule formats (Tollgate's, envoyproxy/ratelimit's), the compiled set, reloads.
//! - [`runtime`]: per-key lease actors, pre-limit, breaker, fail modes, the decision path.
//! - [`metrics`]: Prometheus metrics.

pub mod metrics;
pub mod rules;
pub mod runtime;

pub use runtime::{Descriptor, Matching, Node, Request, RuntimeConfig, Verdict};
