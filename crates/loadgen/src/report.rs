//! What a run reports: as one Markdown table row, and as JSON.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::cli::Run;

/// A run's results.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// The run's name.
    pub(crate) name: String,
    /// The key distribution.
    pub(crate) keys: String,
    /// Connections × streams in flight (closed loop), or the fixed rate.
    pub(crate) load: String,
    /// Requests answered (or failed) while measuring.
    pub(crate) requests: u64,
    /// Seconds measured.
    pub(crate) seconds: f64,
    /// Requests per second.
    pub(crate) throughput: f64,
    /// Latency, microseconds.
    pub p50_us: f64,
    /// Latency, microseconds.
    pub p99_us: f64,
    /// Latency, microseconds.
    pub p999_us: f64,
    /// Answers by Envoy's overall code.
    pub(crate) codes: BTreeMap<String, u64>,
    /// Failed calls by gRPC status.
    pub(crate) grpc_errors: BTreeMap<String, u64>,
    /// Answers a Tollgate node made without its store's answer, by how (`failed-open`,
    /// `last-answer`, `local-fallback`, `failed-closed`); empty when every answer was the
    /// store's (or the server is not Tollgate).
    pub(crate) decided_without_store: BTreeMap<String, u64>,
    /// Admitted (OK) per second.
    pub(crate) admitted_per_second: f64,
}

impl Report {
    /// Builds the report.
    pub(crate) fn new(
        run: &Run,
        seconds: f64,
        histogram: &Histogram<u64>,
        codes: [(&str, u64); 3],
        grpc_errors: BTreeMap<String, u64>,
        decided_without_store: BTreeMap<String, u64>,
    ) -> Self {
        let requests = histogram.len();
        let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        let ok = codes[0].1;
        Report {
            name: run.name.clone(),
            keys: run.keys.clone(),
            load: match run.rate {
                Some(rate) => format!("{rate}/s"),
                None => format!("{}x{}", run.connections, run.streams),
            },
            requests,
            seconds,
            throughput: requests as f64 / seconds,
            p50_us: us(0.5),
            p99_us: us(0.99),
            p999_us: us(0.999),
            codes: codes.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            grpc_errors,
            decided_without_store,
            admitted_per_second: ok as f64 / seconds,
        }
    }

    /// The table's header.
    pub(crate) fn table_header() -> &'static str {
        "| run | keys | load | req/s | p50 | p99 | p999 | OK | OVER_LIMIT | decided without the store | gRPC errors |\n|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"
    }

    /// Answers decided without the store, in all.
    pub(crate) fn without_store_total(&self) -> u64 {
        self.decided_without_store.values().sum()
    }

    /// What the reader must not miss: answers the node made without its store (the
    /// throughput and latency are then partly its fail modes'), None when there were none.
    pub(crate) fn without_store_warning(&self) -> Option<String> {
        let total = self.without_store_total();
        (total > 0).then(|| {
            format!(
                "warning: {total} of {} measured answers ({:.1} %) were decided without the store ({}): \
                 these figures are partly the fail modes', not the limiter's; the node's /metrics \
                 say why (tollgate_store_failures_total, tollgate_breaker_opened_total)",
                self.requests,
                100.0 * total as f64 / self.requests.max(1) as f64,
                counts(&self.decided_without_store),
            )
        })
    }

    /// The run as a table row.
    pub(crate) fn table_row(&self) -> String {
        let errors = if self.grpc_errors.is_empty() {
            "none".to_owned()
        } else {
            counts(&self.grpc_errors)
        };
        let without_store = if self.decided_without_store.is_empty() {
            "none".to_owned()
        } else {
            format!(
                "**{}** ({:.1} %)",
                counts(&self.decided_without_store),
                100.0 * self.without_store_total() as f64 / self.requests.max(1) as f64
            )
        };
        format!(
            "| {} | {} | {} | {:.0} | {:.1} µs | {:.1} µs | {:.1} µs | {} | {} | {without_store} | {errors} |",
            self.name,
            self.keys,
            self.load,
            self.throughput,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.codes.get("OK").copied().unwrap_or(0),
            self.codes.get("OVER_LIMIT").copied().unwrap_or(0),
        )
    }
}

/// `a: 1, b: 2`.
fn counts(map: &BTreeMap<String, u64>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
