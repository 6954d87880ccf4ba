//! Every metric registered, once, in a fresh registry: names, help texts and buckets.

use std::sync::Arc;

use super::*;

impl Metrics {
    /// Registers every metric in a fresh registry.
    ///
    /// A list, one registration per metric in the order of [`Metrics`]' fields: longer than
    /// other functions, and read as a table.
    pub(super) fn build(regions: bool) -> Arc<Self> {
        let mut registry = Registry::with_prefix("tollgate");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Decisions per rule and outcome",
            decisions.clone(),
        );
        let store_latency = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 14))
        });
        registry.register(
            "store_call_seconds",
            "Store call latency by operation",
            store_latency.clone(),
        );
        let store_failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "store_failures",
            "Store calls that failed, by operation and cause",
            store_failures.clone(),
        );
        // Every failure series exists from the start, at zero (alerts and rates need them).
        for op in StoreOp::ALL {
            for failure in StoreFailure::ALL {
                let _ = store_failures.get_or_create(&FailureLabels { op, failure });
            }
        }
        let by_op = |op| store_latency.get_or_create(&OpLabels { op }).clone();
        let store_latency = StoreOp::ALL.map(by_op);
        let results = Family::<ApiResultLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests per API and result (ok, over_limit, invalid)",
            results.clone(),
        );
        let latency = Family::<ApiLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_002, 2.0, 20))
        });
        registry.register(
            "request_seconds",
            "Decision latency per API, from request decoded to answer built",
            latency.clone(),
        );
        let api = [Api::Rls, Api::Check].map(|api| ApiMetrics {
            results: [ApiResult::Ok, ApiResult::OverLimit, ApiResult::Invalid].map(|result| {
                results
                    .get_or_create(&ApiResultLabels { api, result })
                    .clone()
            }),
            latency: latency.get_or_create(&ApiLabels { api }).clone(),
        });
        let m = Metrics {
            requests_unmatched: Counter::default(),
            api,
            decisions,
            store_latency,
            store_failures,
            store_calls: Counter::default(),
            store_batches: Counter::default(),
            store_batched_requests: Counter::default(),
            breaker_state: Gauge::default(),
            breaker_opened: Counter::default(),
            breakers_open: Gauge::default(),
            store_answering: Gauge::default(),
            store_last_answer_age_seconds: Gauge::default(),
            store_cluster_full_coverage_required: Gauge::default(),
            late_leases: Counter::default(),
            owed_units: Counter::default(),
            owed_units_debited: Counter::default(),
            owed_units_paid_by_grant: Counter::default(),
            penalties: Family::default(),
            penalized_requests: Family::default(),
            penalty_denials_uncounted: Family::default(),
            settlements: Family::default(),
            settled_units: Family::default(),
            store_stalls: Counter::default(),
            owed_units_forgiven: Counter::default(),
            slow_store_decisions: Counter::default(),
            leases_acquired: Counter::default(),
            lease_units_acquired: Counter::default(),
            leases_returned: Counter::default(),
            lease_units_returned: Counter::default(),
            lease_hits: Counter::default(),
            lease_misses: Counter::default(),
            lease_waits: Counter::default(),
            slots_taken: Counter::default(),
            slots_released: Counter::default(),
            slots_release_missed: Counter::default(),
            key_actors: Gauge::default(),
            key_actors_refused: Counter::default(),
            key_actors_evicted: Counter::default(),
            key_state_bytes: Gauge::default(),
            memory_store_bytes: Gauge::default(),
            memory_store_keys: Gauge::default(),
            memory_store_evictions: Counter::default(),
            refreshing: Default::default(),
            prelimit_denied: Counter::default(),
            rules_version: Gauge::default(),
            rules_loaded: Gauge::default(),
            rules_reload_errors: Counter::default(),
            rules_staleness_seconds: Gauge::default(),
            tls_reloads: Counter::default(),
            tls_reload_errors: Counter::default(),
            tls_handshakes_refused: Counter::default(),
            region: Default::default(),
            rlqs: Default::default(),
            client_input: Default::default(),
            unmatched: Default::default(),
            connections: Default::default(),
            registry: Registry::default(),
        };
        if regions {
            m.region.register(&mut registry);
        }
        m.rlqs.register(&mut registry);
        m.client_input.register(&mut registry);
        m.unmatched.register(&mut registry);
        m.connections.register(&mut registry);
        registry.register(
            "requests_unmatched",
            "Requests that matched no rule (nothing limited them)",
            m.requests_unmatched.clone(),
        );
        registry.register("store_calls", "Store calls made", m.store_calls.clone());
        registry.register(
            "store_batches",
            "Batches of two or more checks or lease asks sent to Redis as one call",
            m.store_batches.clone(),
        );
        registry.register(
            "store_batched_requests",
            "Checks and lease asks sent to Redis in batches",
            m.store_batched_requests.clone(),
        );
        registry.register(
            "breaker_state",
            "Store circuit breaker: 0 closed, 1 half-open, 2 open",
            m.breaker_state.clone(),
        );
        registry.register(
            "breaker_opened",
            "Times the store circuit breaker opened",
            m.breaker_opened.clone(),
        );
        registry.register(
            "breakers_open",
            "Store shards whose circuit breaker is open or half-open",
            m.breakers_open.clone(),
        );
        registry.register(
            "store_answering",
            "1 while every store shard answers (no call failed since its last answer, breaker closed)",
            m.store_answering.clone(),
        );
        registry.register(
            "store_last_answer_age_seconds",
            "Seconds since the store last answered (the shard that answered longest ago)",
            m.store_last_answer_age_seconds.clone(),
        );
        registry.register(
            "store_cluster_full_coverage_required",
            "A Redis Cluster's cluster-require-full-coverage: 1 yes (one failed primary stops every shard), 0 no, -1 unreadable",
            m.store_cluster_full_coverage_required.clone(),
        );
        registry.register(
            "leases_late",
            "Lease acquisitions answered after the store stalled (their units were still used)",
            m.late_leases.clone(),
        );
        registry.register(
            "lease_units_owed",
            "Units admitted while the store had stalled (fail mode, or its last answer), owed to the store",
            m.owed_units.clone(),
        );
        registry.register(
            "store_stalls",
            "Store calls judged stalled: nothing answered for a budget while the node kept up",
            m.store_stalls.clone(),
        );
        registry.register(
            "owed_units_debited",
            "Owed units debited in the store when it answered again",
            m.owed_units_debited.clone(),
        );
        registry.register(
            "penalties",
            "Blocks started by a rule's penalty box (outcome shadow: a SHADOW rule's, which blocks nobody)",
            m.penalties.clone(),
        );
        registry.register(
            "penalized_requests",
            "Requests denied because their identity was in a rule's penalty box",
            m.penalized_requests.clone(),
        );
        registry.register(
            "penalty_denials_uncounted",
            "Denials a rule's penalty box did not count (lifted: handed out before a lift or reset and refused by the store; store_failed; pending_full)",
            m.penalty_denials_uncounted.clone(),
        );
        registry.register(
            "settlements",
            "Reservations settled, by what the store did (settled, expired, already-settled, unknown)",
            m.settlements.clone(),
        );
        registry.register(
            "settled_units",
            "Units settlements gave back (refunded) or charged (the excess over the estimate)",
            m.settled_units.clone(),
        );
        registry.register(
            "owed_units_paid_by_grant",
            "Owed units paid out of the late grant of the lease call that was out while they were admitted",
            m.owed_units_paid_by_grant.clone(),
        );
        registry.register(
            "owed_units_forgiven",
            "Owed units forgiven: the store was down, not late, or had counted them already",
            m.owed_units_forgiven.clone(),
        );
        registry.register(
            "slow_store_decisions",
            "Decisions made on the store's last answer while it was slow, instead of a fail mode",
            m.slow_store_decisions.clone(),
        );
        registry.register(
            "leases_acquired",
            "Leases granted with at least one unit",
            m.leases_acquired.clone(),
        );
        registry.register(
            "lease_units_acquired",
            "Units granted by leases",
            m.lease_units_acquired.clone(),
        );
        registry.register(
            "leases_returned",
            "Leases returned with unspent units",
            m.leases_returned.clone(),
        );
        registry.register(
            "lease_units_returned",
            "Unspent units credited back to the store",
            m.lease_units_returned.clone(),
        );
        registry.register(
            "lease_hits",
            "Decisions served from a live lease",
            m.lease_hits.clone(),
        );
        registry.register(
            "lease_misses",
            "Decisions that went to the key's actor",
            m.lease_misses.clone(),
        );
        registry.register(
            "lease_waits",
            "Decisions that found their lease empty and waited for a refill",
            m.lease_waits.clone(),
        );
        registry.register(
            "slots_taken",
            "Concurrency slots taken by admitted requests",
            m.slots_taken.clone(),
        );
        registry.register(
            "slots_released",
            "Concurrency slots released while held (ReleaseSlots); taken - released expired or are held",
            m.slots_released.clone(),
        );
        registry.register(
            "slots_release_missed",
            "Releases of slots no longer held (expired by their TTL, or released twice)",
            m.slots_release_missed.clone(),
        );
        registry.register("key_actors", "Per-key actors alive", m.key_actors.clone());
        registry.register(
            "key_actors_refused",
            "New keys decided without an actor because the key state budget was reached",
            m.key_actors_refused.clone(),
        );
        registry.register(
            "key_actors_evicted",
            "Idle key actors stopped because the key state budget was short",
            m.key_actors_evicted.clone(),
        );
        registry.register(
            "key_state_bytes",
            "Bytes of key state held (actors, buckets, keys seen, LOCAL fallbacks)",
            m.key_state_bytes.clone(),
        );
        registry.register(
            "memory_store_bytes",
            "Bytes the in-memory store holds",
            m.memory_store_bytes.clone(),
        );
        registry.register(
            "memory_store_keys",
            "Keys the in-memory store holds",
            m.memory_store_keys.clone(),
        );
        registry.register(
            "memory_store_evictions",
            "Live keys the in-memory store evicted to make room",
            m.memory_store_evictions.clone(),
        );
        registry.register(
            "prelimit_denied",
            "Requests rejected by the local pre-limit",
            m.prelimit_denied.clone(),
        );
        registry.register(
            "rules_version",
            "Version of the active rule set",
            m.rules_version.clone(),
        );
        registry.register(
            "rules_loaded",
            "Rules in the active rule set",
            m.rules_loaded.clone(),
        );
        registry.register(
            "rules_reload_errors",
            "Rule reloads rejected (the previous set stayed)",
            m.rules_reload_errors.clone(),
        );
        registry.register(
            "rules_staleness_seconds",
            "Seconds since rules were last loaded from their source",
            m.rules_staleness_seconds.clone(),
        );
        registry.register(
            "tls_reloads",
            "TLS certificate sets reloaded after their files changed",
            m.tls_reloads.clone(),
        );
        registry.register(
            "tls_reload_errors",
            "TLS files that changed but did not load (the previous certificate stayed)",
            m.tls_reload_errors.clone(),
        );
        registry.register(
            "tls_handshakes_refused",
            "Connections closed before their TLS handshake: too many in flight from their address",
            m.tls_handshakes_refused.clone(),
        );
        Arc::new(Metrics { registry, ..m })
    }
}
