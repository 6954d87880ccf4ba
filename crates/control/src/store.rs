//! The rule store in PostgreSQL. Every write is one transaction that checks the precondition,
//! bumps the rule's version and the rule set's revision, appends to the history and notifies
//! the nodes (delivered at commit). Concurrent writers of one rule are serialised by its row
//! lock, so no update is lost: each history entry's "before" is the true previous rule.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use deadpool_postgres::{Config, Pool, PoolConfig, Runtime, Timeouts};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_postgres::{NoTls, Row};

use tollgate_node::rules::native::{DurationValue, FieldError, RuleDoc};

/// The channel nodes LISTEN on; the payload is the new revision.
pub const CHANNEL: &str = "tollgate_rules";

/// What went wrong in the control plane.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// The rule is invalid.
    #[error("{0}")]
    Invalid(FieldError),
    /// No such rule.
    #[error("no rule {0:?}")]
    NotFound(String),
    /// The precondition failed: the rule's version is not the one named.
    #[error("rule {id:?} is at version {current:?}; {expected}")]
    Stale {
        /// The rule.
        id: String,
        /// Its current version (None: it does not exist).
        current: Option<i64>,
        /// What the caller's precondition asked (`If-Match named 3`).
        expected: String,
    },
    /// PostgreSQL cannot be reached.
    #[error("the rule store is unavailable: {0}")]
    Unavailable(String),
    /// PostgreSQL refused something.
    #[error("rule store error: {0}")]
    Database(String),
}

/// What PostgreSQL said, in full: the server's own message for a database error (`database
/// "x" does not exist`, `password authentication failed for user "y"`), else the error and
/// its causes (`error connecting to server: Connection refused`). tokio-postgres's `Display`
/// alone says only "db error".
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{}: {}", db.severity(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" ({detail})"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(&format!(": {cause_text}"));
        }
        source = cause.source();
    }
    text
}

impl From<tokio_postgres::Error> for ControlError {
    fn from(e: tokio_postgres::Error) -> Self {
        let text = describe(&e);
        match e.as_db_error() {
            // The server answered: what it refused is the message (a missing database or a
            // failed authentication is not a passing outage, but the node keeps retrying).
            Some(_) if !e.is_closed() => ControlError::Database(text),
            _ => ControlError::Unavailable(text),
        }
    }
}

impl From<deadpool_postgres::PoolError> for ControlError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => ControlError::from(e),
            other => ControlError::Unavailable(other.to_string()),
        }
    }
}

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

/// A rule as stored.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredRule {
    /// The rule.
    #[serde(flatten)]
    pub doc: RuleDoc,
    /// Its version (the `ETag`).
    pub version: i64,
    /// When it last changed (RFC 3339, UTC).
    pub updated_at: String,
    /// Who changed it (a token's name).
    pub updated_by: String,
}

/// One change in a rule's history.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// created, updated or deleted.
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

/// Every rule at one revision.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The rule set's revision.
    pub revision: i64,
    /// Tollgate rules (including DISABLED ones).
    pub rules: Vec<RuleDoc>,
    /// envoyproxy/ratelimit configurations, one document per domain.
    pub envoy: Vec<Value>,
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

const TIME: &str = "to_char(%s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')";
const RULE_COLUMNS: &str = "id, domain, name, match_json, per_json, algorithm, parameters, mode, fail_mode, version, updated_by, regional_policy";

fn time(column: &str) -> String {
    TIME.replace("%s", column)
}

/// The rule store.
#[derive(Debug, Clone)]
pub struct RuleStore {
    pool: Pool,
    url: String,
}

