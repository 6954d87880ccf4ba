//! The admin REST API (JSON): `PUT/GET/PATCH/DELETE /admin/v1/rate-limit-rules/{id}`, the list,
//! each rule's history, and the OpenAPI document (`docs/admin-api.openapi.yaml`, served at
//! `/admin/v1/openapi.yaml`).
//!
//! Writes are optimistic: every rule has a version, sent as `ETag`; `If-Match` with another
//! version gets 412. Errors are `application/problem+json` naming the field. Bodies are limited
//! to [`MAX_BODY_BYTES`]; unknown fields are refused.
//!
//! Support reads a descriptor's live counters (`GET /admin/v1/counters`) and resets them
//! (`POST /admin/v1/counters/reset`, write tokens only), and lifts penalty blocks
//! (`POST /admin/v1/penalties/lift`, write tokens only): see [`counters`].
//!
//! The kill switch is a mode override, `PUT /admin/v1/mode-overrides/{id} {"mode":
//! "DISABLED"}`, for any rule the nodes enforce (from a file or stored): nodes stop enforcing
//! it within a second, no deploy, and `rules import` leaves it standing. `PATCH {"mode": ...}`
//! on a stored rule changes the rule itself; on a rule from a file it sets the override.

mod counters;
pub(crate) use counters::{Clearing, clear, counter_problem, parse_descriptor, request_of};

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::{Access, Tokens};
use crate::problem::Problem;
use crate::store::{
    ControlError, ListFilter, OverrideBody, Precondition, Put, RuleStore, StoredOverride,
    StoredRule, Written, from_json,
};
use tollgate_node::rules::native::{RuleDoc, validate_id};

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The OpenAPI document, kept in the repository.
pub const OPENAPI: &str = include_str!("../../../docs/admin-api.openapi.yaml");

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// The rule store.
    pub store: RuleStore,
    /// Who may call.
    pub tokens: Tokens,
    /// The domain of rules that name none (the seed's example body names none); None: the
    /// node's only domain, and a rule naming none is refused when it enforces several or none.
    pub default_domain: Option<String>,
    /// How long a client may take to send a request's headers, and then its body.
    pub client_timeout: Duration,
    /// The node whose most-denied keys `GET /admin/v1/top-denied` serves (set once it runs).
    pub node: Option<tollgate_node::runtime::Node>,
    /// Whether the port is served over TLS (the console's cookie is then `Secure`).
    pub tls: bool,
}

impl AdminState {
    /// The domain a rule naming none goes in: the configured default, else the node's only
    /// domain (None when it enforces several or none: such a rule is refused).
    fn default_domain(&self) -> Option<String> {
        if let Some(d) = &self.default_domain {
            return Some(d.clone());
        }
        let node = self.node.as_ref()?;
        let rules = node.rules().load();
        let mut domains = rules.domain_names();
        match (domains.next(), domains.next()) {
            (Some(only), None) => Some(only.to_owned()),
            _ => None,
        }
    }
}

/// Who is calling (set by the auth layer).
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) String);

impl From<ControlError> for Problem {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Invalid(f) => Problem::invalid(f.field, f.reason),
            ControlError::InvalidFields(fields) => {
                Problem::invalid_all(fields.into_iter().map(|f| (f.field, f.reason)))
            }
            ControlError::NotFound(id) => Problem::not_found(format!("there is no rule {id:?}")),
            ControlError::Stale {
                id,
                current: Some(v),
                expected,
            } => Problem::stale(format!("rule {id:?} is at version {v}; {expected}")),
            ControlError::Stale {
                id,
                current: None,
                expected,
            } => Problem::stale(format!("rule {id:?} does not exist; {expected}")),
            ControlError::Conflict(m) => Problem::conflict(m),
            ControlError::Unavailable(m) => Problem::unavailable(m),
            ControlError::Database(m) => {
                tracing::error!(error = %m, "rule store error");
                Problem::unavailable(m)
            }
        }
    }
}

/// The admin port's router: the JSON API on `/admin/v1` and the operators' console on
/// `/console` ([`crate::console`]), each with its own way in.
pub fn router(state: AdminState) -> Router {
    api(state.clone()).merge(crate::console::router(state))
}

