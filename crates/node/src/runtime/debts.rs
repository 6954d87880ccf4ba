//! What a node owes the store: units it admitted while the store had stalled (a fail mode, or
//! its share of the store's last answer), debited in the store's own bucket as soon as the
//! store answers again, so that every node's next grant pays for them, not only this node's
//! (whose next grant may never come: the other nodes may take every refill).
//!
//! Each debt is a debit-once under this node's own name and an epoch end of its own: sent
//! again after a timeout (which may have applied it), it is applied once. A debt that cannot
//! reach the store before its epoch ends is forgiven: the store was down, not late.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tollgate_lease::{BucketKey, DebitItem, DebitOnce, DebitRequest, Limit, Micros};

use crate::runtime::shared::Shared;

/// How long a debt is tried for (and its record kept in the store).
const KEEP: Duration = Duration::from_secs(30);
/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// This node's name in the store's debit records, and the epochs it has used.
#[derive(Debug)]
pub struct Debts {
    origin: String,
    /// The last epoch end handed out (node clock, µs): each debt gets its own.
    last_until: AtomicU64,
}

/// One debt: units of one bucket.
#[derive(Debug, Clone)]
pub(crate) struct Debt {
    /// The bucket.
    pub(crate) key: BucketKey,
    /// Its limit.
    pub(crate) limit: Limit,
    /// Units owed.
    pub(crate) units: u64,
    /// When the latest of them was admitted (node clock, µs): a window's debt lands in the
    /// window they were admitted in, or nowhere once it has ended.
    pub(crate) admitted_at: Micros,
}

impl Debts {
    /// A name for this node's debts: random, or drawn from `seed` (a simulation repeats).
    pub fn new(seed: Option<u64>) -> Self {
        let mut rng = match seed {
            Some(seed) => rand::rngs::StdRng::seed_from_u64(seed ^ 0x6465_6274),
            None => rand::rngs::StdRng::from_os_rng(),
        };
        Self {
            origin: format!("owed.{:016x}", rng.random::<u64>()),
            last_until: AtomicU64::new(0),
        }
    }

    /// An epoch end no other debt of this node has: at least `now + KEEP`.
    fn next_until(&self, now: Micros) -> Micros {
        let wanted = now + KEEP.as_micros() as u64;
        let mut last = self.last_until.load(Ordering::Acquire);
        loop {
            let until = wanted.max(last + 1);
            match self.last_until.compare_exchange_weak(
                last,
                until,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return until,
                Err(actual) => last = actual,
            }
        }
    }
}

/// Debits `debts` (one identity's buckets) in the store, in a task of its own, exactly once;
/// tried again after transient failures until the debts' epoch ends.
pub(crate) fn settle(shared: Arc<Shared>, debts: Vec<Debt>) {
    if debts.is_empty() {
        return;
    }
    let now = shared.clock.now_micros();
    let owed: u64 = debts.iter().map(|d| d.units).sum();
    shared.metrics.owed_units.inc_by(owed);
    let once = DebitOnce {
        origin: shared.debts.origin.clone(),
        until: shared.debts.next_until(now),
    };
    let items = debts
        .into_iter()
        .map(|d| DebitItem {
            key: d.key,
            limit: d.limit,
            units: d.units,
            consumed_at: Some(d.admitted_at),
            once: Some(once.clone()),
        })
        .collect();
    let request = match DebitRequest::new(items) {
        Ok(request) => request,
        Err(e) => {
            tracing::warn!(error = %e, "a debt cannot be debited");
            shared.metrics.owed_units_forgiven.inc_by(owed);
            return;
        }
    };
    tokio::spawn(async move {
        let mut pause = FIRST_PAUSE;
        // Whether an earlier try may have been applied (its answer never came): then the
        // store's answer to this one (what it applied anew) says nothing of what it has.
        let mut tried = false;
        loop {
            match shared.store.debit(&request).await {
                Ok(applied) => {
                    let applied = if tried { owed } else { applied.iter().sum() };
                    shared.metrics.owed_units_debited.inc_by(applied);
                    // Units of a window that ended before the debit landed are gone with it.
                    shared
                        .metrics
                        .owed_units_forgiven
                        .inc_by(owed.saturating_sub(applied));
                    return;
                }
                Err(e)
                    if e.is_transient()
                        && shared.clock.now_micros() + pause_us(pause) < once.until =>
                {
                    tracing::debug!(error = %e, "a debt waits for the store");
                    tried |= matches!(e, tollgate_lease::StoreError::Timeout { .. });
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Err(e) => {
                    tracing::debug!(error = %e, units = owed, "a debt was forgiven");
                    shared.metrics.owed_units_forgiven.inc_by(owed);
                    return;
                }
            }
        }
    });
}

fn pause_us(pause: Duration) -> Micros {
    pause.as_micros() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_debt_gets_an_epoch_of_its_own() {
        let debts = Debts::new(Some(7));
        let now = 1_700_000_000_000_000;
        let a = debts.next_until(now);
        let b = debts.next_until(now);
        let c = debts.next_until(now + 1);
        assert_eq!(a, now + KEEP.as_micros() as u64);
        assert!(a < b && b < c, "{a} {b} {c}");
        assert!(Debts::new(Some(7)).origin == debts.origin);
        assert!(Debts::new(Some(8)).origin != debts.origin);
        assert!(debts.origin.len() <= tollgate_lease::MAX_ORIGIN_BYTES);
    }
}
