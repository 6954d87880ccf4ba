//! A rule as a row of `rate_limit_rules`, both ways: the row read back into a document, the
//! document written as a row.

use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_postgres::Row;

use tollgate_node::rules::native::{DurationValue, RuleDoc};

use super::error::ControlError;

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

/// An RFC 3339 UTC timestamp of the column `%s`.
const TIME: &str = "to_char(%s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')";
pub(super) const RULE_COLUMNS: &str = "id, domain, name, match_json, per_json, algorithm, parameters, mode, fail_mode, version, updated_by, regional_policy, penalty_json, replaces_json, without_json";

pub(super) fn time(column: &str) -> String {
    TIME.replace("%s", column)
}

/// The rule `id` as stored, read through `client` (a connection or a transaction).
pub(super) async fn get_rule(
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

pub(super) async fn write_rule(
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
    let penalty = doc
        .penalty
        .as_ref()
        .map(|p| serde_json::to_value(p).unwrap_or(Value::Null));
    let replaces = (!doc.replaces.is_empty()).then(|| serde_json::json!(doc.replaces));
    let without = (!doc.without.is_empty()).then(|| serde_json::json!(doc.without));
    tx.execute(
        "INSERT INTO rate_limit_rules (id, domain, name, match_json, per_json, algorithm, parameters, mode, fail_mode, version, updated_by, regional_policy, penalty_json, replaces_json, without_json)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
         ON CONFLICT (id) DO UPDATE SET domain = $2, name = $3, match_json = $4, per_json = $5, algorithm = $6,
             parameters = $7, mode = $8, fail_mode = $9, version = $10, updated_at = now(), updated_by = $11,
             regional_policy = $12, penalty_json = $13, replaces_json = $14, without_json = $15",
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
            &penalty,
            &replaces,
            &without,
        ],
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
    num("burst", doc.burst);
    num("ratePerSecond", doc.rate_per_second);
    num("limit", doc.limit);
    num("maxInFlight", doc.max_in_flight);
    let mut dur = |k: &str, v: &Option<DurationValue>| {
        if let Some(v) = v {
            p.insert(k.into(), serde_json::to_value(v).unwrap_or(Value::Null));
        }
    };
    dur("window", &doc.window);
    dur("slotTtl", &doc.slot_ttl);
    dur("duration", &doc.duration);
    Value::Object(p)
}

pub(super) fn stored(row: &Row) -> StoredRule {
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
        burst: number("burst"),
        rate_per_second: number("ratePerSecond"),
        limit: number("limit"),
        window: duration("window"),
        max_in_flight: number("maxInFlight"),
        slot_ttl: duration("slotTtl"),
        duration: duration("duration"),
        mode: Some(row.get(7)),
        fail_mode: Some(row.get(8)),
        regional: row
            .get::<_, Option<Value>>(11)
            .and_then(|v| serde_json::from_value(v).ok()),
        penalty: row
            .get::<_, Option<Value>>(12)
            .and_then(|v| serde_json::from_value(v).ok()),
        replaces: row
            .get::<_, Option<Value>>(13)
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default(),
        without: row
            .get::<_, Option<Value>>(14)
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default(),
    };
    StoredRule {
        doc,
        version: row.get(9),
        updated_by: row.get(10),
        updated_at: row.get(15),
    }
}
