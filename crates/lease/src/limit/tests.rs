use super::*;

fn field_of(spec: LimitSpec) -> &'static str {
    spec.validate().expect_err("spec should be rejected").field
}

#[test]
fn the_average_rate_is_the_refill_or_the_limit_over_the_window() {
    let per_second = |l: Result<Limit, LimitError>| l.expect("limit").average_per_second();
    assert_eq!(per_second(Limit::token_bucket(100, 20.0)), Some(20.0));
    assert_eq!(
        per_second(Limit::fixed_window(600, Duration::from_secs(60))),
        Some(10.0)
    );
    assert_eq!(
        per_second(Limit::sliding_window(5, Duration::from_millis(500))),
        Some(10.0)
    );
    assert_eq!(
        per_second(Limit::concurrency(4, Duration::from_secs(30))),
        None
    );
}

#[test]
fn valid_limits_round_trip_through_their_spec() {
    let limits = [
        Limit::token_bucket(100, 10.0),
        Limit::fixed_window(600, Duration::from_secs(60)),
        Limit::sliding_window(5, Duration::from_secs(86_400)),
        Limit::sliding_window_log(3, Duration::from_millis(1500)),
        Limit::concurrency(4, Duration::from_secs(30)),
        Limit::gcra(20, 2.5),
        Limit::leaky_bucket(10, Duration::from_secs(60), None),
        Limit::leaky_bucket(10, Duration::from_millis(1500), Some(3)),
    ];
    for limit in limits {
        let limit = limit.expect("valid");
        assert_eq!(limit.spec().validate(), Ok(limit));
    }
}

#[test]
fn rejects_bad_counts_naming_the_field() {
    let tb = |capacity, refill_per_second| LimitSpec::TokenBucket {
        capacity,
        refill_per_second,
    };
    assert_eq!(field_of(tb(0.0, 1.0)), "capacity");
    assert_eq!(field_of(tb(-5.0, 1.0)), "capacity");
    assert_eq!(field_of(tb(1.5, 1.0)), "capacity");
    assert_eq!(field_of(tb(f64::NAN, 1.0)), "capacity");
    assert_eq!(field_of(tb(f64::INFINITY, 1.0)), "capacity");
    assert_eq!(field_of(tb(1e300, 1.0)), "capacity");
    assert_eq!(field_of(tb(10.0, 0.0)), "refillPerSecond");
    assert_eq!(field_of(tb(10.0, -1.0)), "refillPerSecond");
    assert_eq!(field_of(tb(10.0, f64::NAN)), "refillPerSecond");
    assert_eq!(field_of(tb(10.0, f64::INFINITY)), "refillPerSecond");
    assert_eq!(field_of(tb(10.0, 1e12)), "refillPerSecond");
    assert_eq!(field_of(tb(1e12, 1e-9)), "refillPerSecond");
    let gcra = |burst, rate_per_second| LimitSpec::Gcra {
        burst,
        rate_per_second,
    };
    assert_eq!(field_of(gcra(0.0, 1.0)), "burst");
    assert_eq!(field_of(gcra(2.5, 1.0)), "burst");
    assert_eq!(field_of(gcra(10.0, 0.0)), "ratePerSecond");
    assert_eq!(field_of(gcra(10.0, f64::NAN)), "ratePerSecond");
    assert_eq!(field_of(gcra(1e12, 1e-9)), "ratePerSecond");
    let lb = |limit, duration, burst| LimitSpec::LeakyBucket {
        limit,
        duration,
        burst,
    };
    let minute = Duration::from_secs(60);
    assert_eq!(field_of(lb(0.0, minute, None)), "limit");
    assert_eq!(field_of(lb(10.0, Duration::ZERO, None)), "duration");
    assert_eq!(field_of(lb(10.0, minute, Some(0.0))), "burst");
    assert_eq!(field_of(lb(10.0, minute, Some(1.5))), "burst");
    assert_eq!(field_of(lb(1.0, MAX_PERIOD, Some(1e12))), "duration");
    assert_eq!(
        Limit::leaky_bucket(30, minute, None).map(|l| (l.capacity(), l.refill_per_second())),
        Ok((30, Some(0.5))),
        "the burst defaults to the limit; the leak is limit per duration"
    );
}

#[test]
fn rejects_bad_windows_naming_the_field() {
    let fw = |limit, window| LimitSpec::FixedWindow { limit, window };
    assert_eq!(field_of(fw(0.0, Duration::from_secs(1))), "limit");
    assert_eq!(field_of(fw(10.0, Duration::ZERO)), "window");
    assert_eq!(field_of(fw(10.0, Duration::from_micros(1500))), "window");
    assert_eq!(
        field_of(fw(10.0, MAX_PERIOD + Duration::from_secs(1))),
        "window"
    );
    let c = |max_in_flight, slot_ttl| LimitSpec::Concurrency {
        max_in_flight,
        slot_ttl,
    };
    assert_eq!(field_of(c(0.0, Duration::from_secs(1))), "maxInFlight");
    assert_eq!(field_of(c(3.0, Duration::ZERO)), "slotTtl");
}

#[test]
fn the_largest_limit_over_the_longest_window_is_valid() {
    let limit = LimitSpec::SlidingWindow {
        limit: MAX_UNITS as f64,
        window: MAX_PERIOD,
    }
    .validate()
    .expect("limit × window past u64 is still a limit");
    assert_eq!(limit.capacity(), MAX_UNITS);
}

#[test]
fn algorithm_names_parse_and_unknown_ones_are_named() {
    for a in Algorithm::ALL {
        assert_eq!(a.as_str().parse::<Algorithm>(), Ok(a));
    }
    let err = "LEAKY".parse::<Algorithm>().expect_err("unknown");
    assert_eq!(err.field, "algorithm");
}

#[test]
fn the_most_a_limit_admits_over_a_span() {
    let tb = Limit::token_bucket(50, 10.0).expect("limit");
    assert_eq!(tb.most_over(Duration::ZERO), 50);
    assert_eq!(tb.most_over(Duration::from_secs(5)), 100);
    let fw = Limit::fixed_window(100, Duration::from_secs(60)).expect("limit");
    assert_eq!(fw.most_over(Duration::from_secs(60)), 200);
    assert_eq!(fw.most_over(Duration::from_secs(61)), 300);
    assert_eq!(fw.most_over(Duration::ZERO), 100);
}
