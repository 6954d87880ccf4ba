//! Reading rules: one, a page of them, every rule and envoy domain at one revision, every id.

use serde::Serialize;
use serde_json::Value;

use tollgate_node::rules::native::RuleDoc;

use super::error::ControlError;
use super::overrides::{StoredOverride, all_overrides};
use super::pool::RuleStore;
use super::rows::{RULE_COLUMNS, StoredRule, get_rule, stored, time};

/// Every rule at one revision.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The rule set's revision.
    pub revision: i64,
    /// Tollgate rules (including DISABLED ones).
    pub rules: Vec<RuleDoc>,
    /// envoyproxy/ratelimit configurations, one document per domain.
    pub envoy: Vec<Value>,
    /// Mode overrides (absent from snapshots written before there were any).
    #[serde(default)]
    pub overrides: Vec<StoredOverride>,
}

/// A list query.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this domain.
    pub domain: Option<String>,
    /// Only this mode.
    pub mode: Option<String>,
    /// Ids after this one (keyset pagination).
    pub after: Option<String>,
    /// At most this many.
    pub limit: i64,
}

impl RuleStore {
    /// One rule.
    pub async fn get(&self, id: &str) -> Result<Option<StoredRule>, ControlError> {
        let client = self.pool.get().await?;
        get_rule(&client, id).await
    }

    /// Rules in id order, filtered, one page.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<StoredRule>, ControlError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {RULE_COLUMNS}, {} FROM rate_limit_rules
             WHERE ($1::text IS NULL OR domain = $1) AND ($2::text IS NULL OR mode = $2) AND ($3::text IS NULL OR id > $3)
             ORDER BY id LIMIT $4",
            time("updated_at")
        );
        let rows = client
            .query(
                &sql,
                &[&filter.domain, &filter.mode, &filter.after, &filter.limit],
            )
            .await?;
        Ok(rows.iter().map(stored).collect())
    }

    /// Every rule and envoy domain at one revision (a repeatable-read transaction).
    pub async fn snapshot(&self) -> Result<Snapshot, ControlError> {
        let mut client = self.pool.get().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let revision: i64 = tx
            .query_one("SELECT revision FROM rule_set_revision", &[])
            .await?
            .get(0);
        let sql = format!(
            "SELECT {RULE_COLUMNS}, {} FROM rate_limit_rules ORDER BY id",
            time("updated_at")
        );
        let rules = tx
            .query(&sql, &[])
            .await?
            .iter()
            .map(|r| stored(r).doc)
            .collect();
        let envoy = tx
            .query(
                "SELECT config FROM envoy_ratelimit_domains ORDER BY domain",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let overrides = all_overrides(&tx).await?;
        tx.commit().await?;
        Ok(Snapshot {
            revision,
            rules,
            envoy,
            overrides,
        })
    }

    /// Ids of every Tollgate rule.
    pub async fn rule_ids(&self) -> Result<Vec<String>, ControlError> {
        let client = self.pool.get().await?;
        Ok(client
            .query("SELECT id FROM rate_limit_rules ORDER BY id", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }
}
