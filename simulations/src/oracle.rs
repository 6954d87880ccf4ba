//! What an exact limiter would have done: the yardstick every decision is measured against.
//!
//! Each bucket seen in a run gets three views, in two books: an [`ExactBook`] per rule and
//! identity over both regions (ideal and real), a [`BoundBook`] per region (the bound):
//! - **ideal**: an exact limiter with a global view, fed every request of the run: what it
//!   admits is the "exact" line of the plot; Tollgate admitting more is overshoot.
//! - **real**: the same limit fed only what Tollgate admitted: a denial while it still had
//!   room is a *false denial* (the units were leased to another node, or held by a pre-limit).
//! - **bound**: the most any correct limiter may admit since the bucket was first used
//!   (token bucket: capacity + rate × elapsed; windows: the limit per window touched; plus a
//!   full bucket for each store failover or eviction of the bucket, which forget its state):
//!   the invariant.

use std::collections::VecDeque;
use std::time::Duration;

use tollgate_lease::{Algorithm, Limit};

/// One limit's exact state.
#[derive(Debug, Clone)]
enum Exact {
    Bucket {
        capacity: f64,
        rate: f64,
        level: f64,
        at: u64,
    },
    Fixed {
        limit: u64,
        window: u64,
        start: u64,
        count: u64,
    },
    Sliding {
        limit: u64,
        window: u64,
        log: VecDeque<(u64, u64)>,
        sum: u64,
    },
    Concurrency {
        limit: u64,
        in_flight: u64,
    },
}

impl Exact {
    fn new(limit: &Limit, now: u64) -> Self {
        let capacity = limit.capacity();
        let window = limit.window().unwrap_or(Duration::from_secs(1)).as_micros() as u64;
        match limit.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => Exact::Bucket {
                capacity: capacity as f64,
                rate: limit.refill_per_second().unwrap_or(0.0) / 1e6,
                level: capacity as f64,
                at: now,
            },
            Algorithm::FixedWindow => Exact::Fixed {
                limit: capacity,
                window: window.max(1),
                start: now - now % window.max(1),
                count: 0,
            },
            Algorithm::SlidingWindow | Algorithm::SlidingWindowLog => Exact::Sliding {
                limit: capacity,
                window: window.max(1),
                log: VecDeque::new(),
                sum: 0,
            },
            Algorithm::Concurrency => Exact::Concurrency {
                limit: capacity,
                in_flight: 0,
            },
        }
    }

    /// Units free at `now`.
    fn room(&mut self, now: u64) -> u64 {
        match self {
            Exact::Bucket {
                capacity,
                rate,
                level,
                at,
            } => {
                if now > *at {
                    *level = (*level + *rate * (now - *at) as f64).min(*capacity);
                    *at = now;
                }
                level.max(0.0).floor() as u64
            }
            Exact::Fixed {
                limit,
                window,
                start,
                count,
            } => {
                if now >= *start + *window {
                    *start = now - now % *window;
                    *count = 0;
                }
                limit.saturating_sub(*count)
            }
            Exact::Sliding {
                limit,
                window,
                log,
                sum,
            } => {
                while let Some(&(t, units)) = log.front() {
                    if t + *window > now {
                        break;
                    }
                    log.pop_front();
                    *sum -= units;
                }
                limit.saturating_sub(*sum)
            }
            Exact::Concurrency { limit, in_flight } => limit.saturating_sub(*in_flight),
        }
    }

    /// Takes `cost` at `now`, room or not (the real view takes what Tollgate admitted).
    fn take(&mut self, now: u64, cost: u64) {
        self.room(now);
        match self {
            Exact::Bucket { level, .. } => *level -= cost as f64,
            Exact::Fixed { count, .. } => *count += cost,
            Exact::Sliding { log, sum, .. } => {
                log.push_back((now, cost));
                *sum += cost;
            }
            Exact::Concurrency { in_flight, .. } => *in_flight += cost,
        }
    }

    /// Whether the state at `now` is what a fresh state would be. Reads without moving the
    /// state to `now`: a token bucket refilled in one step rounds as it would have without
    /// this look.
    fn at_rest(&self, now: u64) -> bool {
        match self {
            Exact::Bucket {
                capacity,
                rate,
                level,
                at,
            } => *level + *rate * now.saturating_sub(*at) as f64 >= *capacity,
            Exact::Fixed {
                window,
                start,
                count,
                ..
            } => *count == 0 || now >= *start + *window,
            Exact::Sliding { window, log, .. } => {
                log.back().is_none_or(|&(t, _)| t + *window <= now)
            }
            Exact::Concurrency { in_flight, .. } => *in_flight == 0,
        }
    }

    fn release(&mut self, cost: u64) {
        if let Exact::Concurrency { in_flight, .. } = self {
            *in_flight = in_flight.saturating_sub(cost);
        }
    }

    /// The rule changed from `from` to `to` at `now`: the state carries over as the store
    /// carries it. Another algorithm (or window) starts afresh; a token bucket keeps its
    /// tokens (capped at the new capacity), a leaky bucket its level (the units in it), GCRA
    /// its theoretical arrival time (how far ahead of now it is); windows keep their counts.
    fn relimit(&mut self, from: &Limit, to: &Limit, now: u64) {
        if from.algorithm() != to.algorithm() || from.window() != to.window() {
            *self = Exact::new(to, now);
            return;
        }
        self.room(now);
        let new_capacity = to.capacity();
        match self {
            Exact::Bucket {
                capacity,
                rate,
                level,
                ..
            } => {
                let new_rate = to.refill_per_second().unwrap_or(0.0) / 1e6;
                let used = *capacity - *level;
                let cap = new_capacity as f64;
                *level = match to.algorithm() {
                    Algorithm::LeakyBucket => cap - used,
                    Algorithm::Gcra if *rate > 0.0 => cap - used / *rate * new_rate,
                    _ => level.min(cap),
                };
                *capacity = cap;
                *rate = new_rate;
            }
            Exact::Fixed { limit, .. }
            | Exact::Sliding { limit, .. }
            | Exact::Concurrency { limit, .. } => *limit = new_capacity,
        }
    }
}

