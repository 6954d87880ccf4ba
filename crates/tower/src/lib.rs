//! Tollgate's HTTP edge: a [`tower::Layer`] for axum, hyper or any tower-based gateway that
//! rate-limits each request and answers over-limit clients the way the seed's gateway does:
//!
//! ```text
//! HTTP/1.1 429 Too Many Requests
//! Retry-After: 2
//! RateLimit-Policy: "gold-orders";q=100;w=10
//! RateLimit: "gold-orders";r=0;t=2
//! Cache-Control: no-store
//! Content-Type: application/problem+json
//!
//! {"type":"https://api.example.com/problems/rate-limited","title":"Too Many Requests",
//!  "status":429,"detail":"POST /orders: limit of 600 requests per minute exceeded."}
//! ```
//!
//! Admitted responses carry the rate-limit headers (hidden per rule if you like); a
//! CONCURRENCY rule's slot is held until the response body is done, and given back when the
//! client goes away or the service fails (something Envoy's filter cannot do). With
//! [`RateLimitLayer::settle`] a request's cost is an estimate, settled at the response's actual
//! cost (a header, an [`ActualCost`] extension, or the body's size) when its body ends.
//!
//! ```
//! use axum::{Router, routing::post};
//! use tollgate_tower::{Extractor, RateLimitLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let rules = "domain: public-api\nrules:\n  - {id: orders, name: gold-orders, match: {route: 'POST /orders/{id}'}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 10}\n";
//! let node = tollgate_node::builder::NodeBuilder::new().rules_text(rules).start().await?;
//! let app: Router = Router::new()
//!     .route("/orders/{id}", post(|| async { "created" }))
//!     .route_layer(RateLimitLayer::new(
//!         node,
//!         Extractor::new("public-api").api_key_header("x-api-key").route(),
//!     ));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! `route_layer` runs the layer after routing, so it sees the route template (axum's
//! `MatchedPath`): `POST /orders/{id}`, not `/orders/17?x=1`.
//!
//! # Layout
//! - [`extract`]: request → descriptors and cost ([`Extractor`], trusted proxies,
//!   [`VerifiedIdentity`] from the gateway's auth layer).
//! - [`client_ip`]: the client's address, from the one header the gateway's proxies write,
//!   as far as they vouch for it; IPv6 per prefix ([`ClientIp`]).
//! - [`decide`]: who decides ([`Decide`]: an embedded [`tollgate_node::Node`], or
//!   [`Remote`] over gRPC) and what it says ([`Decision`]).
//! - [`response`]: the 429 (headers, problem+json per rule) and what admitted responses carry.
//! - [`layer`]: [`RateLimitLayer`], its service, and the body that holds a slot and settles a
//!   reservation.

pub mod client_ip;
pub mod decide;
pub mod extract;
pub mod layer;
pub mod response;

pub use client_ip::{ClientIp, ForwardedHeader, PeerAddr};
pub use decide::{Decide, DecideError, Decision, Remote};
pub use extract::{Cost, Extractor, RouteTemplate, VerifiedIdentity};
pub use layer::{ActualCost, FailMode, RateLimitLayer, RateLimitService, SettleFrom};
pub use response::{Answers, Problem};
