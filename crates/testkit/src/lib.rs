//! Test support shared by every crate's integration tests: real `redis-server` processes,
//! single or clustered, each on free ports in its own temporary directory, stopped on drop.
//!
//! Tests that kill, pause or cluster Redis start their own servers here, so they never touch a
//! Redis some other test (or a developer) is using.
//!
//! # Layout
//! - [`redis`]: one server ([`RedisServer`]) and a cluster of them ([`RedisCluster`]).
//! - [`process`]: free ports, waiting, and finding binaries.

pub mod process;
pub mod redis;

pub use redis::{RedisCluster, RedisServer};
