//! The keys this node decides: one [`bucket::Bucket`] per rule applied to an identity (the
//! atomic lease counter of the hot path), one [`actor::KeyActor`] per identity that leases,
//! refills and returns for its buckets, and the [`registry::Registry`] that finds both.
//!
//! - [`bucket`]: one bucket's state on this node, and [`KeyMsg`](bucket::KeyMsg), what the
//!   decision path and a key actor say to each other; [`bucket_id`]: which bucket, and its
//!   keys; [`last_answer`]: what the store last said of it, and what was admitted without it.
//! - [`actor`]: the per-identity actor: its messages and timers; it never awaits the store.
//!   Beside it: `book` (its lease book: the arithmetic of what it holds, given `now`), `calls`
//!   (its store calls, in tasks that report back by message) and `waiters` (the requests
//!   waiting on it).
//! - [`supervisor`]: spawns key actors and cleans up after a failed one.
//! - [`registry`]: buckets and actors by key, bounded; `lookup`: a hit's bucket, found or
//!   made (with its actor) on first use, within the key state budget.

pub mod actor;
pub(crate) mod book;
pub mod bucket;
pub mod bucket_id;
pub(crate) mod calls;
pub mod last_answer;
pub(crate) mod lookup;
pub mod registry;
pub mod supervisor;
pub(crate) mod waiters;
