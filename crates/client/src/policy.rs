//! When to retry and how long to wait: what the server said (`Retry-After` in seconds or as an
//! HTTP date, else the RateLimit header's `t=` of an exhausted policy), else exponential
//! backoff; jittered either way so a fleet that was refused at the same instant does not come
//! back at the same instant.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method, StatusCode};
use rand::Rng;

/// How waits are spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Backoff waits are uniform in `[0, backoff]` ("full jitter"); a wait the server named
    /// is stretched by up to `told_spread` of itself, never shortened.
    Full,
    /// Exact waits (for tests and for callers that jitter themselves).
    None,
}

/// The retry policy. Defaults: 4 attempts, at most 30 s of waiting in all, backoff from
/// 100 ms doubling to 10 s, full jitter, 429 and 503 retried, idempotent methods only.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The most time spent waiting over all retries; a wait that would pass it ends the
    /// retries (the last answer is returned).
    pub max_total_wait: Duration,
    /// The first backoff.
    pub base: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
    /// How waits are spread.
    pub jitter: Jitter,
    /// With full jitter, how much a wait the server named is stretched at most (0.5: up to
    /// half of it again).
    pub told_spread: f64,
    /// Retry requests whose method is not idempotent (POST, PATCH) too. Off by default: a
    /// retried POST may do its work twice. A request with an `Idempotency-Key` header is
    /// retried regardless.
    pub retry_non_idempotent: bool,
    /// Statuses that are retried.
    pub statuses: Vec<StatusCode>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            max_total_wait: Duration::from_secs(30),
            base: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            jitter: Jitter::Full,
            told_spread: 0.5,
            retry_non_idempotent: false,
            statuses: vec![
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE,
            ],
        }
    }
}

/// What a retrying client did for one request, for logging: in the final response's
/// extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryReport {
    /// Attempts made, the first included.
    pub attempts: u32,
    /// Each wait before a retry, and where it came from.
    pub waits: Vec<(Duration, WaitSource)>,
    /// Why the last answer was not retried, when it was a retryable one.
    pub gave_up: Option<String>,
}

/// Where a wait came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitSource {
    /// `Retry-After`.
    RetryAfter,
    /// The RateLimit header's `t=`.
    RateLimit,
    /// Exponential backoff.
    Backoff,
}

/// `Retry-After`: delay-seconds or an HTTP date (then measured from `now`).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The RateLimit header (`"gold-orders";r=0;t=2, "burst";r=4;t=1`): the longest `t=` among
/// the policies with nothing left (`r=0`); None when none is exhausted.
pub fn ratelimit_reset(headers: &HeaderMap) -> Option<Duration> {
    let mut longest: Option<u64> = None;
    for value in headers.get_all("ratelimit") {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let (mut r, mut t) = (None, None);
            for param in item.split(';').skip(1) {
                match param.trim().split_once('=') {
                    Some(("r", v)) => r = v.trim().parse::<u64>().ok(),
                    Some(("t", v)) => t = v.trim().parse::<u64>().ok(),
                    _ => {}
                }
            }
            if let (Some(0), Some(t)) = (r, t) {
                longest = Some(longest.map_or(t, |l| l.max(t)));
            }
        }
    }
    longest.map(Duration::from_secs)
}

impl RetryPolicy {
    /// Whether a request with `method` and `headers` may be sent again.
    pub fn may_retry(&self, method: &Method, headers: &HeaderMap) -> bool {
        let idempotent = matches!(
            *method,
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::PUT
                | Method::DELETE
                | Method::TRACE
        );
        idempotent || self.retry_non_idempotent || headers.contains_key("idempotency-key")
    }

    /// The wait before retry number `retry` (1 for the first) after an answer with
    /// `headers`, and where it came from.
    pub fn wait(
        &self,
        retry: u32,
        headers: &HeaderMap,
        now: SystemTime,
        rng: &mut impl Rng,
    ) -> (Duration, WaitSource) {
        let told = retry_after(headers, now)
            .map(|d| (d, WaitSource::RetryAfter))
            .or_else(|| ratelimit_reset(headers).map(|d| (d, WaitSource::RateLimit)));
        match (told, self.jitter) {
            (Some((d, source)), Jitter::None) => (d, source),
            (Some((d, source)), Jitter::Full) => {
                let stretch = d.mul_f64(self.told_spread.max(0.0));
                let extra = if stretch.is_zero() {
                    Duration::ZERO
                } else {
                    stretch.mul_f64(rng.random::<f64>())
                };
                (d + extra, source)
            }
            (None, jitter) => {
                let exponent = retry.saturating_sub(1).min(30);
                let backoff = self
                    .base
                    .saturating_mul(1u32 << exponent)
                    .min(self.max_backoff);
                let wait = match jitter {
                    Jitter::None => backoff,
                    Jitter::Full => backoff.mul_f64(rng.random::<f64>()),
                };
                (wait, WaitSource::Backoff)
            }
        }
    }

