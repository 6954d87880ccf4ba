//! A rule's limit model: which algorithm, with which parameters, validated once.
//!
//! A [`LimitSpec`] is what a rule file or an admin request says, with numbers as they arrive
//! (floats, possibly negative or NaN). [`LimitSpec::validate`] turns it into a [`Limit`], whose
//! parameters are known to be in range, or names the field that is wrong. Everything downstream
//! (scripts, leases, the in-memory store) takes a [`Limit`] and never re-checks it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

mod spec;
pub use spec::{LimitError, LimitSpec};

/// The largest count a limit may hold (capacity, window limit, slots, cost).
///
/// Counts travel through Lua, whose numbers are doubles: staying far below 2^53 keeps every
/// count, and every sum of a count with a cost or a debit, exact.
pub const MAX_UNITS: u64 = 1 << 40;

/// The longest window (and the longest refill-from-empty of a token bucket): ten years.
pub const MAX_PERIOD: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// The fastest refill a token bucket may have, in units per second.
pub const MAX_REFILL_PER_SECOND: f64 = 1e9;

/// The rate limiting algorithms a rule can choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Capacity = burst, refill per second = sustained rate.
    TokenBucket,
    /// Two fixed-window counters blended by overlap (an approximation of a sliding window).
    SlidingWindow,
    /// One entry per admitted unit batch: exact, memory-heavy; for small limits.
    SlidingWindowLog,
    /// One counter per epoch-aligned window; bursts at the boundary are accepted.
    FixedWindow,
    /// In-flight slots, each held with a TTL so a crashed holder's slots expire.
    Concurrency,
    /// The generic cell rate algorithm: `burst` at once, then one unit every `1/rate` s; its
    /// state is one time (the theoretical arrival time).
    Gcra,
    /// Gubernator's leaky bucket: `burst` slots that leak `limit` per `duration`; a rule change
    /// keeps the level.
    LeakyBucket,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 7] = [
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::FixedWindow,
        Algorithm::Concurrency,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ];

    /// The name used in rule files and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "TOKEN_BUCKET",
            Algorithm::SlidingWindow => "SLIDING_WINDOW",
            Algorithm::SlidingWindowLog => "SLIDING_WINDOW_LOG",
            Algorithm::FixedWindow => "FIXED_WINDOW",
            Algorithm::Concurrency => "CONCURRENCY",
            Algorithm::Gcra => "GCRA",
            Algorithm::LeakyBucket => "LEAKY_BUCKET",
        }
    }

    /// Whether units come back continuously at a rate, with no window (a token bucket, GCRA,
    /// a leaky bucket): such a limit admits what a token bucket of its capacity and rate
    /// admits.
    pub fn refills(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket
        )
    }

    /// The code the Lua scripts dispatch on.
    pub(crate) fn script_code(self) -> u8 {
        match self {
            Algorithm::TokenBucket => 1,
            Algorithm::SlidingWindow => 2,
            Algorithm::SlidingWindowLog => 3,
            Algorithm::FixedWindow => 4,
            Algorithm::Concurrency => 5,
            Algorithm::Gcra => 6,
            Algorithm::LeakyBucket => 7,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| LimitError {
                field: "algorithm",
                reason: format!(
                    "unknown algorithm {s:?}; expected one of TOKEN_BUCKET, GCRA, \
                     LEAKY_BUCKET, SLIDING_WINDOW, SLIDING_WINDOW_LOG, FIXED_WINDOW, CONCURRENCY"
                ),
            })
    }
}

/// A validated limit. Cheap to copy; compare with `==`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    kind: Kind,
}

/// The validated parameters, in the units the stores compute with (microseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    TokenBucket {
        capacity: u64,
        refill_per_second: f64,
    },
    SlidingWindow {
        limit: u64,
        window_us: u64,
    },
    SlidingWindowLog {
        limit: u64,
        window_us: u64,
    },
    FixedWindow {
        limit: u64,
        window_us: u64,
    },
    Concurrency {
        max_in_flight: u64,
        slot_ttl_us: u64,
    },
    Gcra {
        burst: u64,
        rate_per_second: f64,
    },
    /// The store sees a burst and a leak per second; `limit` and `duration_us` are the rule's
    /// own numbers (for headers and the rule as written).
    LeakyBucket {
        burst: u64,
        leak_per_second: f64,
        limit: u64,
        duration_us: u64,
    },
}

impl Limit {
    /// A token bucket holding `capacity` units, refilling `refill_per_second`.
    pub fn token_bucket(capacity: u64, refill_per_second: f64) -> Result<Self, LimitError> {
        LimitSpec::TokenBucket {
            capacity: capacity as f64,
            refill_per_second,
        }
        .validate()
    }

    /// GCRA: `burst` units at once from rest, then `rate_per_second`.
    pub fn gcra(burst: u64, rate_per_second: f64) -> Result<Self, LimitError> {
        LimitSpec::Gcra {
            burst: burst as f64,
            rate_per_second,
        }
        .validate()
    }

