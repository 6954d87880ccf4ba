//! `GET /admin/v1/counters` and `POST /admin/v1/counters/reset`: what support needs to answer
//! "why is customer X limited, and can you unblock them". A read shows, for every rule the
//! descriptor matches, the live counter of the descriptor's identity; a reset forgets it (one
//! rule or all), is written to each rule's history with who did it, and every node drops what
//! it holds of the bucket when PostgreSQL tells it.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AdminState, Caller, body_json, query_problem};
use crate::problem::Problem;
use crate::store::{ResetNotice, ResetRecord};
use tollgate_node::Request;
use tollgate_node::runtime::node::operator::{Counter, CounterError, Reset};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CounterQuery {
    domain: Option<String>,
    descriptor: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResetBody {
    domain: String,
    descriptor: Value,
    #[serde(default)]
    rule: Option<String>,
}

/// 400: the counter request is malformed, naming the field.
fn bad(field: impl Into<String>, reason: impl Into<String>) -> Problem {
    Problem::bad_request("Invalid counter request", field, reason)
}

/// A descriptor written `key=value,key=value` (in that order), or as JSON (see [`entries_of`]),
/// or pasted from a log line: an RLS descriptor's JSON (`{"entries":[{"key":"api_key",
/// "value":"k1"}]}`, as Envoy and envoyproxy/ratelimit log it) found anywhere in the text, or
/// `key=value` pairs separated by spaces (logfmt) when no comma separates them.
pub(crate) fn parse_descriptor(text: &str) -> Result<Vec<(String, String)>, Problem> {
    let text = text.trim();
    if let Some(at) = text.find("{\"entries\"") {
        let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
        if let Some(Ok(descriptor)) = values.next() {
            return rls_entries(&descriptor);
        }
    }
    if text.starts_with('{') || text.starts_with('[') {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| bad("descriptor", format!("not a JSON object: {e}")))?;
        return entries_of(&value);
    }
    let pairs: Vec<&str> = if text.contains(',') {
        text.split(',').collect()
    } else {
        text.split_ascii_whitespace().collect()
    };
    pairs
        .into_iter()
        .map(|entry| match entry.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
            _ => Err(bad(
                "descriptor",
                format!("{entry:?} is not key=value (write key=value,key=value, or a JSON object)"),
            )),
        })
        .collect()
}

/// An RLS descriptor as JSON: `{"entries": [{"key": "...", "value": "..."}, ...]}`.
fn rls_entries(descriptor: &Value) -> Result<Vec<(String, String)>, Problem> {
    let entries = descriptor["entries"]
        .as_array()
        .ok_or_else(|| bad("descriptor", "its \"entries\" is not a list"))?;
    entries
        .iter()
        .enumerate()
        .map(
            |(i, entry)| match (entry["key"].as_str(), entry["value"].as_str()) {
                (Some(k), Some(v)) => Ok((k.to_owned(), v.to_owned())),
                _ => Err(bad(
                    format!("descriptor.entries[{i}]"),
                    "must be {\"key\": \"...\", \"value\": \"...\"}",
                )),
            },
        )
        .collect()
}

/// A descriptor as a JSON array of `[key, value]` pairs (in the descriptor's order, which an
/// envoyproxy/ratelimit rule tree is walked in), or an object of strings (its keys sorted).
fn entries_of(value: &Value) -> Result<Vec<(String, String)>, Problem> {
    if let Some(pairs) = value.as_array() {
        return pairs
            .iter()
            .enumerate()
            .map(|(i, pair)| match pair.as_array().map(Vec::as_slice) {
                Some([Value::String(k), Value::String(v)]) => Ok((k.clone(), v.clone())),
                _ => Err(bad(
                    format!("descriptor[{i}]"),
                    "must be a [key, value] pair of strings",
                )),
            })
            .collect();
    }
    let Some(object) = value.as_object() else {
        return Err(bad(
            "descriptor",
            "must be [[key, value], ...] or an object of entries, {\"api_key\": \"k1\"}",
        ));
    };
    object
        .iter()
        .map(|(k, v)| match v.as_str() {
            Some(v) => Ok((k.clone(), v.to_owned())),
            None => Err(bad(format!("descriptor.{k}"), "must be a string")),
        })
        .collect()
}

