//! A lock-free local bucket (GCRA, as governor implements it): the coarse per-node pre-limit
//! and the LOCAL fail mode's fallback. One atomic holds the theoretical arrival time; a check
//! is a compare-and-swap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_lease::{Algorithm, Limit, Micros};

/// A token bucket in one atomic: `capacity` units, refilled at `rate` per second.
#[derive(Debug)]
pub struct LocalBucket {
    /// Theoretical arrival time, nanoseconds on the node clock.
    tat: AtomicU64,
    /// Nanoseconds per unit.
    interval: u64,
    /// Burst tolerance: `capacity × interval`.
    tolerance: u64,
}

impl LocalBucket {
    /// `capacity` units refilled at `rate` per second (both > 0).
    pub fn new(capacity: f64, rate: f64) -> Self {
        let interval = (1e9 / rate).ceil().max(1.0) as u64;
        let tolerance = (capacity.max(1.0) * interval as f64) as u64;
        Self {
            tat: AtomicU64::new(0),
            interval,
            tolerance,
        }
    }

    /// A local stand-in for `limit`, scaled by `factor` (0.5: half of it). Windows become a
    /// bucket of `limit` units refilled at `limit / window`; slots, of `max_in_flight` refilled
    /// per slot TTL.
    pub fn for_limit(limit: &Limit, factor: f64) -> Self {
        let capacity = limit.capacity() as f64 * factor;
        let period = match limit.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                return Self::new(capacity, limit.refill_per_second().unwrap_or(1.0) * factor);
            }
            Algorithm::Concurrency => limit.slot_ttl(),
            _ => limit.window(),
        };
        let secs = period.unwrap_or(Duration::from_secs(1)).as_secs_f64();
        Self::new(capacity, capacity / secs)
    }

    /// The per-node pre-limit of `limit` at `factor`: at factor 1 it admits everything the
    /// limit itself could admit from one node, so for a lone client it never denies what the
    /// store would admit and its wait is never shorter than the store's. A token bucket is
    /// itself; a window of L becomes a bucket of 2L refilled at L per window, the most any
    /// window algorithm admits over any span (L in each window the span touches, and a span
    /// shorter than a window can touch two). Slots are not pre-limited.
    pub fn prelimit(limit: &Limit, factor: f64) -> Self {
        match limit.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                Self::for_limit(limit, factor)
            }
            Algorithm::Concurrency => Self::for_limit(limit, factor),
            _ => {
                let capacity = limit.capacity() as f64 * factor;
                let secs = limit
                    .window()
                    .unwrap_or(Duration::from_secs(1))
                    .as_secs_f64();
                Self::new(2.0 * capacity, capacity / secs)
            }
        }
    }

    /// Takes `cost` units at `now`, or says how long until they would fit. A cost larger than
    /// the bucket fits when the bucket is full, and empties it: a bucket scaled below a rule's
    /// capacity (a pre-limit under 1, a LOCAL share) never refuses a cost the rule admits.
    pub fn take(&self, cost: u64, now: Micros) -> Result<(), Duration> {
        let now_ns = now.saturating_mul(1000);
        let increment = cost.saturating_mul(self.interval).min(self.tolerance);
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let next = tat.max(now_ns).saturating_add(increment);
            let ahead = next - now_ns;
            if ahead > self.tolerance && increment > 0 {
                return Err(Duration::from_nanos(ahead - self.tolerance));
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(actual) => tat = actual,
            }
        }
    }

    /// Fills the bucket up (a reset of the limit it stands in for).
    pub fn fill(&self) {
        self.tat.store(0, Ordering::Release);
    }

    /// Gives back `cost` units taken for a request that was denied elsewhere.
    pub fn refund(&self, cost: u64) {
        let decrement = cost.saturating_mul(self.interval).min(self.tolerance);
        let _ = self
            .tat
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_sub(decrement))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_a_burst_then_the_rate() {
        let b = LocalBucket::new(10.0, 5.0);
        let now = 1_000_000;
        for _ in 0..10 {
            b.take(1, now).expect("burst");
        }
        let wait = b.take(1, now).expect_err("empty");
        assert_eq!(wait, Duration::from_millis(200));
        b.take(1, now + 200_000).expect("refilled one");
        assert!(b.take(1, now + 200_000).is_err());
    }

    #[test]
    fn a_cost_above_the_burst_fits_a_full_bucket() {
        let b = LocalBucket::new(2.0, 1.0);
        b.take(5, 0)
            .expect("a full bucket admits it, and is emptied");
        assert_eq!(
            b.take(5, 0),
            Err(Duration::from_secs(2)),
            "until full again"
        );
        b.take(5, 2_000_000).expect("full again");
    }

    #[test]
    fn refunds_give_units_back() {
        let b = LocalBucket::new(2.0, 1.0);
        b.take(2, 0).expect("burst");
        assert!(b.take(1, 0).is_err());
        b.refund(1);
        b.take(1, 0).expect("refunded");
    }

    #[test]
    fn a_window_prelimit_admits_two_windows_worth_across_a_boundary() {
        // FIXED_WINDOW 5/min admits 5 just before a boundary and 5 just after it.
        let limit = Limit::fixed_window(5, Duration::from_secs(60)).expect("limit");
        let b = LocalBucket::prelimit(&limit, 1.0);
        for _ in 0..10 {
            b.take(1, 59_900_000).expect("two windows' worth");
        }
        assert!(b.take(1, 59_900_000).is_err());
    }

    #[test]
    fn windows_become_their_average_rate() {
        let limit = Limit::fixed_window(60, Duration::from_secs(60)).expect("limit");
        let b = LocalBucket::for_limit(&limit, 0.5);
        for _ in 0..30 {
            b.take(1, 0).expect("half the window limit");
        }
        assert!(b.take(1, 0).is_err());
        assert!(
            b.take(1, 1_000_000).is_err(),
            "half of 60/min is one unit per two seconds"
        );
        b.take(1, 2_000_000).expect("refilled after two seconds");
    }
}
