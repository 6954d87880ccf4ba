//! A small API gateway on axum: it authenticates API keys, rate-limits with Tollgate's tower
//! layer (an embedded node on a rule file, or a remote node over gRPC), and forwards what is
//! admitted to an upstream (a built-in one when none is given).
//!
//! ```sh
//! cargo run -p axum-gateway -- --rules deploy/rules/example.yaml \
//!     --api-key k_gold=alice:gold --api-key k_free=bob:free
//! curl -i -X POST localhost:8000/orders -H 'x-api-key: k_gold'
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use clap::Parser;
use tollgate_tower::{
    ClientIp, Extractor, ForwardedHeader, RateLimitLayer, Remote, VerifiedIdentity,
};

#[derive(Parser, Debug)]
#[command(about = "A small API gateway: API-key auth, Tollgate's rate limit layer, an upstream")]
struct Args {
    /// Where the gateway listens.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Rule file for the embedded node (Tollgate's format or envoyproxy/ratelimit's).
    #[arg(long, default_value = "deploy/rules/example.yaml")]
    rules: PathBuf,
    /// Decide with a remote Tollgate node instead (its gRPC address, http://host:8081).
    #[arg(long)]
    node: Option<String>,
    /// The rules' domain.
    #[arg(long, default_value = "public-api")]
    domain: String,
    /// An accepted API key: `key=subject:plan` (repeat for more).
    #[arg(long = "api-key", required = true)]
    api_keys: Vec<String>,
    /// Proxies whose forwarding header is believed (CIDRs or addresses).
    #[arg(long = "trusted-proxy")]
    trusted_proxies: Vec<String>,
    /// Or: how many proxies stand in front of every request (a load balancer whose addresses
    /// are not known in advance); the client is that many from the right of the header.
    #[arg(long)]
    trusted_hops: Option<usize>,
    /// The header the proxies write the client's address to: x-forwarded-for or forwarded
    /// (the other one is never read).
    #[arg(long, default_value = "x-forwarded-for", value_parser = forwarded_header)]
    forwarded_header: ForwardedHeader,
    /// The IPv6 prefix a client is counted by (its /64 by default; 128: per address).
    #[arg(long, default_value_t = 64)]
    ipv6_prefix: u8,
    /// The longest a request body may take to arrive, ms (a client trickling one byte a
    /// second would otherwise hold its concurrency slot, and its connection, for as long as it
    /// likes).
    #[arg(long, default_value_t = 10_000)]
    body_timeout_ms: u64,
    /// The longest a whole request may take, ms (its slot goes back then).
    #[arg(long, default_value_t = 30_000)]
    request_timeout_ms: u64,
    /// Where admitted requests go (http://host:port); unset: a built-in upstream answers.
    #[arg(long)]
    upstream: Option<String>,
}

/// API keys and who they belong to.
type Keys = Arc<HashMap<String, VerifiedIdentity>>;

fn forwarded_header(text: &str) -> Result<ForwardedHeader, String> {
    match text.to_ascii_lowercase().as_str() {
        "x-forwarded-for" => Ok(ForwardedHeader::XForwardedFor),
        "forwarded" => Ok(ForwardedHeader::Forwarded),
        other => Err(format!("{other:?}: x-forwarded-for or forwarded")),
    }
}

/// How the client's address is found, as the flags say.
fn client_ip(args: &Args) -> ClientIp {
    let how = match (args.trusted_hops, args.trusted_proxies.is_empty()) {
        (Some(hops), _) => ClientIp::behind_hops(args.forwarded_header, hops),
        (None, false) => ClientIp::behind_proxies(args.forwarded_header, &args.trusted_proxies),
        (None, true) => ClientIp::direct(),
    };
    how.ipv6_prefix(args.ipv6_prefix)
}

fn parse_keys(raw: &[String]) -> anyhow::Result<Keys> {
    let mut keys = HashMap::new();
    for entry in raw {
        let (key, who) = entry
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--api-key {entry:?}: expected key=subject:plan"))?;
        let (subject, plan) = who.split_once(':').unwrap_or((who, "free"));
        keys.insert(
            key.to_owned(),
            VerifiedIdentity {
                subject: subject.to_owned(),
                claims: [("plan".to_owned(), plan.to_owned())].into(),
            },
        );
    }
    Ok(Arc::new(keys))
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or(""),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

/// The gateway's authentication: a known API key puts its owner in the request's extensions
/// (the rate limit layer reads the subject and the plan from there); anything else is 401.
async fn authenticate(State(keys): State<Keys>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok());
    match presented.and_then(|k| keys.get(k)) {
        Some(identity) => {
            request.extensions_mut().insert(identity.clone());
            next.run(request).await
        }
        None => problem(
            StatusCode::UNAUTHORIZED,
            "a valid x-api-key header is required",
        ),
    }
}

