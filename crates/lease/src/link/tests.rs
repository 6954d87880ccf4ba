use super::*;

#[test]
fn latency_draws_follow_median_and_p99() {
    let latency = Latency {
        median: Duration::from_micros(500),
        p99: Duration::from_millis(5),
    };
    let mut rng = StdRng::seed_from_u64(7);
    let mut draws: Vec<Duration> = (0..20_000).map(|_| latency.draw(&mut rng)).collect();
    draws.sort();
    let median = draws[draws.len() / 2].as_secs_f64() * 1e6;
    let p99 = draws[draws.len() * 99 / 100].as_secs_f64() * 1e6;
    assert!((450.0..550.0).contains(&median), "median {median} µs");
    assert!((4_000.0..6_000.0).contains(&p99), "p99 {p99} µs");
}

#[test]
fn one_seed_draws_one_sequence() {
    let latency = Latency {
        median: Duration::from_micros(500),
        p99: Duration::from_millis(5),
    };
    let draw = |seed| {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..8).map(|_| latency.draw(&mut rng)).collect::<Vec<_>>()
    };
    assert_eq!(draw(3), draw(3));
    assert_ne!(draw(3), draw(4));
}
