//! The client side of rate limiting: a retry policy that ends retry storms. A client refused
//! with 429 (or 503) waits what the server said (`Retry-After` in seconds or as an HTTP date,
//! else the RateLimit header's `t=` for the exhausted policy), else backs off exponentially
//! with full jitter; either way jittered so a fleet refused at the same instant does not
//! return at the same instant; with a cap on attempts and on the total wait; never retrying a
//! request that is not idempotent unless told to (or it carries an `Idempotency-Key`). What it
//! did (attempts, waits, why it stopped) is in the final response's extensions.
//!
//! With reqwest:
//!
//! ```
//! use tollgate_client::{RetryMiddleware, RetryPolicy, RetryReport};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::new(RetryPolicy::default()))
//!     .build();
//! let response = client.get("http://127.0.0.1:9/orders").send().await?;
//! if let Some(report) = response.extensions().get::<RetryReport>() {
//!     println!("{} attempts, waited {:?}", report.attempts, report.waits);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! With tower (any `http` client service whose request bodies clone):
//!
//! ```
//! use tollgate_client::{RetryPolicy, TowerRetry};
//!
//! let layer = tower::retry::RetryLayer::new(TowerRetry::new(RetryPolicy::default()));
//! # let _ = layer;
//! ```
//!
//! # Layout
//! - [`policy`]: [`RetryPolicy`] (when, how long, how spread), the header parsers, and
//!   [`RetryReport`].
//! - [`retry`]: the policy as a [`tower::retry::Policy`] ([`TowerRetry`]) and as a
//!   reqwest middleware ([`RetryMiddleware`]).

pub mod policy;
pub mod retry;

pub use policy::{Jitter, RetryPolicy, RetryReport, WaitSource};
pub use retry::{RetryMiddleware, TowerRetry};
