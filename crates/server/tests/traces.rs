//! Traces against a real OTLP receiver (the OpenTelemetry collector's TraceService, served by
//! the test from `opentelemetry-proto`'s generated code): a node started with
//! `--otlp-endpoint` exports the span of a decision as a child of the caller's `traceparent`,
//! with its rules and outcome, and the store call beneath it; a request that starts its own
//! trace is sampled at the node's ratio (0 here: not exported), and a caller's unsampled trace
//! is not exported either.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use tollgate_testkit::RedisServer;
use tollgate_testkit::process::{free_port, wait_for};

mod support;

#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("spans");
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn receiver() -> (Receiver, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let receiver = Receiver::default();
    let service = TraceServiceServer::new(receiver.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("receiver");
    });
    (receiver, port)
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            AnyValue::StringValue(s) => s.clone(),
            AnyValue::BoolValue(b) => b.to_string(),
            AnyValue::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Node(std::process::Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_node(rules: &std::path::Path, redis: &RedisServer, otlp: Option<u16>) -> (Node, u16) {
    let (grpc, http) = (
        free_port(false).expect("port"),
        free_port(false).expect("port"),
    );
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command
        .args(["--rules", &rules.display().to_string()])
        .args(["--redis-url", &redis.url()])
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // Export batches every 200 ms rather than the SDK's 5 s, so the test need not wait.
        .env("OTEL_BSP_SCHEDULE_DELAY", "200");
    if let Some(port) = otlp {
        command
            .args(["--otlp-endpoint", &format!("http://127.0.0.1:{port}")])
            .args(["--trace-sample-ratio", "0"]);
    }
    let node = Node(command.spawn().expect("tollgate starts"));
    wait_for("the node", Duration::from_secs(20), || {
        tollgate_testkit::http::get(http, "/readyz", &[])
            .ok()
            .filter(|r| r.status == 200)
    })
    .expect("ready");
    (node, grpc)
}

async fn decide_with_traceparent(grpc: u16, traceparent: Option<&str>) {
    let mut rls = tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::connect(
        format!("http://127.0.0.1:{grpc}"),
    )
    .await
    .expect("connect");
    let mut request =
        tonic::Request::new(support::rls_request("api", &[&[("api_key", "k-traced")]]));
    if let Some(traceparent) = traceparent {
        request
            .metadata_mut()
            .insert("traceparent", traceparent.parse().expect("metadata"));
    }
    rls.should_rate_limit(request).await.expect("answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_continues_the_callers_trace() {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let dir = tempfile::tempdir().expect("dir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: 1}\n",
    )
    .expect("rules");
    let (receiver, otlp) = receiver().await;
    let (node, grpc) = start_node(&rules, &redis, Some(otlp));
    // The caller's trace: sampled, so the node keeps it whatever its own ratio (here 0).
    let (trace_id, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    decide_with_traceparent(grpc, Some(&format!("00-{trace_id}-{parent}-01"))).await;
    // A request without a trace is started here, at ratio 0: not exported.
    decide_with_traceparent(grpc, None).await;
    // A caller that did not sample its trace: followed, so not exported either.
    decide_with_traceparent(
        grpc,
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
    )
    .await;
    let spans = receiver.spans.clone();
    let found = tokio::task::spawn_blocking(move || {
        wait_for("the decision's spans", Duration::from_secs(20), || {
            let spans = spans.lock().expect("spans");
            let decision = spans
                .iter()
                .find(|s| s.name == "decision" && hex(&s.trace_id) == trace_id)?
                .clone();
            let store = spans
                .iter()
                .find(|s| s.name == "store" && s.parent_span_id == decision.span_id)?
                .clone();
            Some((decision, store, spans.len()))
        })
    })
    .await
    .expect("join")
    .expect("spans arrive");
    let (decision, store, _) = found;
    assert_eq!(
        hex(&decision.parent_span_id),
        parent,
        "a child of the caller's span"
    );
    assert_eq!(attribute(&decision, "api").as_deref(), Some("rls"));
    assert_eq!(attribute(&decision, "domain").as_deref(), Some("api"));
    assert_eq!(attribute(&decision, "rules").as_deref(), Some("per-key"));
    assert_eq!(attribute(&decision, "allowed").as_deref(), Some("true"));
    assert_eq!(
        attribute(&store, "op").as_deref(),
        Some("check"),
        "{store:?}"
    );
    // Of the decisions, only the caller's trace was exported (the node's own ratio is 0), and
    // the untraced one made no store span either; rule installs are traced on their own.
    let all = receiver.spans.lock().expect("spans").clone();
    let decisions: Vec<(&String, String)> = all
        .iter()
        .filter(|s| s.name != "rules_install")
        .map(|s| (&s.name, hex(&s.trace_id)))
        .collect();
    assert!(
        decisions.iter().all(|(_, t)| t == trace_id),
        "{decisions:?}"
    );
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    assert!(
        all.iter().any(|s| s.name == "rules_install"),
        "the rule set installed at start"
    );
    drop(node);
}