/// The JSON API, on `/admin/v1`.
fn api(state: AdminState) -> Router {
    let only = |allowed: &'static str| {
        move || async move {
            Problem::method_not_allowed(format!("this resource allows {allowed}"))
                .with_allow(allowed)
        }
    };
    let collection = || async {
        Problem::method_not_allowed(
            "the collection allows GET; create a rule with PUT /admin/v1/rate-limit-rules/{id}",
        )
        .with_allow("GET")
    };
    Router::new()
        .route("/admin/v1/rate-limit-rules", get(list).fallback(collection))
        .route(
            "/admin/v1/rate-limit-rules/{id}",
            get(get_rule)
                .put(put_rule)
                .patch(patch_rule)
                .delete(delete_rule)
                .fallback(only("GET, PUT, PATCH, DELETE")),
        )
        .route(
            "/admin/v1/rate-limit-rules/{id}/history",
            get(history).fallback(only("GET")),
        )
        .route(
            "/admin/v1/mode-overrides",
            get(list_overrides).fallback(only("GET")),
        )
        .route(
            "/admin/v1/mode-overrides/{id}",
            get(get_override)
                .put(put_override)
                .delete(delete_override)
                .fallback(only("GET, PUT, DELETE")),
        )
        .route(
            "/admin/v1/top-denied",
            get(top_denied).fallback(only("GET")),
        )
        .route(
            "/admin/v1/counters",
            get(counters::read).fallback(only("GET")),
        )
        .route(
            "/admin/v1/counters/reset",
            axum::routing::post(counters::reset).fallback(only("POST")),
        )
        .route(
            "/admin/v1/penalties/lift",
            axum::routing::post(counters::lift).fallback(only("POST")),
        )
        .route("/admin/v1/openapi.yaml", get(openapi).fallback(only("GET")))
        .fallback(|| async { Problem::not_found("no such endpoint") })
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

async fn authenticate(
    State(state): State<AdminState>,
    mut request: Request,
    next: Next,
) -> Response {
    // The API's description is public.
    let public = request.uri().path() == "/admin/v1/openapi.yaml";
    let caller = if state.tokens.any() && !public {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let Some((name, access)) = state.tokens.check(presented) else {
            return Problem::unauthorized("a valid bearer token is required").into_response();
        };
        let reading = matches!(*request.method(), Method::GET | Method::HEAD);
        if !reading && access == Access::Read {
            return Problem::forbidden(format!("token {name:?} is read-only")).into_response();
        }
        name
    } else {
        // No token configured: the API listens on loopback only.
        "local".to_owned()
    };
    request.extensions_mut().insert(Caller(caller));
    next.run(request).await
}

fn etag(version: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
}

fn rule_response(status: StatusCode, rule: &StoredRule) -> Response {
    let mut response = (status, axum::Json(rule)).into_response();
    response
        .headers_mut()
        .insert(header::ETAG, etag(rule.version));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The write's precondition: `If-Match: "<version>"` or `*`, or `If-None-Match: *` (create
/// only). An ETag must be quoted (RFC 9110 §8.8.3): `If-Match: 3` is a 400.
fn precondition(headers: &HeaderMap) -> Result<Option<Precondition>, Problem> {
    let text_of = |name: header::HeaderName| -> Result<Option<String>, Problem> {
        headers
            .get(&name)
            .map(|v| {
                v.to_str().map(|t| t.trim().to_owned()).map_err(|_| {
                    Problem::bad_request("Invalid precondition", name.as_str(), "not ASCII")
                })
            })
            .transpose()
    };
    if let Some(text) = text_of(header::IF_NONE_MATCH)? {
        if text != "*" {
            return Err(Problem::bad_request(
                "Invalid precondition",
                "If-None-Match",
                format!("{text:?}: only `*` (create, never replace) is supported"),
            ));
        }
        return Ok(Some(Precondition::Absent));
    }
    let Some(text) = text_of(header::IF_MATCH)? else {
        return Ok(None);
    };
    if text == "*" {
        return Ok(Some(Precondition::Exists));
    }
    let etag = text.strip_prefix("W/").unwrap_or(&text);
    let version = etag
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .and_then(|v| v.parse::<i64>().ok())
        .ok_or_else(|| {
            Problem::bad_request(
                "Invalid precondition",
                "If-Match",
                format!("{text:?} is not an ETag this API issued (a quoted version, \"3\")"),
            )
        })?;
    Ok(Some(Precondition::Version(version)))
}

/// A rule id from the path, checked: a bad one (invalid UTF-8 included) is a 400 problem.
struct RuleId(String);

impl<S: Send + Sync> FromRequestParts<S> for RuleId {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| Problem::invalid("id", e.body_text()))?;
        validate_id(&id).map_err(|e| Problem::invalid("id", e.reason))?;
        Ok(Self(id))
    }
}