    /// A leaky bucket of `burst` slots (default: `limit`) leaking `limit` per `duration`.
    pub fn leaky_bucket(
        limit: u64,
        duration: Duration,
        burst: Option<u64>,
    ) -> Result<Self, LimitError> {
        LimitSpec::LeakyBucket {
            limit: limit as f64,
            duration,
            burst: burst.map(|b| b as f64),
        }
        .validate()
    }

    /// `limit` units per epoch-aligned window.
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, LimitError> {
        LimitSpec::FixedWindow {
            limit: limit as f64,
            window,
        }
        .validate()
    }

    /// `limit` units per sliding window (counter approximation).
    pub fn sliding_window(limit: u64, window: Duration) -> Result<Self, LimitError> {
        LimitSpec::SlidingWindow {
            limit: limit as f64,
            window,
        }
        .validate()
    }

    /// `limit` units per sliding window, exact (one log entry per admission).
    pub fn sliding_window_log(limit: u64, window: Duration) -> Result<Self, LimitError> {
        LimitSpec::SlidingWindowLog {
            limit: limit as f64,
            window,
        }
        .validate()
    }

    /// At most `max_in_flight` slots held at once, each expiring after `slot_ttl`.
    pub fn concurrency(max_in_flight: u64, slot_ttl: Duration) -> Result<Self, LimitError> {
        LimitSpec::Concurrency {
            max_in_flight: max_in_flight as f64,
            slot_ttl,
        }
        .validate()
    }

    /// Which algorithm this limit uses.
    pub fn algorithm(&self) -> Algorithm {
        match self.kind {
            Kind::TokenBucket { .. } => Algorithm::TokenBucket,
            Kind::SlidingWindow { .. } => Algorithm::SlidingWindow,
            Kind::SlidingWindowLog { .. } => Algorithm::SlidingWindowLog,
            Kind::FixedWindow { .. } => Algorithm::FixedWindow,
            Kind::Concurrency { .. } => Algorithm::Concurrency,
            Kind::Gcra { .. } => Algorithm::Gcra,
            Kind::LeakyBucket { .. } => Algorithm::LeakyBucket,
        }
    }

    /// The most units the bucket can ever hold at once: the capacity (a GCRA's burst), the
    /// window limit or the number of slots. A cost above it can never be admitted.
    pub fn capacity(&self) -> u64 {
        match self.kind {
            Kind::TokenBucket { capacity, .. } => capacity,
            Kind::Gcra { burst, .. } | Kind::LeakyBucket { burst, .. } => burst,
            Kind::SlidingWindow { limit, .. }
            | Kind::SlidingWindowLog { limit, .. }
            | Kind::FixedWindow { limit, .. } => limit,
            Kind::Concurrency { max_in_flight, .. } => max_in_flight,
        }
    }

    /// The window length for window algorithms; `None` otherwise.
    pub fn window(&self) -> Option<Duration> {
        match self.kind {
            Kind::SlidingWindow { window_us, .. }
            | Kind::SlidingWindowLog { window_us, .. }
            | Kind::FixedWindow { window_us, .. } => Some(Duration::from_micros(window_us)),
            _ => None,
        }
    }

    /// The store said `denied` units do not fit for `retry_after`: how long until `cost`
    /// units (at least `denied`, at most the capacity) fit, when the algorithm alone says
    /// (fewer than `denied` may fit sooner: None).
    /// A token bucket refills at its rate, so `(cost − denied) / rate` more; a fixed window
    /// admits anything up to its limit when it turns, which is when `denied` fits too.
    /// Sliding windows depend on the counts in them: None (ask the store).
    pub fn retry_for_more(
        &self,
        denied: u64,
        retry_after: Duration,
        cost: u64,
    ) -> Option<Duration> {
        if cost < denied {
            return None;
        }
        if cost == denied {
            return Some(retry_after);
        }
        match self.kind {
            Kind::TokenBucket {
                refill_per_second, ..
            }
            | Kind::Gcra {
                rate_per_second: refill_per_second,
                ..
            }
            | Kind::LeakyBucket {
                leak_per_second: refill_per_second,
                ..
            } => {
                let more_us = ((cost - denied) as f64 * 1e6 / refill_per_second).ceil();
                Some(retry_after + Duration::from_micros(more_us as u64))
            }
            Kind::FixedWindow { .. } => Some(retry_after),
            _ => None,
        }
    }

    /// The most units this limit can admit over any span of time of `span`: a token bucket its
    /// capacity and the refill over the span; a window algorithm its limit for every window the
    /// span reaches into, and one more (a fixed window lets two windows' worth through back to
    /// back at its boundary); a concurrency limit its slots for every slot lifetime the span
    /// reaches into. What a peer region reports of one bucket is never more.
    pub fn most_over(&self, span: Duration) -> u64 {
        let span_us = span.as_micros() as u64;
        let windows = |window_us: u64| span_us.div_ceil(window_us.max(1)).saturating_add(1);
        match self.kind {
            Kind::TokenBucket {
                capacity,
                refill_per_second,
            }
            | Kind::Gcra {
                burst: capacity,
                rate_per_second: refill_per_second,
            }
            | Kind::LeakyBucket {
                burst: capacity,
                leak_per_second: refill_per_second,
                ..
            } => capacity.saturating_add((refill_per_second * span.as_secs_f64()).ceil() as u64),
            Kind::SlidingWindow { limit, window_us }
            | Kind::SlidingWindowLog { limit, window_us }
            | Kind::FixedWindow { limit, window_us } => limit.saturating_mul(windows(window_us)),
            Kind::Concurrency {
                max_in_flight,
                slot_ttl_us,
            } => max_in_flight.saturating_mul(windows(slot_ttl_us)),
        }
    }