impl RuleStore {
    /// A pool on `url` (no connection is made until used). Calls wait at most `timeout` for a
    /// connection, so an unreachable database fails requests fast.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, ControlError> {
        let config = Config {
            url: Some(url.to_owned()),
            pool: Some(PoolConfig {
                max_size: 8,
                timeouts: Timeouts {
                    wait: Some(timeout),
                    create: Some(timeout),
                    recycle: Some(timeout),
                },
                ..PoolConfig::default()
            }),
            ..Config::default()
        };
        let pool = config
            .create_pool(Some(Runtime::Tokio1), NoTls)
            .map_err(|e| ControlError::Unavailable(e.to_string()))?;
        Ok(Self {
            pool,
            url: url.to_owned(),
        })
    }

    /// The database URL (for the listening connection).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<usize, ControlError> {
        let mut client = self.pool.get().await?;
        Ok(crate::schema::migrate(&mut client).await?)
    }

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

    /// Creates or replaces a rule with the document as written. Returns it and what was done.
    pub async fn put(
        &self,
        id: &str,
        doc: RuleDoc,
        condition: Option<Precondition>,
        actor: &str,
        default_domain: &str,
    ) -> Result<(StoredRule, Written), ControlError> {
        let doc = as_written(id, doc, default_domain)?;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let current = lock_rule(&tx, id).await?;
        check(id, &condition, current.as_ref().map(|(v, _)| *v))?;
        let written = self.write(&tx, id, current, doc, actor).await?;
        // Read inside the transaction, under its lock: what this write stored, not what a
        // writer that follows it has stored since.
        let rule = get_rule(&tx, id)
            .await?
            .ok_or_else(|| ControlError::NotFound(id.into()))?;
        tx.commit().await?;
        Ok((rule, written))
    }

    /// Applies a JSON merge patch (RFC 7396) to a rule, e.g. `{"mode": "DISABLED"}`.
    pub async fn patch(
        &self,
        id: &str,
        patch: &Value,
        condition: Option<Precondition>,
        actor: &str,
        default_domain: &str,
    ) -> Result<StoredRule, ControlError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let current = lock_rule(&tx, id).await?;
        let Some((version, old)) = &current else {
            return Err(ControlError::NotFound(id.into()));
        };
        check(id, &condition, Some(*version))?;
        let mut merged = old.clone();
        merge_patch(&mut merged, patch);
        let doc: RuleDoc = from_json(merged).map_err(ControlError::Invalid)?;
        let doc = as_written(id, doc, default_domain)?;
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
        let Some((version, old)) = lock_rule(&tx, id).await? else {
            return Err(ControlError::NotFound(id.into()));
        };
        check(id, &condition, Some(version))?;
        tx.execute("DELETE FROM rate_limit_rules WHERE id = $1", &[&id])
            .await?;
        record(&tx, id, "deleted", version + 1, actor, Some(old), None).await?;
        tx.commit().await?;
        Ok(())
    }

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
        tx.commit().await?;
        Ok(Snapshot {
            revision,
            rules,
            envoy,
        })
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

/// Validates the document and returns it as it is stored: as written, with the id from the
/// path, the default domain if it names none, and the mode and fail mode's defaults spelled
/// out. Nothing is derived here (not `per` from `match`, nor durations rewritten): a later
/// PATCH of `match` must not leave behind a `per` nobody wrote, and an export gives back what
/// was written. Derived values are derived when the rule is compiled.
fn as_written(id: &str, mut doc: RuleDoc, default_domain: &str) -> Result<RuleDoc, ControlError> {
    match &doc.id {
        Some(given) if given != id => {
            return Err(ControlError::Invalid(FieldError {
                field: "id".into(),
                reason: format!("{given:?} does not match the id in the path, {id:?}"),
            }));
        }
        _ => doc.id = Some(id.to_owned()),
    }
    doc.validate(Some(default_domain), format!("rule {id}"))
        .map_err(ControlError::Invalid)?;
    doc.domain.get_or_insert_with(|| default_domain.to_owned());
    doc.mode.get_or_insert_with(|| "ENFORCE".into());
    doc.fail_mode.get_or_insert_with(|| "OPEN".into());
    Ok(doc)
}

/// Serialises writers of one id (creations included, which no row lock can: the row does not
/// exist yet), for the rest of the transaction.
async fn lock_id(tx: &impl GenericClient, id: &str) -> Result<(), ControlError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 7026))",
        &[&id],
    )
    .await?;
    Ok(())
}

/// The last version rule `id` ever had (0 if none), deleted ones included.
async fn last_version(tx: &impl GenericClient, id: &str) -> Result<i64, ControlError> {
    Ok(tx
        .query_opt(
            "SELECT version FROM rate_limit_rule_history WHERE rule_id = $1 ORDER BY seq DESC LIMIT 1",
            &[&id],
        )
        .await?
        .map_or(0, |r| r.get(0)))
}

