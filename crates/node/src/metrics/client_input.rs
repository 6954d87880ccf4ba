//! What a node made of request content it could not take as sent: counted by reason, and
//! logged at most once per reason every few seconds (a client can send such content at any
//! rate; the log says how many were held back since the last line).
//!
//! None of it is refused: an RPC error is an uncounted allow behind Envoy's default
//! `failure_mode_deny: false`, so what a client controls is decided, never an error.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tollgate_regionsync::throttle::Throttled;

/// What was made of content a client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjustment {
    /// An identity longer than the literal limit, kept as its digest
    /// ([`crate::rules::identity`]).
    LongIdentity,
    /// A value that was not UTF-8, read with U+FFFD for each byte that is not.
    NotUtf8,
    /// A cost above the most a count holds ([`tollgate_lease::limit::MAX_UNITS`]), counted as
    /// that most: more than any limit below it admits.
    CostAboveMax,
}

impl Adjustment {
    /// Every adjustment, in label order.
    pub const ALL: [Adjustment; 3] = [
        Adjustment::LongIdentity,
        Adjustment::NotUtf8,
        Adjustment::CostAboveMax,
    ];

    /// Its `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Adjustment::LongIdentity => "long_identity",
            Adjustment::NotUtf8 => "not_utf8",
            Adjustment::CostAboveMax => "cost_above_max",
        }
    }

    fn what(self) -> String {
        match self {
            Adjustment::LongIdentity => format!(
                "a bucket identity longer than {} bytes is kept as its digest",
                crate::rules::identity::MAX_LITERAL_IDENTITY_BYTES
            ),
            Adjustment::NotUtf8 => {
                "a descriptor value that is not UTF-8 is read with U+FFFD".into()
            }
            Adjustment::CostAboveMax => format!(
                "a cost above {} is counted as {0}",
                tollgate_lease::limit::MAX_UNITS
            ),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The counters and the log's pacing.
#[derive(Debug, Clone, Default)]
pub struct ClientInputMetrics {
    adjusted: Family<ReasonLabels, Counter>,
    throttles: std::sync::Arc<[Throttled; 3]>,
}

impl ClientInputMetrics {
    /// Registers them under `registry`'s prefix.
    pub fn register(&self, registry: &mut Registry) {
        for a in Adjustment::ALL {
            // Every reason shows from the start, at 0.
            let _ = self
                .adjusted
                .get_or_create(&ReasonLabels { reason: a.as_str() });
        }
        registry.register(
            "client_input_adjusted",
            "Request content decided on other terms than as sent, by reason (never refused)",
            self.adjusted.clone(),
        );
    }

    /// Counts `n` adjustments of one kind in one request (`domain` names it in the log).
    pub fn note(&self, adjustment: Adjustment, n: u64, domain: &str) {
        if n == 0 {
            return;
        }
        self.adjusted
            .get_or_create(&ReasonLabels {
                reason: adjustment.as_str(),
            })
            .inc_by(n);
        let index = Adjustment::ALL
            .iter()
            .position(|a| *a == adjustment)
            .unwrap_or(0);
        if let Some(held_back) = self.throttles[index].ready() {
            let domain: String = domain.chars().take(64).collect();
            tracing::info!(
                reason = adjustment.as_str(),
                %domain,
                held_back,
                "client input decided on other terms than as sent: {}",
                adjustment.what()
            );
        }
    }

    /// How many adjustments of one kind were counted.
    pub fn count(&self, adjustment: Adjustment) -> u64 {
        self.adjusted
            .get_or_create(&ReasonLabels {
                reason: adjustment.as_str(),
            })
            .get()
    }
}
