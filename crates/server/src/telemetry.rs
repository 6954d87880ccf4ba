//! Logs and traces of the `tollgate` process. Logs always (text or JSON, `RUST_LOG` filters
//! them). With `--otlp-endpoint`, the spans the node samples (see `tollgate_node::telemetry`)
//! go to an OpenTelemetry collector over OTLP/gRPC.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use tollgate_node::telemetry::{
    child_of_current, continue_trace, decision_span, record_decision, sampled,
};

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
                .with_target("tollgate_server", tracing::Level::DEBUG)
                .with_target("tollgate_control", tracing::Level::DEBUG)
                .with_target("tollgate_regionsync", tracing::Level::DEBUG),
        );
    tracing_subscriber::registry().with(logs).with(spans).init();
    tollgate_node::telemetry::enable(settings.sample_ratio);
    Ok(Telemetry {
        provider: Some(provider),
    })
}
