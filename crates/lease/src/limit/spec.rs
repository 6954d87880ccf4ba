//! What a rule file or an admin request says of a limit ([`LimitSpec`]), numbers as they
//! arrive, and its validation into a [`Limit`], naming the field that is wrong
//! ([`LimitError`]).

use std::time::Duration;

use super::{Kind, Limit, MAX_PERIOD, MAX_REFILL_PER_SECOND, MAX_UNITS};

/// A parameter that is out of range, with the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid `{field}`: {reason}")]
pub struct LimitError {
    /// The field's name as written in rule files (`capacity`, `refillPerSecond`, ...).
    pub field: &'static str,
    /// Why the value is rejected.
    pub reason: String,
}

impl LimitError {
    fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

/// A limit as written, before validation. Counts are `f64` because that is what JSON and YAML
/// numbers are; validation rejects fractions, negatives, NaN and infinities.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimitSpec {
    /// `TOKEN_BUCKET`.
    TokenBucket {
        /// Burst size.
        capacity: f64,
        /// Sustained rate, units per second.
        refill_per_second: f64,
    },
    /// `SLIDING_WINDOW` (counter approximation).
    SlidingWindow {
        /// Units per window.
        limit: f64,
        /// Window length.
        window: Duration,
    },
    /// `SLIDING_WINDOW_LOG` (exact).
    SlidingWindowLog {
        /// Units per window.
        limit: f64,
        /// Window length.
        window: Duration,
    },
    /// `FIXED_WINDOW`.
    FixedWindow {
        /// Units per window.
        limit: f64,
        /// Window length.
        window: Duration,
    },
    /// `CONCURRENCY`.
    Concurrency {
        /// Slots that may be held at once.
        max_in_flight: f64,
        /// How long a slot lives if its holder never releases it.
        slot_ttl: Duration,
    },
    /// `GCRA`.
    Gcra {
        /// Units admitted at once from rest.
        burst: f64,
        /// Sustained rate, units per second (one every `1/rate` s).
        rate_per_second: f64,
    },
    /// `LEAKY_BUCKET`.
    LeakyBucket {
        /// Hits that leak out every `duration`.
        limit: f64,
        /// The period `limit` leaks over.
        duration: Duration,
        /// Slots in the bucket (default: `limit`).
        burst: Option<f64>,
    },
}

impl LimitSpec {
    /// Checks every parameter and returns the validated limit, or every parameter at fault
    /// (`capacity: 0` does not hide `refillPerSecond: 0`). A parameter found wrong is read
    /// as a plain one (1, or 1 s) while the others are checked, so an error about one
    /// parameter is never caused by another's.
    pub fn validate_all(self) -> Result<Limit, Vec<LimitError>> {
        let mut spec = self;
        let mut errors: Vec<LimitError> = vec![];
        loop {
            match spec.validate() {
                Ok(limit) if errors.is_empty() => return Ok(limit),
                Ok(_) => return Err(errors),
                Err(e) => {
                    let field = e.field;
                    // A field already set plain that is still wrong (a rate too slow for
                    // its units) is said once.
                    if errors.iter().any(|seen| seen.field == field) {
                        return Err(errors);
                    }
                    errors.push(e);
                    spec = spec.with_plain(field);
                }
            }
        }
    }

    /// The spec with parameter `field` set to a plain valid value (1, or 1 s).
    fn with_plain(self, field: &str) -> Self {
        let one = Duration::from_secs(1);
        match self {
            LimitSpec::TokenBucket {
                capacity,
                refill_per_second,
            } => LimitSpec::TokenBucket {
                capacity: if field == "capacity" { 1.0 } else { capacity },
                refill_per_second: if field == "refillPerSecond" {
                    1.0
                } else {
                    refill_per_second
                },
            },
            LimitSpec::Gcra {
                burst,
                rate_per_second,
            } => LimitSpec::Gcra {
                burst: if field == "burst" { 1.0 } else { burst },
                rate_per_second: if field == "ratePerSecond" {
                    1.0
                } else {
                    rate_per_second
                },
            },
            LimitSpec::LeakyBucket {
                limit,
                duration,
                burst,
            } => LimitSpec::LeakyBucket {
                limit: if field == "limit" { 1.0 } else { limit },
                duration: if field == "duration" { one } else { duration },
                burst: if field == "burst" { Some(1.0) } else { burst },
            },
            LimitSpec::SlidingWindow { limit, window } => LimitSpec::SlidingWindow {
                limit: if field == "limit" { 1.0 } else { limit },
                window: if field == "window" { one } else { window },
            },
            LimitSpec::SlidingWindowLog { limit, window } => LimitSpec::SlidingWindowLog {
                limit: if field == "limit" { 1.0 } else { limit },
                window: if field == "window" { one } else { window },
            },
            LimitSpec::FixedWindow { limit, window } => LimitSpec::FixedWindow {
                limit: if field == "limit" { 1.0 } else { limit },
                window: if field == "window" { one } else { window },
            },
            LimitSpec::Concurrency {
                max_in_flight,
                slot_ttl,
            } => LimitSpec::Concurrency {
                max_in_flight: if field == "maxInFlight" {
                    1.0
                } else {
                    max_in_flight
                },
                slot_ttl: if field == "slotTtl" { one } else { slot_ttl },
            },
        }
    }