pub(crate) fn request_of(domain: &str, entries: Vec<(String, String)>) -> Result<Request, Problem> {
    if entries.is_empty() {
        return Err(bad("descriptor", "has no entries"));
    }
    // Validated where it is matched (`Node::charges`), as any request is.
    Ok(Request::new(domain).descriptor(entries))
}

pub(crate) fn counter_problem(e: CounterError) -> Problem {
    match e {
        CounterError::Request(e) => bad("descriptor", e.to_string()),
        CounterError::Key(reason) => bad("descriptor", reason),
        CounterError::NoSuchRule(id) => {
            bad("rule", format!("no rule {id:?} limits this descriptor"))
        }
        CounterError::Store(e) => Problem::unavailable(format!("the store did not answer: {e}")),
    }
}

fn counter_json(c: &Counter) -> Value {
    json!({
        "rule": c.rule,
        "domain": c.domain,
        "identity": String::from_utf8_lossy(&c.identity),
        "mode": c.mode.as_str(),
        "algorithm": c.algorithm.map(|a| a.as_str()),
        "limit": c.limit,
        "remaining": c.remaining,
        "resetAfterMs": c.reset_after.as_millis() as u64,
        "leases": {"live": c.held.leases, "units": c.held.units},
        "heldByThisNode": c.held_here,
        "penalty": c.penalty.map(|p| json!({
            "blocked": p.blocked(),
            "blockedForMs": p.blocked_for.as_micros().div_ceil(1000) as u64,
            "denialsCounted": p.denials,
        })),
    })
}

pub(super) async fn read(
    State(state): State<AdminState>,
    query: Result<Query<CounterQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let Query(query) = query.map_err(query_problem)?;
    let node = state
        .node
        .as_ref()
        .ok_or_else(|| Problem::not_found("this admin API serves no node"))?;
    let domain = query
        .domain
        .filter(|d| !d.is_empty())
        .ok_or_else(|| bad("domain", "is required"))?;
    let descriptor = query
        .descriptor
        .ok_or_else(|| bad("descriptor", "is required (key=value,key=value)"))?;
    let entries = parse_descriptor(&descriptor)?;
    let request = request_of(&domain, entries.clone())?;
    let counters = node
        .operator()
        .counters(&request)
        .await
        .map_err(counter_problem)?;
    Ok(axum::Json(json!({
        "domain": domain,
        "descriptor": entries.into_iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "counters": counters.iter().map(counter_json).collect::<Vec<_>>(),
    }))
    .into_response())
}

pub(super) async fn reset(
    state: State<AdminState>,
    caller: axum::Extension<Caller>,
    body: axum::body::Body,
) -> Result<Response, Problem> {
    reset_or_lift(state, caller, body, Clearing::Counters).await
}

/// `POST /admin/v1/penalties/lift`: lifts the penalty blocks of a descriptor's identity.
pub(super) async fn lift(
    state: State<AdminState>,
    caller: axum::Extension<Caller>,
    body: axum::body::Body,
) -> Result<Response, Problem> {
    reset_or_lift(state, caller, body, Clearing::Penalties).await
}

/// What a support call clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clearing {
    /// The key's counters, block included.
    Counters,
    /// Only the key's penalty blocks.
    Penalties,
}

async fn reset_or_lift(
    State(state): State<AdminState>,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    body: axum::body::Body,
    clearing: Clearing,
) -> Result<Response, Problem> {
    let body: ResetBody = body_json(body, state.client_timeout).await?;
    if body.domain.is_empty() {
        return Err(bad("domain", "is required"));
    }
    let entries = entries_of(&body.descriptor)?;
    let resets = clear(
        &state,
        &caller,
        &body.domain,
        entries,
        body.rule.as_deref(),
        clearing,
    )
    .await?;
    let (field, existed) = match clearing {
        Clearing::Counters => ("reset", "existed"),
        Clearing::Penalties => ("lifted", "wasBlocked"),
    };
    Ok(axum::Json(json!({
        field: resets.iter().map(|r| json!({
            "rule": r.rule,
            "identity": String::from_utf8_lossy(&r.identity),
            existed: r.existed,
        })).collect::<Vec<_>>(),
    }))
    .into_response())
}

