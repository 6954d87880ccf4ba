//! The retry policy against the tower layer's real 429s over real HTTP: a client that honours
//! Retry-After is admitted at its first retry; a POST is not retried unless told; a wait longer
//! than the budget ends the retries; and a fleet of 50 clients refused at the same instant
//! comes back spread out with jitter, and all at once without it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use axum::Router;
use axum::routing::{get, post};
use parking_lot::Mutex;
use tollgate_client::{Jitter, RetryMiddleware, RetryPolicy, RetryReport, TowerRetry, WaitSource};
use tollgate_tower::{Extractor, RateLimitLayer};

/// Per API key: 1 now, then 1 per second; `/hourly`: 1 per hour.
const RULES: &str = r#"domain: api
rules:
  - {id: per-key, match: {route: "GET /work"}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 1}
  - {id: orders, match: {route: "POST /orders"}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 1}
  - {id: hourly, match: {route: "GET /hourly"}, per: [api_key], algorithm: FIXED_WINDOW, limit: 1, window: 1h}
"#;

/// When each admitted `/work` request arrived, per API key.
type Arrivals = Arc<Mutex<Vec<(String, Instant)>>>;

async fn server() -> (String, Arrivals) {
    let node = tollgate_node::builder::NodeBuilder::new()
        .rules_text(RULES)
        .start()
        .await
        .expect("node");
    let arrivals: Arrivals = Arc::default();
    let seen = arrivals.clone();
    let app = Router::new()
        .route(
            "/work",
            get(move |headers: axum::http::HeaderMap| {
                let seen = seen.clone();
                async move {
                    let key = headers
                        .get("x-api-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    seen.lock().push((key, Instant::now()));
                    "done"
                }
            }),
        )
        .route("/orders", post(|| async { "ordered" }))
        .route("/hourly", get(|| async { "hourly" }))
        .route_layer(RateLimitLayer::new(
            node,
            Extractor::new("api").api_key_header("x-api-key").route(),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (format!("http://{addr}"), arrivals)
}

fn client(policy: RetryPolicy) -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy))
        .build()
}

fn report(response: &reqwest::Response) -> RetryReport {
    response
        .extensions()
        .get::<RetryReport>()
        .cloned()
        .expect("a retry report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honouring_retry_after_is_admitted_at_the_first_retry() {
    let (base, _) = server().await;
    let client = client(RetryPolicy::default());
    let work = || {
        client
            .get(format!("{base}/work"))
            .header("x-api-key", "k1")
            .send()
    };
    assert_eq!(work().await.expect("first").status(), 200);
    let started = Instant::now();
    let second = work().await.expect("second");
    let took = started.elapsed();
    assert_eq!(second.status(), 200, "admitted at its first retry");
    let report = report(&second);
    assert_eq!(report.attempts, 2, "{report:?}");
    let (wait, source) = report.waits[0];
    assert_eq!(source, WaitSource::RetryAfter);
    assert!(
        wait >= Duration::from_secs(1) && wait <= Duration::from_millis(1500),
        "Retry-After: 1 honoured, stretched by at most half: {wait:?}"
    );
    assert!(took >= Duration::from_secs(1), "{took:?}");
    // The same over tower: the policy as a tower::retry::Policy over a hyper-like service.
    let service = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(TowerRetry::new(
            RetryPolicy::default(),
        )))
        .service(ReqwestService(reqwest::Client::new()));
    use tower::ServiceExt;
    let request = || {
        http::Request::get(format!("{base}/work"))
            .header("x-api-key", "k-tower")
            .body(String::new())
            .expect("request")
    };
    let first = service.clone().oneshot(request()).await.expect("first");
    assert_eq!(first.status(), 200);
    let second = service.clone().oneshot(request()).await.expect("second");
    assert_eq!(second.status(), 200);
    let report = second.extensions().get::<RetryReport>().expect("report");
    assert_eq!(report.attempts, 2, "{report:?}");
    assert!(report.waits[0].0 >= Duration::from_secs(1));
}

/// A minimal tower client service over reqwest (what a hyper client would be).
#[derive(Clone)]
struct ReqwestService(reqwest::Client);

