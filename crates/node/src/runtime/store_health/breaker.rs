//! The circuit breaker in front of the store: plain state that takes `now`.
//!
//! Closed: calls go through, and their outcomes are counted over a sliding window (ten slices
//! of `window`). It opens when, over that window, at least `min_calls` calls were made and at
//! least `failure_ratio` of them failed: a few timeouts on a loaded node are not an outage, and
//! a store that fails most calls is one. At any traffic it also opens when calls have failed
//! for a whole `window` with no answer between (two failures a second apart at 1 request a
//! second), and at once on a refused connection (nothing listens at the store's address: no
//! doubt to weigh). Open: calls fail at once, so nodes stop waiting on a
//! store that cannot answer. After a cooldown (jittered, so nodes do not all probe at once) one
//! probe goes through: success closes the breaker, a refusal opens it again with a doubled
//! cooldown, up to a maximum. A probe the store took and did not answer (it ran out of time,
//! or its caller stopped waiting) keeps the breaker half-open while the guard keeps one probe
//! of its own out (`runtime/store_health/guarded.rs`): a stalled store is asked again the moment the last
//! question times out, so that the breaker closes as soon as it answers, not a cooldown later.

use std::time::Duration;

use tollgate_lease::Micros;

/// Breaker settings.
#[derive(Debug, Clone)]
pub struct BreakerConfig {
    /// The span over which failures are counted.
    pub window: Duration,
    /// Fewest calls in the window before the breaker may open.
    pub min_calls: u32,
    /// The share of failed calls in the window that opens the breaker, in (0, 1].
    pub failure_ratio: f64,
    /// The first cooldown.
    pub cooldown: Duration,
    /// The longest cooldown (bounds how long after recovery the store is used again).
    pub max_cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(1),
            min_calls: 20,
            failure_ratio: 0.5,
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
    /// One probe is out; if it never reports (its caller gave up on it), another may go after
    /// `until`.
    HalfOpen {
        /// When another probe may go.
        until: Micros,
    },
}

impl BreakerState {
    /// 0 closed, 1 half-open, 2 open (the metric's encoding).
    pub fn code(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen { .. } => 1,
            BreakerState::Open { .. } => 2,
        }
    }

    /// The name `/readyz` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen { .. } => "half-open",
            BreakerState::Open { .. } => "open",
        }
    }
}

const SLICES: usize = 10;

/// Calls and failures in one slice of the window.
#[derive(Debug, Clone, Copy, Default)]
struct Slice {
    /// Which slice of time it counts (`now / slice length`).
    epoch: u64,
    calls: u32,
    failures: u32,
}

