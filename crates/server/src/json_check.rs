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
//! `--json-check-token` it wants that bearer token, checked before the body is read; without
//! one it answers callers on this machine only (403 to others): a call names any identity it
//! likes, spends that identity's limit, and can put it in a penalty box.
//! `--json-check false` turns it off. The body is at most [`MAX_BODY_BYTES`] (413 past it)
//! and must arrive within the port's client timeout (408 past it).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
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
                            value: e.value.into_bytes(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: r.hits_addend,
        }
    }
}

/// The largest body `POST /json` reads (an Envoy request of many descriptors is a few KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Who may call: callers on this machine, or a bearer token's holders.
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

    /// Whether `caller` may call at all: anyone with a token configured (it is checked next),
    /// else only a caller on this machine.
    fn may_call(&self, caller: std::net::SocketAddr) -> bool {
        self.token.is_some() || caller.ip().to_canonical().is_loopback()
    }

    /// `POST /json`: the token first, then the body, read within `timeout`.
    pub async fn answer(
        &self,
        headers: &HeaderMap,
        caller: std::net::SocketAddr,
        body: Body,
        timeout: std::time::Duration,
    ) -> Response {
        if !self.may_call(caller) {
            return Problem::forbidden(
                "POST /json answers callers on the node's own machine only, unless the node \
                 has a --json-check-token (a call spends the limit of whatever identity it \
                 names)",
            )
            .into_response();
        }
        if let Some(token) = &self.token {
            let authorization = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if !tollgate_control::auth::presents(authorization, token) {
                return Problem::unauthorized(
                    "POST /json needs the --json-check-token as a bearer token",
                )
                .into_response();
            }
        }
        let body = match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY_BYTES))
            .await
        {
            Ok(Ok(body)) => body,
            Ok(Err(_)) => return Problem::too_large(MAX_BODY_BYTES).into_response(),
            Err(_) => {
                return Problem::too_slow(format!("the body did not arrive within {timeout:?}"))
                    .into_response();
            }
        };
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

/// Envoy's answer in protobuf's JSON form (what `POST /json` and `tollgate check --json` print).
pub fn to_json(answer: &RateLimitResponse) -> Value {
    let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown).as_str_name();
    let status = |s: &DescriptorStatus| {
        let mut out = json!({ "code": code(s.code) });
        // A remaining is stated against a limit (or is an unlimited rule's): a status with
        // neither knows none, and says none (protobuf's JSON form leaves out a zero too).
        if s.current_limit.is_some() || s.limit_remaining > 0 {
            out["limitRemaining"] = json!(s.limit_remaining);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_token_only_this_machine_may_call() {
        let node = tollgate_node::NodeBuilder::new()
            .rules_text("domain: d\nrules: []\n")
            .start()
            .await
            .expect("a node");
        let open = JsonCheck::new(Rls::new(node.clone()), None);
        let guarded = JsonCheck::new(Rls::new(node), Some("a-json-check-token".into()));
        for (caller, alone) in [
            ("127.0.0.1:5000", true),
            ("127.9.9.9:5000", true),
            ("[::1]:5000", true),
            ("[::ffff:127.0.0.1]:5000", true),
            ("10.1.2.3:5000", false),
            ("[2001:db8::1]:5000", false),
        ] {
            let caller = caller.parse().expect("address");
            assert_eq!(open.may_call(caller), alone, "{caller}");
            assert!(guarded.may_call(caller), "{caller}: the token decides");
        }
    }
}
