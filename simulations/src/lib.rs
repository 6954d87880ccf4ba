//! Chaos simulations of Tollgate: many nodes on virtual time, running the real node runtime
//! against the real in-memory store behind a link that faults can slow, stall, cut or fail
//! over. A scenario (YAML) states the topology, the rules, the traffic and the faults; a run
//! reports what was admitted against what an exact limiter would have admitted, and checks
//! the invariants a rate limiter owes its users.
//!
//! ```no_run
//! use tollgate_simulations::{Scenario, run};
//!
//! let scenario = Scenario::load("simulations/scenarios/seed-50-pods.yaml".as_ref())?;
//! let report = run(&scenario, scenario.seed, &mut |_second| {})?;
//! assert!(report.passed(), "{}", report.table());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layout
//! - [`scenario`]: the YAML format, checked with the field that is wrong.
//! - [`lint`]: what a scenario says that it may not mean (streams no rule matches,
//!   placeholder typos, small limits split between regions).
//! - [`run`](mod@run): the world (stores, nodes, traffic, faults) on one paused tokio runtime.
//! - [`oracle`]: the exact limiter, false denials and the bound each limit owes.
//! - [`report`]: what a run measured and the invariants, as a table or JSON.
//! - [`plot`]: admitted against exact per rule over time, fault windows shaded (SVG).
//! - [`sweep`]: a table over parameter values and seeds.

pub mod lint;
pub mod oracle;
pub mod plot;
pub mod report;
pub mod run;
pub mod scenario;
pub mod sweep;
pub mod wire;

pub use report::Report;
pub use run::{RunError, run};
pub use scenario::{Scenario, ScenarioError};
