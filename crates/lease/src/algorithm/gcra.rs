//! GCRA, the generic cell rate algorithm (redis-cell's and governor's): `burst` units at once
//! from rest, then one every emission interval `T = 1 / rate`.
//!
//! Its state is the theoretical arrival time (TAT): the moment the key would be back at rest.
//! A cost fits when `max(TAT, now) + cost·T − now ≤ τ`, with `τ = burst·T`; admitting it moves
//! the TAT on by `cost·T`. Everything a caller is told is read straight from the TAT, in time:
//! `retry_after = TAT + cost·T − τ − now`, `reset_after = TAT − now`.
//!
//! The TAT is kept as the time it is *ahead* of the last call (`ahead = TAT − ts`): an absolute
//! TAT in epoch microseconds is about 1.7·10¹⁵, where a double's step is a quarter of a
//! microsecond, so adding an emission interval of a few microseconds (a rate of 300,000/s)
//! would round by several per cent each time. `ahead` is at most `2τ`, where doubles are exact
//! to far below a microsecond.
//!
//! Mirrors `redis/scripts/lib.lua` (`GCRA`), the same formulas in the same order.

use crate::clock::Micros;

/// Microseconds of slack when comparing times: `ahead` accumulates emission intervals in
/// doubles, and a client retrying at the retry-after it was given must fit.
pub(crate) const SLACK_US: f64 = 1e-3;

/// A GCRA key's state at a moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Gcra {
    /// How far the TAT is past `ts`, in microseconds (never negative).
    pub(crate) ahead: f64,
    /// When the state was last loaded (never moves back).
    pub(crate) ts: Micros,
}

/// The emission interval in microseconds.
pub(crate) fn interval_us(rate: f64) -> f64 {
    1e6 / rate
}

impl Gcra {
    /// The state at `now`: at rest if there is none; else the time since `ts` taken off
    /// `ahead`. If the clock went backwards, nothing is taken off and `ts` does not move back.
    pub(crate) fn load(stored: Option<Self>, now: Micros) -> Self {
        match stored {
            None => Self {
                ahead: 0.0,
                ts: now,
            },
            Some(s) => {
                let elapsed = now.saturating_sub(s.ts);
                Self {
                    ahead: f64::max(0.0, s.ahead - elapsed as f64),
                    ts: s.ts.max(now),
                }
            }
        }
    }

    pub(crate) fn admits(&self, burst: u64, rate: f64, cost: u64) -> bool {
        let t = interval_us(rate);
        self.ahead + cost as f64 * t <= burst as f64 * t + SLACK_US
    }

    /// Whole units that fit now.
    pub(crate) fn available(&self, burst: u64, rate: f64) -> u64 {
        let t = interval_us(rate);
        let units = ((burst as f64 * t - self.ahead + SLACK_US) / t).floor();
        if units <= 0.0 { 0 } else { units as u64 }
    }

    pub(crate) fn take(&mut self, units: u64, rate: f64) {
        self.ahead += units as f64 * interval_us(rate);
    }

    /// Gives back unspent units: the TAT moves back, never behind now.
    pub(crate) fn credit(&mut self, units: u64, rate: f64) {
        self.ahead = f64::max(0.0, self.ahead - units as f64 * interval_us(rate));
    }

    /// Adds units consumed elsewhere; the TAT goes at most `2τ` ahead (a token bucket's debt
    /// floor of one full bucket).
    ///
    /// Returns the units taken: `units`, or fewer where the debt stopped at two bursts ahead
    /// (whole units; lib.lua `debit_bucket`).
    pub(crate) fn debit(&mut self, units: u64, burst: u64, rate: f64) -> u64 {
        let t = interval_us(rate);
        let most = 2.0 * (burst as f64 * t);
        let wanted = self.ahead + units as f64 * t;
        if wanted <= most {
            self.ahead = wanted;
            return units;
        }
        let taken = ((most - self.ahead) / t).max(0.0).floor() as u64;
        self.ahead = most;
        taken
    }

    /// Microseconds until `cost` fits.
    pub(crate) fn retry_after(&self, burst: u64, rate: f64, cost: u64) -> u64 {
        let t = interval_us(rate);
        let us = (self.ahead + cost as f64 * t - burst as f64 * t - SLACK_US).ceil();
        if us <= 0.0 { 0 } else { us as u64 }
    }

    /// Microseconds until the key is at rest (the TAT).
    pub(crate) fn reset_after(&self) -> u64 {
        let us = (self.ahead - SLACK_US).ceil();
        if us <= 0.0 { 0 } else { us as u64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval_with_exact_retry_after() {
        // Burst 3 at 4/s (T = 250 ms): three at once, then the fourth in exactly 250 ms.
        let now = 1_000_000;
        let mut g = Gcra::load(None, now);
        for _ in 0..3 {
            assert!(g.admits(3, 4.0, 1));
            g.take(1, 4.0);
        }
        assert!(!g.admits(3, 4.0, 1));
        assert_eq!(g.retry_after(3, 4.0, 1), 250_000);
        assert_eq!(g.reset_after(), 750_000);
        assert_eq!(g.available(3, 4.0), 0);
        let later = Gcra::load(Some(g), now + 250_000);
        assert!(later.admits(3, 4.0, 1));
        assert!(!later.admits(3, 4.0, 2));
        assert_eq!(later.retry_after(3, 4.0, 2), 250_000);
    }

    #[test]
    fn returns_never_move_the_tat_behind_now_and_debits_are_capped() {
        let mut g = Gcra::load(None, 0);
        g.take(2, 10.0);
        g.credit(5, 10.0);
        assert_eq!(g.ahead, 0.0);
        assert_eq!(
            g.debit(1_000, 10, 10.0),
            20,
            "up to two bursts ahead: what was taken"
        );
        assert_eq!(g.reset_after(), 2_000_000);
    }

    #[test]
    fn a_clock_going_back_gives_nothing_back() {
        let mut g = Gcra::load(None, 5_000_000);
        g.take(1, 1.0);
        let back = Gcra::load(Some(g), 4_000_000);
        assert_eq!((back.ahead, back.ts), (1_000_000.0, 5_000_000));
    }

    #[test]
    fn a_fast_rate_keeps_its_interval_exact() {
        // 300,000/s: T = 3.33 µs. After 299,999 units in the same microsecond the key is
        // ahead by just under a second, and exactly one more unit of burst fits.
        let mut g = Gcra::load(None, 1_700_000_000_000_000);
        g.take(299_999, 300_000.0);
        assert!(g.admits(300_000, 300_000.0, 1));
        g.take(1, 300_000.0);
        assert!(!g.admits(300_000, 300_000.0, 1));
        assert_eq!(g.retry_after(300_000, 300_000.0, 1), 4);
    }
}
