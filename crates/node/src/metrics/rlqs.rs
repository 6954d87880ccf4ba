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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Every RLQS metric.
#[derive(Debug, Clone, Default)]
pub struct RlqsMetrics {
    /// Memory the buckets and their shares take, bytes (bounded by `--rlqs-max-state-mb`).
    pub state_bytes: Gauge,
    /// Streams the node ended, or would not open, by why.
    streams_ended: Family<ReasonLabels, Counter>,
    /// RLQS streams open (one per Envoy and domain).
    pub streams: Gauge,
    /// Buckets shared among the streams of this node.
    pub buckets: Gauge,
    /// Quota assignments pushed to Envoys (new shares, changed shares, TTLs renewed).
    pub assignments: Counter,
    /// Buckets Envoys were told to abandon (idle for several reports).
    pub abandons: Counter,
    /// Bucket reports not tracked, by why: `malformed` or `not_utf8` (the bucket id; no
    /// answer can name a bucket that is not UTF-8), `node_full` or `stream_full` (the budget
    /// in bytes; the Envoy is told to abandon such a bucket). The Envoy keeps its
    /// no-assignment behaviour for them.
    buckets_refused: Family<ReasonLabels, Counter>,
    /// Requests Envoys reported, per rule and result.
    pub reported: Family<ReportedLabels, Counter>,
}

impl RlqsMetrics {
    /// Counts a stream the node ended, or would not open, for `reason` (`report_too_large`,
    /// `unreadable`, `domain`, `unread`, `no_first_report`, `too_many_streams`,
    /// `too_many_from_host`).
    pub fn ended(&self, reason: &'static str) {
        self.streams_ended
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a bucket report not tracked, for `reason` (`malformed`, `not_utf8`,
    /// `node_full`, `stream_full`).
    pub fn refused(&self, reason: &'static str) {
        self.buckets_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// How many bucket reports were not tracked for `reason`.
    pub fn refused_count(&self, reason: &'static str) -> u64 {
        self.buckets_refused
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// How many streams were ended for `reason`.
    pub fn ended_count(&self, reason: &'static str) -> u64 {
        self.streams_ended
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// Registers them under `registry`'s prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rlqs_state_bytes",
            "Memory RLQS buckets and their shares take (bounded by --rlqs-max-state-mb)",
            self.state_bytes.clone(),
        );
        registry.register(
            "rlqs_streams_ended",
            "RLQS streams the node ended or would not open, by reason",
            self.streams_ended.clone(),
        );
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
            "Bucket reports not tracked, by reason (malformed id, node or stream budget full)",
            self.buckets_refused.clone(),
        );
        registry.register(
            "rlqs_reported_requests",
            "Requests Envoys reported per rule, allowed or denied on their share",
            self.reported.clone(),
        );
    }
}
