//! Leaky bucket, as Gubernator defines it: a bucket of `burst` slots that hits fill and that
//! leaks `limit` hits every `duration`, continuously.
//!
//! Its state is the bucket's *level* (hits in it) and when it was last looked at. A cost fits
//! when `level + cost ≤ burst`. What sets it apart from a token bucket of the same numbers is
//! what a rule change does: the level is kept, so raising the limit or the burst gives room at
//! once and changing the duration only changes how fast the level falls (a token bucket keeps
//! its *remaining* tokens instead). `reset_after` is the time until the bucket is empty.
//!
//! The store receives the burst and the leak per second (`limit / duration`), as a token
//! bucket receives its capacity and refill rate.
//!
//! Mirrors `redis/scripts/lib.lua` (`LB`), the same formulas in the same order.

use crate::algorithm::token_bucket::EPSILON;
use crate::clock::Micros;

/// A leaky bucket's state at a moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LeakyBucket {
    /// Hits in the bucket (never negative; above the burst after a debit or a lowered burst).
    pub(crate) level: f64,
    /// When the level was last computed (never moves back).
    pub(crate) ts: Micros,
}

impl LeakyBucket {
    /// The bucket at `now`: empty if there is no state; else leaked for the time since `ts`.
    /// If the clock went backwards, nothing leaks and `ts` does not move back.
    pub(crate) fn load(stored: Option<Self>, leak_per_second: f64, now: Micros) -> Self {
        match stored {
            None => Self {
                level: 0.0,
                ts: now,
            },
            Some(s) => {
                let elapsed = now.saturating_sub(s.ts);
                Self {
                    level: f64::max(0.0, s.level - elapsed as f64 * leak_per_second / 1e6),
                    ts: s.ts.max(now),
                }
            }
        }
    }

    pub(crate) fn admits(&self, burst: u64, cost: u64) -> bool {
        self.level + cost as f64 <= burst as f64 + EPSILON
    }

    /// Whole hits that fit now.
    pub(crate) fn available(&self, burst: u64) -> u64 {
        let room = (burst as f64 - self.level + EPSILON).floor();
        if room <= 0.0 { 0 } else { room as u64 }
    }

    pub(crate) fn fill(&mut self, units: u64) {
        self.level += units as f64;
    }

    /// Takes back unspent units, never below empty.
    pub(crate) fn credit(&mut self, units: u64) {
        self.level = f64::max(0.0, self.level - units as f64);
    }

    /// Adds units consumed elsewhere; the level is capped at twice the burst (a token
    /// bucket's debt floor of one full bucket).
    ///
    /// Returns the units taken: `units`, or fewer where the level stopped at two bursts
    /// (whole units; lib.lua `debit_bucket`).
    pub(crate) fn debit(&mut self, units: u64, burst: u64) -> u64 {
        let most = 2.0 * burst as f64;
        let wanted = self.level + units as f64;
        if wanted <= most {
            self.level = wanted;
            return units;
        }
        let taken = (most - self.level).max(0.0).floor() as u64;
        self.level = most;
        taken
    }

    /// Microseconds until `cost` fits.
    pub(crate) fn retry_after(&self, burst: u64, leak_per_second: f64, cost: u64) -> u64 {
        let us =
            ((self.level + cost as f64 - burst as f64 - EPSILON) * 1e6 / leak_per_second).ceil();
        if us <= 0.0 { 0 } else { us as u64 }
    }

    /// Microseconds until the bucket is empty.
    pub(crate) fn reset_after(&self, leak_per_second: f64) -> u64 {
        let us = ((self.level - EPSILON) * 1e6 / leak_per_second).ceil();
        if us <= 0.0 { 0 } else { us as u64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_to_its_burst_and_leaks_at_its_rate() {
        // 5 hits per second, burst 5: five at once, then one every 200 ms.
        let now = 1_000_000;
        let mut b = LeakyBucket::load(None, 5.0, now);
        for _ in 0..5 {
            assert!(b.admits(5, 1));
            b.fill(1);
        }
        assert!(!b.admits(5, 1));
        assert_eq!(b.retry_after(5, 5.0, 1), 200_000);
        assert_eq!(b.reset_after(5.0), 1_000_000);
        let later = LeakyBucket::load(Some(b), 5.0, now + 200_000);
        assert!(later.admits(5, 1));
        assert_eq!(later.available(5), 1);
    }

    #[test]
    fn a_new_limit_keeps_the_level() {
        // Full at burst 5; the rule now says burst 10: five more fit at once.
        let mut b = LeakyBucket::load(None, 5.0, 0);
        b.fill(5);
        let same_moment = LeakyBucket::load(Some(b), 10.0, 0);
        assert_eq!(same_moment.available(10), 5);
        // A faster leak empties the same level sooner.
        assert_eq!(same_moment.reset_after(10.0), 500_000);
    }

    #[test]
    fn credits_stop_at_empty_and_debits_at_twice_the_burst() {
        let mut b = LeakyBucket::load(None, 1.0, 0);
        b.fill(2);
        b.credit(9);
        assert_eq!(b.level, 0.0);
        assert_eq!(b.debit(1000, 4), 8, "up to two bursts: what was taken");
        assert_eq!(b.level, 8.0);
    }
}
