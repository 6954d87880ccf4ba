//! The one source of time for the in-memory store.
//!
//! Redis scripts read Redis `TIME`; everything that runs in-process reads a [`Clock`]. Time is
//! microseconds since the Unix epoch so that window boundaries (aligned to the epoch) agree
//! between the two stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub type Micros = u64;

/// A source of wall-clock time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current time.
    fn now_micros(&self) -> Micros;
}

/// A clock shared between a store and whoever drives it.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// Wall-clock time that advances with tokio's clock, so a runtime on paused time
/// (`#[tokio::test(start_paused = true)]`, the simulations) sees time move only when tokio's
/// does.
#[derive(Debug, Clone)]
pub struct TokioClock {
    base: Micros,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Starts at the system's current wall-clock time.
    pub fn new() -> Self {
        Self::starting_at(SystemClock.now_micros())
    }

    /// Starts at a chosen Unix time (microseconds), for reproducible simulations.
    pub fn starting_at(base: Micros) -> Self {
        Self {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_micros(&self) -> Micros {
        self.base + self.start.elapsed().as_micros() as u64
    }
}

/// A clock that moves only when told to. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start` microseconds since the epoch.
    pub fn new(start: Micros) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Sets the time (it may move backwards, as a failed-over Redis clock can).
    pub fn set(&self, to: Micros) {
        self.now.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_micros(), 1_000);
        clock.advance(Duration::from_millis(2));
        assert_eq!(clock.now_micros(), 3_000);
        let shared = clock.clone();
        shared.set(10);
        assert_eq!(clock.now_micros(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::starting_at(5_000_000);
        assert_eq!(clock.now_micros(), 5_000_000);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(clock.now_micros(), 8_000_000);
    }
}