impl tower::Service<http::Request<String>> for ReqwestService {
    type Response = http::Response<String>;
    type Error = reqwest::Error;
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<http::Response<String>, reqwest::Error>> + Send,
        >,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), reqwest::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<String>) -> Self::Future {
        let client = self.0.clone();
        Box::pin(async move {
            let request = reqwest::Request::try_from(request.map(reqwest::Body::from))?;
            let response = client.execute(request).await?;
            let mut out = http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                out = out.header(name, value);
            }
            let body = response.text().await?;
            Ok(out.body(body).expect("response"))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_not_retried_unless_told_and_a_long_wait_ends_the_retries() {
    let (base, _) = server().await;
    let order = |client: &reqwest_middleware::ClientWithMiddleware, key: &str| {
        client
            .post(format!("{base}/orders"))
            .header("x-api-key", key)
            .send()
    };
    let careful = client(RetryPolicy::default());
    assert_eq!(order(&careful, "k2").await.expect("ok").status(), 200);
    let refused = order(&careful, "k2").await.expect("answered");
    assert_eq!(refused.status(), 429);
    let r = report(&refused);
    assert_eq!(r.attempts, 1, "{r:?}");
    assert!(
        r.gave_up.as_deref().is_some_and(|w| w.contains("POST")),
        "{r:?}"
    );
    let told = client(RetryPolicy {
        retry_non_idempotent: true,
        ..RetryPolicy::default()
    });
    let admitted = order(&told, "k2").await.expect("answered");
    assert_eq!(admitted.status(), 200, "{:?}", report(&admitted));
    // An hour's wait is more than the 30 s budget: one attempt, and why.
    let hourly = || {
        careful
            .get(format!("{base}/hourly"))
            .header("x-api-key", "k3")
            .send()
    };
    assert_eq!(hourly().await.expect("ok").status(), 200);
    let started = Instant::now();
    let refused = hourly().await.expect("answered");
    assert_eq!(refused.status(), 429);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "it did not wait an hour"
    );
    let r = report(&refused);
    assert_eq!(r.attempts, 1);
    assert!(
        r.gave_up
            .as_deref()
            .is_some_and(|w| w.contains("would pass")),
        "{r:?}"
    );
}

/// 50 clients, each refused at the same instant (their second request, Retry-After: 1): the
/// spread of their retries' arrivals, between the 10th and 90th percentile.
async fn fleet_spread(jitter: Jitter) -> Duration {
    let (base, arrivals) = server().await;
    let client = client(RetryPolicy {
        jitter,
        ..RetryPolicy::default()
    });
    let name = match jitter {
        Jitter::Full => "jittered",
        Jitter::None => "exact",
    };
    let keys: Vec<String> = (0..50).map(|i| format!("{name}-{i}")).collect();
    for key in &keys {
        let first = client
            .get(format!("{base}/work"))
            .header("x-api-key", key)
            .send()
            .await
            .expect("first");
        assert_eq!(first.status(), 200);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(keys.len()));
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (client, base, key, barrier) =
                (client.clone(), base.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                client
                    .get(format!("{base}/work"))
                    .header("x-api-key", &key)
                    .send()
                    .await
                    .expect("answered")
                    .status()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(
            task.await.expect("join"),
            200,
            "every client got in at its retry"
        );
    }
    let arrivals = arrivals.lock();
    let mut retries: Vec<Instant> = keys
        .iter()
        .map(|key| {
            arrivals
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, at)| *at)
                .nth(1)
                .expect("the retry arrived")
        })
        .collect();
    retries.sort();
    retries[44] - retries[5]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jittered_fleet_does_not_come_back_at_once() {
    let exact = fleet_spread(Jitter::None).await;
    let jittered = fleet_spread(Jitter::Full).await;
    eprintln!(
        "50 clients refused at once (Retry-After: 1): their retries spread over {exact:?} without jitter, {jittered:?} with it (10th to 90th percentile)"
    );
    assert!(
        jittered >= Duration::from_millis(250),
        "the jittered fleet came back within {jittered:?}"
    );
    assert!(
        jittered >= exact * 2,
        "jitter spread {jittered:?}, no jitter {exact:?}"
    );
}
