//! Logs and traces. Logs always (text or JSON, `RUST_LOG` filters them). With
//! `--otlp-endpoint`, sampled spans go to an OpenTelemetry collector over OTLP/gRPC: a
//! `decision` (its API, rules, outcome, and any fail mode as a span event), its store calls,
//! rule installs and region link calls. A W3C `traceparent` in the incoming gRPC
//! metadata makes the decision a child of the caller's span, so a trace continues from Envoy.
//!
//! The spans are `debug` level and only the OpenTelemetry layer asks for them: with tracing
//! off (the default) no layer is interested, and a span costs the decision path one check of
//! a cached callsite interest. With tracing on, a decision is sampled before its span is made
//! ([`sampled`]): one that is not kept builds no span at all, nor do its store calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The share of traces started here that are kept (f64 bits); 0 until tracing starts.
static SAMPLE_RATIO: AtomicU64 = AtomicU64::new(0);

/// Whether spans are exported at all.
static TRACING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether to trace a decision whose request carries `metadata`: a caller's `traceparent` is
/// followed (kept when it says sampled, dropped when it says not); a trace that starts here is
/// kept at the configured ratio. Always false while tracing is off.
pub fn sampled(metadata: &tonic::metadata::MetadataMap) -> bool {
    if !TRACING.load(Ordering::Relaxed) {
        return false;
    }
    let ratio = f64::from_bits(SAMPLE_RATIO.load(Ordering::Relaxed));
    if ratio <= 0.0 && metadata.get("traceparent").is_none() {
        return false;
    }
    match metadata.get("traceparent").and_then(|v| v.to_str().ok()) {
        // version-traceid-parentid-flags: the low bit of the flags says sampled.
        Some(parent) => parent
            .rsplit('-')
            .next()
            .and_then(|flags| u8::from_str_radix(flags, 16).ok())
            .is_some_and(|flags| flags & 1 == 1),
        None => rand::random::<f64>() < ratio,
    }
}

/// Where spans go, and how many.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The collector's OTLP/gRPC endpoint (`http://host:4317`).
    pub endpoint: String,
    /// The share of traces started here that are kept, in [0, 1]; a caller's sampled flag is
    /// followed either way.
    pub sample_ratio: f64,
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {reason}")]
pub struct TelemetryError {
    endpoint: String,
    reason: String,
}

/// What must outlive the process's work: the tracer provider, flushed on [`Telemetry::shutdown`].
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the process's subscriber: logs, and traces when `traces` is given. Must run inside
/// a tokio runtime (the exporter runs on it).
pub fn init(json: bool, traces: Option<&TraceSettings>) -> Result<Telemetry, TelemetryError> {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let logs = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let Some(settings) = traces else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let failed = |reason: String| TelemetryError {
        endpoint: settings.endpoint.clone(),
        reason,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let batch = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(batch)
        // Decisions are sampled before their spans exist (`sampled`): what reaches the SDK is
        // kept.
        .with_sampler(Sampler::AlwaysOn)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("tollgate")
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("tollgate");
    // Only Tollgate's own spans, from debug up: the stack's (h2, tonic) stay out.
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("tollgate_node", tracing::Level::DEBUG)
                .with_target("tollgate_regionsync", tracing::Level::DEBUG),
        );
    tracing_subscriber::registry().with(logs).with(spans).init();
    SAMPLE_RATIO.store(
        settings.sample_ratio.clamp(0.0, 1.0).to_bits(),
        Ordering::Relaxed,
    );
    TRACING.store(true, Ordering::Relaxed);
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// Reads W3C trace context from gRPC metadata.
struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl opentelemetry::propagation::Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The span of a decision that came in by `api` (`rls`, `check`), continuing the caller's
/// trace; none when the decision is not traced.
pub fn decision_span(api: &'static str, metadata: &tonic::metadata::MetadataMap) -> tracing::Span {
    if !sampled(metadata) {
        return tracing::Span::none();
    }
    let span = tracing::debug_span!(
        "decision",
        api,
        domain = tracing::field::Empty,
        descriptors = tracing::field::Empty,
        allowed = tracing::field::Empty,
        rules = tracing::field::Empty,
    );
    continue_trace(&span, metadata);
    span
}

/// A span for the work of a traced decision: a child of the current span, or none when the
/// decision is not traced (so an untraced decision's store calls make no spans either).
pub fn child_of_current(make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if tracing::Span::current().is_disabled() {
        tracing::Span::none()
    } else {
        make()
    }
}

/// Makes `span` a child of the caller's span when the request carries a `traceparent`.
pub fn continue_trace(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    if span.is_disabled() || metadata.get("traceparent").is_none() {
        return;
    }
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Metadata(metadata)));
    let _ = span.set_parent(parent);
}

/// Records what was decided on the current span (the decision's), when it is traced.
pub fn record_decision(domain: &str, descriptors: usize, verdict: &crate::runtime::Verdict) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    let rules: Vec<&str> = verdict
        .statuses
        .iter()
        .map(|s| s.rule.id.as_str())
        .collect();
    span.record("domain", domain);
    span.record("descriptors", descriptors);
    span.record("allowed", verdict.allowed);
    span.record("rules", rules.join(",").as_str());
}
