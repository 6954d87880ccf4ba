//! The history and the revision: a write appends what changed to the rule's history, bumps
//! the rule set's revision and notifies the nodes; both are read back here.

use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::Value;

use super::error::ControlError;
use super::pool::RuleStore;
use super::rows::time;

/// The channel nodes LISTEN on; the payload is the new revision.
pub const CHANNEL: &str = "tollgate_rules";

/// One change in a rule's history.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// created, updated or deleted; overridden or override-lifted (a mode override's, whose
    /// version, old and new are the override's).
    pub change: String,
    /// The rule's version after the change.
    pub version: i64,
    /// The rule set's revision after the change.
    pub revision: i64,
    /// Who.
    pub changed_by: String,
    /// When (RFC 3339, UTC).
    pub changed_at: String,
    /// The rule before (absent when created).
    pub old_rule: Option<Value>,
    /// The rule after (absent when deleted).
    pub new_rule: Option<Value>,
}

impl RuleStore {
    /// A rule's history, newest first.
    pub async fn history(&self, id: &str, limit: i64) -> Result<Vec<HistoryEntry>, ControlError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT change, version, revision, changed_by, {}, old_rule, new_rule FROM rate_limit_rule_history
             WHERE rule_id = $1 ORDER BY seq DESC LIMIT $2",
            time("changed_at")
        );
        let rows = client.query(&sql, &[&id, &limit]).await?;
        Ok(rows
            .iter()
            .map(|r| HistoryEntry {
                change: r.get(0),
                version: r.get(1),
                revision: r.get(2),
                changed_by: r.get(3),
                changed_at: r.get(4),
                old_rule: r.get(5),
                new_rule: r.get(6),
            })
            .collect())
    }

    /// The rule set's current revision.
    pub async fn revision(&self) -> Result<i64, ControlError> {
        let client = self.pool.get().await?;
        Ok(client
            .query_one("SELECT revision FROM rule_set_revision", &[])
            .await?
            .get(0))
    }
}

/// The last version rule `id` ever had (0 if none), deleted ones included (its mode
/// overrides' entries have versions of their own).
pub(super) async fn last_version(tx: &impl GenericClient, id: &str) -> Result<i64, ControlError> {
    Ok(tx
        .query_opt(
            "SELECT version FROM rate_limit_rule_history
             WHERE rule_id = $1 AND change IN ('created', 'updated', 'deleted')
             ORDER BY seq DESC LIMIT 1",
            &[&id],
        )
        .await?
        .map_or(0, |r| r.get(0)))
}

pub(super) async fn bump_revision(tx: &impl GenericClient) -> Result<i64, ControlError> {
    let revision: i64 = tx
        .query_one(
            "UPDATE rule_set_revision SET revision = revision + 1 RETURNING revision",
            &[],
        )
        .await?
        .get(0);
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&CHANNEL, &revision.to_string()],
    )
    .await?;
    Ok(revision)
}

pub(super) async fn record(
    tx: &impl GenericClient,
    id: &str,
    change: &str,
    version: i64,
    actor: &str,
    old: Option<Value>,
    new: Option<Value>,
) -> Result<(), ControlError> {
    let revision = bump_revision(tx).await?;
    tx.execute(
        "INSERT INTO rate_limit_rule_history (rule_id, change, version, revision, changed_by, old_rule, new_rule)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[&id, &change, &version, &revision, &actor, &old, &new],
    )
    .await?;
    Ok(())
}
