//! The plan's arithmetic, without a broker loop: what rules make of a bucket, and how a tick's
//! paid-for rate is shared out among streams.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate_node::metrics::Metrics;
use tollgate_node::runtime::Charge;

use super::{BucketState, Decided, Plan, StreamShare, share_out};
use crate::rlqs::shares::Strategy;
use crate::rlqs::streams::{Budget, Outbox, StreamHandle};

/// The charges of one identity under every rule of `yaml`.
fn charges(yaml: &str) -> Vec<Charge> {
    let metrics = Metrics::new();
    let rules = tollgate_node::test_support::rules(yaml, &metrics);
    rules
        .load()
        .rules()
        .iter()
        .map(|rule| Charge {
            rule: rule.clone(),
            identity: b"k".to_vec(),
            cost: 1,
        })
        .collect()
}

fn rule(id: &str, rest: &str) -> String {
    format!("  - {{id: {id}, match: {{k: '*'}}, {rest}}}\n")
}

fn rules(lines: &[String]) -> String {
    format!("domain: d\nrules:\n{}", lines.concat())
}

#[test]
fn a_plan_shares_the_tightest_enforced_rate_and_burst() {
    let plan = Plan::of(charges(&rules(&[
        rule(
            "wide",
            "algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 50",
        ),
        rule(
            "narrow",
            "algorithm: TOKEN_BUCKET, capacity: 20, refillPerSecond: 10",
        ),
        // Neither counts: a SHADOW rule never limits, and an Envoy's reports carry nothing
        // of requests in flight.
        rule(
            "trial",
            "algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 1, mode: SHADOW",
        ),
        rule(
            "slots",
            "algorithm: CONCURRENCY, maxInFlight: 1, slotTtl: 30s",
        ),
    ])));
    let Plan::Shares {
        charges,
        rate,
        capacity,
    } = plan
    else {
        panic!("two enforced token buckets share");
    };
    assert_eq!((rate, capacity), (10.0, 20));
    let mut paid_from: Vec<&str> = charges.iter().map(|c| c.rule.id.as_str()).collect();
    paid_from.sort();
    assert_eq!(paid_from, ["narrow", "wide"], "every limited rule pays");
}

#[test]
fn a_bucket_no_enforced_rule_limits_is_allowed_whole() {
    for only in [
        rule(
            "trial",
            "algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 1, mode: SHADOW",
        ),
        rule(
            "slots",
            "algorithm: CONCURRENCY, maxInFlight: 1, slotTtl: 30s",
        ),
    ] {
        assert!(matches!(Plan::of(charges(&rules(&[only]))), Plan::AllowAll));
    }
    assert!(matches!(Plan::of(vec![]), Plan::AllowAll));
}

/// A bucket's state with one open stream per `(id, host, strategy)`, each with a measured
/// demand of `demand` a second, and `credit` units drawn for every rule of `charges`.
fn state(
    streams: &[(u64, &str, Option<Strategy>)],
    demand: f64,
    charges: &[Charge],
    credit: f64,
    now: Instant,
) -> BucketState {
    let budget = Arc::new(Budget::new(Default::default()));
    let mut state = BucketState::default();
    for &(id, host, strategy) in streams {
        let host: IpAddr = host.parse().expect("ip");
        let handle = Arc::new(StreamHandle::new(id, host, Outbox::new(budget.clone())));
        let mut share = StreamShare::new(handle, 0, now);
        share.strategy = strategy;
        share.demand.per_second = Some(demand);
        state.streams.insert(id, share);
    }
    for c in charges {
        state.credit.insert(c.rule.key.clone(), credit);
    }
    state
}

fn one_rule(capacity: u64, per_second: u64) -> Vec<Charge> {
    charges(&rules(&[rule(
        "r",
        &format!("algorithm: TOKEN_BUCKET, capacity: {capacity}, refillPerSecond: {per_second}"),
    )]))
}

fn rate_of(decided: &[Decided], stream: u64) -> u64 {
    let d = decided
        .iter()
        .find(|d| d.stream == stream)
        .expect("decided");
    d.strategy.per_second().unwrap_or(0)
}

const TICK: Duration = Duration::from_secs(1);

#[tokio::test]
async fn shares_are_fair_per_host_before_per_stream() {
    let charges = one_rule(100, 12);
    let now = Instant::now();
    // Host a opens three streams, host b one; each asks far more than the rate.
    let streams = [
        (1, "10.0.0.1", None),
        (2, "10.0.0.1", None),
        (3, "10.0.0.1", None),
        (4, "10.0.0.2", None),
    ];
    let state = state(&streams, 1_000.0, &charges, 1_000.0, now);
    let all: HashSet<u64> = [1, 2, 3, 4].into();
    let decided = share_out(&state, &charges, 12.0, 100, now, TICK, &all);
    assert_eq!(
        rate_of(&decided, 4),
        6,
        "host b gets a host's half: {decided:?}"
    );
    let a: u64 = [1, 2, 3].iter().map(|&s| rate_of(&decided, s)).sum();
    assert_eq!(a, 6, "host a's three streams share the other half");
    // New Envoy buckets start full: an even share of the rule's burst each.
    for d in &decided {
        assert_eq!(d.fill, 25.0, "{d:?}");
    }
}

#[tokio::test]
async fn a_stream_that_joined_during_the_draw_waits_for_the_next_tick() {
    let charges = one_rule(100, 10);
    let now = Instant::now();
    let state = state(
        &[(1, "10.0.0.1", None), (2, "10.0.0.2", None)],
        1_000.0,
        &charges,
        1_000.0,
        now,
    );
    let drawn_for: HashSet<u64> = [1].into();
    let decided = share_out(&state, &charges, 10.0, 100, now, TICK, &drawn_for);
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0].stream, 1);
    assert_eq!(rate_of(&decided, 1), 10, "the whole rate, for now");
}

#[tokio::test]
async fn a_stream_holding_a_bucket_is_not_cut_off_for_a_newcomer() {
    let charges = one_rule(2, 2);
    let now = Instant::now();
    let holding = Some(Strategy::share(1, 2));
    // Two streams hold a bucket of ours; a third is new. The credit pays for two units a
    // second and nothing more.
    let state = state(
        &[
            (1, "10.0.0.1", holding),
            (2, "10.0.0.2", holding),
            (3, "10.0.0.3", None),
        ],
        1_000.0,
        &charges,
        -1.0,
        now,
    );
    let all: HashSet<u64> = [1, 2, 3].into();
    let decided = share_out(&state, &charges, 2.0, 2, now, TICK, &all);
    assert_eq!(rate_of(&decided, 1), 1, "{decided:?}");
    assert_eq!(rate_of(&decided, 2), 1, "{decided:?}");
    let newcomer = decided.iter().find(|d| d.stream == 3).expect("decided");
    assert_eq!(
        newcomer.strategy,
        Strategy::DenyAll,
        "the newcomer waits for its first bucket"
    );
}

#[tokio::test]
async fn nothing_paid_for_gives_nothing() {
    let charges = one_rule(100, 10);
    let now = Instant::now();
    // The store had no room: the credit is a bucket short, and no stream holds one of ours.
    let state = state(
        &[(1, "10.0.0.1", None), (2, "10.0.0.2", None)],
        5.0,
        &charges,
        -200.0,
        now,
    );
    let all: HashSet<u64> = [1, 2].into();
    let decided = share_out(&state, &charges, 10.0, 100, now, TICK, &all);
    for d in &decided {
        assert_eq!(d.strategy, Strategy::DenyAll, "{d:?}");
        assert_eq!(d.fill, 0.0);
    }
}
