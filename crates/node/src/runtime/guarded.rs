//! The store as the runtime sees it: every call passes through the circuit breaker and is
//! timed; failures are counted by cause. (The per-call timeout itself lives in the store: the
//! Redis store fails a call that outlives its budget.)

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tollgate_lease::{
    CheckOutcome, CheckRequest, LeaseGrant, LeaseRequest, LeaseStore, ReturnRequest, SharedClock,
    SlotRelease, Store, StoreError,
};

use crate::metrics::{Metrics, StoreFailure, StoreOp};
use crate::runtime::breaker::{Breaker, BreakerConfig, BreakerState};

/// The store behind a circuit breaker, with metrics.
#[derive(Debug)]
pub struct GuardedStore {
    store: Store,
    breaker: Mutex<Breaker>,
    clock: SharedClock,
    metrics: Arc<Metrics>,
}

impl GuardedStore {
    /// Wraps `store`.
    pub fn new(
        store: Store,
        breaker: BreakerConfig,
        clock: SharedClock,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            breaker: Mutex::new(Breaker::new(breaker)),
            clock,
            metrics,
        }
    }

    /// The store itself.
    pub fn inner(&self) -> &Store {
        &self.store
    }

    /// Where the breaker stands.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.lock().state()
    }

    async fn call<T>(
        &self,
        op: StoreOp,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let allowed = {
            let mut breaker = self.breaker.lock();
            let allowed = breaker.allow(self.clock.now_micros());
            self.metrics.breaker_state.set(breaker.state().code());
            allowed
        };
        if !allowed {
            self.metrics.count_failure(op, StoreFailure::BreakerOpen);
            return Err(StoreError::Unavailable("circuit breaker open".into()));
        }
        self.metrics.store_calls.inc();
        let start = tokio::time::Instant::now();
        let result = call.await;
        self.metrics
            .observe_store(op, start.elapsed().as_secs_f64());
        let mut breaker = self.breaker.lock();
        match &result {
            Err(e) if e.is_transient() => {
                let failure = match e {
                    StoreError::Timeout { .. } => StoreFailure::Timeout,
                    _ => StoreFailure::Unavailable,
                };
                self.metrics.count_failure(op, failure);
                if breaker.on_failure(self.clock.now_micros(), rand::random()) {
                    self.metrics.breaker_opened.inc();
                    tracing::warn!(error = %e, "store circuit breaker opened");
                }
            }
            Err(e) => {
                // The store answered: it is up, the request was wrong.
                self.metrics.count_failure(op, StoreFailure::Other);
                tracing::warn!(error = %e, "store rejected a call");
                breaker.on_success();
            }
            Ok(_) => {
                if breaker.state() != BreakerState::Closed {
                    tracing::info!("store circuit breaker closed");
                }
                breaker.on_success();
            }
        }
        self.metrics.breaker_state.set(breaker.state().code());
        result
    }

    /// [`LeaseStore::check`] through the breaker.
    pub async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        self.call(StoreOp::Check, self.store.check(req)).await
    }

    /// [`LeaseStore::acquire_leases`] through the breaker.
    pub async fn acquire_leases(&self, req: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        self.call(StoreOp::LeaseAcquire, self.store.acquire_leases(req))
            .await
    }

    /// [`LeaseStore::return_leases`] through the breaker.
    pub async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        self.call(StoreOp::LeaseReturn, self.store.return_leases(req))
            .await
    }

    /// [`LeaseStore::release_slots`] through the breaker.
    pub async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        self.call(StoreOp::SlotRelease, self.store.release_slots(req))
            .await
    }
}
