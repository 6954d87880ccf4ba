//! `POST /json` on the HTTP port: Envoy's rate limit request as JSON, answered with the same
//! decision as `ShouldRateLimit`, as JSON (envoyproxy/ratelimit serves the same at `/json`),
//! so a rule can be tried with curl:
//!
//! ```sh
//! curl -i localhost:8080/json -d '{"domain": "public-api",
//!   "descriptors": [{"entries": [{"key": "api_key", "value": "k_123"}]}]}'
//! ```
//!
//! It counts against the limits like any request. 200 when admitted, 429 when over a limit
//! (the body says which), 400 for a request it cannot read (problem+json). With
//! `--json-check-token` it wants that bearer token; `--json-check false` turns it off.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tollgate_control::problem::Problem;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use tollgate_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::grpc::rls::{DECIDED_WITHOUT_STORE, Rls};

/// The request as JSON (protobuf's JSON names; `hits_addend` also as written in the proto).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    value: String,
}

impl From<JsonRequest> for RateLimitRequest {
    fn from(r: JsonRequest) -> Self {
        RateLimitRequest {
            domain: r.domain,
            descriptors: r
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: r.hits_addend,
        }
    }
}

/// Who may call: anyone who reaches the port, or a bearer token's holders.
#[derive(Debug, Clone)]
pub struct JsonCheck {
    rls: Rls,
    token: Option<Arc<str>>,
}

impl JsonCheck {
    /// Answers with `rls`; wants `token` as a bearer token when one is given.
    pub fn new(rls: Rls, token: Option<String>) -> Self {
        Self {
            rls,
            token: token.map(Into::into),
        }
    }

    /// `POST /json`.
    pub async fn answer(&self, headers: &HeaderMap, body: Bytes) -> Response {
        if let Some(token) = &self.token {
            let presented = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|a| a.trim().split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, t)| t.trim().as_bytes())
                .unwrap_or_default();
            if !(presented.len() == token.len() && bool::from(presented.ct_eq(token.as_bytes()))) {
                return Problem::unauthorized(
                    "POST /json needs the --json-check-token as a bearer token",
                )
                .into_response();
            }
        }
        let request: JsonRequest = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return unreadable(e.to_string()),
        };
        match self.rls.answer(request.into()).await {
            Ok((answer, without_store)) => {
                let status = if answer.overall_code == Code::OverLimit as i32 {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::OK
                };
                let mut response = (
                    status,
                    [(header::CONTENT_TYPE, "application/json")],
                    to_json(&answer).to_string(),
                )
                    .into_response();
                if let Some(how) = without_store {
                    response
                        .headers_mut()
                        .insert(DECIDED_WITHOUT_STORE, header::HeaderValue::from_static(how));
                }
                response
            }
            Err(status) => unreadable(status.message().to_owned()),
        }
    }
}

/// 400: a request that cannot be decided, and why.
fn unreadable(reason: String) -> Response {
    Problem::bad_request("The rate limit request is invalid", "body", reason).into_response()
}

/// Envoy's answer in protobuf's JSON form.
fn to_json(answer: &RateLimitResponse) -> Value {
    let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown).as_str_name();
    let status = |s: &DescriptorStatus| {
        let mut out = json!({
            "code": code(s.code),
            "limitRemaining": s.limit_remaining,
        });
        if let Some(limit) = &s.current_limit {
            out["currentLimit"] = json!({
                "name": limit.name,
                "requestsPerUnit": limit.requests_per_unit,
                "unit": Unit::try_from(limit.unit).unwrap_or(Unit::Unknown).as_str_name(),
            });
        }
        if let Some(d) = &s.duration_until_reset {
            out["durationUntilReset"] = json!(format!("{}.{:03}s", d.seconds, d.nanos / 1_000_000));
        }
        out
    };
    json!({
        "overallCode": code(answer.overall_code),
        "statuses": answer.statuses.iter().map(status).collect::<Vec<_>>(),
        "responseHeadersToAdd": answer
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect::<Vec<_>>(),
    })
}