    /// The refill rate for token buckets, the rate of a GCRA, the leak of a leaky bucket
    /// (each admits what a token bucket of its burst and rate admits); `None` otherwise.
    pub fn refill_per_second(&self) -> Option<f64> {
        match self.kind {
            Kind::TokenBucket {
                refill_per_second, ..
            }
            | Kind::Gcra {
                rate_per_second: refill_per_second,
                ..
            }
            | Kind::LeakyBucket {
                leak_per_second: refill_per_second,
                ..
            } => Some(refill_per_second),
            _ => None,
        }
    }

    /// The units a second the limit admits over the long run: a token bucket's refill rate,
    /// a window's limit over its length; `None` for a concurrency limit (it bounds requests
    /// in flight, not a rate).
    pub fn average_per_second(&self) -> Option<f64> {
        match self.kind {
            Kind::TokenBucket {
                refill_per_second, ..
            }
            | Kind::Gcra {
                rate_per_second: refill_per_second,
                ..
            }
            | Kind::LeakyBucket {
                leak_per_second: refill_per_second,
                ..
            } => Some(refill_per_second),
            Kind::SlidingWindow { limit, window_us }
            | Kind::SlidingWindowLog { limit, window_us }
            | Kind::FixedWindow { limit, window_us } => {
                Some(limit as f64 * 1e6 / window_us.max(1) as f64)
            }
            Kind::Concurrency { .. } => None,
        }
    }

    /// A leaky bucket's limit and the duration it leaks over; `None` for other limits.
    pub fn leak(&self) -> Option<(u64, Duration)> {
        match self.kind {
            Kind::LeakyBucket {
                limit, duration_us, ..
            } => Some((limit, Duration::from_micros(duration_us))),
            _ => None,
        }
    }

    /// The slot TTL for concurrency limits; `None` otherwise.
    pub fn slot_ttl(&self) -> Option<Duration> {
        match self.kind {
            Kind::Concurrency { slot_ttl_us, .. } => Some(Duration::from_micros(slot_ttl_us)),
            _ => None,
        }
    }

    /// The limit as written (round-trips through [`LimitSpec::validate`]).
    pub fn spec(&self) -> LimitSpec {
        match self.kind {
            Kind::TokenBucket {
                capacity,
                refill_per_second,
            } => LimitSpec::TokenBucket {
                capacity: capacity as f64,
                refill_per_second,
            },
            Kind::SlidingWindow { limit, window_us } => LimitSpec::SlidingWindow {
                limit: limit as f64,
                window: Duration::from_micros(window_us),
            },
            Kind::SlidingWindowLog { limit, window_us } => LimitSpec::SlidingWindowLog {
                limit: limit as f64,
                window: Duration::from_micros(window_us),
            },
            Kind::FixedWindow { limit, window_us } => LimitSpec::FixedWindow {
                limit: limit as f64,
                window: Duration::from_micros(window_us),
            },
            Kind::Concurrency {
                max_in_flight,
                slot_ttl_us,
            } => LimitSpec::Concurrency {
                max_in_flight: max_in_flight as f64,
                slot_ttl: Duration::from_micros(slot_ttl_us),
            },
            Kind::Gcra {
                burst,
                rate_per_second,
            } => LimitSpec::Gcra {
                burst: burst as f64,
                rate_per_second,
            },
            Kind::LeakyBucket {
                burst,
                limit,
                duration_us,
                ..
            } => LimitSpec::LeakyBucket {
                limit: limit as f64,
                duration: Duration::from_micros(duration_us),
                burst: Some(burst as f64),
            },
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// A limit of `kind` as it is (callers scale a valid limit, see
    /// [`crate::ops::allowance::share_of`]).
    pub(crate) fn of_kind(kind: Kind) -> Self {
        Self { kind }
    }

    /// The two numeric parameters as the scripts receive them.
    pub(crate) fn script_params(&self) -> (String, String) {
        match self.kind {
            Kind::TokenBucket {
                capacity,
                refill_per_second,
            }
            | Kind::Gcra {
                burst: capacity,
                rate_per_second: refill_per_second,
            }
            | Kind::LeakyBucket {
                burst: capacity,
                leak_per_second: refill_per_second,
                ..
            } => (capacity.to_string(), format!("{refill_per_second:?}")),
            Kind::SlidingWindow { limit, window_us }
            | Kind::SlidingWindowLog { limit, window_us }
            | Kind::FixedWindow { limit, window_us } => (limit.to_string(), window_us.to_string()),
            Kind::Concurrency {
                max_in_flight,
                slot_ttl_us,
            } => (max_in_flight.to_string(), slot_ttl_us.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
