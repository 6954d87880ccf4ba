//! The store as the runtime sees it: every call passes through the circuit breaker of the
//! shard its key lives on (one for a single Redis or the in-memory store, one per slot range
//! of a Redis Cluster: a failing shard opens its own breaker only), and is timed; failures are
//! counted by cause.
//!
//! Checks, returns and slot releases get the store budget (default 5 ms). A lease acquisition
//! is patient: at the budget it counts as a timeout (the breaker sees a slow store), the
//! requests waiting on it are decided by their fail modes, and the call goes on for an answer
//! up to `patience`, so a lease the store granted late is still used rather than lost
//! (the runtime charges what was admitted meanwhile against it).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tollgate_lease::{
    BucketKey, CheckOutcome, CheckRequest, LeaseGrant, LeaseRequest, LeaseStore, ReturnRequest,
    SharedClock, SlotRelease, Store, StoreError,
};
use tracing::Instrument;

use crate::metrics::{Metrics, StoreFailure, StoreOp};
use crate::runtime::breaker::{Breaker, BreakerConfig, BreakerState};

/// The store behind per-shard circuit breakers, with metrics.
#[derive(Debug)]
pub struct GuardedStore {
    store: Store,
    /// The same store, with a budget of `patience` (lease acquisitions).
    patient: Store,
    budget: Duration,
    breakers: DashMap<u16, Breaker>,
    config: BreakerConfig,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    /// Cooldown jitter (seeded, so a simulation repeats).
    jitter: parking_lot::Mutex<StdRng>,
}

impl GuardedStore {
    /// Wraps `store` (`budget` per call; lease acquisitions wait up to `patience`).
    pub fn new(
        store: Store,
        budget: Duration,
        patience: Duration,
        breaker: BreakerConfig,
        clock: SharedClock,
        metrics: Arc<Metrics>,
        seed: Option<u64>,
    ) -> Self {
        Self {
            patient: store.with_budget(patience.max(budget)),
            store: store.with_budget(budget),
            budget,
            breakers: DashMap::new(),
            config: breaker,
            clock,
            metrics,
            jitter: parking_lot::Mutex::new(match seed {
                Some(seed) => StdRng::seed_from_u64(seed),
                None => StdRng::from_os_rng(),
            }),
        }
    }

    /// The store itself.
    pub fn inner(&self) -> &Store {
        &self.store
    }

    /// The store call budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Where the breaker of `key`'s shard stands.
    pub fn breaker_state_of(&self, key: &BucketKey) -> BreakerState {
        self.breakers
            .get(&self.store.shard_of(key))
            .map_or(BreakerState::Closed, |b| b.state())
    }

    /// Every shard's breaker that has seen a call, by shard.
    pub fn breaker_states(&self) -> Vec<(u16, BreakerState)> {
        let mut states: Vec<_> = self
            .breakers
            .iter()
            .map(|b| (*b.key(), b.state()))
            .collect();
        states.sort_by_key(|(shard, _)| *shard);
        states
    }

    /// The worst breaker state over every shard (open, else half-open, else closed).
    pub fn breaker_state(&self) -> BreakerState {
        self.breakers
            .iter()
            .map(|b| b.state())
            .max_by_key(|s| s.code())
            .unwrap_or(BreakerState::Closed)
    }

    fn publish_state(&self) {
        let (worst, open) = self.breakers.iter().fold((0, 0), |(worst, open), b| {
            let code = b.state().code();
            (worst.max(code), open + i64::from(code > 0))
        });
        self.metrics.breaker_state.set(worst);
        self.metrics.breakers_open.set(open);
    }

    /// Whether the breaker of `shard` lets a call through now.
    fn admit(&self, op: StoreOp, shard: u16) -> Result<(), StoreError> {
        let (allowed, changed) = {
            let mut breaker = self
                .breakers
                .entry(shard)
                .or_insert_with(|| Breaker::new(self.config.clone()));
            let before = breaker.state();
            let allowed = breaker.allow(self.clock.now_micros());
            (allowed, breaker.state() != before)
        };
        if changed {
            self.publish_state();
        }
        if allowed {
            self.metrics.store_calls.inc();
            Ok(())
        } else {
            self.metrics.count_failure(op, StoreFailure::BreakerOpen);
            Err(StoreError::Unavailable("circuit breaker open".into()))
        }
    }

