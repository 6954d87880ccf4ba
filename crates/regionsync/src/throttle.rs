//! A warning said at most once per interval: a link that stays broken is logged clearly
//! without flooding the log (how many were held back is said with the next one).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often a throttled warning may be logged.
pub const EVERY: Duration = Duration::from_secs(10);

/// One kind of warning's throttle.
#[derive(Debug, Default)]
pub struct Throttled {
    /// When it was last logged (ms since the epoch; wall time is fine for log pacing).
    last_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttled {
    /// Whether to log now; if so, how many were held back since the last one.
    pub fn ready(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = self.last_ms.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= EVERY.as_millis() as u64)
            && self
                .last_ms
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_it_once_then_counts_the_rest() {
        let t = Throttled::default();
        assert_eq!(t.ready(), Some(0));
        assert_eq!(t.ready(), None);
        assert_eq!(t.ready(), None);
        assert_eq!(t.suppressed.load(Ordering::Relaxed), 2);
    }
}
