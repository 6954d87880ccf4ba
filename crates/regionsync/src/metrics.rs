//! Region-sync metrics. The handles are shared; [`RegionMetrics::register`] adds them to a
//! node's registry (names prefixed by the registry's prefix, e.g. `tollgate_region_...`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A rule label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RuleLabel {
    /// The rule id.
    pub rule: String,
}

/// A reason label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// An outcome label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// What happened.
    pub outcome: String,
}

/// Every region-sync metric.
#[derive(Debug, Clone, Default)]
pub struct RegionMetrics {
    /// Batches the peer acknowledged.
    pub batches_sent: Counter,
    /// Units those batches added (totals above what the peer had acknowledged).
    pub units_sent: Counter,
    /// Bytes of acknowledged batches.
    pub bytes_sent: Counter,
    /// Entries (bucket totals) in acknowledged batches.
    pub entries_sent: Counter,
    /// Batches that could not be delivered (their totals go with the next one).
    pub batches_failed: Counter,
    /// Batches received and applied.
    pub batches_applied: Counter,
    /// Units debited from received batches.
    pub units_applied: Counter,
    /// Received batches refused, by reason.
    pub batches_rejected: Family<ReasonLabel, Counter>,
    /// Milliseconds between the sending of the newest applied batch and now.
    pub sync_lag_ms: Gauge,
    /// 1 while the peer is Up, 0 while Down.
    pub peer_up: Gauge,
    /// 1 while ASYNC_SYNC buckets are held to regional allowances, 0 while they are not (peer
    /// down, or speaking link version 1).
    pub allowances_on: Gauge,
    /// Peer state changes.
    pub peer_changes: Counter,
    /// Buckets with consumption waiting to be shipped or acknowledged.
    pub pending_keys: Gauge,
    /// This region's share of each SPLIT rule, in thousandths.
    pub share_permille: Family<RuleLabel, Gauge>,
    /// HOME_REGION decisions sent to the home region, by outcome (allowed, denied, fallback).
    pub forwarded: Family<OutcomeLabel, Counter>,
    /// HOME_REGION decisions made here for the other region.
    pub forwards_served: Counter,
}

impl RegionMetrics {
    /// HOME_REGION decisions sent to the home region with this outcome (allowed, denied,
    /// fallback).
    pub fn forwarded_count(&self, outcome: &str) -> u64 {
        self.forwarded
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .get()
    }

    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "region_batches_sent",
            "Consumption batches the peer region acknowledged",
            self.batches_sent.clone(),
        );
        r.register(
            "region_units_sent",
            "Units of consumption shipped to the peer region",
            self.units_sent.clone(),
        );
        r.register(
            "region_bytes_sent",
            "Bytes of consumption batches shipped",
            self.bytes_sent.clone(),
        );
        r.register(
            "region_entries_sent",
            "Bucket totals in consumption batches shipped",
            self.entries_sent.clone(),
        );
        r.register(
            "region_batches_failed",
            "Consumption batches not delivered (resent with the next)",
            self.batches_failed.clone(),
        );
        r.register(
            "region_batches_applied",
            "Consumption batches received from the peer and applied",
            self.batches_applied.clone(),
        );
        r.register(
            "region_units_applied",
            "Units of peer consumption debited here",
            self.units_applied.clone(),
        );
        r.register(
            "region_batches_rejected",
            "Received batches refused, by reason",
            self.batches_rejected.clone(),
        );
        r.register(
            "region_sync_lag_milliseconds",
            "Age of the newest applied batch from the peer",
            self.sync_lag_ms.clone(),
        );
        r.register(
            "region_peer_up",
            "1 while the peer region is reachable, 0 while it is down",
            self.peer_up.clone(),
        );
        r.register(
            "region_allowances_on",
            "1 while ASYNC_SYNC buckets are held to regional allowances by demand; 0 while the peer is down or speaks link version 1",
            self.allowances_on.clone(),
        );
        r.register(
            "region_peer_changes",
            "Peer region state changes",
            self.peer_changes.clone(),
        );
        r.register(
            "region_pending_keys",
            "Buckets with consumption not yet acknowledged by the peer",
            self.pending_keys.clone(),
        );
        r.register(
            "region_share_permille",
            "This region's share of each SPLIT rule, in thousandths",
            self.share_permille.clone(),
        );
        r.register(
            "region_forwarded",
            "HOME_REGION decisions sent to the home region, by outcome",
            self.forwarded.clone(),
        );
        r.register(
            "region_forwards_served",
            "HOME_REGION decisions made here for the peer region",
            self.forwards_served.clone(),
        );
    }
}
