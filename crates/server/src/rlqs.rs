//! Envoy's rate limit quota service (RLQS, `envoy.service.rate_limit_quota.v3`): Envoys decide
//! locally on a quota this node assigns them and report their usage; the node shares each
//! rule's global limit among them, paid for out of the same store every other caller uses.
//! Design and bounds: docs/rlqs.md.
//!
//! # Layout
//! - [`service`]: the gRPC stream (one per Envoy and domain): reports in, assignments out.
//! - [`broker`]: the buckets, the streams sharing each, and the loop that pays for and pushes
//!   their shares.
//! - [`plan`]: the pure part of sharing a bucket: targets, what is affordable, each share.
//! - [`shares`]: max-min fair shares of a rate (per Envoy host, then per stream), and the
//!   strategy an Envoy enforces.
//! - [`streams`]: the streams a node holds and what each may hold (places, bytes, unread
//!   answers, an end with a status).

pub mod broker;
pub mod plan;
pub mod service;
pub mod shares;
pub mod streams;

pub use broker::{Broker, RlqsConfig};
pub use service::Rlqs;
