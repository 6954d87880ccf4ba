//! Sliding window counter: the previous window's count, weighted by how much of it still
//! overlaps the sliding window, plus the current window's count.
//!
//! Mirrors `redis/scripts/lib.lua` (`sw_*`).

use crate::algorithm::token_bucket::EPSILON;
use crate::algorithm::window_start;
use crate::clock::Micros;

/// Counts of the window starting at `ws` and of the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    pub(crate) ws: Micros,
    pub(crate) prev: u64,
    pub(crate) cur: u64,
}

impl SlidingWindow {
    /// The counters rolled to the window containing `now`.
    pub(crate) fn load(stored: Option<Self>, window_us: u64, now: Micros) -> Self {
        let ws = window_start(now, window_us);
        match stored {
            Some(s) if s.ws >= ws => s,
            Some(s) if s.ws + window_us == ws => Self {
                ws,
                prev: s.cur,
                cur: 0,
            },
            _ => Self {
                ws,
                prev: 0,
                cur: 0,
            },
        }
    }

    fn elapsed(&self, now: Micros) -> u64 {
        now.saturating_sub(self.ws)
    }

    /// The estimated units in the sliding window ending at `now`.
    pub(crate) fn estimate(&self, window_us: u64, now: Micros) -> f64 {
        let w = window_us as f64;
        let e = self.elapsed(now) as f64;
        self.prev as f64 * (w - e) / w + self.cur as f64
    }

    /// Whether `cost` fits (an estimate within [`EPSILON`] of the room counts as room: the
    /// weighting is done in doubles, and a retry at the retry-after given must fit).
    pub(crate) fn admits(&self, limit: u64, window_us: u64, now: Micros, cost: u64) -> bool {
        self.estimate(window_us, now) + cost as f64 <= limit as f64 + EPSILON
    }

    pub(crate) fn available(&self, limit: u64, window_us: u64, now: Micros) -> u64 {
        let left = (limit as f64 - self.estimate(window_us, now) + EPSILON).floor();
        if left <= 0.0 { 0 } else { left as u64 }
    }

    /// Microseconds until the estimate has room for `cost` (≤ limit): within this window if the
    /// current count alone leaves room (the previous window's weight decays), else in the next
    /// one, where this window's count becomes the decaying part.
    pub(crate) fn retry_after(&self, limit: u64, window_us: u64, now: Micros, cost: u64) -> u64 {
        let w = window_us as f64;
        let e = self.elapsed(now) as f64;
        let need = limit - cost;
        let t = if self.cur <= need {
            if self.prev == 0 {
                return 1;
            }
            (w - (need - self.cur) as f64 * w / self.prev as f64).ceil() - e
        } else {
            (w - e) + (w - need as f64 * w / self.cur as f64).ceil()
        };
        if t < 1.0 { 1 } else { t as u64 }
    }

    pub(crate) fn reset_after(&self, window_us: u64, now: Micros) -> u64 {
        let left = (self.ws + window_us).saturating_sub(now);
        if self.cur > 0 {
            left + window_us
        } else if self.prev > 0 {
            left
        } else {
            0
        }
    }

    /// Where units consumed at `at` land: this window, the previous one, or nowhere (a window
    /// that no longer counts).
    pub(crate) fn debit(&mut self, window_us: u64, at: Micros, units: u64) -> u64 {
        let ws_at = window_start(at, window_us);
        if ws_at >= self.ws {
            self.cur += units;
            units
        } else if ws_at + window_us == self.ws {
            self.prev += units;
            units
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 60_000_000;

    #[test]
    fn seed_formula_42_previous_18_current_at_15s_is_49_5() {
        let sw = SlidingWindow {
            ws: W * 10,
            prev: 42,
            cur: 18,
        };
        assert_eq!(sw.estimate(W, W * 10 + 15_000_000), 49.5);
    }

    #[test]
    fn rolls_forward_one_window_and_forgets_after_two() {
        let sw = SlidingWindow {
            ws: W,
            prev: 5,
            cur: 9,
        };
        assert_eq!(
            SlidingWindow::load(Some(sw), W, 2 * W + 1),
            SlidingWindow {
                ws: 2 * W,
                prev: 9,
                cur: 0
            }
        );
        assert_eq!(
            SlidingWindow::load(Some(sw), W, 3 * W),
            SlidingWindow {
                ws: 3 * W,
                prev: 0,
                cur: 0
            }
        );
    }

    #[test]
    fn retry_after_lands_exactly_where_the_estimate_first_fits() {
        for (prev, cur, e) in [
            (10, 2, 0),
            (10, 9, 30_000_000),
            (3, 10, 1),
            (10, 10, 59_999_999),
        ] {
            let now = W + e;
            let sw = SlidingWindow { ws: W, prev, cur };
            assert!(!sw.admits(10, W, now, 1));
            let t = sw.retry_after(10, W, now, 1);
            let at = |t: u64| SlidingWindow::load(Some(sw), W, now + t);
            assert!(
                at(t).admits(10, W, now + t, 1),
                "{prev} {cur} {e}: not admitted at {t}"
            );
            assert!(
                !at(t - 1).admits(10, W, now + t - 1, 1),
                "{prev} {cur} {e}: admitted before {t}"
            );
        }
    }

    #[test]
    fn debits_land_in_their_own_window_or_nowhere() {
        let mut sw = SlidingWindow {
            ws: 3 * W,
            prev: 0,
            cur: 0,
        };
        assert_eq!(sw.debit(W, 3 * W + 5, 2), 2);
        assert_eq!(sw.debit(W, 2 * W + 5, 3), 3);
        assert_eq!(sw.debit(W, W + 5, 4), 0);
        assert_eq!(
            sw,
            SlidingWindow {
                ws: 3 * W,
                prev: 3,
                cur: 2
            }
        );
    }
}
