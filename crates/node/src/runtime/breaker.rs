//! The circuit breaker in front of the store: plain state that takes `now`.
//!
//! Closed: calls go through; a run of failures (timeouts, lost connections) opens it. Open:
//! calls fail at once, so nodes stop waiting on a store that cannot answer. After a cooldown
//! (jittered, so nodes do not all probe at once) one probe goes through: success closes the
//! breaker, failure opens it again with a doubled cooldown, up to a maximum.

use std::time::Duration;

use tollgate_lease::Micros;

/// Breaker settings.
#[derive(Debug, Clone)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failures_to_open: u32,
    /// The first cooldown.
    pub cooldown: Duration,
    /// The longest cooldown (bounds how long after recovery the store is used again).
    pub max_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures_to_open: 5,
            cooldown: Duration::from_millis(200),
            max_cooldown: Duration::from_secs(1),
        }
    }
}

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls fail at once until `until`.
    Open {
        /// When a probe may go through.
        until: Micros,
    },
    /// One probe is out.
    HalfOpen,
}

impl BreakerState {
    /// 0 closed, 1 half-open, 2 open (the metric's encoding).
    pub fn code(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open { .. } => 2,
        }
    }
}

/// The breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    state: BreakerState,
    failures: u32,
    cooldown: Duration,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        let cooldown = config.cooldown;
        Self {
            config,
            state: BreakerState::Closed,
            failures: 0,
            cooldown,
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Whether a call may go through at `now` (an open breaker past its cooldown lets one
    /// probe through and turns half-open).
    pub fn allow(&mut self, now: Micros) -> bool {
        match self.state {
            BreakerState::Closed => true,
            BreakerState::HalfOpen => false,
            BreakerState::Open { until } if now >= until => {
                self.state = BreakerState::HalfOpen;
                true
            }
            BreakerState::Open { .. } => false,
        }
    }

    /// A call succeeded (the store answered).
    pub fn on_success(&mut self) {
        self.state = BreakerState::Closed;
        self.failures = 0;
        self.cooldown = self.config.cooldown;
    }

    /// A call failed transiently; `jitter` in [0, 1) spreads the cooldown. Returns whether this
    /// failure opened the breaker.
    pub fn on_failure(&mut self, now: Micros, jitter: f64) -> bool {
        self.failures += 1;
        let open = match self.state {
            BreakerState::HalfOpen => {
                self.cooldown = (self.cooldown * 2).min(self.config.max_cooldown);
                true
            }
            BreakerState::Closed => self.failures >= self.config.failures_to_open,
            BreakerState::Open { .. } => false,
        };
        if open {
            let wait = self
                .cooldown
                .mul_f64(0.8 + 0.4 * jitter)
                .min(self.config.max_cooldown);
            self.state = BreakerState::Open {
                until: now + wait.as_micros() as u64,
            };
        }
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;

    #[test]
    fn opens_after_a_run_of_failures_and_probes_after_the_cooldown() {
        let mut b = Breaker::new(BreakerConfig::default());
        for i in 0..4 {
            assert!(b.allow(i * MS));
            assert!(!b.on_failure(i * MS, 0.5));
        }
        assert!(b.on_failure(4 * MS, 0.5), "the fifth failure opens");
        assert!(!b.allow(5 * MS));
        assert!(!b.allow(203 * MS));
        assert!(b.allow(204 * MS), "one probe after 200 ms");
        assert!(!b.allow(204 * MS), "only one");
        b.on_success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allow(205 * MS));
    }

    #[test]
    fn a_failed_probe_doubles_the_cooldown_up_to_the_maximum() {
        let mut b = Breaker::new(BreakerConfig::default());
        for _ in 0..5 {
            b.on_failure(0, 0.5);
        }
        let mut now = 0;
        let mut waits = vec![];
        for _ in 0..5 {
            let BreakerState::Open { until } = b.state() else {
                panic!("open")
            };
            waits.push((until - now) / MS);
            now = until;
            assert!(b.allow(now));
            b.on_failure(now, 0.5);
        }
        assert_eq!(waits, vec![200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn success_resets_the_failure_run() {
        let mut b = Breaker::new(BreakerConfig::default());
        for _ in 0..4 {
            b.on_failure(0, 0.0);
        }
        b.on_success();
        for _ in 0..4 {
            assert!(!b.on_failure(0, 0.0));
        }
    }
}
