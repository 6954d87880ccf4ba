//! The rule store in PostgreSQL. Every write is one transaction that checks the precondition,
//! bumps the rule's version and the rule set's revision, appends to the history and notifies
//! the nodes (delivered at commit). Concurrent writers of one rule are serialised by its row
//! lock, so no update is lost: each history entry's "before" is the true previous rule.
//!
//! - `pool`: the [`RuleStore`] handle, its connections and migrations.
//! - `reads`: one rule, a page, a [`Snapshot`] of them all.
//! - `writes`: create, replace, patch and delete under a [`Precondition`].
//! - `overrides`: mode overrides, the kill switch for rules from any source.
//! - `history`: what each write appends and the revision it bumps ([`CHANNEL`]).
//! - `resets`: counter resets in the history, announced on [`RESET_CHANNEL`].
//! - `rows`: a rule as a row, both ways.
//! - `json`: rule documents as JSON (merge patches, field errors).
//! - `error`: [`ControlError`].

mod error;
mod history;
mod json;
mod overrides;
mod pool;
mod precedence;
mod reads;
mod resets;
mod rows;
mod writes;

pub use error::{ControlError, describe};
pub use history::{CHANNEL, HistoryEntry};
pub use json::{doc_json, from_json, merge_patch, serde_field_error};
pub use overrides::{OverrideBody, StoredOverride};
pub use pool::RuleStore;
pub use reads::{ListFilter, Snapshot};
pub use resets::{RESET_CHANNEL, ResetNotice, ResetRecord};
pub use rows::StoredRule;
pub use writes::{Precondition, Put, Written};
