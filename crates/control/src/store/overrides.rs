//! Mode overrides in PostgreSQL (`rule_mode_overrides`): set, lift, read. Each write is one
//! transaction under the rule id's lock, appends to that id's history (`overridden`,
//! `override-lifted`) and bumps the revision, so every node applies it within a second.

use deadpool_postgres::GenericClient;
use serde::{Deserialize, Serialize};
use serde_json::json;

use tollgate_node::rules::Mode;
use tollgate_node::rules::native::FieldError;
use tollgate_node::rules::overrides::{self, ModeOverride};

use super::error::ControlError;
use super::history::record;
use super::pool::RuleStore;
use super::rows::time;
use super::writes::{Precondition, check, lock_id};

/// A mode override as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredOverride {
    /// The rule's id (an envoyproxy/ratelimit descriptor: its path).
    pub rule_id: String,
    /// The mode every node runs the rule in.
    pub mode: String,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its version (the `ETag`).
    pub version: i64,
    /// When it was set (RFC 3339, UTC).
    pub updated_at: String,
    /// Who set it.
    pub updated_by: String,
}

impl StoredOverride {
    /// As a node applies it.
    pub fn to_override(&self) -> Result<ModeOverride, ControlError> {
        let mode = self.mode.parse::<Mode>().map_err(|reason| {
            ControlError::Database(format!(
                "stored mode override of {:?}: {reason}",
                self.rule_id
            ))
        })?;
        Ok(ModeOverride {
            id: self.rule_id.clone(),
            mode,
            reason: self.reason.clone(),
            origin: format!(
                "postgres (set by {} at {})",
                self.updated_by, self.updated_at
            ),
        })
    }

    fn history_json(&self) -> serde_json::Value {
        json!({ "modeOverride": self.mode, "reason": self.reason })
    }
}

/// What a caller sends to set an override.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideBody {
    /// ENFORCE, SHADOW or DISABLED (any case).
    pub mode: String,
    /// Why (shown in the history and `GET /rules`).
    #[serde(default)]
    pub reason: Option<String>,
}

const COLUMNS: &str = "rule_id, mode, reason, version, updated_by";

fn row_to(row: &tokio_postgres::Row) -> StoredOverride {
    StoredOverride {
        rule_id: row.get(0),
        mode: row.get(1),
        reason: row.get(2),
        version: row.get(3),
        updated_by: row.get(4),
        updated_at: row.get(5),
    }
}

async fn get_override(
    client: &impl GenericClient,
    id: &str,
    lock: bool,
) -> Result<Option<StoredOverride>, ControlError> {
    let sql = format!(
        "SELECT {COLUMNS}, {} FROM rule_mode_overrides WHERE rule_id = $1{}",
        time("updated_at"),
        if lock { " FOR UPDATE" } else { "" }
    );
    Ok(client.query_opt(&sql, &[&id]).await?.map(|r| row_to(&r)))
}

/// Every override, in id order, read through `client`.
pub(super) async fn all_overrides(
    client: &impl GenericClient,
) -> Result<Vec<StoredOverride>, ControlError> {
    let sql = format!(
        "SELECT {COLUMNS}, {} FROM rule_mode_overrides ORDER BY rule_id",
        time("updated_at")
    );
    Ok(client.query(&sql, &[]).await?.iter().map(row_to).collect())
}

impl RuleStore {
    /// Sets rule `id`'s mode on every node; the override as stored and whether it is new.
    pub async fn set_override(
        &self,
        id: &str,
        body: OverrideBody,
        condition: Option<Precondition>,
        actor: &str,
    ) -> Result<(StoredOverride, bool), ControlError> {
        overrides::check_id(id).map_err(|reason| {
            ControlError::Invalid(FieldError {
                field: "id".into(),
                reason: reason.into(),
            })
        })?;
        let mode = body.mode.parse::<Mode>().map_err(|reason| {
            ControlError::Invalid(FieldError {
                field: "mode".into(),
                reason: reason.to_string(),
            })
        })?;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        lock_id(&tx, id).await?;
        let current = get_override(&tx, id, true).await?;
        check(id, &condition, current.as_ref().map(|o| o.version))?;
        let same = current
            .as_ref()
            .is_some_and(|c| c.mode == mode.as_str() && c.reason == body.reason);
        if !same {
            let version = current.as_ref().map_or(1, |c| c.version + 1);
            tx.execute(
                "INSERT INTO rule_mode_overrides (rule_id, mode, reason, version, updated_by)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (rule_id) DO UPDATE SET mode = $2, reason = $3, version = $4,
                     updated_at = now(), updated_by = $5",
                &[&id, &mode.as_str(), &body.reason, &version, &actor],
            )
            .await?;
        }
        let stored = get_override(&tx, id, false)
            .await?
            .ok_or_else(|| ControlError::NotFound(id.into()))?;
        if !same {
            record(
                &tx,
                id,
                "overridden",
                stored.version,
                actor,
                current.as_ref().map(StoredOverride::history_json),
                Some(stored.history_json()),
            )
            .await?;
        }
        tx.commit().await?;
        Ok((stored, current.is_none()))
    }

    /// Lifts rule `id`'s override: every node runs it in its own mode again.
    pub async fn lift_override(
        &self,
        id: &str,
        condition: Option<Precondition>,
        actor: &str,
    ) -> Result<(), ControlError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        lock_id(&tx, id).await?;
        let Some(current) = get_override(&tx, id, true).await? else {
            return Err(ControlError::NotFound(format!("{id} (no mode override)")));
        };
        check(id, &condition, Some(current.version))?;
        tx.execute("DELETE FROM rule_mode_overrides WHERE rule_id = $1", &[&id])
            .await?;
        record(
            &tx,
            id,
            "override-lifted",
            current.version,
            actor,
            Some(current.history_json()),
            None,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Rule `id`'s override, if it has one.
    pub async fn mode_override(&self, id: &str) -> Result<Option<StoredOverride>, ControlError> {
        let client = self.pool.get().await?;
        get_override(&client, id, false).await
    }

    /// Every override, in id order.
    pub async fn mode_overrides(&self) -> Result<Vec<StoredOverride>, ControlError> {
        let client = self.pool.get().await?;
        all_overrides(&client).await
    }
}
