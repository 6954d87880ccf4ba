//! A write or delete checked against the whole rule set the nodes would compile after it:
//! every rule a rule replaces exists in its domain, and no rules replace each other in a
//! circle (docs/rules-precedence.md). The set is the store's rules and the rule files' rules
//! that no stored rule of the same id overrides, exactly as `sync::to_rules` builds it, so an
//! admin write can never make the nodes' set fail to compile.

use std::collections::HashSet;

use deadpool_postgres::GenericClient;
use serde_json::Value;

use tollgate_node::rules::CompileError;
use tollgate_node::rules::native::{FieldError, RuleDoc};
use tollgate_node::rules::replaces::{Replacing, check_replaces};
use tollgate_node::rules::source;

use super::error::ControlError;
use super::pool::RuleStore;
use super::writes::lock_id;

/// A rule of the set, owned.
struct Entry {
    id: String,
    domain: String,
    replaces: Vec<String>,
    origin: String,
}

impl RuleStore {
    /// Checks the set as it would be with rule `id` written as `doc` (None: deleted). Takes
    /// the rule set's lock first, so that two writers at the same instant are checked one
    /// after the other (a delete of a rule and a write replacing it cannot both pass).
    ///
    /// A problem the set had before this write (a rule file edited under a stored rule) is
    /// not this write's: it is logged and the write goes on.
    pub(super) async fn check_precedence(
        &self,
        tx: &impl GenericClient,
        id: &str,
        doc: Option<&RuleDoc>,
    ) -> Result<(), ControlError> {
        lock_id(tx, "tollgate:rule-set").await?;
        let stored = self.stored_entries(tx).await?;
        let files = self.file_entries(&stored);
        let before: Vec<&Entry> = stored.iter().chain(&files).collect();
        let mut after: Vec<&Entry> = before.iter().copied().filter(|e| e.id != id).collect();
        let written = doc.map(|doc| Entry {
            id: id.to_owned(),
            domain: doc.domain.clone().unwrap_or_default(),
            replaces: doc.replaces.clone(),
            origin: format!("rule {id}"),
        });
        after.extend(written.as_ref());
        let Err(problem) = check(&after) else {
            return Ok(());
        };
        if let Err(old) = check(&before)
            && old.to_string() == problem.to_string()
        {
            tracing::warn!(error = %old, "the rule set has a precedence problem this write did not make");
            return Ok(());
        }
        Err(explain(id, problem))
    }

    async fn stored_entries(&self, tx: &impl GenericClient) -> Result<Vec<Entry>, ControlError> {
        let rows = tx
            .query(
                "SELECT id, domain, replaces_json FROM rate_limit_rules ORDER BY id",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let id: String = row.get(0);
                Entry {
                    origin: format!("postgres rule {id}"),
                    id,
                    domain: row.get(1),
                    replaces: row
                        .get::<_, Option<Value>>(2)
                        .and_then(|v| serde_json::from_value(v).ok())
                        .unwrap_or_default(),
                }
            })
            .collect())
    }

    /// The rule files' rules that no stored rule overrides. Files that do not load give none
    /// (a node would refuse them too, and says why).
    fn file_entries(&self, stored: &[Entry]) -> Vec<Entry> {
        if self.rule_files.is_empty() {
            return vec![];
        }
        let loaded = match source::load(&self.rule_files) {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::warn!(error = %e, "the rule files do not load: a write is checked against the store's rules only");
                return vec![];
            }
        };
        let stored: HashSet<&str> = stored.iter().map(|e| e.id.as_str()).collect();
        loaded
            .native
            .into_iter()
            .filter(|rule| !stored.contains(rule.id.as_str()))
            .map(|rule| Entry {
                id: rule.id,
                domain: rule.domain,
                replaces: rule.replaces,
                origin: rule.origin,
            })
            .collect()
    }
}

fn check(entries: &[&Entry]) -> Result<(), CompileError> {
    let rules: Vec<Replacing<'_>> = entries
        .iter()
        .map(|e| Replacing {
            id: &e.id,
            domain: &e.domain,
            replaces: &e.replaces,
            origin: &e.origin,
        })
        .collect();
    check_replaces(&rules)
}

/// The problem as the writer of rule `id` should read it: a field of theirs (422), or another
/// rule standing in the way (409).
fn explain(id: &str, problem: CompileError) -> ControlError {
    match problem {
        CompileError::UnknownReplace {
            id: by,
            target,
            domain,
            ..
        } if by == id => ControlError::Invalid(FieldError {
            field: "replaces".into(),
            reason: format!(
                "names {target:?}, which is no rule of domain {domain:?} (in the store or the \
                 rule files the nodes read)"
            ),
        }),
        CompileError::UnknownReplace { id: by, origin, .. } => ControlError::Conflict(format!(
            "rule {by:?} ({origin}) replaces {id:?}: change or delete {by:?} first, or keep \
             {id:?} in its domain"
        )),
        CompileError::ReplaceCycle { cycle, .. } => ControlError::Invalid(FieldError {
            field: "replaces".into(),
            reason: format!(
                "would make rules replace each other in a circle: {}",
                cycle.join(" → ")
            ),
        }),
        other => ControlError::Database(other.to_string()),
    }
}