/// The exact limiter's view of one limit over both regions: **ideal**, fed every request
/// of the run, and **real**, fed what Tollgate admitted.
#[derive(Debug, Clone)]
pub struct ExactBook {
    limit: Limit,
    ideal: Exact,
    real: Exact,
}

impl ExactBook {
    /// A bucket first used at `now`.
    pub fn new(limit: Limit, now: u64) -> Self {
        Self {
            ideal: Exact::new(&limit, now),
            real: Exact::new(&limit, now),
            limit,
        }
    }

    /// The bucket's rule now says `limit` (a rule change at `now`): its state carries over as
    /// the store carries it ([`Exact::relimit`]).
    pub fn follow(&mut self, limit: Limit, now: u64) {
        if limit != self.limit {
            self.ideal.relimit(&self.limit, &limit, now);
            self.real.relimit(&self.limit, &limit, now);
            self.limit = limit;
        }
    }

    /// Whether the exact limiter has room for `cost` at `now`.
    pub fn fits(&mut self, now: u64, cost: u64) -> bool {
        self.ideal.room(now) >= cost
    }

    /// The exact limiter admits `cost` at `now`.
    pub fn ideal_take(&mut self, now: u64, cost: u64) {
        self.ideal.take(now, cost);
    }

    /// Tollgate admitted `cost` at `now`.
    pub fn admitted(&mut self, now: u64, cost: u64) {
        self.real.take(now, cost);
    }

    /// Tollgate denied `cost` at `now`: whether the limit still had room for it (a false
    /// denial).
    pub fn denied(&mut self, now: u64, cost: u64) -> bool {
        self.real.room(now) >= cost
    }

    /// An admitted concurrent request finished (or died with its pod).
    pub fn released(&mut self, cost: u64) {
        self.real.release(cost);
        self.ideal.release(cost);
    }

    /// Whether both views are back where a bucket first used at `now` starts (full, or an
    /// empty window, or nothing in flight): the book can be dropped and made again when the
    /// bucket is next used, with the same answers.
    pub fn at_rest(&self, now: u64) -> bool {
        self.ideal.at_rest(now) && self.real.at_rest(now)
    }
}

/// What one region's bucket admitted against the bound its limit owes: the most any correct
/// limiter may admit since the bucket was first used.
#[derive(Debug, Clone)]
pub struct BoundBook {
    limit: Limit,
    first: u64,
    /// When a request last charged the bucket.
    pub last: u64,
    /// Units admitted on what the store handed out (a check or a lease; not fail-open, LOCAL
    /// or the store's last answer): what the bound and the store's ledger must cover.
    admitted: u64,
    /// Failovers of the bucket's store since it was first used: each refills it.
    failovers_at_first: u64,
    /// Units in flight now, and the most at once (concurrency).
    in_flight: u64,
    peak_in_flight: u64,
    /// Whether a decision of this bucket went to a fail mode (the store did not answer in
    /// time): the bound is then not owed, and the bucket is counted apart.
    pub failed_over_to_fail_mode: bool,
}

impl BoundBook {
    /// A bucket first used at `now`, when its store had failed over `failovers` times.
    pub fn new(limit: Limit, now: u64, failovers: u64) -> Self {
        Self {
            limit,
            first: now,
            last: now,
            admitted: 0,
            failovers_at_first: failovers,
            in_flight: 0,
            peak_in_flight: 0,
            failed_over_to_fail_mode: false,
        }
    }

