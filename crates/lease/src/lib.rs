//! The lease store: Tollgate's global rate-limit state, behind one trait with two backends.
//!
//! Every decision in Tollgate ends in one of five atomic operations on a set of buckets of one
//! identity: **check** (consume a cost from all or none), **lease acquire** (take a batch of
//! units to spend locally), **lease return** (give back what was not spent), **slot release**
//! (end a concurrency slot) and **debit** (subtract units consumed in another region). Each is
//! one Lua script in Redis, timed by Redis `TIME`, or the same arithmetic under one shard lock
//! in the in-memory store. A denial is a value ([`Decision::Limited`]), never an error.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_lease::{BucketKey, CheckRequest, Limit, LeaseStore, MemoryStore};
//!
//! let store = MemoryStore::new();
//! let limit = Limit::token_bucket(10, 5.0)?; // burst 10, 5 per second
//! let key = BucketKey::new(b"k_123", "gold-orders-create")?;
//! let outcome = store.check(&CheckRequest::single(key, limit, 1)?).await?;
//! assert!(outcome.allowed());
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`limit`]: algorithms and their validated parameters.
//! - [`key`]: bucket keys with one escaped hash tag per identity.
//! - [`ops`]: the operations' requests (validated) and outcomes.
//! - [`store`]: the [`LeaseStore`] trait and the run-time choice [`Store`].
//! - [`memory`]: the in-memory store (sharded, injectable clock).
//! - [`redis`]: the Redis store (single and cluster) and its Lua scripts.
//! - [`link`]: the in-memory store behind a link that can be slowed, stalled, cut or failed
//!   over (the chaos simulations' store).
//! - [`clock`]: the clocks the in-memory store can run on.
//! - [`error`]: typed errors that say whether they are transient.
//! - `algorithm`: the pure arithmetic both stores implement.
//! - `lease_store`: where [`LeaseStore`] is defined, with where a bucket's state lives (the
//!   backends implement it from there; [`store`] hands it on).

mod algorithm;
pub mod clock;
pub mod error;
pub mod key;
mod lease_store;
pub mod limit;
#[cfg(feature = "linked")]
pub mod link;
pub mod memory;
pub mod ops;
pub mod redis;
pub mod store;

pub use clock::{Clock, ManualClock, Micros, SharedClock, SystemClock, TokioClock};
pub use error::{InvalidInput, StoreError};
pub use key::{BucketKey, KeyError};
pub use limit::{Algorithm, Limit, LimitError, LimitSpec};
#[cfg(feature = "linked")]
pub use link::{Latency, Ledger, LinkCalls, LinkCondition, LinkedStore, NodeCpu, Setup, StoreLink};
pub use memory::DEFAULT_MAX_BYTES as DEFAULT_MEMORY_MAX_BYTES;
pub use memory::{MemoryConfig, MemoryStore};
pub use ops::MAX_BUCKETS_PER_CALL;
pub use ops::allowance::{Allowance, DemandReport, DemandRequest, FLOOR_SHARE, share_of};
pub use ops::check::{BucketStatus, CheckItem, CheckOutcome, CheckRequest, Decision};
pub use ops::counter::HeldLeases;
pub use ops::debit::{DebitItem, DebitOnce, DebitRequest, MAX_ORIGIN_BYTES};
pub use ops::lease::{LeaseAsk, LeaseGrant, LeaseId, LeaseRequest, LeaseReturn, ReturnRequest};
pub use ops::penalty::{Lift, Penalty, PenaltyState};
pub use ops::reservation::{
    MAX_RESERVATION_TTL, Reserve, SETTLED_KEPT, SettleItem, SettleRequest, Settlement,
};
pub use ops::slot::{SlotId, SlotRelease, SlotRenew};
pub use redis::batch::{BatchConfig, BatchCounts};
pub use redis::{ClusterSettings, RedisConfig, RedisStore};
pub use store::{LeaseStore, Store};
