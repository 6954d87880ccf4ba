//! The node's Prometheus metrics, registered once and served on `/metrics`.
//!
//! Hot-path counters are resolved when a rule set is compiled ([`RuleCounters`]), so a decision
//! increments plain atomics and never looks up a label set.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::runtime::outcome::Outcome;

pub mod client_input;
pub mod connections;
mod labels;
mod registration;
pub mod rlqs;
pub mod unmatched;

pub use labels::{
    Api, ApiResult, PenaltyLabels, RuleLabels, SettledUnitsLabels, SettlementLabels, StoreFailure,
    StoreOp, UncountedDenialsLabels,
};
use labels::{ApiLabels, ApiResultLabels, DecisionLabels, FailureLabels, OpLabels};

/// Per-rule decision counters, resolved once per compiled rule.
#[derive(Debug, Clone, Default)]
pub struct RuleCounters {
    /// Admitted.
    pub allowed: Counter,
    /// Denied.
    pub denied: Counter,
    /// Would have been denied (SHADOW).
    pub shadow_denied: Counter,
    /// Admitted because the store failed (OPEN).
    pub failed_open: Counter,
    /// Denied because the store failed (CLOSED).
    pub failed_closed: Counter,
    /// Decided by the local fallback bucket (LOCAL).
    pub local_fallback: Counter,
}

impl RuleCounters {
    /// The counter for `outcome`.
    pub fn get(&self, outcome: Outcome) -> &Counter {
        match outcome {
            Outcome::Allowed => &self.allowed,
            Outcome::Denied => &self.denied,
            Outcome::ShadowDenied => &self.shadow_denied,
            Outcome::FailedOpen => &self.failed_open,
            Outcome::FailedClosed => &self.failed_closed,
            Outcome::LocalFallback => &self.local_fallback,
        }
    }
}

