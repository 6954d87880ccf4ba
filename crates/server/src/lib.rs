//! The `tollgate` binary's library: a whole node process, wired from its settings, serving
//! the node (`tollgate-node`) over gRPC (Envoy's rate limit service and Tollgate's own API)
//! and HTTP (health, readiness, Prometheus metrics), with TLS, the admin API and the rule store
//! of `tollgate-control` when a database is configured.
//!
//! # Layout
//! - [`config`]: the binary's settings (file, environment, flags).
//! - [`app`]: a whole node process, wired from a config.
//! - [`grpc`]: Envoy's rate limit service and Tollgate's own API.
//! - [`rlqs`]: Envoy's rate limit quota service: one global quota shared by every Envoy.
//! - [`http`]: health, readiness and Prometheus metrics.
//! - [`admin_listener`]: the admin API's listener (the API itself is `tollgate-control`'s).
//! - [`listener`]: every listener's bounds (connections, deadlines, sizes), and the HTTP/1
//!   server the HTTP, probe and admin ports share.
//! - [`tls`]: certificates, reloads and handshakes for every listener.
//! - [`telemetry`]: logs, and the OTLP exporter for the node's spans.

pub mod admin_listener;
pub mod app;
pub mod check_client;
pub mod config;
pub mod grpc;
pub mod http;
pub mod json_check;
pub mod listener;
pub mod rlqs;
pub mod telemetry;
pub mod tls;
