//! The spans of a decision. A process that exports traces (the `tollgate` binary with
//! `--otlp-endpoint`, see `tollgate-server`'s `telemetry`) calls [`enable`]; sampled spans then
//! go to its OpenTelemetry collector: a
//! `decision` (its API, rules, outcome, and any fail mode as a span event), its store calls,
//! rule installs and region link calls. A W3C `traceparent` in the incoming gRPC
//! metadata makes the decision a child of the caller's span, so a trace continues from Envoy.
//!
//! The spans are `debug` level and only the OpenTelemetry layer asks for them: with tracing
//! off (the default) no layer is interested, and a span costs the decision path one check of
//! a cached callsite interest. With tracing on, a decision is sampled before its span is made
//! ([`sampled`]): one that is not kept builds no span at all, nor do its store calls.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Turns span sampling on, keeping `ratio` (clamped to [0, 1]) of the traces started here:
/// the process that installs an exporter calls it once its subscriber is in place.
pub fn enable(ratio: f64) {
    SAMPLE_RATIO.store(ratio.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    TRACING.store(true, Ordering::Relaxed);
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
    // Untraced (the default), asking the subscriber for the current span is the whole cost.
    if !TRACING.load(Ordering::Relaxed) {
        return;
    }
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