/// Resets the counters (or lifts the penalty blocks) of `entries` in `domain`, one rule's or
/// every matched rule's, as `caller`: the store forgets them, each rule's history records it
/// and every node is told. What the JSON API and the console both do.
pub(crate) async fn clear(
    state: &AdminState,
    caller: &str,
    domain: &str,
    entries: Vec<(String, String)>,
    rule: Option<&str>,
    clearing: Clearing,
) -> Result<Vec<Reset>, Problem> {
    let node = state
        .node
        .as_ref()
        .ok_or_else(|| Problem::not_found("this admin API serves no node"))?;
    let request = request_of(domain, entries)?;
    let resets = match clearing {
        Clearing::Counters => node.operator().reset_counters(&request, rule).await,
        Clearing::Penalties => node.operator().lift_penalties(&request, rule).await,
    }
    .map_err(counter_problem)?;
    let records: Vec<ResetRecord> = resets
        .iter()
        .map(|r| ResetRecord {
            rule: r.rule.clone(),
            notice: match clearing {
                Clearing::Counters => ResetNotice::new(&r.rule_key, &r.identity),
                Clearing::Penalties => ResetNotice::lifted(&r.rule_key, &r.identity),
            },
            domain: domain.to_owned(),
            identity: String::from_utf8_lossy(&r.identity).into_owned(),
            existed: r.existed,
        })
        .collect();
    // The store has forgotten the buckets; if the history cannot be written the reset still
    // happened, and the answer says the other nodes were not told (their leases run out
    // within a lease TTL).
    state.store.record_resets(&records, caller).await.map_err(|e| {
        Problem::unavailable(format!(
            "the counters were reset, but the history and the other nodes could not be told: {e}"
        ))
    })?;
    match clearing {
        Clearing::Counters => {
            tracing::info!(by = %caller, %domain, buckets = resets.len(), "counters reset")
        }
        Clearing::Penalties => {
            tracing::info!(by = %caller, %domain, rules = resets.len(), "penalty blocks lifted")
        }
    }
    Ok(resets)
}

#[cfg(test)]
mod tests {
    use super::parse_descriptor;

    fn pairs(text: &str) -> Vec<(String, String)> {
        parse_descriptor(text).unwrap_or_else(|p| panic!("{text:?}: {p:?}"))
    }

    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Typed, as JSON, or pasted from a log line: the same descriptor each way; a line with
    /// nothing a descriptor can be read from is an error naming the part it could not read.
    #[test]
    fn a_descriptor_is_read_as_typed_or_as_a_log_line_holds_it() {
        let expected = owned(&[("api_key", "k1"), ("path", "/v1/a b")]);
        assert_eq!(pairs("api_key=k1,path=/v1/a b"), expected);
        assert_eq!(pairs(r#"[["api_key","k1"],["path","/v1/a b"]]"#), expected);
        assert_eq!(
            pairs(
                r#"[2026-12-06T10:00:00Z] OVER_LIMIT domain=api descriptor={"entries":[{"key":"api_key","value":"k1"},{"key":"path","value":"/v1/a b"}]} took 1ms"#
            ),
            expected
        );
        assert_eq!(
            pairs("api_key=k1 user=u-7"),
            owned(&[("api_key", "k1"), ("user", "u-7")])
        );
        let problem = parse_descriptor("denied at noon").expect_err("no pairs");
        assert!(
            format!("{problem:?}").contains(r#"\"denied\" is not key=value"#),
            "{problem:?}"
        );
        let problem = parse_descriptor(r#"{"entries":[{"key":"api_key"}]}"#).expect_err("no value");
        assert!(
            format!("{problem:?}").contains("descriptor.entries[0]"),
            "{problem:?}"
        );
    }
}
