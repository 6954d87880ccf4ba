//! The node's figures as its operator reads them: what it holds (key actors, buckets, LOCAL
//! fallbacks, override rules), and the metrics read from their owners brought up to date.

use super::operator::Operator;

impl Operator<'_> {
    /// LOCAL fallback buckets held for keys without an actor, and overflow buckets (per rule).
    pub fn fallback_buckets(&self) -> (usize, usize) {
        self.node.inner.decider.fallbacks.counts()
    }

    /// Rules made from descriptor limit overrides, held for reuse.
    pub fn override_rules(&self) -> usize {
        self.node.inner.decider.overrides.len()
    }

    /// Brings the metrics read from their owners up to date: the memory figures (the registry,
    /// the fallbacks, the in-memory store) and the store's batching.
    pub fn refresh_figures(&self) {
        let shared = &self.node.inner.decider.shared;
        let metrics = &shared.metrics;
        let _one_at_a_time = metrics.refreshing.lock();
        let key_state = shared.registry.bytes() + self.node.inner.decider.fallbacks.bytes();
        if let Some(settings) = shared.store.cluster_settings() {
            use tollgate_lease::redis::ClusterSettings;
            metrics
                .store_cluster_full_coverage_required
                .set(match settings {
                    ClusterSettings::Read {
                        require_full_coverage,
                        ..
                    } => i64::from(require_full_coverage),
                    ClusterSettings::Unreadable(_) => -1,
                });
        }
        let health = shared.store.shard_health();
        metrics
            .store_answering
            .set(i64::from(health.iter().all(|s| s.answering())));
        let oldest = self.node.store().last_answer_age().unwrap_or_default();
        metrics
            .store_last_answer_age_seconds
            .set(oldest.as_secs_f64());
        metrics.key_state_bytes.set(key_state as i64);
        if let Some(memory) = shared.store.memory() {
            metrics.memory_store_bytes.set(memory.bytes() as i64);
            metrics.memory_store_keys.set(memory.len() as i64);
            let evicted = memory.evictions();
            let counted = metrics.memory_store_evictions.get();
            metrics
                .memory_store_evictions
                .inc_by(evicted.saturating_sub(counted));
        }
        if let Some(counts) = shared.store.batch_counts() {
            let catch_up = |counter: &prometheus_client::metrics::counter::Counter, to: u64| {
                counter.inc_by(to.saturating_sub(counter.get()));
            };
            catch_up(&metrics.store_batches, counts.batches);
            catch_up(&metrics.store_batched_requests, counts.batched_requests);
        }
    }

    /// Key actors alive and buckets held.
    pub fn held(&self) -> (usize, usize) {
        let registry = &self.node.inner.decider.shared.registry;
        (registry.live_actors(), registry.buckets())
    }
}
