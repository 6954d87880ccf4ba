//! The layer in a real axum app over real HTTP (hyper's server, reqwest as the client), with an
//! embedded node and with a remote one over gRPC: every header and the problem+json body of a
//! 429; the headers of an admission (and a rule that hides them); one counter per route
//! template whatever the id in the path; a request's cost from a header; a concurrency slot
//! given back when the response body is done, when the handler fails, and when the client goes
//! away; `X-Forwarded-For` believed only through a trusted proxy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::routing::{get, post};
use std::sync::atomic::Ordering;

use tokio::sync::Semaphore;
use tollgate_node::Node;
use tollgate_tower::{
    Answers, ClientIp, Cost, Decide, Extractor, ForwardedHeader, Problem, RateLimitLayer, Remote,
};

const RULES: &str = r#"domain: shop
rules:
  - {id: orders, name: gold-orders, match: {route: "POST /orders/{id}"}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 2, refillPerSecond: 1}
  - {id: reports, match: {route: "GET /reports"}, per: [api_key], algorithm: CONCURRENCY, maxInFlight: 1, slotTtl: 1m}
  - {id: long-reports, match: {route: "GET /long"}, per: [api_key], algorithm: CONCURRENCY, maxInFlight: 1, slotTtl: 1s}
  - {id: by-ip, match: {route: "GET /ip", ip: "*"}, algorithm: FIXED_WINDOW, limit: 3, window: 1h}
  - {id: quiet, match: {route: "GET /quiet"}, per: [api_key], algorithm: FIXED_WINDOW, limit: 1, window: 1h}
"#;

async fn node() -> Node {
    tollgate_node::builder::NodeBuilder::new()
        .rules_text(RULES)
        .start()
        .await
        .expect("node")
}

/// The reports handler waits for a permit (the test hands them out), or fails on `?fail`.
#[derive(serde::Deserialize)]
struct Fail {
    fail: Option<bool>,
}

/// Where the reports handler waits, and how many wait there.
struct Gate {
    open: Semaphore,
    inside: std::sync::atomic::AtomicUsize,
}

fn gate() -> Arc<Gate> {
    Arc::new(Gate {
        open: Semaphore::new(0),
        inside: Default::default(),
    })
}

