//! Fixed window: one counter per epoch-aligned window of `window_us`. A count past the limit
//! (a settlement's excess, or units admitted while the store had stalled, both owed whole) is
//! a debt: it carries into the windows after it, each paying off a limit's worth, so a client
//! that underestimates is charged within limit × windows + its largest excess.
//!
//! Mirrors `redis/scripts/lib.lua` (`fw_*`).

use crate::algorithm::window_start;
use crate::clock::Micros;

/// Units counted in the window starting at `ws`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    pub(crate) ws: Micros,
    pub(crate) count: u64,
}

impl FixedWindow {
    /// The counter of the window containing `now`: what a debt leaves of the windows before
    /// it (a limit's worth paid off by each). A stored window later than `now`'s (the clock
    /// went backwards) is kept as it is: counts are never forgotten early.
    pub(crate) fn load(stored: Option<Self>, limit: u64, window_us: u64, now: Micros) -> Self {
        let ws = window_start(now, window_us);
        match stored {
            Some(s) if s.ws >= ws => s,
            Some(s) => {
                let windows = (ws - s.ws) / window_us;
                Self {
                    ws,
                    count: s.count.saturating_sub(windows.saturating_mul(limit)),
                }
            }
            None => Self { ws, count: 0 },
        }
    }

    /// Windows after the next one that go by before `more` units fit in one (0: they fit in
    /// the next window, as without a debt).
    fn windows_before_room(&self, limit: u64, more: u64) -> u64 {
        let limit = limit.max(1);
        (self.count + more)
            .saturating_sub(limit)
            .div_ceil(limit)
            .saturating_sub(1)
    }

    /// Windows after the next one that a debt still counts in (0: none past this window).
    fn windows_of_debt(&self, limit: u64) -> u64 {
        self.count.div_ceil(limit.max(1)).saturating_sub(1)
    }

    pub(crate) fn admits(&self, limit: u64, cost: u64) -> bool {
        self.count + cost <= limit
    }

    pub(crate) fn available(&self, limit: u64) -> u64 {
        limit.saturating_sub(self.count)
    }

    /// Microseconds until the window ends.
    pub(crate) fn until_end(&self, window_us: u64, now: Micros) -> u64 {
        (self.ws + window_us).saturating_sub(now)
    }

    /// A denied cost (≤ limit) fits as soon as the next window starts, or, with a debt, the
    /// first window it leaves room in.
    pub(crate) fn retry_after(&self, limit: u64, window_us: u64, now: Micros, cost: u64) -> u64 {
        self.until_end(window_us, now) + self.windows_before_room(limit, cost) * window_us
    }

    /// Microseconds until the counter is back to zero.
    pub(crate) fn reset_after(&self, limit: u64, window_us: u64, now: Micros) -> u64 {
        if self.count > 0 {
            self.until_end(window_us, now) + self.windows_of_debt(limit) * window_us
        } else {
            0
        }
    }

    /// Microseconds until the state is no different from none: the window's end, or the end
    /// of the last window a debt reaches into.
    pub(crate) fn neutral_in(&self, limit: u64, window_us: u64, now: Micros) -> u64 {
        self.until_end(window_us, now) + self.windows_of_debt(limit) * window_us
    }

    /// Whether units consumed at `at` belong to this window or a later one (they are counted)
    /// rather than to one that has ended (they are dropped).
    pub(crate) fn counts_at(&self, window_us: u64, at: Micros) -> bool {
        window_start(at, window_us) >= self.ws
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reset_at_the_window_boundary() {
        let w = 1_000_000;
        let mut fw = FixedWindow::load(None, 7, w, 2_500_000);
        assert_eq!(fw.ws, 2_000_000);
        fw.count = 7;
        assert!(!fw.admits(7, 1));
        assert_eq!(fw.retry_after(7, w, 2_500_000, 1), 500_000);
        let next = FixedWindow::load(Some(fw), 7, w, 3_000_000);
        assert_eq!(
            next,
            FixedWindow {
                ws: 3_000_000,
                count: 0
            }
        );
    }

    #[test]
    fn a_clock_going_back_keeps_the_count() {
        let fw = FixedWindow {
            ws: 5_000_000,
            count: 3,
        };
        assert_eq!(FixedWindow::load(Some(fw), 3, 1_000_000, 4_200_000), fw);
    }

    #[test]
    fn a_debt_carries_into_the_windows_after_it() {
        let w = 1_000_000;
        // A settlement's excess left 45 counted against a limit of 10.
        let fw = FixedWindow {
            ws: 2_000_000,
            count: 45,
        };
        // One unit fits when the debt leaves room: 45 - 4 × 10 = 5 at the window of 6 s.
        assert_eq!(fw.retry_after(10, w, 2_500_000, 1), 3_500_000);
        assert_eq!(fw.retry_after(10, w, 2_500_000, 5), 3_500_000);
        assert_eq!(fw.retry_after(10, w, 2_500_000, 6), 4_500_000);
        assert_eq!(
            fw.reset_after(10, w, 2_500_000),
            4_500_000,
            "at 7 s, nothing left"
        );
        assert_eq!(fw.neutral_in(10, w, 2_500_000), 4_500_000);
        assert_eq!(
            FixedWindow::load(Some(fw), 10, w, 3_200_000),
            FixedWindow {
                ws: 3_000_000,
                count: 35
            }
        );
        assert_eq!(
            FixedWindow::load(Some(fw), 10, w, 9_000_000).count,
            0,
            "paid off"
        );
        // Within the limit, nothing carries.
        let fw = FixedWindow {
            ws: 2_000_000,
            count: 10,
        };
        assert_eq!(FixedWindow::load(Some(fw), 10, w, 3_000_000).count, 0);
        assert_eq!(fw.neutral_in(10, w, 2_500_000), 500_000);
    }

    #[test]
    fn consumption_from_an_ended_window_is_not_counted() {
        let fw = FixedWindow {
            ws: 5_000_000,
            count: 0,
        };
        assert!(!fw.counts_at(1_000_000, 4_999_999));
        assert!(fw.counts_at(1_000_000, 5_000_000));
        assert!(fw.counts_at(1_000_000, 6_000_000));
    }
}
