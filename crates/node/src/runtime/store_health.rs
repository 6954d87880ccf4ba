//! The store's one way in, and what the node knows of the store's health.
//!
//! # Layout
//! - [`guarded`]: the store behind each shard's circuit breaker, with metrics: a call started,
//!   waited for and ended; in `guarded/`, every operation the node makes (`operations.rs`),
//!   each shard's state and health (`shards.rs`) and the prober that asks a stalled store
//!   again (`prober.rs`).
//! - [`breaker`]: the breaker's states (pure).
//! - [`lateness`]: what a late call is (a busy store or node, a stalled store, a store down).
//! - [`debts`]: what was admitted while the store had stalled, owed to it.
//! - [`background`]: store calls that outlive their request (a late call handed off, debts
//!   debited when the store answers).

pub(crate) mod background;
pub mod breaker;
pub mod debts;
pub mod guarded;
pub mod lateness;
