//! Token bucket: `capacity` tokens, refilled continuously at `rate` per second.
//!
//! Mirrors `redis/scripts/lib.lua` (`tb_*`).

use crate::clock::Micros;

/// Tokens this close below a whole number count as it: refill accumulates in doubles (and
/// Redis keeps 17 significant digits), so a bucket that should hold exactly 3 tokens may hold
/// 2.9999999999999996, and a client retrying at the retry-after it was given must not be
/// told to wait another microsecond.
pub(crate) const EPSILON: f64 = 1e-9;

/// A token bucket's state at a moment. Tokens may be negative after a debit (a debt that
/// refill repays), never below `-capacity`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TokenBucket {
    pub(crate) tokens: f64,
    pub(crate) ts: Micros,
    /// The capacity the tokens were counted against, for a bucket that keeps its *used*
    /// tokens when its capacity moves (a regional allowance); 0 for every other bucket, whose
    /// level is kept (and capped) instead.
    pub(crate) cap: u64,
}

impl TokenBucket {
    /// The bucket at `now`: full if there is no state, else refilled for the time since `ts`
    /// and capped at `capacity` (which also applies a lowered capacity at once). If the clock
    /// went backwards, nothing is refilled and `ts` does not move back, so no interval is
    /// refilled twice.
    pub(crate) fn load(stored: Option<Self>, capacity: u64, rate: f64, now: Micros) -> Self {
        let cap = capacity as f64;
        match stored {
            None => Self {
                tokens: cap,
                ts: now,
                cap: 0,
            },
            Some(s) => {
                let elapsed = now.saturating_sub(s.ts);
                // A tracked capacity that moved moves the level with it: the used tokens
                // carry over (a debt floored at one bucket, as a debit's is).
                let tokens = if s.cap != 0 && capacity != s.cap {
                    f64::max(-cap, s.tokens + (cap - s.cap as f64))
                } else {
                    s.tokens
                };
                Self {
                    tokens: f64::min(cap, tokens + elapsed as f64 * rate / 1e6),
                    ts: s.ts.max(now),
                    cap: if s.cap != 0 { capacity } else { 0 },
                }
            }
        }
    }

    pub(crate) fn admits(&self, cost: u64) -> bool {
        self.tokens + EPSILON >= cost as f64
    }

    /// Whole tokens available.
    pub(crate) fn available(&self) -> u64 {
        let tokens = (self.tokens + EPSILON).floor();
        if tokens <= 0.0 { 0 } else { tokens as u64 }
    }

    pub(crate) fn take(&mut self, units: u64) {
        self.tokens -= units as f64;
    }

    /// Gives back unspent units, never above capacity.
    pub(crate) fn credit(&mut self, units: u64, capacity: u64) {
        self.tokens = f64::min(capacity as f64, self.tokens + units as f64);
    }

    /// Subtracts units consumed elsewhere; the debt is floored at one full bucket, which bounds
    /// how long a key can stay blocked to two refill periods.
    ///
    /// Returns the units taken: `units`, or fewer where the debt stopped at one full bucket
    /// (whole units; lib.lua `debit_bucket`).
    pub(crate) fn debit(&mut self, units: u64, capacity: u64) -> u64 {
        let floor = -(capacity as f64);
        let wanted = self.tokens - units as f64;
        if wanted >= floor {
            self.tokens = wanted;
            return units;
        }
        let taken = (self.tokens - floor).max(0.0).floor() as u64;
        self.tokens = floor;
        taken
    }

    /// Microseconds until `cost` tokens exist.
    pub(crate) fn retry_after(&self, cost: u64, rate: f64) -> u64 {
        let us = ((cost as f64 - self.tokens - EPSILON) * 1e6 / rate).ceil();
        if us <= 0.0 { 0 } else { us as u64 }
    }

    /// Microseconds until the bucket is full.
    pub(crate) fn reset_after(&self, capacity: u64, rate: f64) -> u64 {
        self.retry_after(capacity, rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_measurement_ten_then_two_denied_with_200ms_retry() {
        // Capacity 10 refilling 5/s: 12 back-to-back calls → 10 allowed, 2 denied, retry 200 ms.
        let now = 1_000_000;
        let mut state = None;
        let mut allowed = 0;
        let mut retries = vec![];
        for _ in 0..12 {
            let mut b = TokenBucket::load(state, 10, 5.0, now);
            if b.admits(1) {
                b.take(1);
                allowed += 1;
            } else {
                retries.push(b.retry_after(1, 5.0));
            }
            state = Some(b);
        }
        assert_eq!(allowed, 10);
        assert_eq!(retries, vec![200_000, 200_000]);
    }

    #[test]
    fn refill_is_capped_and_clock_going_back_refills_nothing() {
        let b = TokenBucket::load(
            Some(TokenBucket {
                tokens: 2.0,
                ts: 10_000_000,
                cap: 0,
            }),
            10,
            5.0,
            20_000_000,
        );
        assert_eq!(b.tokens, 10.0);
        let back = TokenBucket::load(
            Some(TokenBucket {
                tokens: 2.0,
                ts: 10_000_000,
                cap: 0,
            }),
            10,
            5.0,
            9_000_000,
        );
        assert_eq!(
            back,
            TokenBucket {
                tokens: 2.0,
                ts: 10_000_000,
                cap: 0,
            }
        );
    }

    #[test]
    fn a_tracked_capacity_keeps_the_used_tokens_when_it_moves() {
        // An allowance at 300 with 290 used; its share rises to 570: 280 at once.
        let tracked = TokenBucket {
            tokens: 10.0,
            ts: 1_000_000,
            cap: 300,
        };
        let b = TokenBucket::load(Some(tracked), 570, 9.5, 1_000_000);
        assert_eq!((b.tokens, b.cap), (280.0, 570));
        let down = TokenBucket::load(Some(b), 30, 0.5, 1_000_000);
        assert_eq!(
            (down.tokens, down.cap),
            (-30.0, 30),
            "a lowered share keeps the used tokens, the debt floored at one bucket"
        );
    }

    #[test]
    fn lowered_capacity_caps_the_fill_at_once() {
        let b = TokenBucket::load(
            Some(TokenBucket {
                tokens: 90.0,
                ts: 5,
                cap: 0,
            }),
            20,
            1.0,
            5,
        );
        assert_eq!(b.tokens, 20.0);
    }

    #[test]
    fn debit_builds_a_bounded_debt_that_refill_repays() {
        let mut b = TokenBucket::load(None, 10, 10.0, 0);
        assert_eq!(
            b.debit(25, 10),
            20,
            "10 held and 10 of debt: what was taken"
        );
        assert_eq!(b.tokens, -10.0);
        assert_eq!(b.debit(5, 10), 0, "nothing more once in full debt");
        assert!(!b.admits(0));
        assert_eq!(b.retry_after(1, 10.0), 1_100_000);
        let later = TokenBucket::load(Some(b), 10, 10.0, 1_100_000);
        assert!(later.admits(1));
    }

    #[test]
    fn credit_never_exceeds_capacity() {
        let mut b = TokenBucket::load(None, 10, 1.0, 0);
        b.take(3);
        b.credit(50, 10);
        assert_eq!(b.tokens, 10.0);
    }
}