fn app<D: Decide>(decider: D, trusted: &[&str], gate: Arc<Gate>) -> Router {
    let layer = RateLimitLayer::new(
        decider,
        Extractor::new("shop")
            .api_key_header("x-api-key")
            .client_ip(if trusted.is_empty() {
                ClientIp::direct()
            } else {
                ClientIp::behind_proxies(ForwardedHeader::XForwardedFor, trusted.iter().copied())
            })
            .route()
            .cost(Cost::Header(http::HeaderName::from_static("x-cost"))),
    )
    .answers(
        Answers::default()
            .problem(
                "reports",
                Problem {
                    type_uri: "https://shop.example/problems/busy".into(),
                    title: "Too Many Reports".into(),
                    detail: "{method} {route}: {quota} reports at a time.".into(),
                },
            )
            .hide_headers_on_allow("quiet"),
    );
    let gated = move |gate: Arc<Gate>| {
        move |Query(q): Query<Fail>| {
            let gate = gate.clone();
            async move {
                if q.fail == Some(true) {
                    return Err(StatusCode::INTERNAL_SERVER_ERROR);
                }
                gate.inside.fetch_add(1, Ordering::SeqCst);
                let permit = gate.open.acquire().await;
                gate.inside.fetch_sub(1, Ordering::SeqCst);
                permit.expect("gate").forget();
                Ok("report")
            }
        }
    };
    Router::new()
        .route("/orders/{id}", post(|| async { "created" }))
        .route("/long", get(gated(gate.clone())))
        .route(
            "/reports",
            get(move |Query(q): Query<Fail>| {
                let gate = gate.clone();
                async move {
                    if q.fail == Some(true) {
                        return Err(StatusCode::INTERNAL_SERVER_ERROR);
                    }
                    gate.inside.fetch_add(1, Ordering::SeqCst);
                    let permit = gate.open.acquire().await;
                    gate.inside.fetch_sub(1, Ordering::SeqCst);
                    permit.expect("gate").forget();
                    Ok("report")
                }
            }),
        )
        .route("/ip", get(|| async { "ip" }))
        .route("/quiet", get(|| async { "quiet" }))
        .route_layer(layer)
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    addr
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Orders: two admitted with their headers, the third a full 429.
async fn orders_are_limited_and_answered(base: &str, key: &str) {
    let client = reqwest::Client::new();
    let order = |id: u32| {
        client
            .post(format!("{base}/orders/{id}?ignored=1"))
            .header("x-api-key", key)
            .send()
    };
    let first = order(17).await.expect("first");
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"gold-orders\";q=2;w=2")
    );
    assert!(
        header(&first, "ratelimit").is_some_and(|v| v.starts_with("\"gold-orders\";r=1")),
        "{:?}",
        first.headers()
    );
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("1"));
    // Another id, the same route template: the same counter.
    assert_eq!(order(18).await.expect("second").status(), 200);
    let denied = order(19).await.expect("third");
    assert_eq!(denied.status(), 429);
    assert_eq!(header(&denied, "retry-after"), Some("1"));
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"gold-orders\";q=2;w=2")
    );
    assert!(
        header(&denied, "ratelimit").is_some_and(|v| v.starts_with("\"gold-orders\";r=0;t=")),
        "{:?}",
        denied.headers()
    );
    assert!(header(&denied, "x-ratelimit-limit").is_some_and(|v| v.starts_with("2, 2;w=2")));
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    assert!(header(&denied, "x-ratelimit-reset").is_some());
    assert_eq!(header(&denied, "cache-control"), Some("no-store"));
    assert_eq!(
        header(&denied, "content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = denied.json().await.expect("problem+json");
    assert_eq!(
        body,
        serde_json::json!({
            "type": "https://api.example.com/problems/rate-limited",
            "title": "Too Many Requests",
            "status": 429,
            // A token bucket: what the client hit is its burst, not the sustained rate the
            // policy header states as a quota per minute.
            "detail": "POST /orders/{id}: burst of 2 requests used up (gold-orders refills 1 per second); retry after 1 s.",
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_is_a_full_429_and_an_admission_carries_the_headers() {
    let base = format!("http://{}", serve(app(node().await, &[], gate())).await);
    orders_are_limited_and_answered(&base, "k-orders").await;
    let client = reqwest::Client::new();
    // A cost from the request: 2 of the bucket's 2 at once, then nothing.
    let costly = |cost: &str| {
        client
            .post(format!("{base}/orders/1"))
            .header("x-api-key", "k-costly")
            .header("x-cost", cost)
            .send()
    };
    assert_eq!(costly("2").await.expect("ok").status(), 200);
    assert_eq!(costly("1").await.expect("ok").status(), 429);
    let bad = costly("lots").await.expect("answered");
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.expect("body").contains("x-cost"));
    // A rule whose headers are hidden: none on admission, all on denial.
    let quiet = || {
        client
            .get(format!("{base}/quiet"))
            .header("x-api-key", "k-quiet")
            .send()
    };
    let admitted = quiet().await.expect("ok");
    assert_eq!(admitted.status(), 200);
    assert!(
        header(&admitted, "ratelimit").is_none(),
        "{:?}",
        admitted.headers()
    );
    let denied = quiet().await.expect("ok");
    assert_eq!(denied.status(), 429);
    assert!(header(&denied, "ratelimit").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_node_over_grpc_answers_the_same() {
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
    let remote = Remote::new(
        &format!("http://{}", serving.grpc_addr),
        Duration::from_secs(2),
    )
    .expect("client");
    let gate = gate();
    let base = format!("http://{}", serve(app(remote, &[], gate.clone())).await);
    orders_are_limited_and_answered(&base, "k-remote").await;
    // Slots travel as tokens and are released over gRPC when the body is done.
    let client = reqwest::Client::new();
    let held = hold(&client, &base, "k-remote");
    busy(&client, &base, "k-remote", &gate).await;
    gate.open.add_permits(1);
    assert_eq!(held.await.expect("join").expect("ok").status(), 200);
    until_free(&client, &base, "k-remote").await;
    serving.stop().await;
}

/// A slot lives as long as its request: a report that runs 2.5 s on a CONCURRENCY rule whose
/// slots live 1 s keeps its slot (the layer renews it every third of its TTL), so a second
/// report of the same key is refused all along; once the first ends, the slot is free. (A slot
/// that was never renewed expired under a running request: with `maxInFlight: 2` and a 3 s
/// TTL, 6 requests ran at once.)
async fn a_slot_lives_as_long_as_its_request(decider: impl Decide, key: &str) {
    let gate = gate();
    let base = format!("http://{}", serve(app(decider, &[], gate.clone())).await);
    let client = reqwest::Client::new();
    let long = {
        let (client, url, key) = (client.clone(), format!("{base}/long"), key.to_owned());
        tokio::spawn(async move { client.get(&url).header("x-api-key", &key).send().await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while gate.inside.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the long report never got in"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = || {
        client
            .get(format!("{base}/long?fail=true"))
            .header("x-api-key", key)
            .send()
    };
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            second().await.expect("answered").status(),
            429,
            "the running report's slot was given to another"
        );
    }
    gate.open.add_permits(1);
    assert_eq!(long.await.expect("join").expect("ok").status(), 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while second().await.expect("answered").status() == 429 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lives_as_long_as_its_request_with_an_embedded_node() {
    a_slot_lives_as_long_as_its_request(node().await, "k-long-embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lives_as_long_as_its_request_with_a_remote_node() {
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
    let remote = Remote::new(
        &format!("http://{}", serving.grpc_addr),
        Duration::from_secs(2),
    )
    .expect("client");
    a_slot_lives_as_long_as_its_request(remote, "k-long-remote").await;
    serving.stop().await;
}

/// A report for `key` that holds the slot until the gate opens (sent again while the slot is
/// still being given back by an earlier request).
fn hold(
    client: &reqwest::Client,
    base: &str,
    key: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let (client, url, key) = (client.clone(), format!("{base}/reports"), key.to_owned());
    tokio::spawn(async move {
        loop {
            let r = client.get(&url).header("x-api-key", &key).send().await?;
            if r.status() != 429 {
                return Ok(r);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

/// Waits until a held report is inside the handler, then checks that another is refused,
/// with the rule's own problem.
async fn busy(client: &reqwest::Client, base: &str, key: &str, gate: &Gate) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while gate.inside.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the report of {key} never got in"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = client
        .get(format!("{base}/reports?fail=true"))
        .header("x-api-key", key)
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status(), 429, "the slot of {key} is held");
    let body: serde_json::Value = r.json().await.expect("problem+json");
    assert_eq!(body["type"], "https://shop.example/problems/busy");
    assert_eq!(body["title"], "Too Many Reports");
    assert_eq!(body["detail"], "GET /reports: 1 reports at a time.");
}

/// Checks that a report for `key` is admitted again soon (its slot was given back): a probe
/// that is admitted fails at once (500), giving its own slot back.
async fn until_free(client: &reqwest::Client, base: &str, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = client
            .get(format!("{base}/reports?fail=true"))
            .header("x-api-key", key)
            .send()
            .await
            .expect("answered");
        if r.status() == 500 {
            return;
        }
        assert_eq!(r.status(), 429);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot of {key} was never given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_slot_is_given_back_on_success_error_and_disconnect() {
    let gate = gate();
    let base = format!(
        "http://{}",
        serve(app(node().await, &[], gate.clone())).await
    );
    let client = reqwest::Client::new();
    // Success: held while the handler runs, free once the body is done.
    let held = hold(&client, &base, "k-ok");
    busy(&client, &base, "k-ok", &gate).await;
    gate.open.add_permits(1);
    assert_eq!(held.await.expect("join").expect("ok").status(), 200);
    until_free(&client, &base, "k-ok").await;
    // Error: a handler that fails gives its slot back.
    let failed = client
        .get(format!("{base}/reports?fail=true"))
        .header("x-api-key", "k-err")
        .send()
        .await
        .expect("answered");
    assert_eq!(failed.status(), 500);
    until_free(&client, &base, "k-err").await;
    // Disconnect: over HTTP/2 the client resets the stream; the server drops the request.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let over_h2 = h2
        .get(format!("{base}/ip"))
        .send()
        .await
        .expect("the server speaks HTTP/2");
    assert_eq!(over_h2.version(), reqwest::Version::HTTP_2);
    let abandoned = hold(&h2, &base, "k-gone");
    busy(&client, &base, "k-gone", &gate).await;
    abandoned.abort();
    drop(h2);
    until_free(&client, &base, "k-gone").await;
}

/// Behind a proxy that writes `X-Forwarded-For` (as Envoy, nginx and cloud load balancers do,
/// passing a client's own `Forwarded` through untouched), a forged `Forwarded` changes
/// nothing: 8 logins naming 8 addresses there all count against the one real client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_forwarded_header_behind_an_xff_proxy_changes_nothing() {
    let client = reqwest::Client::new();
    let base = format!(
        "http://{}",
        serve(app(node().await, &["127.0.0.1"], gate())).await
    );
    let mut statuses = vec![];
    for i in 0..8 {
        let r = client
            .get(format!("{base}/ip"))
            .header("forwarded", format!("for=198.51.100.{i}"))
            .header("x-forwarded-for", "203.0.113.1")
            .send()
            .await
            .expect("ok");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_addresses_count_only_through_a_trusted_proxy() {
    let client = reqwest::Client::new();
    let ip = |base: &str, forwarded: String| {
        client
            .get(format!("{base}/ip"))
            .header("x-forwarded-for", forwarded)
            .send()
    };
    // No trusted proxy: the connection's address (127.0.0.1) is the key, whatever the header
    // claims; the limit of 3 holds against a client that names a new address each time.
    let untrusting = format!("http://{}", serve(app(node().await, &[], gate())).await);
    let mut statuses = vec![];
    for i in 0..5 {
        statuses.push(
            ip(&untrusting, format!("198.51.100.{i}"))
                .await
                .expect("ok")
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    // Behind a trusted proxy (the loopback here), the forwarded client is the key.
    let trusting = format!(
        "http://{}",
        serve(app(node().await, &["127.0.0.1"], gate())).await
    );
    for i in 0..5 {
        let r = ip(&trusting, format!("198.51.100.{i}")).await.expect("ok");
        assert_eq!(r.status(), 200, "client {i} has its own counter");
    }
    for _ in 0..3 {
        assert_eq!(
            ip(&trusting, "203.0.113.1".into())
                .await
                .expect("ok")
                .status(),
            200
        );
    }
    assert_eq!(
        ip(&trusting, "203.0.113.1".into())
            .await
            .expect("ok")
            .status(),
        429
    );
}