    /// Checks every parameter and returns the validated limit (the first error:
    /// [`LimitSpec::validate_all`] gives each).
    pub fn validate(self) -> Result<Limit, LimitError> {
        let kind = match self {
            LimitSpec::TokenBucket {
                capacity,
                refill_per_second,
            } => {
                let capacity = count("capacity", capacity)?;
                rate("refillPerSecond", capacity, refill_per_second)?;
                Kind::TokenBucket {
                    capacity,
                    refill_per_second,
                }
            }
            LimitSpec::Gcra {
                burst,
                rate_per_second,
            } => {
                let burst = count("burst", burst)?;
                rate("ratePerSecond", burst, rate_per_second)?;
                Kind::Gcra {
                    burst,
                    rate_per_second,
                }
            }
            LimitSpec::LeakyBucket {
                limit,
                duration,
                burst,
            } => {
                let limit = count("limit", limit)?;
                let duration_us = period("duration", duration)?;
                let burst = match burst {
                    Some(b) => count("burst", b)?,
                    None => limit,
                };
                let leak_per_second = leak_per_second(limit, duration_us);
                rate("duration", burst, leak_per_second)?;
                Kind::LeakyBucket {
                    burst,
                    leak_per_second,
                    limit,
                    duration_us,
                }
            }
            LimitSpec::SlidingWindow { limit, window } => {
                let (limit, window_us) = windowed(limit, window)?;
                Kind::SlidingWindow { limit, window_us }
            }
            LimitSpec::SlidingWindowLog { limit, window } => {
                let (limit, window_us) = windowed(limit, window)?;
                Kind::SlidingWindowLog { limit, window_us }
            }
            LimitSpec::FixedWindow { limit, window } => {
                let (limit, window_us) = windowed(limit, window)?;
                Kind::FixedWindow { limit, window_us }
            }
            LimitSpec::Concurrency {
                max_in_flight,
                slot_ttl,
            } => {
                let max_in_flight = count("maxInFlight", max_in_flight)?;
                let slot_ttl_us = period("slotTtl", slot_ttl)?;
                Kind::Concurrency {
                    max_in_flight,
                    slot_ttl_us,
                }
            }
        };
        Ok(Limit { kind })
    }
}

/// What `limit` per `duration_us` leaks per second.
fn leak_per_second(limit: u64, duration_us: u64) -> f64 {
    limit as f64 * 1e6 / duration_us as f64
}

/// A sustained rate: finite, positive, at most [`MAX_REFILL_PER_SECOND`], and fast enough to
/// refill `units` within [`MAX_PERIOD`].
fn rate(field: &'static str, units: u64, per_second: f64) -> Result<(), LimitError> {
    if !per_second.is_finite() {
        return Err(LimitError::new(field, "must be a finite number"));
    }
    if per_second <= 0.0 {
        return Err(LimitError::new(field, "must be greater than zero"));
    }
    if per_second > MAX_REFILL_PER_SECOND {
        return Err(LimitError::new(
            field,
            format!("must be at most {MAX_REFILL_PER_SECOND}"),
        ));
    }
    let fill_secs = units as f64 / per_second;
    if fill_secs > MAX_PERIOD.as_secs_f64() {
        return Err(LimitError::new(
            field,
            format!(
                "too slow: refilling {units} units takes {fill_secs:.0} s, more than the {} s \
                 allowed",
                MAX_PERIOD.as_secs()
            ),
        ));
    }
    Ok(())
}

fn count(field: &'static str, value: f64) -> Result<u64, LimitError> {
    if !value.is_finite() {
        return Err(LimitError::new(field, "must be a finite number"));
    }
    if value <= 0.0 {
        return Err(LimitError::new(
            field,
            format!("must be at least 1, got {value}"),
        ));
    }
    if value.fract() != 0.0 {
        return Err(LimitError::new(
            field,
            format!("must be a whole number, got {value}"),
        ));
    }
    if value > MAX_UNITS as f64 {
        return Err(LimitError::new(
            field,
            format!("must be at most {MAX_UNITS}, got {value}"),
        ));
    }
    Ok(value as u64)
}

fn period(field: &'static str, value: Duration) -> Result<u64, LimitError> {
    if value < Duration::from_millis(1) {
        return Err(LimitError::new(
            field,
            format!("must be at least 1 ms, got {value:?}"),
        ));
    }
    if !value.subsec_micros().is_multiple_of(1000) {
        return Err(LimitError::new(
            field,
            format!("must be a whole number of milliseconds, got {value:?}"),
        ));
    }
    if value > MAX_PERIOD {
        return Err(LimitError::new(
            field,
            format!("must be at most {} s, got {value:?}", MAX_PERIOD.as_secs()),
        ));
    }
    Ok(value.as_micros() as u64)
}

fn windowed(limit: f64, window: Duration) -> Result<(u64, u64), LimitError> {
    // Every window formula computes in doubles (as Lua does), never limit × window in
    // integers, so any limit up to MAX_UNITS over any window up to MAX_PERIOD is exact enough:
    // a million a year (limit × window ≈ 3·10^19 µs, past u64) is an ordinary limit.
    let limit = count("limit", limit)?;
    let window_us = period("window", window)?;
    Ok((limit, window_us))
}
