//! Rules: what they are, the two file formats, the compiled set the decision path matches
//! against, and the watcher that swaps it when files change.
//!
//! # Layout
//! - [`model`]: a rule, its patterns, modes and fail modes.
//! - [`native`]: Tollgate's rule document and file format (also the admin API's body).
//! - [`envoy`]: envoyproxy/ratelimit's YAML configuration.
//! - [`source`]: loading files, with errors that name the file, line and field.
//! - [`errors`]: why rules are refused, as types.
//! - [`overrides`]: mode overrides, the kill switch for rules from any source.
//! - [`compiled`]: one compiled rule; [`set`]: the compiled, indexed rule set.
//! - [`identity`]: a bucket's identity, bounded in bytes (a long one kept as its digest).
//! - [`watch`]: reloading when files change; an invalid file is rejected whole.

pub mod compiled;
pub mod envoy;
pub mod errors;
pub mod identity;
pub mod model;
pub mod native;
pub mod overrides;
pub mod replaces;
pub mod set;
pub mod source;
pub mod watch;

pub use errors::{CompileError, EnvoyConfigError, FailModesError, OverrideError, ValueError};
pub use model::{FailMode, Identity, Mode, Pattern, Rule};
pub use native::{RuleDoc, RulesFile};
pub use set::{CompiledRule, EnvoyFailModes, Matched, RuleKind, RuleSet};
pub use source::{LoadedRules, RulesError};
