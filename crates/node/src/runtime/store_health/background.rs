//! Store calls that outlive the request that made them: a late call handed to a task of its
//! own (its answer, when it comes, is still recorded and settles what was admitted without
//! it), and debts (`runtime/store_health/debts.rs`) debited in a task of their own, tried again after
//! transient failures until their epoch ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{Micros, StoreError};

use crate::runtime::shared::Shared;
use crate::runtime::store_health::debts::{Debt, FIRST_PAUSE, MAX_PAUSE};
use crate::runtime::store_health::guarded::Call;

/// A call handed to a task of its own once its caller stopped waiting: the answer, when it
/// comes, is recorded and given to `settle`.
pub(crate) fn hand_off<T: Send + 'static>(
    shared: Arc<Shared>,
    call: Call,
    future: Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>,
    settle: impl FnOnce(&Arc<Shared>, Result<T, StoreError>) + Send + 'static,
) {
    tokio::spawn(async move {
        let result = future.await;
        shared.store.end(call, &result);
        settle(&shared, result);
    });
}

/// Debits `debts` (one identity's buckets) in the store, in a task of its own, exactly once;
/// tried again after transient failures until the debts' epoch ends.
pub(crate) fn settle(shared: Arc<Shared>, debts: Vec<Debt>) {
    if debts.is_empty() {
        return;
    }
    let owed = shared.debts.owe(debts, shared.clock.now_micros());
    shared.metrics.owed_units.inc_by(owed.units);
    let request = match owed.request {
        Ok(request) => request,
        Err(e) => {
            tracing::warn!(error = %e, "a debt cannot be debited");
            shared.metrics.owed_units_forgiven.inc_by(owed.units);
            return;
        }
    };
    let (units, until) = (owed.units, owed.until);
    tokio::spawn(async move {
        let mut pause = FIRST_PAUSE;
        // Whether an earlier try may have been applied (its answer never came): then the
        // store's answer to this one (what it applied anew) says nothing of what it has.
        let mut tried = false;
        loop {
            match shared.store.debit(&request).await {
                Ok(applied) => {
                    let applied = if tried { units } else { applied.iter().sum() };
                    shared.metrics.owed_units_debited.inc_by(applied);
                    // Units of a window that ended before the debit landed are gone with it.
                    shared
                        .metrics
                        .owed_units_forgiven
                        .inc_by(units.saturating_sub(applied));
                    return;
                }
                Err(e)
                    if e.is_transient() && shared.clock.now_micros() + pause_us(pause) < until =>
                {
                    tracing::debug!(error = %e, "a debt waits for the store");
                    tried |= matches!(e, StoreError::Timeout { .. });
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Err(e) => {
                    tracing::debug!(error = %e, units, "a debt was forgiven");
                    shared.metrics.owed_units_forgiven.inc_by(units);
                    return;
                }
            }
        }
    });
}

fn pause_us(pause: Duration) -> Micros {
    pause.as_micros() as u64
}
