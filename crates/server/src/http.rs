//! The small HTTP port: `/healthz` (the process is up), `/readyz` (the node can answer: rules
//! loaded; store health is in the body, never a reason to be unready), `/rules` (the rules
//! in effect, with where each came from), Prometheus `/metrics`
//! and, to a bearer token only, `/top-denied` (the 20 most-denied keys, overall and per rule, as
//! JSON), and `POST /json`, a decision you can curl (`json_check.rs`). This port is open to
//! whoever scrapes and probes (the whole monitoring namespace in
//! the shipped NetworkPolicy): identities, which may be API keys, are not served on it without
//! a token.

use std::future::Future;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use tokio::net::TcpListener;

use std::sync::Arc;
use tollgate_node::rules::RuleKind;
use tollgate_node::runtime::store_health::breaker::BreakerState;

use crate::json_check::JsonCheck;
use crate::listener::{Bounds, http1_connections, serve_http1};
use tollgate_control::problem::Problem;
use tollgate_node::runtime::{Node, WarmUp};

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready means the node can answer: listeners up (this answer is proof) and rules loaded from
/// their source. Store health is reported, never used: while the store is down the node still
/// decides every request by its rules' fail modes, and taking every pod out of service at the
/// moment Redis fails would hand the decision to the gateway's own failure mode instead.
async fn readyz(State(node): State<Node>) -> impl IntoResponse {
    let rules = node.rules();
    let ready = rules.is_loaded();
    let store = store_health(&node);
    let mut body = serde_json::json!({
        "ready": ready,
        "rulesLoaded": ready,
        "rulesVersion": rules.load().version(),
        "rulesCount": rules.load().rules().len(),
        "rulesSource": rules.source(),
        "rulesStalenessSeconds": node.metrics().rules_staleness_seconds.get(),
        "store": store,
        "breaker": node.store().breaker_state().as_str(),
    });
    let rlqs = &node.metrics().rlqs;
    body["rlqs"] = serde_json::json!({
        "streams": rlqs.streams.get(),
        "buckets": rlqs.buckets.get(),
        "stateBytes": rlqs.state_bytes.get(),
    });
    // Why the rules are not what their source holds: why the node is not ready, or what it
    // rejected while staying ready on its previous set.
    if let Some(problem) = rules.problem() {
        body["rulesProblem"] = serde_json::Value::String(problem);
    }
    if let Some(region) = node.region().link() {
        let status = region.status();
        body["region"] = serde_json::json!({
            "region": status.region,
            "peer": status.peer,
            "peerState": status.peer_state,
            "sinceContactMs": status.since_contact_ms,
            "sincePeerStateChangeMs": status.since_change_ms,
            "syncLagMs": status.lag_ms,
            "allowances": status.allowances.as_str(),
        });
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

/// The store as the node last saw it: whether it answers (no call failed since its last
/// answer, and no breaker open), since when it has not, how long ago it last answered, the
/// last error, and each shard that does not answer. Read from the calls the node made, and the
/// heartbeat it sends a quiet store every second: true at any traffic.
fn store_health(node: &Node) -> serde_json::Value {
    let now = node.now_micros();
    let shards = node.store().shards();
    let ms = |us: u64| us / 1000;
    let not_answering: Vec<serde_json::Value> = shards
        .iter()
        .filter(|s| !s.answering())
        .map(|s| {
            serde_json::json!({
                "shard": s.shard,
                "breaker": s.breaker.as_str(),
                "notAnsweringForMs": s.health.failing_since.map(|since| ms(now.saturating_sub(since))),
                "failedCalls": s.health.failed,
                "lastError": s.health.last_error,
                "lastAnswerAgeMs": (s.last_answer > 0).then(|| ms(now.saturating_sub(s.last_answer))),
            })
        })
        .collect();
    let last_answer_age_ms = node
        .store()
        .last_answer_age()
        .map(|age| age.as_millis() as u64);
    let open: Vec<u16> = shards
        .iter()
        .filter(|s| s.breaker != BreakerState::Closed)
        .map(|s| s.shard)
        .collect();
    let cluster = node.store().cluster_settings().map(|settings| {
        use tollgate_lease::redis::ClusterSettings;
        let warning = settings.warning();
        match settings {
            ClusterSettings::Read {
                require_full_coverage,
                node_timeout_ms,
            } => serde_json::json!({
                "requireFullCoverage": require_full_coverage,
                "nodeTimeoutMs": node_timeout_ms,
                "warning": warning,
            }),
            ClusterSettings::Unreadable(_) => serde_json::json!({
                "requireFullCoverage": null,
                "warning": warning,
            }),
        }
    });
    serde_json::json!({
        "cluster": cluster,
        "answering": not_answering.is_empty(),
        "lastAnswerAgeMs": last_answer_age_ms,
        "breaker": node.store().breaker_state().as_str(),
        "shardsOpen": open,
        "shardsNotAnswering": not_answering,
        "startup": startup(node),
    })
}

/// How the store answered when the node started: `{"answered": true, "tookMs": 12}`, or
/// `{"answered": false, "error": "..."}` when the node started serving without it (deciding by
/// fail modes until it answers).
fn startup(node: &Node) -> serde_json::Value {
    match node.store().warm_up() {
        Some(WarmUp::Answered(took)) => {
            serde_json::json!({"answered": true, "tookMs": took.as_millis() as u64})
        }
        Some(WarmUp::Unanswered(error)) => serde_json::json!({"answered": false, "error": error}),
        None => serde_json::Value::Null,
    }
}

async fn metrics(State(node): State<Node>) -> impl IntoResponse {
    node.operator().refresh_figures();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        node.metrics().render(),
    )
}

/// The node's effective rule set, as `/rlconfig` is envoyproxy/ratelimit's: every rule the node
/// enforces right now (rule files and stored rules together), each with where it came from,
/// its mode and fail mode, and its limit in this region. DISABLED rules are not in it; every
/// mode override is, under `overrides`, with the mode and origin of the rule it overrides.
async fn rules(State(node): State<Node>) -> impl IntoResponse {
    let active = node.rules();
    let set = active.load();
    let rules: Vec<serde_json::Value> = set
        .rules()
        .iter()
        .map(|r| {
            let limit = match &r.kind {
                RuleKind::Unlimited => serde_json::json!({"unlimited": true}),
                RuleKind::Block(window) => {
                    serde_json::json!({"blocked": true, "windowSeconds": window.as_secs_f64()})
                }
                RuleKind::Limited(l) => {
                    let mut limit = serde_json::json!({
                        "algorithm": l.algorithm().as_str(),
                        "capacity": l.capacity(),
                    });
                    if let Some(w) = l.window() {
                        limit["windowSeconds"] = w.as_secs_f64().into();
                    }
                    if let Some(rate) = l.refill_per_second() {
                        limit["refillPerSecond"] = rate.into();
                    }
                    if let Some(ttl) = l.slot_ttl() {
                        limit["slotTtlSeconds"] = ttl.as_secs_f64().into();
                    }
                    limit
                }
            };
            serde_json::json!({
                "id": r.id,
                "domain": r.domain,
                "name": r.name,
                "origin": r.origin,
                "mode": r.mode.as_str(),
                "failMode": r.fail_mode.as_str(),
                "regionShare": r.placement.share,
                "limit": limit,
            })
        })
        .collect();
    // Every mode override, applied or waiting for its rule: a DISABLED rule is not enforced
    // and so is not among the rules above, but shows here with where it came from.
    let overrides: Vec<serde_json::Value> = active
        .overrides()
        .iter()
        .map(|o| {
            serde_json::json!({
                "id": o.by.id,
                "mode": o.by.mode.as_str(),
                "reason": o.by.reason,
                "origin": o.by.origin,
                "ruleMode": o.rule_mode.map(|m| m.as_str()),
                "ruleOrigin": o.rule_origin,
            })
        })
        .collect();
    let body = serde_json::json!({
        "version": set.version(),
        "source": active.source(),
        "problem": active.problem(),
        "rules": rules,
        "overrides": overrides,
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

/// The 20 most-denied keys, overall and per rule (identities shown as configured), to a caller
/// presenting `token` as a bearer token; not served without one configured.
async fn top_denied(
    node: Node,
    token: Option<Arc<str>>,
    authorization: Option<&str>,
) -> axum::response::Response {
    let Some(token) = token else {
        return Problem::not_served(
            "the most-denied keys are served on the admin API (GET /admin/v1/top-denied, a read \
             token), or here with --top-denied-token",
        )
        .into_response();
    };
    if !tollgate_control::auth::presents(authorization, &token) {
        return Problem::unauthorized(
            "GET /top-denied needs the --top-denied-token as a bearer token",
        )
        .into_response();
    }
    let body =
        serde_json::to_string(&node.operator().top_denied(20)).unwrap_or_else(|_| "{}".into());
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The router; `/top-denied` wants `top_denied_token` (None: not served here); `POST /json`
/// is served when `json_check` is given.
pub fn router(
    node: Node,
    top_denied_token: Option<String>,
    json_check: Option<JsonCheck>,
) -> Router {
    let token: Option<Arc<str>> = top_denied_token.map(Into::into);
    let router = match json_check {
        Some(check) => Router::new().route(
            "/json",
            post(
                move |ConnectInfo(caller): ConnectInfo<std::net::SocketAddr>,
                      headers: HeaderMap,
                      body: Body| async move {
                    check.answer(&headers, caller, body, CLIENT_TIMEOUT).await
                },
            ),
        ),
        None => Router::new(),
    };
    router
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/rules", get(rules))
        .route(
            "/top-denied",
            get(
                move |State(node): State<Node>, headers: axum::http::HeaderMap| async move {
                    let authorization = headers
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok());
                    top_denied(node, token, authorization).await
                },
            ),
        )
        .with_state(node)
}

/// The probe port's router: `/healthz` and `/readyz` only, plaintext (see
/// `--probe-listen`): probes need no TLS handshake, so a flood of handshakes cannot fail them.
pub fn probe_router(node: Node) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(node)
}

/// Serves the probes on `listener` until `shutdown` (bounded: [`Bounds::PROBES`]).
pub async fn serve_probes(
    node: Node,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let connections = http1_connections(listener, Bounds::PROBES, None, node.metrics());
    serve_http1(probe_router(node), connections, CLIENT_TIMEOUT, shutdown).await
}

/// How long a client of the HTTP and probe ports may take to send a request's headers (and
/// then `POST /json`'s body).
pub const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Serves the router on `listener` until `shutdown` (bounded: [`Bounds::HTTP`]).
pub async fn serve(
    node: Node,
    top_denied_token: Option<String>,
    json_check: Option<JsonCheck>,
    listener: TcpListener,
    tls: Option<crate::tls::Acceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let connections = http1_connections(listener, Bounds::HTTP, tls, node.metrics());
    let router = router(node, top_denied_token, json_check);
    serve_http1(router, connections, CLIENT_TIMEOUT, shutdown).await
}