fn check(
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

async fn write_rule(
    tx: &impl GenericClient,
    doc: &RuleDoc,
    version: i64,
    actor: &str,
) -> Result<(), ControlError> {
    let matches = serde_json::to_value(&doc.matches).unwrap_or(Value::Null);
    let per = doc
        .per
        .as_ref()
        .map(|p| serde_json::to_value(p).unwrap_or(Value::Null));
    let regional = doc
        .regional
        .as_ref()
        .map(|r| serde_json::to_value(r).unwrap_or(Value::Null));
    tx.execute(
        "INSERT INTO rate_limit_rules (id, domain, name, match_json, per_json, algorithm, parameters, mode, fail_mode, version, updated_by, regional_policy)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT (id) DO UPDATE SET domain = $2, name = $3, match_json = $4, per_json = $5, algorithm = $6,
             parameters = $7, mode = $8, fail_mode = $9, version = $10, updated_at = now(), updated_by = $11,
             regional_policy = $12",
        &[
            &doc.id,
            &doc.domain,
            &doc.name,
            &matches,
            &per,
            &doc.algorithm,
            &parameters(doc),
            &doc.mode.clone().unwrap_or_else(|| "ENFORCE".into()),
            &doc.fail_mode.clone().unwrap_or_else(|| "OPEN".into()),
            &version,
            &actor,
            &regional,
        ],
    )
    .await?;
    Ok(())
}

async fn bump_revision(tx: &impl GenericClient) -> Result<i64, ControlError> {
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

async fn record(
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

fn parameters(doc: &RuleDoc) -> Value {
    let mut p = Map::new();
    let mut num = |k: &str, v: Option<f64>| {
        if let Some(v) = v {
            p.insert(k.into(), json!(v));
        }
    };
    num("capacity", doc.capacity);
    num("refillPerSecond", doc.refill_per_second);
    num("limit", doc.limit);
    num("maxInFlight", doc.max_in_flight);
    let mut dur = |k: &str, v: &Option<DurationValue>| {
        if let Some(v) = v {
            p.insert(k.into(), serde_json::to_value(v).unwrap_or(Value::Null));
        }
    };
    dur("window", &doc.window);
    dur("slotTtl", &doc.slot_ttl);
    Value::Object(p)
}

fn stored(row: &Row) -> StoredRule {
    let matches: Value = row.get(3);
    let per: Option<Value> = row.get(4);
    let params: Value = row.get(6);
    let number = |k: &str| params.get(k).and_then(Value::as_f64);
    let duration = |k: &str| {
        params
            .get(k)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    };
    let doc = RuleDoc {
        id: Some(row.get(0)),
        domain: Some(row.get(1)),
        name: row.get(2),
        matches: serde_json::from_value(matches).unwrap_or_default(),
        per: per.and_then(|p| serde_json::from_value(p).ok()),
        algorithm: row.get(5),
        capacity: number("capacity"),
        refill_per_second: number("refillPerSecond"),
        limit: number("limit"),
        window: duration("window"),
        max_in_flight: number("maxInFlight"),
        slot_ttl: duration("slotTtl"),
        mode: Some(row.get(7)),
        fail_mode: Some(row.get(8)),
        regional: row
            .get::<_, Option<Value>>(11)
            .and_then(|v| serde_json::from_value(v).ok()),
    };
    StoredRule {
        doc,
        version: row.get(9),
        updated_by: row.get(10),
        updated_at: row.get(12),
    }
}

/// The rule document as JSON (what history records).
pub fn doc_json(doc: &RuleDoc) -> Value {
    serde_json::to_value(doc).unwrap_or(Value::Null)
}

/// RFC 7396: objects merge recursively, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in fields {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Reads a JSON document into `T`, naming the field at fault: the path to a value of the
/// wrong type, or the field an error message names (unknown, missing), else `body`.
pub fn from_json<'de, T: serde::Deserialize<'de>>(
    document: impl serde::Deserializer<'de, Error = serde_json::Error>,
) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(document).map_err(|e| {
        let path = e.path().to_string();
        let mut error = serde_field_error(&e.into_inner().to_string());
        // `?` marks a place the parser never reached (a syntax error before any key).
        if error.field == "body" && !path.is_empty() && path != "." && !path.contains('?') {
            error.field = path;
        }
        error
    })
}

/// A serde error message as a field error: `unknown field `x`` names `x`.
pub fn serde_field_error(message: &str) -> FieldError {
    let field = message
        .split('`')
        .nth(1)
        .filter(|_| message.contains("field"))
        .map(str::to_owned)
        .unwrap_or_else(|| "body".into());
    FieldError {
        field,
        reason: message.to_owned(),
    }
}

/// The rule `id` as stored, read through `client` (a connection or a transaction).
async fn get_rule(
    client: &impl deadpool_postgres::GenericClient,
    id: &str,
) -> Result<Option<StoredRule>, ControlError> {
    let sql = format!(
        "SELECT {RULE_COLUMNS}, {} FROM rate_limit_rules WHERE id = $1",
        time("updated_at")
    );
    Ok(client
        .query_opt(&sql, &[&id])
        .await?
        .map(|row| stored(&row)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut doc = json!({"mode": "ENFORCE", "match": {"a": "1", "b": "2"}, "capacity": 5});
        merge_patch(
            &mut doc,
            &json!({"mode": "DISABLED", "match": {"b": null, "c": "3"}}),
        );
        assert_eq!(
            doc,
            json!({"mode": "DISABLED", "match": {"a": "1", "c": "3"}, "capacity": 5})
        );
    }

    #[test]
    fn serde_errors_name_their_field() {
        assert_eq!(
            serde_field_error("unknown field `capacty`, expected one of ...").field,
            "capacty"
        );
        assert_eq!(
            serde_field_error("missing field `algorithm`").field,
            "algorithm"
        );
        assert_eq!(
            serde_field_error("EOF while parsing a value at line 1 column 3").field,
            "body"
        );
    }
}
