//! Mode overrides: the kill switch for every rule, wherever it came from. An override names a
//! rule by id (a Tollgate rule's id, or an envoyproxy/ratelimit descriptor's path as
//! `GET /rules` shows it) and sets its mode (ENFORCE, SHADOW or DISABLED) over what its file
//! or stored document says. Overrides come from PostgreSQL (the admin API's
//! `/admin/v1/mode-overrides`) and from override files among the rule files (a top-level
//! `overrides:` list), for nodes without a database:
//!
//! ```yaml
//! overrides:
//!   - id: api-key-default
//!     mode: DISABLED
//!     reason: "cut off a customer by mistake (INC-1234)"
//! ```
//!
//! An override outlives changes to its rule (an edited file, a `rules import`): it is lifted
//! only by removing it. Where both name a rule, a file's override wins over PostgreSQL's (the
//! file is the node's own hatch); two files naming the same rule are an error.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::rules::envoy::ValidNode;
use crate::rules::errors::OverrideError;
use crate::rules::model::{Mode, Rule};
use crate::rules::set::EnvoyDomainConfig;

/// One rule's mode, set over the rule's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeOverride {
    /// The rule's id (an envoyproxy/ratelimit descriptor: its path).
    pub id: String,
    /// The mode it runs in while the override stands.
    pub mode: Mode,
    /// Why, in the words of whoever set it.
    pub reason: Option<String>,
    /// Where it was set: `file:line`, or `postgres (by alice at 2026-12-02T10:00:00Z)`.
    pub origin: String,
}

/// An override as written in an override file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideDoc {
    /// The rule's id.
    pub id: String,
    /// ENFORCE, SHADOW or DISABLED (any case).
    pub mode: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An override file: a top-level `overrides:` list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverridesFile {
    /// The overrides.
    #[serde(default)]
    pub overrides: Vec<OverrideDoc>,
}

impl OverrideDoc {
    /// Checks the id and mode; the field at fault and why otherwise.
    pub fn validate(&self, origin: String) -> Result<ModeOverride, (&'static str, String)> {
        check_id(&self.id).map_err(|e| ("id", e.to_owned()))?;
        let mode = self
            .mode
            .parse::<Mode>()
            .map_err(|e| ("mode", e.to_string()))?;
        Ok(ModeOverride {
            id: self.id.clone(),
            mode,
            reason: self.reason.clone(),
            origin,
        })
    }
}

/// Checks the id an override names: 1 to 512 bytes without control characters (an
/// envoyproxy/ratelimit path may hold characters a Tollgate rule id may not); why not otherwise.
pub fn check_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() || id.len() > 512 {
        return Err("must be 1 to 512 bytes long");
    }
    if id.chars().any(char::is_control) {
        return Err("must not hold control characters");
    }
    Ok(())
}

/// What became of one override when a rule set was installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedOverride {
    /// The override.
    pub by: ModeOverride,
    /// The mode the rule itself has (None: no rule has this id; the override waits for one).
    pub rule_mode: Option<Mode>,
    /// Where that rule was defined.
    pub rule_origin: Option<String>,
}

/// Sets each overridden rule's mode in `native` and `envoy` (a set's rules, as loaded); what
/// became of each override, in id order. An override of a rule no source defines is kept, and
/// applies once a rule has its id. Later overrides win over earlier ones: PostgreSQL's come
/// first, files' after them.
pub fn apply(
    native: &mut [Rule],
    envoy: &mut [EnvoyDomainConfig],
    overrides: &[ModeOverride],
) -> Result<Vec<AppliedOverride>, OverrideError> {
    let mut applied: HashMap<&str, AppliedOverride> = HashMap::new();
    let mut from_files: HashMap<&str, &str> = HashMap::new();
    for o in overrides {
        let from_file = !o.origin.starts_with("postgres");
        if from_file && let Some(first) = from_files.insert(&o.id, &o.origin) {
            return Err(OverrideError {
                origin: o.origin.clone(),
                id: o.id.clone(),
                first: first.to_owned(),
            });
        }
        let entry = AppliedOverride {
            by: o.clone(),
            rule_mode: None,
            rule_origin: None,
        };
        applied.insert(&o.id, entry);
    }
    for rule in native.iter_mut() {
        if let Some(entry) = applied.get_mut(rule.id.as_str()) {
            entry.rule_mode = Some(rule.mode);
            entry.rule_origin = Some(rule.origin.clone());
            rule.mode = entry.by.mode;
        }
    }
    for config in envoy.iter_mut() {
        apply_envoy(config, &mut applied);
    }
    let mut out: Vec<AppliedOverride> = applied.into_values().collect();
    out.sort_by(|a, b| a.by.id.cmp(&b.by.id));
    Ok(out)
}

fn apply_envoy(config: &mut EnvoyDomainConfig, applied: &mut HashMap<&str, AppliedOverride>) {
    fn walk(nodes: &mut [ValidNode], origin: &str, applied: &mut HashMap<&str, AppliedOverride>) {
        for node in nodes {
            if node.limit.is_some()
                && let Some(entry) = applied.get_mut(node.path.as_str())
            {
                entry.rule_mode = Some(if node.shadow {
                    Mode::Shadow
                } else {
                    Mode::Enforce
                });
                entry.rule_origin = Some(origin.to_owned());
                match entry.by.mode {
                    Mode::Enforce => node.shadow = false,
                    Mode::Shadow => node.shadow = true,
                    // No limit at this depth: what envoyproxy/ratelimit does for a descriptor
                    // without `rate_limit` (its children keep theirs).
                    Mode::Disabled => node.limit = None,
                }
            }
            walk(&mut node.children, origin, applied);
        }
    }
    walk(&mut config.nodes, &config.origin, applied);
}

#[cfg(test)]
mod tests;
