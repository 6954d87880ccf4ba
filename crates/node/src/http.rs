//! The small HTTP port: `/healthz` (the process is up), `/readyz` (rules loaded and the store
//! answering, or failing over per the fail modes) and Prometheus `/metrics`.

use std::future::Future;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::runtime::Node;
use crate::runtime::breaker::BreakerState;

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(node): State<Node>) -> impl IntoResponse {
    let version = node.rules().load().version();
    let breaker = node.breaker_state();
    let store_ok = breaker == BreakerState::Closed;
    let mut body = serde_json::json!({
        "ready": store_ok,
        "rulesVersion": version,
        "rulesSource": node.rules().source(),
        "rulesStalenessSeconds": node.metrics().rules_staleness_seconds.get(),
        "breaker": match breaker {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half-open",
            BreakerState::Open { .. } => "open",
        },
    });
    if let Some(region) = node.region() {
        let status = region.status();
        body["region"] = serde_json::json!({
            "region": status.region,
            "peer": status.peer,
            "peerState": if status.peer_up { "up" } else { "down" },
            "sinceContactMs": status.since_contact_ms,
            "sincePeerStateChangeMs": status.since_change_ms,
            "syncLagMs": status.lag_ms,
        });
    }
    let code = if store_ok {
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

async fn metrics(State(node): State<Node>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        node.metrics().render(),
    )
}

/// The router.
pub fn router(node: Node) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(node)
}

/// Serves the router on `listener` until `shutdown`.
pub async fn serve(
    node: Node,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(node))
        .with_graceful_shutdown(shutdown)
        .await
}
