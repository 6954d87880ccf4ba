//! Bad input gets a clear, typed error before any store is touched; never a panic.

use std::time::Duration;

use tollgate_lease::{
    BucketKey, CheckItem, CheckRequest, DebitItem, DebitRequest, InvalidInput, KeyError, LeaseAsk,
    LeaseId, LeaseRequest, LeaseReturn, Limit, LimitSpec, MAX_BUCKETS_PER_CALL, ReturnRequest,
    SlotId, SlotRelease, StoreError,
};

fn key(identity: &str, rule: &str) -> BucketKey {
    BucketKey::new(identity.as_bytes(), rule).expect("key")
}

fn tb(capacity: u64) -> Limit {
    Limit::token_bucket(capacity, 1.0).expect("limit")
}

#[test]
fn every_invalid_limit_parameter_names_its_field() {
    let cases: Vec<(LimitSpec, &str)> = vec![
        (
            LimitSpec::TokenBucket {
                capacity: 0.0,
                refill_per_second: 1.0,
            },
            "capacity",
        ),
        (
            LimitSpec::TokenBucket {
                capacity: -1.0,
                refill_per_second: 1.0,
            },
            "capacity",
        ),
        (
            LimitSpec::TokenBucket {
                capacity: f64::NAN,
                refill_per_second: 1.0,
            },
            "capacity",
        ),
        (
            LimitSpec::TokenBucket {
                capacity: 10.0,
                refill_per_second: f64::NAN,
            },
            "refillPerSecond",
        ),
        (
            LimitSpec::TokenBucket {
                capacity: 10.0,
                refill_per_second: f64::NEG_INFINITY,
            },
            "refillPerSecond",
        ),
        (
            LimitSpec::TokenBucket {
                capacity: 10.0,
                refill_per_second: 0.0,
            },
            "refillPerSecond",
        ),
        (
            LimitSpec::FixedWindow {
                limit: 0.0,
                window: Duration::from_secs(1),
            },
            "limit",
        ),
        (
            LimitSpec::SlidingWindow {
                limit: 2.5,
                window: Duration::from_secs(1),
            },
            "limit",
        ),
        (
            LimitSpec::SlidingWindowLog {
                limit: 5.0,
                window: Duration::ZERO,
            },
            "window",
        ),
        (
            // More than MAX_UNITS (a long window alone is not a reason to refuse).
            LimitSpec::SlidingWindow {
                limit: 2e12,
                window: Duration::from_secs(86_400 * 365),
            },
            "limit",
        ),
        (
            LimitSpec::Concurrency {
                max_in_flight: -3.0,
                slot_ttl: Duration::from_secs(1),
            },
            "maxInFlight",
        ),
        (
            LimitSpec::Concurrency {
                max_in_flight: 3.0,
                slot_ttl: Duration::from_micros(10),
            },
            "slotTtl",
        ),
    ];
    for (spec, field) in cases {
        let err = spec.validate().expect_err("invalid");
        assert_eq!(err.field, field, "{spec:?}: {err}");
        assert!(err.to_string().contains(field), "{err}");
    }
}

#[test]
fn requests_that_could_never_succeed_are_refused() {
    let k = key("a", "r");
    let err = CheckRequest::single(k.clone(), tb(10), 11).expect_err("cost > capacity");
    assert!(
        matches!(
            err,
            InvalidInput::CostExceedsCapacity {
                cost: 11,
                capacity: 10,
                ..
            }
        ),
        "{err}"
    );
    let err = CheckRequest::single(k.clone(), tb(10), u64::MAX).expect_err("huge cost");
    assert!(matches!(err, InvalidInput::TooLarge { .. }), "{err}");
    let ask = |want, min, share| LeaseAsk {
        key: k.clone(),
        limit: tb(10),
        want,
        min,
        max_share: share,
        allowance: None,
        penalized: false,
    };
    let lease = |a, ttl| LeaseRequest::new(vec![a], ttl);
    assert!(matches!(
        lease(ask(11, 1, 1.0), Duration::from_secs(1)),
        Err(InvalidInput::LeaseExceedsCapacity { .. })
    ));
    assert!(matches!(
        lease(ask(0, 0, 1.0), Duration::from_secs(1)),
        Err(InvalidInput::BadLease { .. })
    ));
    assert!(matches!(
        lease(ask(5, 6, 1.0), Duration::from_secs(1)),
        Err(InvalidInput::BadLease { .. })
    ));
    assert!(matches!(
        lease(ask(5, 1, 0.0), Duration::from_secs(1)),
        Err(InvalidInput::BadLease { .. })
    ));
    assert!(matches!(
        lease(ask(5, 1, f64::NAN), Duration::from_secs(1)),
        Err(InvalidInput::BadLease { .. })
    ));
    assert!(matches!(
        lease(ask(5, 1, 1.0), Duration::ZERO),
        Err(InvalidInput::BadLease { .. })
    ));
    assert!(matches!(
        lease(ask(5, 1, 1.0), Duration::from_secs(86_400)),
        Err(InvalidInput::BadLease { .. })
    ));
}

