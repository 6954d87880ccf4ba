//! The metrics of Envoy's rate limit quota service (RLQS): the streams Envoys hold open, the
//! buckets they share, the assignments pushed to them and the usage they report.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What an Envoy reported of a rule's bucket.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportedLabels {
    /// The rule's domain.
    pub domain: String,
    /// The rule's id.
    pub rule: String,
    /// `allowed` or `denied` (by the Envoy, on its share).
    pub result: &'static str,
}

/// Every RLQS metric.
#[derive(Debug, Clone, Default)]
pub struct RlqsMetrics {
    /// RLQS streams open (one per Envoy and domain).
    pub streams: Gauge,
    /// Buckets shared among the streams of this node.
    pub buckets: Gauge,
    /// Quota assignments pushed to Envoys (new shares, changed shares, TTLs renewed).
    pub assignments: Counter,
    /// Buckets Envoys were told to abandon (idle for several reports).
    pub abandons: Counter,
    /// Bucket reports not tracked: the bucket id was malformed, or the node's or the stream's
    /// bucket budget was full (the Envoy keeps its no-assignment behaviour for them).
    pub buckets_refused: Counter,
    /// Requests Envoys reported, per rule and result.
    pub reported: Family<ReportedLabels, Counter>,
}

impl RlqsMetrics {
    /// Registers them under `registry`'s prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rlqs_streams",
            "RLQS streams open (one per Envoy and domain)",
            self.streams.clone(),
        );
        registry.register(
            "rlqs_buckets",
            "RLQS buckets shared among this node's streams",
            self.buckets.clone(),
        );
        registry.register(
            "rlqs_assignments",
            "Quota assignments pushed to Envoys",
            self.assignments.clone(),
        );
        registry.register(
            "rlqs_abandons",
            "Buckets Envoys were told to abandon",
            self.abandons.clone(),
        );
        registry.register(
            "rlqs_buckets_refused",
            "Bucket reports not tracked (malformed id, or the bucket budget full)",
            self.buckets_refused.clone(),
        );
        registry.register(
            "rlqs_reported_requests",
            "Requests Envoys reported per rule, allowed or denied on their share",
            self.reported.clone(),
        );
    }
}
