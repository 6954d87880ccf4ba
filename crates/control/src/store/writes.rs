//! Writing rules: each write is one transaction that locks the rule, checks the caller's
//! precondition, writes the row and records the change (`history`).

use deadpool_postgres::GenericClient;
use serde_json::Value;

use tollgate_node::rules::native::{FieldError, RuleDoc};

use super::error::ControlError;
use super::history::{bump_revision, last_version, record};
use super::json::{doc_json, from_json, merge_patch};
use super::pool::RuleStore;
use super::rows::{RULE_COLUMNS, StoredRule, get_rule, stored, time, write_rule};

/// A precondition on a write (`If-Match`, `If-None-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// `If-Match: *`: the rule must exist.
    Exists,
    /// `If-None-Match: *`: the rule must not exist (create, never replace).
    Absent,
    /// `If-Match: "N"`: the rule must be at version N.
    Version(i64),
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// A new rule (201).
    Created,
    /// An existing rule changed (a new version).
    Updated,
    /// The rule was already exactly this: nothing was written, no version, no history, no
    /// new revision (imports can run on every commit).
    Unchanged,
}

/// What [`RuleStore::put`] stored, and what it replaced.
#[derive(Debug, Clone)]
pub struct Put {
    /// The rule as stored now.
    pub rule: StoredRule,
    /// What the write did.
    pub written: Written,
    /// The mode of the rule it replaced (None: it created the rule).
    pub previous_mode: Option<String>,
}

impl RuleStore {
    /// Creates or replaces a rule with the document as written.
    pub async fn put(
        &self,
        id: &str,
        doc: RuleDoc,
        condition: Option<Precondition>,
        actor: &str,
        default_domain: Option<&str>,
    ) -> Result<Put, ControlError> {
        let doc = as_written(id, doc, default_domain)?;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        self.check_precedence(&tx, id, Some(&doc)).await?;
        let current = lock_rule(&tx, id).await?;
        check(id, &condition, current.as_ref().map(|(v, _)| *v))?;
        let previous_mode = current
            .as_ref()
            .and_then(|(_, old)| old.get("mode")?.as_str().map(str::to_owned));
        let written = self.write(&tx, id, current, doc, actor).await?;
        // Read inside the transaction, under its lock: what this write stored, not what a
        // writer that follows it has stored since.
        let rule = get_rule(&tx, id)
            .await?
            .ok_or_else(|| ControlError::NotFound(id.into()))?;
        tx.commit().await?;
        Ok(Put {
            rule,
            written,
            previous_mode,
        })
    }

    /// Applies a JSON merge patch (RFC 7396) to a rule, e.g. `{"mode": "DISABLED"}`.
    pub async fn patch(
        &self,
        id: &str,
        patch: &Value,
        condition: Option<Precondition>,
        actor: &str,
        default_domain: Option<&str>,
    ) -> Result<StoredRule, ControlError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // The rule set's lock before the rule's, as in every write.
        lock_id(&tx, "tollgate:rule-set").await?;
        let current = lock_rule(&tx, id).await?;
        let Some((version, old)) = &current else {
            return Err(ControlError::NotFound(id.into()));
        };
        check(id, &condition, Some(*version))?;
        let mut merged = old.clone();
        merge_patch(&mut merged, patch);
        let doc: RuleDoc = from_json(merged).map_err(ControlError::Invalid)?;
        let doc = as_written(id, doc, default_domain)?;
        self.check_precedence(&tx, id, Some(&doc)).await?;
        self.write(&tx, id, current, doc, actor).await?;
        let rule = get_rule(&tx, id)
            .await?
            .ok_or_else(|| ControlError::NotFound(id.into()))?;
        tx.commit().await?;
        Ok(rule)
    }

    /// Writes `doc` over `current` (the rule's locked row), unless it is the same: a new
    /// version one past the last this id ever had (a deleted and re-created rule never reuses
    /// a version, so a stale `If-Match` cannot match it), its history entry, a new revision.
    async fn write(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        id: &str,
        current: Option<(i64, Value)>,
        doc: RuleDoc,
        actor: &str,
    ) -> Result<Written, ControlError> {
        let new = doc_json(&doc);
        if current.as_ref().is_some_and(|(_, old)| *old == new) {
            return Ok(Written::Unchanged);
        }
        let version = last_version(tx, id).await? + 1;
        write_rule(tx, &doc, version, actor).await?;
        let (change, written) = if current.is_some() {
            ("updated", Written::Updated)
        } else {
            ("created", Written::Created)
        };
        record(
            tx,
            id,
            change,
            version,
            actor,
            current.map(|(_, old)| old),
            Some(new),
        )
        .await?;
        Ok(written)
    }

    /// Deletes a rule.
    pub async fn delete(
        &self,
        id: &str,
        condition: Option<Precondition>,
        actor: &str,
    ) -> Result<(), ControlError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        lock_id(&tx, "tollgate:rule-set").await?;
        let Some((version, old)) = lock_rule(&tx, id).await? else {
            return Err(ControlError::NotFound(id.into()));
        };
        check(id, &condition, Some(version))?;
        self.check_precedence(&tx, id, None).await?;
        tx.execute("DELETE FROM rate_limit_rules WHERE id = $1", &[&id])
            .await?;
        record(&tx, id, "deleted", version + 1, actor, Some(old), None).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Creates or replaces an envoyproxy/ratelimit domain configuration; whether it changed
    /// (the same configuration again writes nothing and leaves the revision alone).
    pub async fn put_envoy_domain(
        &self,
        domain: &str,
        config: &Value,
        actor: &str,
    ) -> Result<bool, ControlError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        lock_id(&tx, &format!("envoy:{domain}")).await?;
        let current: Option<Value> = tx
            .query_opt(
                "SELECT config FROM envoy_ratelimit_domains WHERE domain = $1",
                &[&domain],
            )
            .await?
            .map(|r| r.get(0));
        if current.as_ref() == Some(config) {
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO envoy_ratelimit_domains (domain, config, version, updated_by) VALUES ($1, $2, 1, $3)
             ON CONFLICT (domain) DO UPDATE SET config = $2, version = envoy_ratelimit_domains.version + 1,
                 updated_at = now(), updated_by = $3",
            &[&domain, config, &actor],
        )
        .await?;
        bump_revision(&tx).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Validates the document and returns it as it is stored: as written, with the id from the
