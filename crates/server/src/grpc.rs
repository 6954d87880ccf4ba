//! The gRPC APIs: Envoy's rate limit service (v3, wire-compatible) and Tollgate's own
//! `CheckRateLimit`, plus gRPC health and reflection, on one server.
//!
//! # Layout
//! - [`rls`]: Envoy's `ShouldRateLimit` (`envoy.service.ratelimit.v3.RateLimitService`).
//! - [`rls_reservations`]: reserve, then settle, through it (Envoy's `apply_on_stream_done`).
//! - [`check`]: `tollgate.ratelimit.v1.RateLimiter` (`CheckRateLimit`, `ReleaseSlots`).
//! - [`server`]: the server, on a listener and a shutdown signal the caller owns.

pub mod check;
pub mod rls;
pub mod rls_reservations;
pub mod server;

use tonic::Status;

use tollgate_node::runtime::RequestError;

fn invalid(e: RequestError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// A refused reservation or settlement as a status: a bad request (the field named), or the
/// store could not answer.
fn reserve_status(e: tollgate_node::runtime::node::reservations::ReserveError) -> Status {
    use tollgate_node::runtime::node::reservations::ReserveError;
    match e {
        ReserveError::Request(e) => invalid(e),
        ReserveError::Invalid { .. } => Status::invalid_argument(e.to_string()),
        ReserveError::Store(e) => store_status(e),
    }
}

/// A store failure as a status: the store could not answer, or the request was not one.
fn store_status(e: tollgate_lease::StoreError) -> Status {
    if e.is_transient() {
        Status::unavailable(e.to_string())
    } else {
        Status::invalid_argument(e.to_string())
    }
}
