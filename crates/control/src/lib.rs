//! The rule control plane: rules in PostgreSQL behind an admin REST API, propagated live to
//! every node.
//!
//! # Layout
//! - [`schema`]: migrations embedded in the binary, run at start.
//! - [`store`]: the rule store (PostgreSQL): CRUD with versions and history.
//! - [`admin`]: the admin REST API (`/admin/v1/rate-limit-rules`).
//! - [`auth`]: bearer tokens, read-write and read-only.
//! - [`problem`]: `application/problem+json` errors.
//! - [`sync`]: loading rules at start, LISTEN/NOTIFY plus polling, the snapshot on disk.
//! - [`transfer`]: `tollgate rules import` and `export`.

pub mod admin;
pub mod auth;
pub mod console;
pub mod problem;
pub mod schema;
pub mod store;
pub mod sync;
pub mod transfer;

pub use store::{ControlError, RuleStore};
