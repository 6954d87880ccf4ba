//! The gRPC APIs: Envoy's rate limit service (v3, wire-compatible) and Tollgate's own
//! `CheckRateLimit`, plus gRPC health and reflection, on one server.
//!
//! # Layout
//! - [`rls`]: Envoy's `ShouldRateLimit` (`envoy.service.ratelimit.v3.RateLimitService`).
//! - [`check`]: `tollgate.ratelimit.v1.RateLimiter` (`CheckRateLimit`, `ReleaseSlots`).
//! - [`server`]: the server, on a listener and a shutdown signal the caller owns.
//! - [`connection`]: the TCP connection as the server tells it to h2 (responses coalesced).

pub mod check;
pub mod connection;
pub mod rls;
pub mod server;

use tonic::Status;

use tollgate_node::runtime::RequestError;

fn invalid(e: RequestError) -> Status {
    Status::invalid_argument(e.to_string())
}