    /// Counts a call's outcome at its shard's breaker.
    fn record<T>(&self, op: StoreOp, shard: u16, result: &Result<T, StoreError>) {
        let now = self.clock.now_micros();
        let mut breaker = self
            .breakers
            .entry(shard)
            .or_insert_with(|| Breaker::new(self.config.clone()));
        let before = breaker.state();
        match result {
            // A full store answered: it is up; only the new key it refused is affected.
            Err(StoreError::Full(_)) => {
                self.metrics.count_failure(op, StoreFailure::Full);
                breaker.on_success(now);
            }
            Err(e) if e.is_transient() => {
                let failure = match e {
                    StoreError::Timeout { .. } => StoreFailure::Timeout,
                    _ => StoreFailure::Unavailable,
                };
                self.metrics.count_failure(op, failure);
                if breaker.on_failure(now, self.jitter.lock().random()) {
                    self.metrics.breaker_opened.inc();
                    tracing::warn!(shard, error = %e, "store circuit breaker opened");
                }
            }
            Err(e) => {
                // The store answered: it is up, the request was wrong.
                self.metrics.count_failure(op, StoreFailure::Other);
                tracing::warn!(error = %e, "store rejected a call");
                breaker.on_success(now);
            }
            Ok(_) => {
                if breaker.state() != BreakerState::Closed {
                    tracing::info!(shard, "store circuit breaker closed");
                }
                breaker.on_success(now);
            }
        }
        let changed = breaker.state() != before;
        drop(breaker);
        // The gauges summarise every shard: recomputed when one changes, not on every call.
        if changed {
            self.publish_state();
        }
    }

    async fn call<T>(
        &self,
        op: StoreOp,
        key: &BucketKey,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let shard = self.store.shard_of(key);
        self.admit(op, shard)?;
        let start = tokio::time::Instant::now();
        let span = crate::telemetry::child_of_current(|| {
            tracing::debug_span!("store", op = op.as_str(), shard)
        });
        let result = call.instrument(span).await;
        self.metrics
            .observe_store(op, start.elapsed().as_secs_f64());
        self.record(op, shard, &result);
        result
    }

    /// [`LeaseStore::check`] through the breaker.
    pub async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        self.call(StoreOp::Check, &req.items()[0].key, self.store.check(req))
            .await
    }

    /// [`LeaseStore::acquire_leases`] through the breaker, patiently: past the budget the
    /// breaker counts a timeout and `on_budget` runs (the runtime decides the waiting requests
    /// then), and the answer is still awaited up to the patience.
    pub async fn acquire_leases(
        &self,
        req: &LeaseRequest,
        on_budget: impl FnOnce(),
    ) -> Result<Vec<LeaseGrant>, StoreError> {
        let op = StoreOp::LeaseAcquire;
        let shard = self.store.shard_of(&req.asks()[0].key);
        self.admit(op, shard)?;
        let start = tokio::time::Instant::now();
        let call = self
            .patient
            .acquire_leases(req)
            .instrument(crate::telemetry::child_of_current(|| {
                tracing::debug_span!("store", op = op.as_str(), shard)
            }));
        tokio::pin!(call);
        let early = tokio::time::timeout(self.budget, &mut call).await;
        let result = match early {
            Ok(result) => {
                self.record(op, shard, &result);
                result
            }
            Err(_) => {
                let timeout: Result<(), StoreError> = Err(StoreError::Timeout {
                    budget: self.budget,
                });
                self.record(op, shard, &timeout);
                on_budget();
                let result = call.await;
                if result.is_ok() {
                    self.metrics.late_leases.inc();
                }
                result
            }
        };
        self.metrics
            .observe_store(op, start.elapsed().as_secs_f64());
        result
    }

    /// [`LeaseStore::return_leases`] through the breaker.
    pub async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        self.call(
            StoreOp::LeaseReturn,
            &req.items()[0].key,
            self.store.return_leases(req),
        )
        .await
    }

    /// [`LeaseStore::release_slots`] through the breaker.
    pub async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        self.call(
            StoreOp::SlotRelease,
            &req.items()[0].0,
            self.store.release_slots(req),
        )
        .await
    }
}