/// path, the default domain if it names none, and the mode and fail mode's defaults spelled
/// out. Nothing is derived here (not `per` from `match`, nor durations rewritten): a later
/// PATCH of `match` must not leave behind a `per` nobody wrote, and an export gives back what
/// was written. Derived values are derived when the rule is compiled.
fn as_written(
    id: &str,
    mut doc: RuleDoc,
    default_domain: Option<&str>,
) -> Result<RuleDoc, ControlError> {
    match &doc.id {
        Some(given) if given != id => {
            return Err(ControlError::Invalid(FieldError {
                field: "id".into(),
                reason: format!("{given:?} does not match the id in the path, {id:?}"),
            }));
        }
        _ => doc.id = Some(id.to_owned()),
    }
    // Every other field first (a stand-in where the domain is missing), then the domain.
    doc.validate_all(Some(default_domain.unwrap_or("-")), format!("rule {id}"))
        .map_err(ControlError::InvalidFields)?;
    if doc.domain.is_none() && default_domain.is_none() {
        return Err(ControlError::Invalid(FieldError {
            field: "domain".into(),
            reason: "is required: name the domain whose requests the rule limits (a node started \
                     with --default-domain, or enforcing a single domain, fills it in)"
                .into(),
        }));
    }
    if let Some(domain) = default_domain {
        doc.domain.get_or_insert_with(|| domain.to_owned());
    }
    doc.mode.get_or_insert_with(|| "ENFORCE".into());
    doc.fail_mode.get_or_insert_with(|| "OPEN".into());
    Ok(doc)
}

/// Serialises writers of one id (creations included, which no row lock can: the row does not
/// exist yet), for the rest of the transaction.
pub(super) async fn lock_id(tx: &impl GenericClient, id: &str) -> Result<(), ControlError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 7026))",
        &[&id],
    )
    .await?;
    Ok(())
}

pub(super) fn check(
    id: &str,
    condition: &Option<Precondition>,
    current: Option<i64>,
) -> Result<(), ControlError> {
    let stale = |expected: String| ControlError::Stale {
        id: id.into(),
        current,
        expected,
    };
    match (condition, current) {
        (None, _) => Ok(()),
        (Some(Precondition::Exists), Some(_)) => Ok(()),
        (Some(Precondition::Exists), None) => Err(stale("If-Match named *".into())),
        (Some(Precondition::Absent), None) => Ok(()),
        (Some(Precondition::Absent), Some(_)) => Err(stale("If-None-Match: * creates only".into())),
        (Some(Precondition::Version(v)), Some(c)) if *v == c => Ok(()),
        (Some(Precondition::Version(v)), _) => Err(stale(format!("If-Match named {v}"))),
    }
}

/// Locks rule `id` for the transaction (existing or not); its version and document, if it
/// exists.
async fn lock_rule(
    tx: &impl GenericClient,
    id: &str,
) -> Result<Option<(i64, Value)>, ControlError> {
    lock_id(tx, id).await?;
    let sql = format!(
        "SELECT {RULE_COLUMNS}, {} FROM rate_limit_rules WHERE id = $1 FOR UPDATE",
        time("updated_at")
    );
    Ok(tx.query_opt(&sql, &[&id]).await?.map(|row| {
        let rule = stored(&row);
        (rule.version, doc_json(&rule.doc))
    }))
}
