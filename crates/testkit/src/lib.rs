//! Test support shared by every crate's integration tests: real `redis-server` processes,
//! single or clustered, and a real Envoy, each on free ports in its own temporary directory,
//! stopped on drop.
//!
//! Tests that kill, pause or cluster Redis start their own servers here, so they never touch a
//! Redis some other test (or a developer) is using.
//!
//! # Layout
//! - [`redis`]: one server ([`RedisServer`]) and a cluster of them ([`RedisCluster`]).
//! - [`envoy`]: a real Envoy process.
//! - [`http`]: a minimal HTTP client.
//! - [`load`]: threads that keep every core busy while a test runs.
//! - [`postgres`]: real PostgreSQL servers.
//! - [`process`]: free ports, waiting, and finding binaries.
//! - [`proxy`]: a TCP proxy a test can cut and restore.

pub mod envoy;
pub mod http;
pub mod load;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod redis;

pub use envoy::Envoy;
pub use load::BusyCores;
pub use postgres::PostgresServer;
pub use proxy::TcpProxy;
pub use redis::{RedisCluster, RedisServer};