#[test]
fn requests_must_serve_one_identity_with_each_bucket_once() {
    let item = |id: &str, rule: &str| CheckItem {
        key: key(id, rule),
        limit: tb(5),
        cost: 1,
        allowance: None,
        penalized: false,
    };
    assert_eq!(CheckRequest::new(vec![]), Err(InvalidInput::NoBuckets));
    assert!(matches!(
        CheckRequest::new(vec![item("a", "x"), item("b", "y")]),
        Err(InvalidInput::MixedIdentities { .. })
    ));
    assert!(matches!(
        CheckRequest::new(vec![item("a", "x"), item("a", "x")]),
        Err(InvalidInput::DuplicateBucket { .. })
    ));
    let many: Vec<_> = (0..=MAX_BUCKETS_PER_CALL)
        .map(|i| item("a", &format!("r{i}")))
        .collect();
    assert!(matches!(
        CheckRequest::new(many),
        Err(InvalidInput::TooManyBuckets { .. })
    ));
}

#[test]
fn operations_an_algorithm_cannot_do_are_refused() {
    let conc = Limit::concurrency(3, Duration::from_secs(1)).expect("limit");
    let k = key("a", "r");
    let ask = LeaseAsk {
        key: k.clone(),
        limit: conc,
        want: 1,
        min: 1,
        max_share: 1.0,
        allowance: None,
        penalized: false,
    };
    assert!(matches!(
        LeaseRequest::new(vec![ask], Duration::from_secs(1)),
        Err(InvalidInput::Unsupported { .. })
    ));
    let debit = DebitItem {
        key: k.clone(),
        limit: conc,
        units: 1,
        consumed_at: None,
        once: None,
    };
    assert!(matches!(
        DebitRequest::new(vec![debit]),
        Err(InvalidInput::Unsupported { .. })
    ));
    let ret = LeaseReturn {
        key: k.clone(),
        limit: conc,
        lease: LeaseId::forged("x"),
        unspent: 1,
        allowance: None,
    };
    assert!(matches!(
        ReturnRequest::new(vec![ret]),
        Err(InvalidInput::Unsupported { .. })
    ));
    let slot = SlotId::forged("x");
    assert!(matches!(
        SlotRelease::new(vec![(k, tb(3), slot)]),
        Err(InvalidInput::Unsupported { .. })
    ));
}

#[test]
fn debit_once_origins_are_checked() {
    for origin in ["", "has space", "pipe|inside", &"o".repeat(65), "ünï"] {
        let item = DebitItem {
            key: key("a", "r"),
            limit: tb(3),
            units: 1,
            consumed_at: None,
            once: Some(tollgate_lease::DebitOnce {
                origin: origin.to_owned(),
                until: 1,
            }),
        };
        assert!(
            matches!(
                DebitRequest::new(vec![item]),
                Err(InvalidInput::BadOrigin { .. })
            ),
            "{origin:?}"
        );
    }
}

#[test]
fn oversized_identities_and_rule_ids_are_refused() {
    let mib = vec![b'k'; 1 << 20];
    assert!(matches!(
        BucketKey::new(&mib, "r"),
        Err(KeyError::IdentityTooLong { .. })
    ));
    assert!(matches!(
        BucketKey::new(b"a", &"r".repeat(2000)),
        Err(KeyError::BadRuleId { .. })
    ));
    assert!(matches!(
        BucketKey::new(b"a", ""),
        Err(KeyError::BadRuleId { .. })
    ));
}

#[test]
fn invalid_input_is_not_transient() {
    let err = StoreError::from(InvalidInput::NoBuckets);
    assert!(!err.is_transient());
    assert!(
        StoreError::Timeout {
            budget: Duration::from_millis(5)
        }
        .is_transient()
    );
    assert!(StoreError::Unavailable("refused".into()).is_transient());
    assert!(!StoreError::BadReply("?".into()).is_transient());
    assert!(!StoreError::Rejected("CROSSSLOT".into()).is_transient());
}

#[test]
fn an_allowance_travels_with_its_item_and_is_checked_there() {
    let allowance = |share: f64| tollgate_lease::Allowance {
        region: "us".into(),
        interval_us: 1_000_000,
        unknown_share: share,
    };
    let log = Limit::sliding_window_log(5, Duration::from_secs(1)).expect("limit");
    // A window log keeps no allowance: refused, and the item that carries it is named.
    let item = CheckItem::new(key("u", "log"), log, 1).with_allowance(Some(allowance(0.5)));
    match CheckRequest::new(vec![CheckItem::new(key("u", "tb"), tb(5), 1), item]) {
        Err(InvalidInput::BadAllowance { key, .. }) => assert!(key.contains("log"), "{key}"),
        other => panic!("{other:?}"),
    }
    // A share outside (0, 1] is refused on a lease ask and on a return alike.
    let ask = LeaseAsk {
        key: key("u", "tb"),
        limit: tb(5),
        want: 2,
        min: 1,
        max_share: 1.0,
        allowance: Some(allowance(0.0)),
        penalized: false,
    };
    assert!(matches!(
        LeaseRequest::new(vec![ask], Duration::from_secs(1)),
        Err(InvalidInput::BadAllowance { .. })
    ));
    let ret = LeaseReturn {
        key: key("u", "tb"),
        limit: tb(5),
        lease: LeaseId::forged("x"),
        unspent: 1,
        allowance: Some(allowance(1.5)),
    };
    assert!(matches!(
        ReturnRequest::new(vec![ret]),
        Err(InvalidInput::BadAllowance { .. })
    ));
    // Well formed, it is kept on its item.
    let fine = CheckItem::new(key("u", "tb"), tb(5), 1)
        .with_allowance(Some(allowance(0.5)))
        .with_penalty(true);
    let req = CheckRequest::new(vec![fine]).expect("valid");
    assert!(req.items()[0].allowance.is_some() && req.items()[0].penalized);
}
