//! Requests no rule limited: no rule of their domain matched any of their descriptors, or no
//! rule serves their domain at all. Counted by domain (a domain no rule serves counts as
//! `(unknown)`: a client names domains, and a label per name would grow without bound), and a
//! domain no rule serves is logged, at most once every few seconds: a gateway configured for a
//! domain the node does not know limits nothing, and says so nowhere else.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tollgate_regionsync::throttle::Throttled;

/// The label of a domain no rule serves.
pub const UNKNOWN_DOMAIN: &str = "(unknown)";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

/// The counter and the log's pacing.
#[derive(Debug, Clone, Default)]
pub struct UnmatchedMetrics {
    requests: Family<DomainLabels, Counter>,
    unknown_domains: std::sync::Arc<Throttled>,
}

impl UnmatchedMetrics {
    /// Registers it under `registry`'s prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "requests_unmatched",
            "Requests no rule limited (admitted), by domain; (unknown): a domain no rule serves",
            self.requests.clone(),
        );
    }

    /// Counts a request of `domain` that no rule matched; `served`: whether any rule serves
    /// the domain.
    pub fn note(&self, domain: &str, served: bool) {
        let label = if served { domain } else { UNKNOWN_DOMAIN };
        self.requests
            .get_or_create(&DomainLabels {
                domain: label.to_owned(),
            })
            .inc();
        if !served && let Some(held_back) = self.unknown_domains.ready() {
            let domain: String = domain.chars().take(64).collect();
            tracing::warn!(
                domain = ?domain,
                held_back,
                "a request for a domain no rule serves was admitted unlimited (is the gateway's \
                 domain the rules' domain?)"
            );
        }
    }

    /// How many requests of `domain` (or [`UNKNOWN_DOMAIN`]) no rule limited.
    pub fn count(&self, domain: &str) -> u64 {
        self.requests
            .get_or_create(&DomainLabels {
                domain: domain.to_owned(),
            })
            .get()
    }
}