async fn body_json<T: for<'de> Deserialize<'de>>(
    body: Body,
    timeout: Duration,
) -> Result<T, Problem> {
    let bytes = tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY_BYTES))
        .await
        .map_err(|_| Problem::too_slow(format!("the body did not arrive within {timeout:?}")))?
        .map_err(|_| Problem::too_large(MAX_BODY_BYTES))?;
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(Problem::invalid("body", "must be a JSON object"));
    }
    from_json(&mut serde_json::Deserializer::from_slice(&bytes))
        .map_err(|f| Problem::invalid(f.field, f.reason))
}

/// A query string that does not parse: a 400 titled for what it is.
fn query_problem(e: axum::extract::rejection::QueryRejection) -> Problem {
    Problem::bad_request("Invalid query", "query", e.body_text())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    domain: Option<String>,
    mode: Option<String>,
    limit: Option<i64>,
    after: Option<String>,
}

async fn list(
    State(state): State<AdminState>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let Query(q) = query.map_err(query_problem)?;
    if let Some(mode) = &q.mode
        && mode.parse::<tollgate_node::rules::Mode>().is_err()
    {
        return Err(Problem::bad_request(
            "Invalid query",
            "mode",
            format!("{mode:?} is not ENFORCE, SHADOW or DISABLED"),
        ));
    }
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(Problem::bad_request(
            "Invalid query",
            "limit",
            format!("must be between 1 and 500, got {limit}"),
        ));
    }
    let filter = ListFilter {
        domain: q.domain,
        mode: q.mode,
        after: q.after,
        limit: limit + 1,
    };
    let mut items = state.store.list(&filter).await?;
    let next = if items.len() as i64 > limit {
        items.truncate(limit as usize);
        items.last().and_then(|r| r.doc.id.clone())
    } else {
        None
    };
    Ok((
        StatusCode::OK,
        axum::Json(json!({ "items": items, "next": next })),
    )
        .into_response())
}

async fn get_rule(
    State(state): State<AdminState>,
    RuleId(id): RuleId,
) -> Result<Response, Problem> {
    let rule = state
        .store
        .get(&id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("there is no rule {id:?}")))?;
    Ok(rule_response(StatusCode::OK, &rule))
}

async fn put_rule(
    State(state): State<AdminState>,
    RuleId(id): RuleId,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let condition = precondition(&headers)?;
    let doc: RuleDoc = body_json(body, state.client_timeout).await?;
    let defaulted = doc.domain.is_none();
    let default_domain = state.default_domain();
    let Put { rule, written, .. } = state
        .store
        .put(&id, doc, condition, &caller, default_domain.as_deref())
        .await?;
    let created = written == Written::Created;
    let mut response = rule_response(
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        &rule,
    );
    if created
        && let Ok(location) = HeaderValue::from_str(&format!("/admin/v1/rate-limit-rules/{id}"))
    {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if defaulted
        && let Some(note) = default_domain.and_then(|d| {
            HeaderValue::from_str(&format!("the rule names no domain: {d:?} was used")).ok()
        })
    {
        response.headers_mut().insert(DOMAIN_NOTE, note);
    }
    Ok(response)
}

/// The response header that says which domain a rule naming none was put in.
pub const DOMAIN_NOTE: &str = "tollgate-domain-defaulted";

async fn patch_rule(
    State(state): State<AdminState>,
    RuleId(id): RuleId,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let condition = precondition(&headers)?;
    let patch: Value = body_json(body, state.client_timeout).await?;
    if !patch.is_object() {
        return Err(Problem::invalid(
            "body",
            "a JSON merge patch must be an object",
        ));
    }
    let result = state
        .store
        .patch(
            &id,
            &patch,
            condition.clone(),
            &caller,
            state.default_domain().as_deref(),
        )
        .await;
    match result {
        Ok(rule) => Ok(rule_response(StatusCode::OK, &rule)),
        // Not stored: a rule from a file, whose mode the API can override (nothing else).
        Err(ControlError::NotFound(_)) => {
            let Some(origin) = state.node.as_ref().and_then(|n| n.rules().rule_origin(&id)) else {
                return Err(Problem::not_found(format!(
                    "there is no rule {id:?}, neither stored nor in this node's rule files"
                )));
            };
            let fields: Vec<&String> = patch
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k)
                .collect();
            let Some(mode) = patch.get("mode").filter(|_| fields == ["mode"]) else {
                return Err(Problem::conflict(format!(
                    "rule {id:?} comes from a file ({origin}), not from the rule store: change it \
                     there; the API can set only its mode (PATCH {{\"mode\": \"DISABLED\"}} or \
                     PUT /admin/v1/mode-overrides/{id})"
                )));
            };
            let body = OverrideBody {
                mode: mode.as_str().unwrap_or_default().to_owned(),
                reason: Some(format!("PATCH of the rule from {origin}")),
            };
            let (stored, _) = state
                .store
                .set_override(&id, body, condition, &caller)
                .await?;
            let mut response = override_response(StatusCode::OK, &stored);
            if let Ok(note) = HeaderValue::from_str(&format!(
                "rule {id:?} comes from {origin}: its mode is overridden on every node; lift it \
                 with DELETE /admin/v1/mode-overrides/{id}"
            )) {
                response.headers_mut().insert(OVERRIDE_NOTE, note);
            }
            Ok(response)
        }
        Err(e) => Err(e.into()),
    }
}