    /// Decides after attempt number `attempts` answered `status` with `headers`, having
    /// waited `waited` so far: the wait before the next attempt, or why there is none (None:
    /// not a retryable answer).
    pub fn next(
        &self,
        attempts: u32,
        waited: Duration,
        status: StatusCode,
        headers: &HeaderMap,
        rng: &mut impl Rng,
    ) -> Option<Result<(Duration, WaitSource), String>> {
        if !self.statuses.contains(&status) {
            return None;
        }
        if attempts >= self.max_attempts {
            return Some(Err(format!("{attempts} attempts made, the most allowed")));
        }
        let (wait, source) = self.wait(attempts, headers, SystemTime::now(), rng);
        if waited + wait > self.max_total_wait {
            return Some(Err(format!(
                "the next wait ({wait:?}) would pass the {:?} allowed in all",
                self.max_total_wait
            )));
        }
        Some(Ok((wait, source)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::try_from(*k).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_784_000_000);
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")]), now),
            Some(Duration::from_secs(2))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &later)]), now),
            Some(Duration::from_secs(90))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(5));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &past)]), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
    }

    #[test]
    fn the_ratelimit_header_gives_the_longest_exhausted_reset() {
        let h = headers(&[("ratelimit", "\"gold-orders\";r=0;t=2, \"burst\";r=4;t=9")]);
        assert_eq!(ratelimit_reset(&h), Some(Duration::from_secs(2)));
        let h = headers(&[("ratelimit", "\"a\";r=0;t=2, \"b\";r=0;t=7")]);
        assert_eq!(ratelimit_reset(&h), Some(Duration::from_secs(7)));
        assert_eq!(
            ratelimit_reset(&headers(&[("ratelimit", "\"a\";r=3;t=2")])),
            None
        );
    }

    #[test]
    fn waits_follow_the_server_then_backoff_and_jitter_never_shortens_a_told_wait() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let exact = RetryPolicy {
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        let now = SystemTime::now();
        let told = headers(&[("retry-after", "3"), ("ratelimit", "\"a\";r=0;t=9")]);
        assert_eq!(
            exact.wait(1, &told, now, &mut rng),
            (Duration::from_secs(3), WaitSource::RetryAfter)
        );
        let only_t = headers(&[("ratelimit", "\"a\";r=0;t=9")]);
        assert_eq!(
            exact.wait(1, &only_t, now, &mut rng),
            (Duration::from_secs(9), WaitSource::RateLimit)
        );
        let none = HeaderMap::new();
        assert_eq!(
            exact.wait(1, &none, now, &mut rng).0,
            Duration::from_millis(100)
        );
        assert_eq!(
            exact.wait(3, &none, now, &mut rng).0,
            Duration::from_millis(400)
        );
        assert_eq!(
            exact.wait(20, &none, now, &mut rng).0,
            Duration::from_secs(10)
        );
        let jittered = RetryPolicy::default();
        for _ in 0..100 {
            let (w, _) = jittered.wait(1, &told, now, &mut rng);
            assert!(
                w >= Duration::from_secs(3) && w <= Duration::from_millis(4500),
                "{w:?}"
            );
            let (b, _) = jittered.wait(3, &none, now, &mut rng);
            assert!(b <= Duration::from_millis(400), "{b:?}");
        }
    }

    #[test]
    fn caps_and_methods_end_retries() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let p = RetryPolicy {
            max_attempts: 2,
            max_total_wait: Duration::from_secs(5),
            ..RetryPolicy::default()
        };
        let too_many = StatusCode::TOO_MANY_REQUESTS;
        let none = HeaderMap::new();
        assert!(matches!(
            p.next(1, Duration::ZERO, too_many, &none, &mut rng),
            Some(Ok(_))
        ));
        assert!(matches!(
            p.next(2, Duration::ZERO, too_many, &none, &mut rng),
            Some(Err(_))
        ));
        let long = headers(&[("retry-after", "60")]);
        assert!(matches!(
            p.next(1, Duration::ZERO, too_many, &long, &mut rng),
            Some(Err(_))
        ));
        assert!(
            p.next(1, Duration::ZERO, StatusCode::OK, &none, &mut rng)
                .is_none()
        );
        assert!(p.may_retry(&Method::GET, &none));
        assert!(!p.may_retry(&Method::POST, &none));
        assert!(p.may_retry(&Method::POST, &headers(&[("idempotency-key", "k1")])));
    }
}