/// Every metric of a node.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    /// Store call latency, seconds, by operation: looked up once, indexed by [`StoreOp`]
    /// (no label hashing per call).
    store_latency: [Histogram; StoreOp::ALL.len()],
    store_failures: Family<FailureLabels, Counter>,
    /// Store calls made (whatever their outcome; not those the open breaker refused).
    pub store_calls: Counter,
    /// Batches of two checks or lease asks or more sent to Redis in one call.
    pub store_batches: Counter,
    /// Checks and lease asks those batches carried.
    pub store_batched_requests: Counter,
    /// Breaker state: 0 closed, 1 half-open, 2 open.
    pub breaker_state: Gauge,
    /// Times the breaker opened.
    pub breaker_opened: Counter,
    /// Shards whose breaker is not closed.
    pub breakers_open: Gauge,
    /// 1 while every store shard answers (no call failed since its last answer, breaker
    /// closed), 0 otherwise.
    pub store_answering: Gauge,
    /// Seconds since the store last answered (the shard that answered longest ago), as of the
    /// last scrape; at most about the heartbeat (1 s) while it answers, whatever the traffic.
    pub store_last_answer_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// A Redis Cluster's `cluster-require-full-coverage`: 1 yes (one failed primary stops
    /// every shard), 0 no, -1 could not be read; absent (0) elsewhere.
    pub store_cluster_full_coverage_required: Gauge,
    /// Lease acquisitions answered after the store had stalled (their grants were used, not
    /// lost).
    pub late_leases: Counter,
    /// Units admitted while the store had stalled (by a fail mode, or on its last answer),
    /// once settled: debited in the store when it answered, or forgiven.
    pub owed_units: Counter,
    /// Store calls judged stalled: nothing answered for a store budget while the node kept
    /// up (the requests that do not wait were decided then; the call went on).
    pub store_stalls: Counter,
    /// Owed units debited in the store (exactly once each).
    pub owed_units_debited: Counter,
    /// Owed units paid out of the late grant of the lease call that was out while they were
    /// admitted (the store had granted them from the same remainder).
    pub owed_units_paid_by_grant: Counter,
    /// Blocks started by a rule's penalty, per rule and outcome (`blocked`; `shadow` for a
    /// SHADOW rule, which blocks nobody).
    pub penalties: Family<PenaltyLabels, Counter>,
    /// Requests denied because their identity was in a rule's penalty box, per rule.
    pub penalized_requests: Family<RuleLabels, Counter>,
    /// Denials a rule's penalty did not count, per rule and reason.
    pub penalty_denials_uncounted: Family<UncountedDenialsLabels, Counter>,
    /// Reservations settled, per rule and what the store did.
    pub settlements: Family<SettlementLabels, Counter>,
    /// Units settlements gave back or charged, per rule.
    pub settled_units: Family<SettledUnitsLabels, Counter>,
    /// Owed units forgiven: the store could not be reached to take them (it was down, not
    /// late), or a late answer showed it had counted them already.
    pub owed_units_forgiven: Counter,
    /// Decisions made on this node's share of the store's last answer while it had stalled
    /// (not by a fail mode).
    pub slow_store_decisions: Counter,
    /// Leases acquired (grants of at least one unit).
    pub leases_acquired: Counter,
    /// Units granted by leases.
    pub lease_units_acquired: Counter,
    /// Leases returned with unspent units.
    pub leases_returned: Counter,
    /// Units credited back to the store by returns.
    pub lease_units_returned: Counter,
    /// Decisions served from a live lease without waiting for the store.
    pub lease_hits: Counter,
    /// Decisions that went to the key's actor (cold key, or a refill that did not cover them).
    pub lease_misses: Counter,
    /// Decisions that found their lease empty and waited for a refill.
    pub lease_waits: Counter,
    /// Concurrency slots taken by admissions.
    pub slots_taken: Counter,
    /// Slots released while still held (ReleaseSlots).
    pub slots_released: Counter,
    /// Release calls for slots no longer held (expired by their TTL, or released already):
    /// a client releasing late. Slots never released (Envoy has no release call) expire
    /// silently: taken - released is what expired or is still held.
    pub slots_release_missed: Counter,
    /// Per-key actors alive.
    pub key_actors: Gauge,
    /// New keys refused an actor because the key state budget was reached (decided by a
    /// direct check).
    pub key_actors_refused: Counter,
    /// Actors idle for a second stopped because the key state budget was short.
    pub key_actors_evicted: Counter,
    /// Bytes of key state held (actors, buckets, the keys-seen map, LOCAL fallbacks), as
    /// counted against `--max-key-state-mb`.
    pub key_state_bytes: Gauge,
    /// Bytes the in-memory store holds, as counted against `--memory-max-mb`.
    pub memory_store_bytes: Gauge,
    /// Keys the in-memory store holds.
    pub memory_store_keys: Gauge,
    /// Live keys the in-memory store evicted to make room.
    pub memory_store_evictions: Counter,
    /// Serializes the refresh of the figures above that are read from their owners.
    pub(crate) refreshing: std::sync::Mutex<()>,
    /// Requests rejected by the local pre-limit before reaching the store.
    pub prelimit_denied: Counter,
    /// The active rule set's version.
    pub rules_version: Gauge,
    /// Rules in the active set.
    pub rules_loaded: Gauge,
    /// Rule reloads rejected (the previous set stayed).
    pub rules_reload_errors: Counter,
    /// Seconds since the rules were last loaded successfully from their source.
    pub rules_staleness_seconds: Gauge,
    /// TLS certificate sets reloaded after their files changed.
    pub tls_reloads: Counter,
    /// TLS files that changed but did not load (the previous certificate stayed).
    pub tls_reload_errors: Counter,
    /// Connections closed before their TLS handshake: their source address had too many
    /// handshakes in flight.
    pub tls_handshakes_refused: Counter,
    /// Region sync (exported only by a node that runs in two regions: a single-region node
    /// showing `tollgate_region_peer_up 0` would fire a naive alert).
    pub region: tollgate_regionsync::metrics::RegionMetrics,
    /// Requests that matched no rule (nothing limits them: an unknown domain, a descriptor
    /// no rule names).
    pub requests_unmatched: Counter,
    /// Requests per API and result, and their latency per API, pre-resolved.
    pub api: [ApiMetrics; 2],
    /// Envoy's rate limit quota service.
    pub rlqs: rlqs::RlqsMetrics,
    /// Request content decided on other terms than as sent.
    pub client_input: client_input::ClientInputMetrics,
    /// Requests no rule limited, by domain.
    pub unmatched: unmatched::UnmatchedMetrics,
    /// Each listener's connections.
    pub connections: connections::ConnectionMetrics,
}

