//! The small HTTP port: `/healthz` (the process is up), `/readyz` (the node can answer: rules
//! loaded; store health is in the body, never a reason to be unready), Prometheus `/metrics`
//! and `/top-denied` (the 20 most-denied keys, overall and per rule, as JSON).

use std::future::Future;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::runtime::breaker::BreakerState;
use crate::runtime::{Node, WarmUp};

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
    let breakers = node.breaker_states();
    let open: Vec<u16> = breakers
        .iter()
        .filter(|(_, s)| *s != BreakerState::Closed)
        .map(|(shard, _)| *shard)
        .collect();
    let mut body = serde_json::json!({
        "ready": ready,
        "rulesLoaded": ready,
        "rulesVersion": rules.load().version(),
        "rulesCount": rules.load().rules().len(),
        "rulesSource": rules.source(),
        "rulesStalenessSeconds": node.metrics().rules_staleness_seconds.get(),
        "store": {
            "answering": open.is_empty(),
            "breaker": node.breaker_state().as_str(),
            "shardsOpen": open,
            "startup": startup(&node),
        },
        "breaker": node.breaker_state().as_str(),
    });
    if let Some(region) = node.region() {
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

/// How the store answered when the node started: `{"answered": true, "tookMs": 12}`, or
/// `{"answered": false, "error": "..."}` when the node started serving without it (deciding by
/// fail modes until it answers).
fn startup(node: &Node) -> serde_json::Value {
    match node.store_warm_up() {
        Some(WarmUp::Answered(took)) => {
            serde_json::json!({"answered": true, "tookMs": took.as_millis() as u64})
        }
        Some(WarmUp::Unanswered(error)) => serde_json::json!({"answered": false, "error": error}),
        None => serde_json::Value::Null,
    }
}

async fn metrics(State(node): State<Node>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        node.metrics().render(),
    )
}

/// The 20 most-denied keys, overall and per rule (identities shown as configured).
async fn top_denied(State(node): State<Node>) -> impl IntoResponse {
    let body = serde_json::to_string(&node.top_denied(20)).unwrap_or_else(|_| "{}".into());
    ([(header::CONTENT_TYPE, "application/json")], body)
}

/// The router.
pub fn router(node: Node) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/top-denied", get(top_denied))
        .with_state(node)
}

/// Serves the router on `listener` until `shutdown`.
pub async fn serve(
    node: Node,
    listener: TcpListener,
    tls: Option<crate::tls::Acceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        None => {
            axum::serve(listener, router(node))
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(acceptor) => {
            axum::serve(
                crate::tls::TlsListener::new(listener, acceptor, "http")?,
                router(node),
            )
            .with_graceful_shutdown(shutdown)
            .await
        }
    }
}
