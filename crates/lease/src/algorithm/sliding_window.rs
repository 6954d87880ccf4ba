//! Sliding window counter: the previous window's count, weighted by how much of it still
//! overlaps the sliding window, plus the current window's count.
//!
//! A count past the limit (a settlement's excess, or units admitted while the store had
//! stalled, both owed whole) is a debt, as a fixed window's is: when the window ends, a
//! limit's worth of it becomes the decaying previous count and the rest stays counted in the
//! new window, a limit's worth paid off each window. A client that underestimates is so charged
//! within limit × windows + its largest excess (without the carry, an excess counted for one
//! window and a half, and one that settled 100 on a 20-a-window rule got 100 a window).
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
    /// The counters rolled to the window containing `now`: each window that ended hands a
    /// limit's worth of its count to the next as the decaying previous count, and what is past
    /// that (a debt) stays counted. A stored window later than `now`'s (the clock went
    /// backwards) is kept as it is.
    pub(crate) fn load(stored: Option<Self>, limit: u64, window_us: u64, now: Micros) -> Self {
        let ws = window_start(now, window_us);
        match stored {
            Some(s) if s.ws >= ws => s,
            Some(s) => {
                let windows = (ws - s.ws) / window_us;
                let limit = limit.max(1);
                // What of the stored window's count was still counted in the window before
                // `ws`'s: its count less the limits paid off in the windows between.
                let before = s
                    .cur
                    .saturating_sub(windows.saturating_sub(1).saturating_mul(limit));
                Self {
                    ws,
                    prev: before.min(limit),
                    cur: before.saturating_sub(limit),
                }
            }
            None => Self {
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
    /// current count alone leaves room (the previous window's weight decays), else in the first
    /// window whose debt leaves room, where the count handed on decays.
    pub(crate) fn retry_after(&self, limit: u64, window_us: u64, now: Micros, cost: u64) -> u64 {
        let w = window_us as f64;
        let e = self.elapsed(now) as f64;
        let need = limit.saturating_sub(cost);
        let t = if self.cur <= need {
            if self.prev == 0 {
                return 1;
            }
            (w - (need - self.cur) as f64 * w / self.prev as f64).ceil() - e
        } else {
            // Windows from now until the debt leaves room: in the `ahead`-th, `cur` counts
            // what is past `ahead` limits and the decaying count is a limit's worth (or what
            // was left).
            let step = limit.max(1);
            let ahead = (self.cur - need).div_ceil(step).max(1);
            let cur = self.cur.saturating_sub(ahead.saturating_mul(step));
            let prev = self
                .cur
                .saturating_sub((ahead - 1).saturating_mul(step))
                .min(step);
            (w - e) + (ahead - 1) as f64 * w + (w - (need - cur) as f64 * w / prev as f64).ceil()
        };
        if t < 1.0 { 1 } else { t as u64 }
    }

    /// Microseconds until both counts are zero: a debt counts a window for each limit's worth
    /// of it, then decays for one more.
    pub(crate) fn reset_after(&self, limit: u64, window_us: u64, now: Micros) -> u64 {
        let left = (self.ws + window_us).saturating_sub(now);
        if self.cur > 0 {
            left + self.cur.div_ceil(limit.max(1)) * window_us
        } else if self.prev > 0 {
            left
        } else {
            0
        }
    }

    /// Microseconds until the state is no different from none (what its key's expiry is set
    /// from): a window past the end of the current one, or of the last a debt counts in.
    pub(crate) fn neutral_in(&self, limit: u64, window_us: u64, now: Micros) -> u64 {
        (self.ws + window_us).saturating_sub(now)
            + self.cur.div_ceil(limit.max(1)).max(1) * window_us
    }

    /// Where units consumed at `at` land: this window, the previous one, or nowhere (a window
    /// that no longer counts).
    /// A previous count pushed past the limit hands what is past it on to this window, as the
    /// roll would have had the units been counted before it.
    pub(crate) fn debit(&mut self, limit: u64, window_us: u64, at: Micros, units: u64) -> u64 {
        let ws_at = window_start(at, window_us);
        if ws_at >= self.ws {
            self.cur += units;
            units
        } else if ws_at + window_us == self.ws {
            let prev = self.prev + units;
            let limit = limit.max(1);
            self.prev = prev.min(limit.max(self.prev));
            self.cur += prev - self.prev;
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
            SlidingWindow::load(Some(sw), 10, W, 2 * W + 1),
            SlidingWindow {
                ws: 2 * W,
                prev: 9,
                cur: 0
            }
        );
        assert_eq!(
            SlidingWindow::load(Some(sw), 10, W, 3 * W),
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
            let at = |t: u64| SlidingWindow::load(Some(sw), 10, W, now + t);
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
        assert_eq!(sw.debit(10, W, 3 * W + 5, 2), 2);
        assert_eq!(sw.debit(10, W, 2 * W + 5, 3), 3);
        assert_eq!(sw.debit(10, W, W + 5, 4), 0);
        assert_eq!(
            sw,
            SlidingWindow {
                ws: 3 * W,
                prev: 3,
                cur: 2
            }
        );
    }

    #[test]
    fn a_debt_carries_into_the_windows_after_it() {
        // A settlement's excess left 45 counted against a limit of 10.
        let sw = SlidingWindow {
            ws: W,
            prev: 0,
            cur: 45,
        };
        let rolled = |windows: u64| SlidingWindow::load(Some(sw), 10, W, (1 + windows) * W);
        assert_eq!(
            (rolled(1).prev, rolled(1).cur),
            (10, 35),
            "a limit's worth decays"
        );
        assert_eq!((rolled(4).prev, rolled(4).cur), (10, 5));
        assert_eq!((rolled(5).prev, rolled(5).cur), (5, 0));
        assert_eq!((rolled(6).prev, rolled(6).cur), (0, 0));
        // Room comes first in the window where 5 are left: once the decaying 10 leave room.
        for (cost, e) in [(1, 0), (5, 30_000_000), (6, 59_999_999), (10, 1)] {
            let now = W + e;
            let t = sw.retry_after(10, W, now, cost);
            let at = |t: u64| SlidingWindow::load(Some(sw), 10, W, now + t);
            assert!(at(t).admits(10, W, now + t, cost), "{cost}: not at {t}");
            assert!(
                !at(t - 1).admits(10, W, now + t - 1, cost),
                "{cost}: admitted before {t}"
            );
        }
        assert_eq!(
            sw.reset_after(10, W, W),
            6 * W,
            "5 windows of debt, then one of decay"
        );
        assert_eq!(sw.neutral_in(10, W, W), 6 * W);
    }

    #[test]
    fn a_debit_past_the_limit_in_the_previous_window_carries_on() {
        let mut sw = SlidingWindow {
            ws: 3 * W,
            prev: 8,
            cur: 1,
        };
        assert_eq!(sw.debit(10, W, 2 * W + 5, 7), 7);
        assert_eq!(
            sw,
            SlidingWindow {
                ws: 3 * W,
                prev: 10,
                cur: 6
            }
        );
    }
}
