//! The breaker's own probe: one call out to a shard whose probe ran out of time or was
//! dropped unanswered, asked again until the store answers or refuses.

use super::*;

/// What keeps one probe out to a shard whose probe ran out of time or was dropped
/// unanswered, until the store answers one (the breaker closes) or refuses it (the breaker
/// opens again, for a doubled cooldown). Meanwhile the breaker stays half-open.
#[derive(Debug)]
pub(super) struct Prober {
    pub(super) breakers: Arc<Breakers>,
    pub(super) store: Store,
    pub(super) key: BucketKey,
    pub(super) shard: u16,
    /// The least time between two probes (a store that times out at once is not asked in a
    /// busy loop): the patience, which is also how long one probe is waited for.
    pub(super) every: Duration,
}

impl Prober {
    /// Starts probing on a task of its own, unless a probe of the shard's is out already.
    pub(super) fn start(self: Box<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut s = self.breakers.shard(self.shard);
            if s.probing || !s.breaker.half_open() {
                return;
            }
            s.probing = true;
        }
        runtime.spawn(self.probe());
    }

    async fn probe(self: Box<Self>) {
        let breakers = &self.breakers;
        loop {
            let started = breakers.clock.now_micros();
            {
                let mut s = breakers.shard(self.shard);
                if !s.breaker.half_open() {
                    s.probing = false;
                    return;
                }
                s.breaker.hold_half_open(started);
            }
            breakers.metrics.store_calls.inc();
            // A read of the key whose call was the probe: on its shard, and cheap.
            let result = self.store.held_leases(&self.key).await;
            let now = breakers.clock.now_micros();
            breakers
                .metrics
                .observe_store(StoreOp::Probe, now.saturating_sub(started) as f64 / 1e6);
            let mut s = breakers.shard(self.shard);
            if !s.breaker.half_open() {
                // Another call's answer decided meanwhile.
                s.probing = false;
                return;
            }
            match result {
                Err(e @ StoreError::Timeout { .. }) => {
                    s.failed(self.shard, now, &e);
                    drop(s);
                    breakers
                        .metrics
                        .count_failure(StoreOp::Probe, StoreFailure::Timeout);
                    let next = started + self.every.as_micros() as u64;
                    if now < next {
                        tokio::time::sleep(Duration::from_micros(next - now)).await;
                    }
                }
                Err(e) if e.is_transient() && !matches!(e, StoreError::Full(_)) => {
                    s.failed(self.shard, now, &e);
                    s.breaker.on_failure(now, breakers.jitter.lock().random());
                    s.probing = false;
                    drop(s);
                    breakers
                        .metrics
                        .count_failure(StoreOp::Probe, StoreFailure::Unavailable);
                    breakers.publish_state();
                    return;
                }
                _ => {
                    s.answered(self.shard, now);
                    s.breaker.on_success(now);
                    s.probing = false;
                    drop(s);
                    tracing::info!(shard = self.shard, "store circuit breaker closed");
                    breakers.publish_state();
                    return;
                }
            }
        }
    }
}