#[derive(Clone)]
struct Upstream {
    client: reqwest::Client,
    base: Option<String>,
    /// How long a request body may take to arrive.
    body_timeout: Duration,
}

/// Forwards an admitted request (bodies up to 1 MiB), or answers for the built-in upstream.
async fn forward(State(upstream): State<Upstream>, request: Request) -> Response {
    let Some(base) = upstream.base.clone() else {
        let (parts, _) = request.into_parts();
        return format!("upstream: {} {}\n", parts.method, parts.uri).into_response();
    };
    let (parts, body) = request.into_parts();
    let body = match tokio::time::timeout(
        upstream.body_timeout,
        axum::body::to_bytes(body, 1 << 20),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return problem(StatusCode::PAYLOAD_TOO_LARGE, "bodies are limited to 1 MiB");
        }
        Err(_) => {
            return problem(
                StatusCode::REQUEST_TIMEOUT,
                "the body took too long to arrive",
            );
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if name != "host" {
            headers.append(name, value.clone());
        }
    }
    let sent = upstream
        .client
        .request(parts.method, format!("{base}{path}"))
        .headers(headers)
        .body(body)
        .send()
        .await;
    match sent {
        Ok(answer) => {
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                response = response.header(name, value);
            }
            let body = answer.bytes().await.unwrap_or_default();
            response
                .body(Body::from(body))
                .unwrap_or_else(|_| problem(StatusCode::BAD_GATEWAY, "bad upstream answer"))
        }
        Err(e) => problem(StatusCode::BAD_GATEWAY, &format!("upstream: {e}")),
    }
}

fn routes<D: tollgate_tower::Decide>(
    decider: D,
    args: &Args,
    keys: Keys,
    upstream: Upstream,
) -> Router {
    // Authenticated routes: limited per API key, user and plan (and route).
    let private = Router::new()
        .route("/orders", post(forward))
        .route("/orders/{id}", get(forward))
        .route("/reports", get(forward))
        .route("/{*rest}", any(forward))
        .with_state(upstream.clone())
        .route_layer(RateLimitLayer::new(
            decider.clone(),
            Extractor::new(args.domain.clone())
                .api_key_header("x-api-key")
                .subject()
                .claim("plan")
                .route(),
        ))
        .route_layer(middleware::from_fn_with_state(keys, authenticate));
    // Public routes: anonymous, limited per client address (through trusted proxies only).
    let public = Router::new()
        .route("/login", post(forward))
        .with_state(upstream)
        .route_layer(RateLimitLayer::new(
            decider,
            Extractor::new(args.domain.clone())
                .client_ip(client_ip(args))
                .route(),
        ));
    let request_timeout = Duration::from_millis(args.request_timeout_ms);
    private
        .merge(public)
        .route("/healthz", get(|| async { "ok" }))
        .layer(middleware::from_fn(
            move |request: Request, next: Next| async move {
                // Dropped at the deadline: the request's slots go back with it.
                match tokio::time::timeout(request_timeout, next.run(request)).await {
                    Ok(response) => response,
                    Err(_) => problem(StatusCode::GATEWAY_TIMEOUT, "the request took too long"),
                }
            },
        ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let keys = parse_keys(&args.api_keys)?;
    let upstream = Upstream {
        client: reqwest::Client::new(),
        base: args.upstream.clone(),
        body_timeout: Duration::from_millis(args.body_timeout_ms),
    };
    let app = match &args.node {
        Some(url) => routes(
            Remote::new(url, Duration::from_millis(50))?,
            &args,
            keys,
            upstream,
        ),
        None => {
            let node = tollgate_node::builder::NodeBuilder::new()
                .rules_file(&args.rules)
                .start()
                .await?;
            routes(node, &args, keys, upstream)
        }
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %args.listen, "gateway serving");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
