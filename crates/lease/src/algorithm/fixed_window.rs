//! Fixed window: one counter per epoch-aligned window of `window_us`.
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
    /// The counter of the window containing `now`. A stored window later than `now`'s (the
    /// clock went backwards) is kept as it is: counts are never forgotten early.
    pub(crate) fn load(stored: Option<Self>, window_us: u64, now: Micros) -> Self {
        let ws = window_start(now, window_us);
        match stored {
            Some(s) if s.ws >= ws => s,
            _ => Self { ws, count: 0 },
        }
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

    /// A denied cost (≤ limit) fits as soon as the next window starts.
    pub(crate) fn retry_after(&self, window_us: u64, now: Micros) -> u64 {
        self.until_end(window_us, now)
    }

    pub(crate) fn reset_after(&self, window_us: u64, now: Micros) -> u64 {
        if self.count > 0 {
            self.until_end(window_us, now)
        } else {
            0
        }
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
        let mut fw = FixedWindow::load(None, w, 2_500_000);
        assert_eq!(fw.ws, 2_000_000);
        fw.count = 7;
        assert!(!fw.admits(7, 1));
        assert_eq!(fw.retry_after(w, 2_500_000), 500_000);
        let next = FixedWindow::load(Some(fw), w, 3_000_000);
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
        assert_eq!(FixedWindow::load(Some(fw), 1_000_000, 4_200_000), fw);
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
