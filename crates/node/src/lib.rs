//! The Tollgate node: the runtime gateway pods link as a library, and the `tollgate` binary
//! that serves it over gRPC (Envoy's rate limit service and Tollgate's own API) and HTTP
//! (health and Prometheus metrics).
//!
//! # Layout
//! - [`rules`]: rule formats (Tollgate's, envoyproxy/ratelimit's), the compiled set, reloads.
//! - [`runtime`]: per-key lease actors, pre-limit, breaker, fail modes, the decision path.
//! - [`grpc`]: Envoy's rate limit service and Tollgate's own API.
//! - [`http`]: health, readiness and Prometheus metrics.
//! - [`headers`]: `RateLimit`, `RateLimit-Policy`, `X-RateLimit-*` and `Retry-After`.
//! - [`metrics`]: Prometheus metrics.
//! - [`config`]: the binary's settings (file, environment, flags).
//! - [`control`]: the rule store in PostgreSQL, the admin API, live propagation.
//! - [`app`]: a whole node process, wired from a config.
//! - [`builder`]: a node built in-process, for gateways that link this crate.

pub mod app;
pub mod builder;
pub mod config;
pub mod control;
pub mod grpc;
pub mod headers;
pub mod http;
pub mod metrics;
pub mod rules;
pub mod runtime;
pub mod telemetry;
pub mod tls;

pub use builder::NodeBuilder;
pub use runtime::{
    Decision, Descriptor, Matching, Node, Prepared, Request, RuntimeConfig, Verdict,
};
