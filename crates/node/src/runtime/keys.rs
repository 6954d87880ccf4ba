//! The keys this node decides: one [`bucket::Bucket`] per rule applied to an identity (the
//! atomic lease counter of the hot path), one [`actor::KeyActor`] per identity that leases,
//! refills and returns for its buckets, and the [`registry::Registry`] that finds both.
//!
//! - [`bucket`]: one bucket's state on this node; [`bucket_id`]: which bucket, and its keys;
//!   [`last_answer`]: what the store last said of it, and what was admitted without it; [`KeyMsg`](bucket::KeyMsg):
//!   what the decision path and a key actor say to each other.
//! - [`actor`]: the per-identity actor; it never awaits the store (calls run in tasks that
//!   report back by message).
//! - [`supervisor`]: spawns key actors and cleans up after a failed one.
//! - [`registry`]: buckets and actors by key, bounded.

pub mod actor;
pub mod bucket;
pub mod bucket_id;
pub mod last_answer;
pub mod registry;
pub mod supervisor;