/// The breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    state: BreakerState,
    slices: [Slice; SLICES],
    cooldown: Duration,
    /// Failures since the store last answered: when the first was, and how many.
    streak: Option<(Micros, u32)>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        let cooldown = config.cooldown;
        Self {
            config,
            state: BreakerState::Closed,
            slices: [Slice::default(); SLICES],
            cooldown,
            streak: None,
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
            BreakerState::HalfOpen { until } | BreakerState::Open { until } if now >= until => {
                // A probe's answer counts; a probe dropped unanswered must not leave the shard
                // refused for good: past the longest cooldown another one goes.
                self.state = BreakerState::HalfOpen {
                    until: now + self.config.max_cooldown.as_micros() as u64,
                };
                true
            }
            BreakerState::HalfOpen { .. } | BreakerState::Open { .. } => false,
        }
    }

    /// Whether a probe is out (or was, and never reported).
    pub fn half_open(&self) -> bool {
        matches!(self.state, BreakerState::HalfOpen { .. })
    }

    /// Keeps the breaker half-open from `now` for the longest cooldown: a probe is out, and
    /// no other call goes meanwhile.
    pub fn hold_half_open(&mut self, now: Micros) {
        self.state = BreakerState::HalfOpen {
            until: now + self.config.max_cooldown.as_micros() as u64,
        };
    }

    /// A call succeeded (the store answered).
    pub fn on_success(&mut self, now: Micros) {
        if self.state != BreakerState::Closed {
            // The probe answered: start counting afresh.
            self.slices = [Slice::default(); SLICES];
            self.cooldown = self.config.cooldown;
        }
        self.state = BreakerState::Closed;
        self.streak = None;
        self.count(now, false);
    }

    /// A call failed transiently; `jitter` in [0, 1) spreads the cooldown. Returns whether this
    /// failure opened the breaker.
    pub fn on_failure(&mut self, now: Micros, jitter: f64) -> bool {
        self.fail(now, jitter, false)
    }

    /// A call the store certainly could not take: its address refused the connection. Opens
    /// the breaker at once, whatever the traffic. Returns whether it did.
    pub fn on_refusal(&mut self, now: Micros, jitter: f64) -> bool {
        self.fail(now, jitter, true)
    }

    fn fail(&mut self, now: Micros, jitter: f64, certain: bool) -> bool {
        let open = match self.state {
            BreakerState::HalfOpen { .. } => {
                // A refused connection costs the store nothing: it is asked again at the first
                // cooldown, so that its return is seen within moments.
                if !certain {
                    self.cooldown = (self.cooldown * 2).min(self.config.max_cooldown);
                }
                true
            }
            BreakerState::Closed => {
                self.count(now, true);
                let (calls, failures) = self.totals(now);
                let (since, failed) = self.streak.get_or_insert((now, 0));
                *failed += 1;
                let unanswered_for = now.saturating_sub(*since);
                certain
                    || (calls >= self.config.min_calls.max(1)
                        && f64::from(failures) >= self.config.failure_ratio * f64::from(calls))
                    || (*failed >= 2 && unanswered_for >= self.config.window.as_micros() as u64)
            }
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

    fn slice_len(&self) -> u64 {
        (self.config.window.as_micros() as u64 / SLICES as u64).max(1)
    }

    fn count(&mut self, now: Micros, failed: bool) {
        let epoch = now / self.slice_len();
        let slice = &mut self.slices[(epoch % SLICES as u64) as usize];
        if slice.epoch != epoch {
            *slice = Slice {
                epoch,
                ..Slice::default()
            };
        }
        slice.calls += 1;
        slice.failures += u32::from(failed);
    }

    /// Calls and failures over the window ending at `now`.
    fn totals(&self, now: Micros) -> (u32, u32) {
        let epoch = now / self.slice_len();
        self.slices
            .iter()
            .filter(|s| epoch.saturating_sub(s.epoch) < SLICES as u64 && s.epoch <= epoch)
            .fold((0, 0), |(c, f), s| (c + s.calls, f + s.failures))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;
    const T0: u64 = 1_000_000_000;

    fn config(min_calls: u32) -> BreakerConfig {
        BreakerConfig {
            min_calls,
            ..BreakerConfig::default()
        }
    }

    #[test]
    fn a_few_failures_among_many_calls_do_not_open_it() {
        let mut b = Breaker::new(config(20));
        // 2 % of calls fail (a loaded node's timeouts): the breaker stays closed.
        for i in 0..1000 {
            let now = T0 + i * MS;
            assert!(b.allow(now));
            if i % 50 == 0 {
                assert!(!b.on_failure(now, 0.5), "call {i}");
            } else {
                b.on_success(now);
            }
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn it_opens_on_a_failure_rate_over_the_minimum_calls_and_probes_after_the_cooldown() {
        let mut b = Breaker::new(config(20));
        for i in 0..19 {
            assert!(!b.on_failure(T0 + i * MS, 0.5), "fewer than 20 calls");
        }
        assert!(
            b.on_failure(T0 + 19 * MS, 0.5),
            "the 20th failure in a second opens"
        );
        let opened = T0 + 19 * MS;
        assert!(!b.allow(opened + MS));
        assert!(!b.allow(opened + 199 * MS));
        assert!(b.allow(opened + 200 * MS), "one probe after 200 ms");
        assert!(!b.allow(opened + 200 * MS), "only one");
        assert!(
            b.allow(opened + 1_200 * MS),
            "a probe that never answers does not keep the breaker half-open for good"
        );
        b.on_success(opened + 201 * MS);
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(
            !b.on_failure(opened + 202 * MS, 0.5),
            "counting starts afresh after a successful probe"
        );
    }

    #[test]
    fn failures_outside_the_window_are_forgotten() {
        let mut b = Breaker::new(config(20));
        for i in 0..15 {
            b.on_failure(T0 + i * MS, 0.5);
        }
        b.on_success(T0 + 1_000 * MS);
        // Two seconds later, the old failures no longer count.
        for i in 0..15 {
            assert!(!b.on_failure(T0 + 2_000 * MS + i * MS, 0.5));
        }
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn at_low_traffic_a_window_of_failures_with_no_answer_opens_it() {
        // 10 calls a second, each out of patience (a stalled store): far below the minimum
        // of calls, but nothing has answered for a second.
        let mut b = Breaker::new(config(20));
        for i in 0..10 {
            assert!(!b.on_failure(T0 + i * 100 * MS, 0.5), "call {i}");
        }
        assert!(b.on_failure(T0 + 1_000 * MS, 0.5), "a second of failures");
        // One answer between breaks the streak.
        let mut b = Breaker::new(config(20));
        for i in 0..20 {
            let now = T0 + i * 100 * MS;
            if i == 10 {
                b.on_success(now);
            } else {
                assert!(!b.on_failure(now, 0.5), "call {i}");
            }
        }
        // A lone failure is not a streak, however long ago the last answer was.
        let mut b = Breaker::new(config(20));
        b.on_success(T0);
        assert!(!b.on_failure(T0 + 60_000 * MS, 0.5));
    }

    #[test]
    fn a_refused_connection_opens_it_at_once() {
        let mut b = Breaker::new(config(20));
        b.on_success(T0);
        assert!(b.on_refusal(T0 + MS, 0.5));
        assert!(!b.allow(T0 + 2 * MS));
        assert!(b.allow(T0 + 2 * MS + 200 * MS), "probed after the cooldown");
        // Refused again: the cooldown does not grow (a refusal costs the store nothing).
        let again = T0 + 2 * MS + 200 * MS;
        assert!(b.on_refusal(again, 0.5));
        assert!(b.allow(again + 200 * MS));
    }

    #[test]
    fn half_failing_calls_open_it() {
        let mut b = Breaker::new(config(20));
        let mut opened = false;
        for i in 0..40 {
            let now = T0 + i * MS;
            if i % 2 == 0 {
                opened |= b.on_failure(now, 0.5);
            } else {
                b.on_success(now);
            }
        }
        assert!(opened, "half of 40 calls in a second failed");
    }

    #[test]
    fn a_failed_probe_doubles_the_cooldown_up_to_the_maximum() {
        let mut b = Breaker::new(config(1));
        b.on_failure(T0, 0.5);
        let mut now = T0;
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
}
