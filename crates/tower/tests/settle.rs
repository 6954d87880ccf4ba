//! Reserve, then settle, through the layer (docs/reserve-settle.md) in a real axum app over
//! real HTTP: the request's cost is an estimate, reserved; the response's actual cost (a
//! header, an extension the handler sets, or the body's size) is settled when the body ends,
//! or at what was sent when the client goes away; with an embedded node and a remote one.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::post;
use http::HeaderName;
use tollgate_node::{Node, Request};
use tollgate_tower::{ActualCost, Cost, Decide, Extractor, RateLimitLayer, Remote, SettleFrom};

/// An LLM API's token budget per key, never refilled within a test.
const RULES: &str = "domain: llm
rules:
  - {id: tokens, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000, refillPerSecond: 0.001}
";

async fn node() -> Node {
    tollgate_node::builder::NodeBuilder::new()
        .rules_text(RULES)
        .start()
        .await
        .expect("node")
}

/// `/header` states 30 tokens in `x-tokens`; `/extension` sets [`ActualCost`] 40; `/body`
/// sends 2,500 bytes; `/stream` sends 1,000 bytes, then waits forever.
fn app<D: Decide>(decider: D, from: SettleFrom) -> Router {
    let layer = RateLimitLayer::new(
        decider,
        Extractor::new("llm")
            .api_key_header("x-api-key")
            .cost(Cost::Header(HeaderName::from_static("x-estimate"))),
    )
    .settle(from, Duration::from_secs(60));
    Router::new()
        .route("/header", post(|| async { ([("x-tokens", "30")], "done") }))
        .route(
            "/extension",
            post(|| async {
                let mut response = "done".into_response();
                response.extensions_mut().insert(ActualCost(40));
                response
            }),
        )
        .route("/body", post(|| async { "x".repeat(2500) }))
        .route(
            "/stream",
            post(|| async {
                let first = futures::stream::once(async {
                    Ok::<_, std::convert::Infallible>(bytes::Bytes::from(vec![b'x'; 1000]))
                });
                let never = futures::stream::pending();
                Body::from_stream(futures::StreamExt::chain(first, never))
            }),
        )
        .route_layer(layer)
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

async fn call(addr: SocketAddr, path: &str, key: &str, estimate: u64) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .header("x-api-key", key)
        .header("x-estimate", estimate.to_string())
        .send()
        .await
        .expect("send")
}

/// What `key`'s token bucket holds.
async fn left(node: &Node, key: &str) -> u64 {
    let counters = node
        .operator()
        .counters(&Request::new("llm").descriptor([("api_key", key)]))
        .await
        .expect("counters");
    counters[0].remaining.expect("a limit")
}

/// Waits (up to 2 s) for the settle the body's end set off (it runs on its own task).
async fn settles_to(node: &Node, key: &str, expected: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let now = left(node, key).await;
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key}: {now} left, {expected} expected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stated_cost_is_settled_when_the_body_ends() {
    let node = node().await;
    let header = serve(app(
        node.clone(),
        SettleFrom::Header(HeaderName::from_static("x-tokens")),
    ))
    .await;
    let response = call(header, "/header", "h", 200).await;
    assert_eq!(response.status(), 200);
    response.text().await.expect("body");
    settles_to(&node, "h", 970).await;

    let extension = serve(app(node.clone(), SettleFrom::Extension)).await;
    call(extension, "/extension", "e", 10)
        .await
        .text()
        .await
        .expect("body");
    settles_to(&node, "e", 960).await;
    // An underestimate is charged in full.
    call(header, "/header", "u", 1)
        .await
        .text()
        .await
        .expect("body");
    settles_to(&node, "u", 970).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_size_is_settled_at_what_was_sent_also_when_the_client_goes_away() {
    let node = node().await;
    let addr = serve(app(
        node.clone(),
        SettleFrom::BodyBytes {
            bytes_per_unit: 100,
        },
    ))
    .await;
    call(addr, "/body", "b", 500)
        .await
        .text()
        .await
        .expect("body");
    settles_to(&node, "b", 975).await;

    // The client reads the first 1,000 bytes, then goes away: 10 units are settled.
    let mut response = call(addr, "/stream", "s", 500).await;
    let mut got = 0;
    while got < 1000 {
        got += response.chunk().await.expect("chunk").expect("data").len();
    }
    assert_eq!(
        left(&node, "s").await,
        500,
        "the estimate is reserved, nothing settled while the body runs"
    );
    drop(response);
    settles_to(&node, "s", 990).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_node_settles_the_same() {
    let dir = tempfile::tempdir().expect("dir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let config = tollgate_server::config::Config::try_from(tollgate_server::config::Settings {
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        rules: Some(vec![rules]),
        ..Default::default()
    })
    .expect("config");
    let mut serving = tollgate_server::app::App::start(config)
        .await
        .expect("starts")
        .spawn();
    let node = serving.node.clone();
    let remote = Remote::new(
        &format!("http://{}", serving.grpc_addr),
        Duration::from_secs(2),
    )
    .expect("client");
    let addr = serve(app(
        remote,
        SettleFrom::Header(HeaderName::from_static("x-tokens")),
    ))
    .await;
    let response = call(addr, "/header", "r", 300).await;
    assert_eq!(response.status(), 200);
    response.text().await.expect("body");
    settles_to(&node, "r", 970).await;
    serving.stop().await;
}