    /// Tollgate admitted `cost` (`from_store`: on the store's answer, so the bound and the
    /// ledger cover it).
    pub fn admitted(&mut self, cost: u64, from_store: bool) {
        if from_store {
            self.admitted += cost;
        }
        if self.is_concurrency() {
            self.in_flight += cost;
            self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
        }
    }

    /// An admitted concurrent request finished (or died with its pod).
    pub fn released(&mut self, cost: u64) {
        self.in_flight = self.in_flight.saturating_sub(cost);
    }

    /// Units of concurrency still in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The most a correct limiter may have admitted by `now`, given `failovers` of its store
    /// so far. For concurrency, the limit on what is in flight at once.
    pub fn bound(&self, now: u64, failovers: u64) -> u64 {
        let refills = failovers.saturating_sub(self.failovers_at_first);
        let capacity = self.limit.capacity();
        let elapsed = now.saturating_sub(self.first);
        match self.limit.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                let rate = self.limit.refill_per_second().unwrap_or(0.0);
                capacity * (1 + refills) + (rate * elapsed as f64 / 1e6).floor() as u64
            }
            Algorithm::FixedWindow => {
                let w = window_of(&self.limit);
                let windows = (now / w) - (self.first / w) + 1;
                capacity * (windows + refills)
            }
            Algorithm::SlidingWindow | Algorithm::SlidingWindowLog => {
                // A sliding window admits at most the limit in any span of one window; the
                // counter variant estimates the previous window, so allow one more.
                let windows = elapsed.div_ceil(window_of(&self.limit)) + 1;
                capacity * (windows + 1 + refills)
            }
            Algorithm::Concurrency => capacity,
        }
    }

    /// Units admitted on the store's answers.
    pub fn store_backed(&self) -> u64 {
        self.admitted
    }

    /// Whether the limit is a concurrency limit (slots, not units).
    pub fn is_concurrency(&self) -> bool {
        self.limit.algorithm() == Algorithm::Concurrency
    }

    /// What the bound is compared with: units admitted (or, for concurrency, the peak in
    /// flight).
    pub fn measured(&self) -> u64 {
        match self.limit.algorithm() {
            Algorithm::Concurrency => self.peak_in_flight,
            _ => self.admitted,
        }
    }
}

fn window_of(limit: &Limit) -> u64 {
    (limit.window().unwrap_or(Duration::from_secs(1)).as_micros() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request of `cost` arriving at this bucket alone: whether the exact limiter admits it.
    fn ideal(o: &mut ExactBook, now: u64, cost: u64) -> bool {
        let fits = o.fits(now, cost);
        if fits {
            o.ideal_take(now, cost);
        }
        fits
    }

    #[test]
    fn the_ideal_token_bucket_admits_its_burst_then_its_rate() {
        let limit = Limit::token_bucket(10, 10.0).expect("limit");
        let mut o = ExactBook::new(limit, 0);
        let burst = (0..20).filter(|_| ideal(&mut o, 0, 1)).count();
        assert_eq!(burst, 10);
        // One second later: ten more.
        let later = (0..20).filter(|_| ideal(&mut o, 1_000_000, 1)).count();
        assert_eq!(later, 10);
    }

    #[test]
    fn a_denial_with_room_left_is_false() {
        let limit = Limit::token_bucket(5, 1.0).expect("limit");
        let mut o = ExactBook::new(limit, 0);
        for _ in 0..4 {
            o.admitted(0, 1);
        }
        assert!(o.denied(0, 1), "one unit was left");
        o.admitted(0, 1);
        assert!(!o.denied(0, 1), "the bucket is empty");
    }

    #[test]
    fn the_bound_grows_with_rate_and_failovers() {
        let limit = Limit::token_bucket(100, 10.0).expect("limit");
        let o = BoundBook::new(limit, 1_000_000, 0);
        assert_eq!(o.bound(1_000_000, 0), 100);
        assert_eq!(o.bound(3_000_000, 0), 120);
        assert_eq!(o.bound(3_000_000, 1), 220);
    }

    #[test]
    fn a_book_is_at_rest_once_both_views_are_as_new() {
        let limit = Limit::token_bucket(10, 10.0).expect("limit");
        let mut o = ExactBook::new(limit, 0);
        assert!(o.at_rest(0), "a fresh bucket is full");
        o.ideal_take(0, 5);
        assert!(!o.at_rest(100_000), "half a second short of full");
        assert!(o.at_rest(500_000), "refilled");
        o.admitted(500_000, 1);
        assert!(!o.at_rest(500_000), "the real view spent one");
        let window = Limit::fixed_window(5, Duration::from_secs(1)).expect("limit");
        let mut w = ExactBook::new(window, 0);
        w.admitted(10, 1);
        assert!(!w.at_rest(999_999), "in the window it was spent in");
        assert!(w.at_rest(1_000_000), "the next window starts empty");
    }
}