/// The response header that says a PATCH of a file's rule set a mode override.
pub const OVERRIDE_NOTE: &str = "tollgate-mode-override";

fn override_response(status: StatusCode, stored: &StoredOverride) -> Response {
    let mut response = (status, axum::Json(stored)).into_response();
    response
        .headers_mut()
        .insert(header::ETAG, etag(stored.version));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// An override's id from the path: a Tollgate rule's id or an envoyproxy/ratelimit path.
struct OverrideId(String);

impl<S: Send + Sync> FromRequestParts<S> for OverrideId {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| Problem::invalid("id", e.body_text()))?;
        tollgate_node::rules::overrides::check_id(&id).map_err(|e| Problem::invalid("id", e))?;
        Ok(Self(id))
    }
}

async fn list_overrides(State(state): State<AdminState>) -> Result<Response, Problem> {
    let items = state.store.mode_overrides().await?;
    Ok((StatusCode::OK, axum::Json(json!({ "items": items }))).into_response())
}

async fn get_override(
    State(state): State<AdminState>,
    OverrideId(id): OverrideId,
) -> Result<Response, Problem> {
    let stored = state
        .store
        .mode_override(&id)
        .await?
        .ok_or_else(|| Problem::not_found(format!("rule {id:?} has no mode override")))?;
    Ok(override_response(StatusCode::OK, &stored))
}

async fn put_override(
    State(state): State<AdminState>,
    OverrideId(id): OverrideId,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let condition = precondition(&headers)?;
    let body: OverrideBody = body_json(body, state.client_timeout).await?;
    let (stored, created) = state
        .store
        .set_override(&id, body, condition, &caller)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut response = override_response(status, &stored);
    // Set ahead of its rule is allowed (it applies once a rule has the id), but said.
    if let Some(node) = &state.node
        && node.rules().rule_origin(&id).is_none()
        && let Ok(note) = HeaderValue::from_str(&format!(
            "no rule {id:?} is enforced by this node: the override applies once one has this id"
        ))
    {
        response.headers_mut().insert(OVERRIDE_NOTE, note);
    }
    Ok(response)
}

async fn delete_override(
    State(state): State<AdminState>,
    OverrideId(id): OverrideId,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let condition = precondition(&headers)?;
    state.store.lift_override(&id, condition, &caller).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn delete_rule(
    State(state): State<AdminState>,
    RuleId(id): RuleId,
    axum::Extension(Caller(caller)): axum::Extension<Caller>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let condition = precondition(&headers)?;
    state.store.delete(&id, condition, &caller).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    limit: Option<i64>,
}

async fn history(
    State(state): State<AdminState>,
    RuleId(id): RuleId,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let Query(q) = query.map_err(query_problem)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let items = state.store.history(&id, limit).await?;
    if items.is_empty() && state.store.get(&id).await?.is_none() {
        return Err(Problem::not_found(format!("rule {id:?} has no history")));
    }
    Ok((StatusCode::OK, axum::Json(json!({ "items": items }))).into_response())
}

/// This node's 20 most-denied keys, overall and per rule (as the HTTP port's `/top-denied`).
async fn top_denied(State(state): State<AdminState>) -> Response {
    match &state.node {
        Some(node) => axum::Json(node.operator().top_denied(20)).into_response(),
        None => Problem::not_found("this admin API serves no node").into_response(),
    }
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI).into_response()
}