/// One API's request counters and latency histogram.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    /// Requests admitted, denied and refused.
    pub results: [Counter; 3],
    /// Time from request decoded to answer built, seconds.
    pub latency: Histogram,
}

impl ApiMetrics {
    /// Counts one answered request that took `seconds`.
    pub fn answered(&self, result: ApiResult, seconds: f64) {
        self.results[result as usize].inc();
        self.latency.observe(seconds);
    }
}

impl Metrics {
    /// Metrics of a node of one region (region sync's are kept but not exported).
    pub fn new() -> Arc<Self> {
        Self::build(false)
    }

    /// Metrics of a node that runs in one of two regions.
    pub fn with_regions() -> Arc<Self> {
        Self::build(true)
    }

    /// The metrics of `api`.
    pub fn api(&self, api: Api) -> &ApiMetrics {
        &self.api[api as usize]
    }

    /// The counters of one rule.
    pub fn rule_counters(&self, labels: &RuleLabels) -> RuleCounters {
        let get = |outcome| {
            self.decisions
                .get_or_create(&DecisionLabels {
                    domain: labels.domain.clone(),
                    rule: labels.rule.clone(),
                    outcome,
                })
                .clone()
        };
        RuleCounters {
            allowed: get(Outcome::Allowed),
            denied: get(Outcome::Denied),
            shadow_denied: get(Outcome::ShadowDenied),
            failed_open: get(Outcome::FailedOpen),
            failed_closed: get(Outcome::FailedClosed),
            local_fallback: get(Outcome::LocalFallback),
        }
    }

    /// Records a store call's latency.
    /// Counts one rule's settlement.
    pub fn settlement(&self, rule: &str, settlement: &tollgate_lease::Settlement) {
        self.settlements
            .get_or_create(&SettlementLabels {
                rule: rule.to_owned(),
                result: settlement.as_str().to_owned(),
            })
            .inc();
        let (refunded, charged) = match *settlement {
            tollgate_lease::Settlement::Settled { refunded, charged } => (refunded, charged),
            tollgate_lease::Settlement::Expired { charged } => (0, charged),
            _ => (0, 0),
        };
        for (direction, units) in [("refunded", refunded), ("charged", charged)] {
            if units > 0 {
                self.settled_units
                    .get_or_create(&SettledUnitsLabels {
                        rule: rule.to_owned(),
                        direction: direction.to_owned(),
                    })
                    .inc_by(units);
            }
        }
    }

    pub fn observe_store(&self, op: StoreOp, seconds: f64) {
        self.store_latency[op.index()].observe(seconds);
    }

    /// Counts a failed store call.
    pub fn count_failure(&self, op: StoreOp, failure: StoreFailure) {
        self.store_failures
            .get_or_create(&FailureLabels { op, failure })
            .inc();
    }

    /// The decision counter value for one rule and outcome (tests, benchmarks).
    pub fn decisions(&self, domain: &str, rule: &str, outcome: Outcome) -> u64 {
        self.decisions
            .get(&DecisionLabels {
                domain: domain.into(),
                rule: rule.into(),
                outcome,
            })
            .map_or(0, |c| c.get())
    }

    /// Store calls that failed with `failure`, all operations together.
    pub fn failures(&self, failure: StoreFailure) -> u64 {
        StoreOp::ALL
            .into_iter()
            .map(|op| self.store_failures_counted(op, failure))
            .sum()
    }

    /// Store calls of `op` that failed, whatever the cause.
    pub fn store_failures_of(&self, op: StoreOp) -> u64 {
        StoreFailure::ALL
            .into_iter()
            .map(|failure| self.store_failures_counted(op, failure))
            .sum()
    }

    fn store_failures_counted(&self, op: StoreOp, failure: StoreFailure) -> u64 {
        self.store_failures
            .get(&FailureLabels { op, failure })
            .map_or(0, |c| c.get())
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
