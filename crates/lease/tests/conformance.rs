//! The lease store's conformance suite: every case is written once and run against the
//! in-memory store (on a manual clock), a real single Redis and a real 3-primary Redis Cluster.
//!
//! Against Redis, time is Redis `TIME` and moves on its own; cases are written so that a few
//! milliseconds of extra time between calls cannot change their outcome, and assert exact
//! values where the in-memory store's clock makes them exact.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Backend, check1};
use tollgate_lease::{
    Allowance, BucketKey, CheckItem, CheckOutcome, CheckRequest, DebitItem, DebitRequest, Decision,
    DemandReport, DemandRequest, HeldLeases, LeaseAsk, LeaseGrant, LeaseId, LeaseRequest,
    LeaseReturn, LeaseStore, Limit, Penalty, PenaltyState, ReturnRequest, SettleItem,
    SettleRequest, Settlement, SlotId, SlotRelease, SlotRenew,
};

const HOUR: Duration = Duration::from_secs(3600);
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn check(b: &Backend, key: &BucketKey, limit: Limit, cost: u64) -> CheckOutcome {
    b.store
        .check(&check1(key, limit, cost))
        .await
        .expect("check")
}

async fn allowed_in_a_row(b: &Backend, key: &BucketKey, limit: Limit, calls: usize) -> usize {
    let mut allowed = 0;
    for _ in 0..calls {
        if check(b, key, limit, 1).await.allowed() {
            allowed += 1;
        }
    }
    allowed
}

async fn lease(
    b: &Backend,
    key: &BucketKey,
    limit: Limit,
    want: u64,
    min: u64,
    share: f64,
    ttl: Duration,
) -> LeaseGrant {
    let req = LeaseRequest::new(
        vec![LeaseAsk {
            key: key.clone(),
            limit,
            want,
            min,
            max_share: share,
            allowance: None,
            penalized: false,
        }],
        ttl,
    )
    .expect("valid lease request");
    let mut grants = b.store.acquire_leases(&req).await.expect("acquire");
    assert_eq!(grants.len(), 1);
    grants.remove(0)
}

async fn give_back(
    b: &Backend,
    key: &BucketKey,
    limit: Limit,
    lease: &LeaseId,
    unspent: u64,
) -> u64 {
    let req = ReturnRequest::new(vec![LeaseReturn {
        key: key.clone(),
        limit,
        lease: lease.clone(),
        unspent,
        allowance: None,
    }])
    .expect("valid return");
    b.store.return_leases(&req).await.expect("return")[0]
}

async fn debit(b: &Backend, key: &BucketKey, limit: Limit, units: u64, at: Option<u64>) -> u64 {
    let req = DebitRequest::new(vec![DebitItem {
        key: key.clone(),
        limit,
        units,
        consumed_at: at,
        once: None,
    }])
    .expect("valid");
    b.store.debit(&req).await.expect("debit")[0]
}

/// A debit-once of `origin`'s running `total` for the epoch ending at `until`.
async fn debit_once(
    b: &Backend,
    key: &BucketKey,
    limit: Limit,
    origin: &str,
    until: u64,
    total: u64,
    at: Option<u64>,
) -> u64 {
    let req = DebitRequest::new(vec![DebitItem {
        key: key.clone(),
        limit,
        units: total,
        consumed_at: at,
        once: Some(tollgate_lease::DebitOnce {
            origin: origin.into(),
            until,
        }),
    }])
    .expect("valid");
    b.store.debit(&req).await.expect("debit")[0]
}

async fn remaining(b: &Backend, key: &BucketKey, limit: Limit) -> u64 {
    let out = check(b, key, limit, 0).await;
    out.buckets[0].remaining
}

// ---- the seed's measurements ------------------------------------------------------------

/// Capacity 10 refilling 5/s: 12 back-to-back calls, the first 10 allowed, the last 2 denied
/// with retry-after ≈ 200 ms.
async fn seed_twelve_calls(b: &Backend) {
    let key = b.fresh_key("seed");
    let limit = Limit::token_bucket(10, 5.0).expect("limit");
    let mut outcomes = vec![];
    for _ in 0..12 {
        outcomes.push(check(b, &key, limit, 1).await);
    }
    let allowed: Vec<bool> = outcomes.iter().map(CheckOutcome::allowed).collect();
    assert_eq!(allowed, [vec![true; 10], vec![false; 2]].concat());
    for out in &outcomes[10..] {
        let Decision::Limited { retry_after } = out.decision() else {
            panic!("denied")
        };
        if b.exact_time() {
            assert_eq!(retry_after, ms(200));
        } else {
            assert!(
                retry_after > ms(100) && retry_after <= ms(200),
                "{retry_after:?}"
            );
        }
    }
}

/// Capacity 50, 200 concurrent clients: exactly 50 allowed.
async fn seed_two_hundred_concurrent_clients(b: &Backend) {
    let key = b.fresh_key("seed-concurrent");
    let limit = Limit::token_bucket(50, 0.001).expect("limit");
    let store = Arc::new(b.store.clone());
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (store, req) = (store.clone(), check1(&key, limit, 1));
            tokio::spawn(async move { store.check(&req).await.expect("check").allowed() })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        allowed += usize::from(t.await.expect("join"));
    }
    assert_eq!(allowed, 50);
}

// ---- check semantics ---------------------------------------------------------------------

async fn all_rules_or_none(b: &Backend) {
    let wide = b.key("all-or-none", "wide");
    let narrow = b.key("all-or-none", "narrow");
    let (lw, ln) = (
        Limit::token_bucket(5, 0.001).expect("l"),
        Limit::token_bucket(2, 0.001).expect("l"),
    );
    let both = || {
        CheckRequest::new(vec![
            CheckItem {
                key: wide.clone(),
                limit: lw,
                cost: 1,
                allowance: None,
                penalized: false,
            },
            CheckItem {
                key: narrow.clone(),
                limit: ln,
                cost: 1,
                allowance: None,
                penalized: false,
            },
        ])
        .expect("valid")
    };
    assert!(b.store.check(&both()).await.expect("check").allowed());
    assert!(b.store.check(&both()).await.expect("check").allowed());
    let third = b.store.check(&both()).await.expect("check");
    assert!(!third.allowed());
    assert!(third.buckets[0].allowed && !third.buckets[1].allowed);
    // The wide rule allowed alone, but spent nothing for the denied request.
    assert_eq!(remaining(b, &wide, lw).await, 3);
    assert_eq!(third.buckets[0].remaining, 3);
}

async fn denied_request_spends_nothing(b: &Backend) {
    let key = b.fresh_key("denied");
    let limit = Limit::token_bucket(10, 0.001).expect("l");
    assert!(check(b, &key, limit, 8).await.allowed());
    let denied = check(b, &key, limit, 5).await;
    assert!(!denied.allowed());
    assert_eq!(denied.buckets[0].remaining, 2);
    assert!(check(b, &key, limit, 2).await.allowed());
    assert_eq!(remaining(b, &key, limit).await, 0);
}

async fn cost_zero_peeks(b: &Backend) {
    let key = b.fresh_key("peek");
    let limit = Limit::fixed_window(10, HOUR).expect("l");
    b.room_in_window(HOUR, Duration::from_secs(10)).await;
    for _ in 0..3 {
        let out = check(b, &key, limit, 0).await;
        assert!(out.allowed());
        assert_eq!(out.buckets[0].remaining, 10);
        assert_eq!(out.buckets[0].reset_after, Duration::ZERO);
    }
    assert!(check(b, &key, limit, 4).await.allowed());
    assert_eq!(remaining(b, &key, limit).await, 6);
    assert_eq!(remaining(b, &key, limit).await, 6);
}

/// A peek is judged as a check (whether the cost fits; if not, when) and consumes nothing.
async fn peek_tells_when_a_cost_fits_without_spending(b: &Backend) {
    let key = b.fresh_key("peek");
    let limit = Limit::token_bucket(5, 10.0).expect("l");
    let peek = |cost| {
        CheckRequest::single(key.clone(), limit, cost)
            .expect("r")
            .peek()
    };
    let out = b.store.check(&peek(5)).await.expect("peek");
    assert!(out.allowed(), "5 fit a full bucket of 5");
    assert_eq!(remaining(b, &key, limit).await, 5, "a peek spends nothing");
    assert!(check(b, &key, limit, 4).await.allowed());
    let out = b.store.check(&peek(3)).await.expect("peek");
    assert!(!out.allowed());
    let retry = out.buckets[0].retry_after;
    assert!(
        retry > ms(150) && retry <= ms(200),
        "two more tokens at 10/s: {retry:?}"
    );
    assert_eq!(
        remaining(b, &key, limit).await,
        1,
        "a denied peek spends nothing"
    );
    let slots = Limit::concurrency(1, ms(60_000)).expect("l");
    let slot_key = b.fresh_key("peek-slots");
    let out = b
        .store
        .check(
            &CheckRequest::single(slot_key.clone(), slots, 1)
                .expect("r")
                .peek(),
        )
        .await
        .expect("peek");
    assert!(
        out.allowed() && out.buckets[0].slot.is_none(),
        "a peek takes no slot"
    );
    assert!(
        check(b, &slot_key, slots, 1).await.allowed(),
        "the slot is still free"
    );
}

async fn token_bucket_refills_over_time(b: &Backend) {
    let key = b.fresh_key("refill");
    let limit = Limit::token_bucket(2, 10.0).expect("l"); // one token per 100 ms
    assert_eq!(allowed_in_a_row(b, &key, limit, 3).await, 2);
    let denied = check(b, &key, limit, 1).await;
    assert!(!denied.allowed());
    assert!(denied.buckets[0].retry_after <= ms(100));
    assert!(denied.buckets[0].reset_after <= ms(200));
    b.advance(ms(110)).await;
    assert!(check(b, &key, limit, 1).await.allowed());
}

async fn token_bucket_retry_is_exact_for_a_large_cost(b: &Backend) {
    let key = b.fresh_key("retry-cost");
    let limit = Limit::token_bucket(100, 10.0).expect("l");
    assert!(check(b, &key, limit, 100).await.allowed());
    let out = check(b, &key, limit, 30).await;
    let retry = out.buckets[0].retry_after;
    if b.exact_time() {
        assert_eq!(retry, Duration::from_secs(3));
        assert_eq!(out.buckets[0].reset_after, Duration::from_secs(10));
    } else {
        assert!(
            retry > ms(2500) && retry <= Duration::from_secs(3),
            "{retry:?}"
        );
    }
}

async fn lowered_capacity_applies_at_once(b: &Backend) {
    let key = b.fresh_key("lowered");
    let big = Limit::token_bucket(100, 0.001).expect("l");
    assert!(check(b, &key, big, 10).await.allowed());
    let small = Limit::token_bucket(20, 0.001).expect("l");
    assert_eq!(remaining(b, &key, small).await, 20);
    assert_eq!(allowed_in_a_row(b, &key, small, 21).await, 20);
}

async fn changing_algorithm_starts_fresh(b: &Backend) {
    let key = b.fresh_key("switch");
    let tb = Limit::token_bucket(10, 0.001).expect("l");
    let fw = Limit::fixed_window(3, HOUR).expect("l");
    let log = Limit::sliding_window_log(2, HOUR).expect("l");
    let gcra = Limit::gcra(5, 0.001).expect("l");
    b.room_in_window(HOUR, Duration::from_secs(10)).await;
    assert!(check(b, &key, tb, 7).await.allowed());
    // A GCRA over the token bucket's hash reads no state, and the other way round.
    assert_eq!(remaining(b, &key, gcra).await, 5);
    assert!(check(b, &key, gcra, 5).await.allowed());
    assert_eq!(remaining(b, &key, tb).await, 10);
    assert!(check(b, &key, tb, 7).await.allowed());
    assert_eq!(allowed_in_a_row(b, &key, fw, 4).await, 3);
    assert_eq!(allowed_in_a_row(b, &key, log, 3).await, 2);
    // Back to the token bucket: the hash now holds a window, which reads as no state.
    assert_eq!(remaining(b, &key, tb).await, 10);
}

// ---- GCRA ----------------------------------------------------------------------------------

async fn gcra_admits_its_burst_then_one_per_interval(b: &Backend) {
    let key = b.fresh_key("gcra");
    let limit = Limit::gcra(3, 4.0).expect("l"); // one every 250 ms
    assert_eq!(allowed_in_a_row(b, &key, limit, 4).await, 3);
    let denied = check(b, &key, limit, 1).await;
    assert!(!denied.allowed());
    let (retry, reset) = (denied.buckets[0].retry_after, denied.buckets[0].reset_after);
    if b.exact_time() {
        assert_eq!(retry, ms(250), "read from the TAT, to the microsecond");
        assert_eq!(reset, ms(750));
        b.advance(retry).await;
    } else {
        assert!(retry <= ms(250) && retry > ms(150), "{retry:?}");
        assert!(reset <= ms(750) && reset > ms(650), "{reset:?}");
        b.advance(ms(260)).await;
    }
    assert!(check(b, &key, limit, 1).await.allowed());
    assert!(!check(b, &key, limit, 1).await.allowed());
}

async fn gcra_leases_returns_and_debits(b: &Backend) {
    let key = b.fresh_key("gcra-lease");
    let limit = Limit::gcra(100, 0.001).expect("l");
    let g = lease(b, &key, limit, 50, 1, 1.0, HOUR).await;
    assert_eq!((g.units, g.remaining), (50, 50));
    let id = g.lease.expect("lease");
    assert_eq!(give_back(b, &key, limit, &id, 30).await, 30);
    assert_eq!(remaining(b, &key, limit).await, 80);
    assert_eq!(give_back(b, &key, limit, &id, 30).await, 0, "credited once");
    let debt = b.fresh_key("gcra-debt");
    let limit = Limit::gcra(10, 10.0).expect("l"); // τ = 1 s
    assert_eq!(debit(b, &debt, limit, 15, None).await, 15);
    let retry = check(b, &debt, limit, 1).await.buckets[0].retry_after;
    assert!(retry <= ms(600) && retry > ms(450), "{retry:?}");
    let taken = debit(b, &debt, limit, 1000, None).await;
    assert!(
        (5..=7).contains(&taken),
        "{taken} taken of 1000: up to 2τ ahead"
    );
    let floor = check(b, &debt, limit, 1).await.buckets[0].retry_after;
    assert!(
        floor <= ms(1100) && floor > ms(950),
        "the TAT goes at most 2τ ahead: {floor:?}"
    );
}

async fn gcra_returns_never_move_the_tat_behind_now(b: &Backend) {
    let key = b.fresh_key("gcra-behind");
    let limit = Limit::gcra(10, 10.0).expect("l"); // one every 100 ms
    let g = lease(b, &key, limit, 5, 1, 1.0, HOUR).await;
    assert_eq!(g.units, 5);
    b.advance(ms(600)).await; // the 5 units' 500 ms have passed: the key is at rest
    assert_eq!(
        give_back(b, &key, limit, &g.lease.expect("lease"), 5).await,
        5
    );
    assert_eq!(
        remaining(b, &key, limit).await,
        10,
        "never more than the burst"
    );
    assert_eq!(allowed_in_a_row(b, &key, limit, 11).await, 10);
}

async fn gcra_keeps_its_tat_when_its_parameters_change(b: &Backend) {
    let key = b.fresh_key("gcra-change");
    let slow = |burst| Limit::gcra(burst, 0.001).expect("l"); // one every 1000 s
    assert!(check(b, &key, slow(10), 6).await.allowed());
    assert_eq!(remaining(b, &key, slow(10)).await, 4);
    // A larger burst: the same TAT, so the 6 units taken still count.
    assert_eq!(remaining(b, &key, slow(20)).await, 14);
    // Twice the rate: the TAT (6000 s ahead) is 12 intervals of the new rate: full.
    let faster = Limit::gcra(10, 0.002).expect("l");
    assert_eq!(remaining(b, &key, faster).await, 0);
    assert_eq!(
        remaining(b, &key, slow(20)).await,
        14,
        "peeks changed nothing"
    );
}

// ---- leaky bucket --------------------------------------------------------------------------

async fn leaky_bucket_fills_to_its_burst_and_leaks(b: &Backend) {
    let key = b.fresh_key("leaky");
    // 5 per second (one leaks every 200 ms), 3 slots.
    let limit = Limit::leaky_bucket(5, Duration::from_secs(1), Some(3)).expect("l");
    assert_eq!(allowed_in_a_row(b, &key, limit, 4).await, 3);
    let denied = check(b, &key, limit, 1).await;
    assert!(!denied.allowed());
    let (retry, reset) = (denied.buckets[0].retry_after, denied.buckets[0].reset_after);
    if b.exact_time() {
        assert_eq!(retry, ms(200));
        assert_eq!(reset, ms(600), "the time until the bucket is empty");
        b.advance(retry).await;
    } else {
        assert!(retry <= ms(200) && retry > ms(100), "{retry:?}");
        assert!(reset <= ms(600) && reset > ms(500), "{reset:?}");
        b.advance(ms(210)).await;
    }
    assert!(check(b, &key, limit, 1).await.allowed());
    assert!(!check(b, &key, limit, 1).await.allowed());
}

async fn leaky_bucket_leases_returns_and_debits(b: &Backend) {
    let key = b.fresh_key("leaky-lease");
    let limit = Limit::leaky_bucket(1, HOUR, Some(100)).expect("l");
    let g = lease(b, &key, limit, 50, 1, 1.0, HOUR).await;
    assert_eq!((g.units, g.remaining), (50, 50));
    let id = g.lease.expect("lease");
    assert_eq!(give_back(b, &key, limit, &id, 30).await, 30);
    assert_eq!(remaining(b, &key, limit).await, 80);
    assert_eq!(give_back(b, &key, limit, &id, 30).await, 0, "credited once");
    let debt = b.fresh_key("leaky-debt");
    let limit = Limit::leaky_bucket(10, Duration::from_secs(1), None).expect("l");
    assert_eq!(debit(b, &debt, limit, 15, None).await, 15);
    let retry = check(b, &debt, limit, 1).await.buckets[0].retry_after;
    assert!(retry <= ms(600) && retry > ms(450), "{retry:?}");
    let taken = debit(b, &debt, limit, 1000, None).await;
    assert!(
        (5..=7).contains(&taken),
        "{taken} taken of 1000: up to 2τ ahead"
    );
    let floor = check(b, &debt, limit, 1).await.buckets[0].retry_after;
    assert!(
        floor <= ms(1100) && floor > ms(950),
        "the level goes at most to twice the burst: {floor:?}"
    );
}

async fn a_leaky_bucket_keeps_its_level_when_its_limit_changes(b: &Backend) {
    let (leaky_key, bucket_key) = (b.fresh_key("leaky-change"), b.fresh_key("tb-change"));
    let leaky = |limit, burst| {
        Limit::leaky_bucket(limit, Duration::from_secs(3600 * 24), Some(burst)).expect("l")
    };
    let bucket = |capacity| Limit::token_bucket(capacity, 0.0001).expect("l");
    assert!(check(b, &leaky_key, leaky(10, 10), 6).await.allowed());
    assert!(check(b, &bucket_key, bucket(10), 6).await.allowed());
    // The rule now allows 20: the leaky bucket still holds its 6 hits (14 fit at once), where
    // a token bucket keeps its 4 remaining tokens.
    assert_eq!(remaining(b, &leaky_key, leaky(20, 20)).await, 14);
    assert_eq!(remaining(b, &bucket_key, bucket(20)).await, 4);
    // A lower burst: the same 6 hits, so 2 fit of 8.
    assert_eq!(remaining(b, &leaky_key, leaky(8, 8)).await, 2);
    // Twice the leak empties the same level twice as fast.
    let slow = check(b, &leaky_key, leaky(10, 10), 0).await.buckets[0].reset_after;
    let fast = check(b, &leaky_key, leaky(20, 10), 0).await.buckets[0].reset_after;
    // (Over real time the level leaks between the two calls: by half their distance here.)
    let within = if b.exact_time() {
        Duration::from_micros(1)
    } else {
        Duration::from_secs(1)
    };
    assert!(fast.abs_diff(slow / 2) <= within, "{fast:?} vs {slow:?}");
}

// ---- reserve, then settle --------------------------------------------------------------------

async fn reserve(
    b: &Backend,
    key: &BucketKey,
    limit: Limit,
    estimate: u64,
    nonce: &str,
    ttl: Duration,
) -> CheckOutcome {
    let req = check1(key, limit, estimate)
        .reserve(nonce, ttl)
        .expect("valid reservation");
    b.store.check(&req).await.expect("reserve")
}

async fn settle(
    b: &Backend,
    key: &BucketKey,
    limit: Limit,
    nonce: &str,
    actual: u64,
) -> Settlement {
    let req = SettleRequest::new(vec![SettleItem {
        key: key.clone(),
        limit,
        nonce: nonce.into(),
        actual,
    }])
    .expect("valid settle");
    b.store.settle(&req).await.expect("settle")[0]
}

async fn a_settle_below_the_estimate_gives_the_rest_back_once(b: &Backend) {
    let key = b.fresh_key("settle-less");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    assert!(reserve(b, &key, limit, 30, "r1", HOUR).await.allowed());
    assert_eq!(
        remaining(b, &key, limit).await,
        70,
        "the estimate is consumed at once"
    );
    assert_eq!(
        settle(b, &key, limit, "r1", 10).await,
        Settlement::Settled {
            refunded: 20,
            charged: 0
        }
    );
    assert_eq!(remaining(b, &key, limit).await, 90);
    assert_eq!(
        settle(b, &key, limit, "r1", 0).await,
        Settlement::AlreadySettled
    );
    assert_eq!(remaining(b, &key, limit).await, 90, "settled once");
    assert_eq!(
        settle(b, &key, limit, "never-made", 0).await,
        Settlement::Unknown
    );
    assert_eq!(remaining(b, &key, limit).await, 90);
}

async fn a_settle_above_the_estimate_charges_the_excess_into_debt(b: &Backend) {
    let key = b.fresh_key("settle-more");
    let limit = Limit::token_bucket(10, 10.0).expect("l");
    assert!(reserve(b, &key, limit, 10, "big", HOUR).await.allowed());
    // An excess of 15, owed whole: the bucket goes 15 into debt (a settlement's excess has no
    // floor; it used to stop at one bucket, 10).
    assert_eq!(
        settle(b, &key, limit, "big", 25).await,
        Settlement::Settled {
            refunded: 0,
            charged: 15
        }
    );
    let denied = check(b, &key, limit, 1).await;
    assert!(!denied.allowed());
    let retry = denied.buckets[0].retry_after;
    assert!(
        retry > ms(1500) && retry <= ms(1700),
        "in debt by 15, the next unit at 10 a second: {retry:?}"
    );
    // The largest actual there is is charged whole, and waited for.
    let key = b.fresh_key("settle-most");
    assert!(reserve(b, &key, limit, 1, "most", HOUR).await.allowed());
    let most = tollgate_lease::limit::MAX_UNITS;
    assert_eq!(
        settle(b, &key, limit, "most", most).await,
        Settlement::Settled {
            refunded: 0,
            charged: most - 1
        }
    );
    let denied = check(b, &key, limit, 1).await;
    assert!(!denied.allowed());
    assert!(
        denied.buckets[0].retry_after >= Duration::from_secs((most - 20) / 10),
        "{:?}",
        denied.buckets[0].retry_after
    );
}

async fn a_refund_never_raises_a_bucket_above_capacity(b: &Backend) {
    let key = b.fresh_key("settle-cap");
    let limit = Limit::token_bucket(10, 10.0).expect("l");
    assert!(reserve(b, &key, limit, 5, "r", HOUR).await.allowed());
    b.advance(ms(600)).await; // refilled to 10 meanwhile
    // Given back into a full bucket: it keeps none of it, and `refunded` says so.
    assert_eq!(
        settle(b, &key, limit, "r", 0).await,
        Settlement::Settled {
            refunded: 0,
            charged: 0
        }
    );
    assert_eq!(remaining(b, &key, limit).await, 10);
    assert_eq!(allowed_in_a_row(b, &key, limit, 11).await, 10);
}

async fn an_expired_reservation_stays_charged_and_a_late_settle_charges_only_excess(b: &Backend) {
    let key = b.fresh_key("settle-late");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    assert!(reserve(b, &key, limit, 40, "late", ms(50)).await.allowed());
    b.advance(ms(100)).await;
    assert_eq!(
        settle(b, &key, limit, "late", 10).await,
        Settlement::Expired { charged: 0 }
    );
    assert_eq!(
        remaining(b, &key, limit).await,
        60,
        "an expired estimate stands"
    );
    assert!(reserve(b, &key, limit, 20, "later", ms(50)).await.allowed());
    b.advance(ms(100)).await;
    assert_eq!(
        settle(b, &key, limit, "later", 50).await,
        Settlement::Expired { charged: 30 }
    );
    assert_eq!(remaining(b, &key, limit).await, 10);
    assert_eq!(
        settle(b, &key, limit, "later", 50).await,
        Settlement::AlreadySettled
    );
}

async fn a_denied_reservation_records_nothing(b: &Backend) {
    let key = b.fresh_key("settle-denied");
    let limit = Limit::token_bucket(5, 0.001).expect("l");
    assert!(reserve(b, &key, limit, 3, "first", HOUR).await.allowed());
    assert!(!reserve(b, &key, limit, 3, "second", HOUR).await.allowed());
    assert_eq!(
        settle(b, &key, limit, "second", 0).await,
        Settlement::Unknown
    );
    assert_eq!(remaining(b, &key, limit).await, 2);
    // All or nothing across a request's buckets: one bucket without room denies the other's
    // record too.
    let (wide, narrow) = (b.key("settle-two", "wide"), b.key("settle-two", "narrow"));
    let (big, small) = (
        Limit::token_bucket(100, 0.001).expect("l"),
        Limit::token_bucket(2, 0.001).expect("l"),
    );
    let both = |cost| {
        CheckRequest::new(vec![
            CheckItem {
                key: wide.clone(),
                limit: big,
                cost,
                allowance: None,
                penalized: false,
            },
            CheckItem {
                key: narrow.clone(),
                limit: small,
                cost,
                allowance: None,
                penalized: false,
            },
        ])
        .expect("valid")
    };
    let req = both(2).reserve("two", HOUR).expect("valid");
    assert!(b.store.check(&req).await.expect("reserve").allowed());
    let req = both(1).reserve("three", HOUR).expect("valid");
    assert!(!b.store.check(&req).await.expect("reserve").allowed());
    assert_eq!(settle(b, &wide, big, "three", 0).await, Settlement::Unknown);
    assert_eq!(
        settle(b, &wide, big, "two", 1).await,
        Settlement::Settled {
            refunded: 1,
            charged: 0
        }
    );
    assert_eq!(remaining(b, &wide, big).await, 99);
}

async fn a_window_reservation_refunds_only_into_its_own_window(b: &Backend) {
    let key = b.fresh_key("settle-window");
    let w = Duration::from_secs(2);
    let limit = Limit::fixed_window(10, w).expect("l");
    b.room_in_window(w, ms(500)).await;
    assert!(
        reserve(b, &key, limit, 6, "in-window", HOUR)
            .await
            .allowed()
    );
    assert!(
        reserve(b, &key, limit, 2, "same-window", HOUR)
            .await
            .allowed()
    );
    assert_eq!(
        settle(b, &key, limit, "same-window", 1).await,
        Settlement::Settled {
            refunded: 1,
            charged: 0
        }
    );
    assert_eq!(remaining(b, &key, limit).await, 3);
    b.start_of_window(w, ms(10)).await;
    assert_eq!(
        settle(b, &key, limit, "in-window", 0).await,
        Settlement::Settled {
            refunded: 0,
            charged: 0
        },
        "a refund never lands in a later window"
    );
    assert_eq!(remaining(b, &key, limit).await, 10);
}

async fn a_log_reservation_shrinks_its_own_entry(b: &Backend) {
    let key = b.fresh_key("settle-log");
    let limit = Limit::sliding_window_log(10, HOUR).expect("l");
    assert!(reserve(b, &key, limit, 6, "log", HOUR).await.allowed());
    assert_eq!(remaining(b, &key, limit).await, 4);
    assert_eq!(
        settle(b, &key, limit, "log", 2).await,
        Settlement::Settled {
            refunded: 4,
            charged: 0
        }
    );
    assert_eq!(remaining(b, &key, limit).await, 8);
}

async fn concurrent_settles_of_one_reservation_apply_once(b: &Backend) {
    let key = b.fresh_key("settle-race");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    assert!(reserve(b, &key, limit, 50, "raced", HOUR).await.allowed());
    let store = Arc::new(b.store.clone());
    let mut tasks = vec![];
    for _ in 0..20 {
        let (store, key) = (store.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let req = SettleRequest::new(vec![SettleItem {
                key,
                limit,
                nonce: "raced".into(),
                actual: 10,
            }])
            .expect("valid");
            store.settle(&req).await.expect("settle")[0]
        }));
    }
    let mut settled = 0;
    for t in tasks {
        match t.await.expect("task") {
            Settlement::Settled { refunded: 40, .. } => settled += 1,
            Settlement::AlreadySettled => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(settled, 1, "exactly one settle applies");
    assert_eq!(remaining(b, &key, limit).await, 90);
}

async fn a_reset_forgets_reservations(b: &Backend) {
    let key = b.fresh_key("settle-reset");
    let limit = Limit::token_bucket(10, 0.001).expect("l");
    assert!(reserve(b, &key, limit, 8, "r", HOUR).await.allowed());
    assert!(b.store.reset(&key).await.expect("reset"));
    assert_eq!(settle(b, &key, limit, "r", 0).await, Settlement::Unknown);
    assert_eq!(remaining(b, &key, limit).await, 10);
}

// ---- windows -------------------------------------------------------------------------------

async fn fixed_window_counts_and_resets(b: &Backend) {
    let key = b.fresh_key("fixed");
    let w = Duration::from_secs(1);
    let limit = Limit::fixed_window(3, w).expect("l");
    b.start_of_window(w, ms(5)).await;
    assert_eq!(allowed_in_a_row(b, &key, limit, 5).await, 3);
    let denied = check(b, &key, limit, 1).await;
    let retry = denied.buckets[0].retry_after;
    assert_eq!(retry, denied.buckets[0].reset_after);
    if b.exact_time() {
        assert_eq!(retry, ms(995));
    } else {
        assert!(retry <= ms(995) && retry > ms(500), "{retry:?}");
    }
    b.advance(retry + ms(1)).await;
    assert_eq!(allowed_in_a_row(b, &key, limit, 4).await, 3);
}

async fn fixed_window_of_a_day(b: &Backend) {
    let key = b.fresh_key("daily");
    let day = Duration::from_secs(86_400);
    let limit = Limit::fixed_window(2, day).expect("l");
    b.room_in_window(day, Duration::from_secs(10)).await;
    assert_eq!(allowed_in_a_row(b, &key, limit, 3).await, 2);
    let out = check(b, &key, limit, 1).await;
    let now = b.now();
    let to_midnight = Duration::from_micros(86_400_000_000 - now % 86_400_000_000);
    let retry = out.buckets[0].retry_after;
    assert!(
        retry <= to_midnight + ms(50) && retry + ms(500) >= to_midnight,
        "{retry:?} vs {to_midnight:?}"
    );
}

/// Limits whose limit × window in microseconds does not fit 64 bits (a million a year, 300
/// million a day) count exactly like small ones: they were once refused as an overflow, and
/// envoyproxy/ratelimit rules with them silently became deny-everything.
async fn large_window_limits_count_exactly(b: &Backend) {
    let year = Duration::from_secs(365 * 86_400);
    let day = Duration::from_secs(86_400);
    let cases = [
        Limit::fixed_window(1_000_000, year).expect("a million a year is a valid limit"),
        Limit::sliding_window(300_000_000, day).expect("300 million a day is a valid limit"),
        Limit::sliding_window_log(1_000_000, year).expect("a million a year, exact"),
    ];
    b.room_in_window(day, Duration::from_secs(10)).await;
    for limit in cases {
        let key = b.fresh_key("large");
        let capacity = limit.capacity();
        assert_eq!(remaining(b, &key, limit).await, capacity, "{limit:?}");
        assert!(check(b, &key, limit, 3).await.allowed(), "{limit:?}");
        let grant = lease(b, &key, limit, 50, 1, 0.5, ms(1000)).await;
        assert_eq!(grant.units, 50, "{limit:?}");
        assert_eq!(remaining(b, &key, limit).await, capacity - 53, "{limit:?}");
        let out = check(b, &key, limit, capacity).await;
        assert!(!out.allowed(), "more than is left is denied: {limit:?}");
        assert!(out.buckets[0].retry_after > Duration::ZERO, "{limit:?}");
    }
}

async fn sliding_window_weights_the_previous_window(b: &Backend) {
    let key = b.fresh_key("sliding");
    let w = Duration::from_secs(2);
    let limit = Limit::sliding_window(10, w).expect("l");
    b.start_of_window(w, ms(2)).await;
    assert_eq!(allowed_in_a_row(b, &key, limit, 12).await, 10);
    // A quarter into the next window, the previous 10 weigh 7.5: room for 2 more (and still
    // 2 for the next 100 ms, so real time passing cannot change the count).
    b.start_of_window(w, ms(500)).await;
    let out = check(b, &key, limit, 0).await;
    assert_eq!(out.buckets[0].remaining, 2);
    assert_eq!(allowed_in_a_row(b, &key, limit, 3).await, 2);
    let denied = check(b, &key, limit, 1).await;
    assert!(!denied.allowed());
    let retry = denied.buckets[0].retry_after;
    // 7.5 + 2 + 1 > 10: the previous window's weight must fall to 7 (at 30% of the window).
    if b.exact_time() {
        assert_eq!(retry, ms(100));
    } else {
        assert!(retry <= ms(100), "{retry:?}");
    }
    b.advance(retry).await;
    assert!(check(b, &key, limit, 1).await.allowed());
}

async fn sliding_log_is_exact(b: &Backend) {
    let key = b.fresh_key("log");
    let w = Duration::from_secs(1);
    let limit = Limit::sliding_window_log(3, w).expect("l");
    assert!(check(b, &key, limit, 2).await.allowed());
    assert!(check(b, &key, limit, 1).await.allowed());
    let denied = check(b, &key, limit, 1).await;
    assert!(!denied.allowed());
    let retry = denied.buckets[0].retry_after;
    assert!(retry <= w && retry > ms(500), "{retry:?}");
    assert_eq!(denied.buckets[0].remaining, 0);
    b.advance(retry + ms(1)).await;
    // The first entry (2 units) has left; the second (1 unit) may or may not have.
    assert!(check(b, &key, limit, 2).await.allowed());
}

// ---- concurrency ---------------------------------------------------------------------------

async fn concurrency_slots_are_held_and_released(b: &Backend) {
    let key = b.fresh_key("conc");
    let limit = Limit::concurrency(2, Duration::from_secs(30)).expect("l");
    let first = check(b, &key, limit, 1).await;
    let second = check(b, &key, limit, 1).await;
    assert!(first.allowed() && second.allowed());
    let (s1, s2) = (
        first.buckets[0].slot.clone().expect("slot"),
        second.buckets[0].slot.clone().expect("slot"),
    );
    assert_ne!(s1, s2);
    let third = check(b, &key, limit, 1).await;
    assert!(!third.allowed());
    assert!(third.buckets[0].slot.is_none());
    assert!(third.buckets[0].retry_after <= Duration::from_secs(30));
    let release = |slot| SlotRelease::new(vec![(key.clone(), limit, slot)]).expect("valid");
    assert_eq!(
        b.store
            .release_slots(&release(s1.clone()))
            .await
            .expect("release"),
        vec![true]
    );
    assert_eq!(
        b.store.release_slots(&release(s1)).await.expect("release"),
        vec![false]
    );
    assert!(check(b, &key, limit, 1).await.allowed());
    assert!(!check(b, &key, limit, 1).await.allowed());
}

async fn crashed_holders_slots_expire(b: &Backend) {
    let key = b.fresh_key("conc-ttl");
    let limit = Limit::concurrency(1, ms(100)).expect("l");
    let held = check(b, &key, limit, 1).await.buckets[0]
        .slot
        .clone()
        .expect("slot");
    assert!(!check(b, &key, limit, 1).await.allowed());
    b.advance(ms(150)).await;
    assert!(check(b, &key, limit, 1).await.allowed());
    let release = SlotRelease::new(vec![(key.clone(), limit, held)]).expect("valid");
    assert_eq!(
        b.store.release_slots(&release).await.expect("release"),
        vec![false]
    );
}

async fn a_renewed_slot_outlives_its_ttl_and_an_expired_one_stays_gone(b: &Backend) {
    let key = b.fresh_key("conc-renew");
    let limit = Limit::concurrency(1, ms(200)).expect("l");
    let held = check(b, &key, limit, 1).await.buckets[0]
        .slot
        .clone()
        .expect("slot");
    let renew = SlotRenew::new(vec![(key.clone(), limit, held.clone())]).expect("valid");
    // Renewed every 100 ms, the slot is held 500 ms past its 200 ms TTL.
    for _ in 0..5 {
        b.advance(ms(100)).await;
        assert_eq!(
            b.store.renew_slots(&renew).await.expect("renew"),
            vec![true]
        );
        assert!(
            !check(b, &key, limit, 1).await.allowed(),
            "the slot is still held"
        );
    }
    // Released, it is not brought back by a renewal.
    let release = SlotRelease::new(vec![(key.clone(), limit, held)]).expect("valid");
    assert_eq!(
        b.store.release_slots(&release).await.expect("release"),
        vec![true]
    );
    assert_eq!(
        b.store.renew_slots(&renew).await.expect("renew"),
        vec![false]
    );
    // Expired (its holder vanished), neither.
    let other = check(b, &key, limit, 1).await.buckets[0]
        .slot
        .clone()
        .expect("slot");
    b.advance(ms(300)).await;
    let late = SlotRenew::new(vec![(key.clone(), limit, other)]).expect("valid");
    assert_eq!(
        b.store.renew_slots(&late).await.expect("renew"),
        vec![false]
    );
    assert!(
        check(b, &key, limit, 1).await.allowed(),
        "the expired slot is free"
    );
    // Only concurrency limits have slots.
    assert!(
        SlotRenew::new(vec![(
            key,
            Limit::token_bucket(1, 1.0).expect("l"),
            SlotId::forged("x")
        )])
        .is_err()
    );
}

async fn a_denied_request_takes_no_slot(b: &Backend) {
    let tb = b.key("mixed", "rate");
    let conc = b.key("mixed", "inflight");
    let (lt, lc) = (
        Limit::token_bucket(1, 0.001).expect("l"),
        Limit::concurrency(5, HOUR).expect("l"),
    );
    let req = || {
        CheckRequest::new(vec![
            CheckItem {
                key: tb.clone(),
                limit: lt,
                cost: 1,
                allowance: None,
                penalized: false,
            },
            CheckItem {
                key: conc.clone(),
                limit: lc,
                cost: 1,
                allowance: None,
                penalized: false,
            },
        ])
        .expect("valid")
    };
    let first = b.store.check(&req()).await.expect("check");
    assert!(first.allowed());
    assert_eq!(first.slots().count(), 1);
    let second = b.store.check(&req()).await.expect("check");
    assert!(!second.allowed());
    assert_eq!(second.slots().count(), 0);
    assert_eq!(remaining(b, &conc, lc).await, 4);
}

// ---- leases --------------------------------------------------------------------------------

async fn lease_takes_units_at_once(b: &Backend) {
    let key = b.fresh_key("lease");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    let g = lease(b, &key, limit, 50, 1, 1.0, Duration::from_secs(1)).await;
    assert_eq!(g.units, 50);
    assert!(g.lease.is_some());
    assert_eq!(g.valid_for, Duration::from_secs(1));
    assert_eq!(g.remaining, 50);
    assert_eq!(remaining(b, &key, limit).await, 50);
    assert_eq!(
        lease(b, &key, limit, 50, 1, 1.0, Duration::from_secs(1))
            .await
            .units,
        50
    );
    let none = lease(b, &key, limit, 50, 1, 1.0, Duration::from_secs(1)).await;
    assert_eq!((none.units, none.lease.is_none()), (0, true));
    assert!(
        none.retry_after > Duration::from_secs(900),
        "{:?}",
        none.retry_after
    );
}

async fn lease_leaves_a_share_for_others(b: &Backend) {
    let key = b.fresh_key("share");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    let grants: Vec<u64> = {
        let mut v = vec![];
        for _ in 0..4 {
            v.push(lease(b, &key, limit, 80, 1, 0.5, HOUR).await.units);
        }
        v
    };
    assert_eq!(grants, vec![50, 25, 12, 6]);
}

async fn lease_counts_the_live_leases_of_its_bucket(b: &Backend) {
    let key = b.fresh_key("holders");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    // Each grant counts itself and the leases before it; a refusal counts those still live.
    let first = lease(b, &key, limit, 10, 1, 1.0, ms(300)).await;
    assert_eq!((first.units, first.live_leases), (10, 1));
    let second = lease(b, &key, limit, 10, 1, 1.0, HOUR).await;
    assert_eq!((second.units, second.live_leases), (10, 2));
    assert!(check(b, &key, limit, 80).await.allowed());
    let refused = lease(b, &key, limit, 10, 1, 1.0, HOUR).await;
    assert_eq!((refused.units, refused.live_leases), (0, 2));
    // An ended lease no longer counts; a returned one neither.
    b.advance(ms(400)).await;
    let id = second.lease.expect("lease");
    assert_eq!(give_back(b, &key, limit, &id, 10).await, 10);
    let after = lease(b, &key, limit, 5, 1, 1.0, HOUR).await;
    assert_eq!((after.units, after.live_leases), (5, 1));
}

async fn warming_up_makes_the_store_answer(b: &Backend) {
    b.store
        .warm_up(Duration::from_secs(5))
        .await
        .expect("warm up");
    let key = b.fresh_key("warm");
    assert!(
        check(b, &key, Limit::token_bucket(1, 1.0).expect("l"), 1)
            .await
            .allowed()
    );
}

async fn lease_needs_its_minimum(b: &Backend) {
    let key = b.fresh_key("min");
    let limit = Limit::token_bucket(10, 1.0).expect("l");
    assert!(check(b, &key, limit, 9).await.allowed());
    let g = lease(b, &key, limit, 5, 2, 1.0, HOUR).await;
    assert_eq!(g.units, 0);
    assert!(
        g.retry_after <= ms(1000) && g.retry_after > ms(500),
        "{:?}",
        g.retry_after
    );
    let g = lease(b, &key, limit, 5, 1, 1.0, HOUR).await;
    assert_eq!(g.units, 1);
}

async fn lease_return_credits_unspent_units_once(b: &Backend) {
    let key = b.fresh_key("return");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    let g = lease(b, &key, limit, 50, 1, 1.0, HOUR).await;
    let id = g.lease.expect("lease");
    assert_eq!(give_back(b, &key, limit, &id, 30).await, 30);
    assert_eq!(remaining(b, &key, limit).await, 80);
    assert_eq!(
        give_back(b, &key, limit, &id, 30).await,
        0,
        "a duplicate return adds nothing"
    );
    assert_eq!(
        give_back(b, &key, limit, &LeaseId::forged("1:50:0:1:00"), 50).await,
        0
    );
    let g = lease(b, &key, limit, 10, 1, 1.0, HOUR).await;
    assert_eq!(
        give_back(b, &key, limit, &g.lease.expect("lease"), 500).await,
        10,
        "capped at the grant"
    );
    assert_eq!(remaining(b, &key, limit).await, 80);
}

// ---- reading and resetting a counter (support) ---------------------------------------------

async fn held_leases_count_the_live_grants(b: &Backend) {
    let key = b.fresh_key("held");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    assert_eq!(
        b.store.held_leases(&key).await.expect("read"),
        HeldLeases::default(),
        "a bucket nobody leased"
    );
    let first = lease(b, &key, limit, 30, 1, 1.0, HOUR).await;
    lease(b, &key, limit, 20, 1, 1.0, HOUR).await;
    lease(b, &key, limit, 5, 1, 1.0, ms(100)).await;
    assert_eq!(
        b.store.held_leases(&key).await.expect("read"),
        HeldLeases {
            leases: 3,
            units: 55
        }
    );
    // A returned lease and an expired one are no longer held.
    give_back(b, &key, limit, &first.lease.expect("lease"), 10).await;
    b.advance(ms(150)).await;
    assert_eq!(
        b.store.held_leases(&key).await.expect("read"),
        HeldLeases {
            leases: 1,
            units: 20
        }
    );
}

async fn a_reset_bucket_is_full_and_its_old_leases_credit_nothing(b: &Backend) {
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    let key = b.fresh_key("reset");
    let g = lease(b, &key, limit, 60, 1, 1.0, HOUR).await;
    assert_eq!(check(b, &key, limit, 30).await.buckets[0].remaining, 10);
    assert!(b.store.reset(&key).await.expect("reset"));
    assert_eq!(remaining(b, &key, limit).await, 100);
    assert_eq!(
        b.store.held_leases(&key).await.expect("read"),
        HeldLeases::default()
    );
    assert_eq!(
        give_back(b, &key, limit, &g.lease.expect("lease"), 60).await,
        0,
        "a lease from before the reset gives nothing back"
    );
    assert_eq!(remaining(b, &key, limit).await, 100);
    assert!(
        !b.store.reset(&key).await.expect("reset"),
        "nothing left to forget"
    );
    // Every algorithm's state goes: a log, a window, held slots.
    let log = Limit::sliding_window_log(3, HOUR).expect("l");
    let key = b.fresh_key("reset-log");
    assert!(check(b, &key, log, 3).await.allowed());
    assert!(b.store.reset(&key).await.expect("reset"));
    assert!(check(b, &key, log, 3).await.allowed());
    let window = Limit::fixed_window(2, HOUR).expect("l");
    let key = b.fresh_key("reset-window");
    assert!(check(b, &key, window, 2).await.allowed());
    assert!(b.store.reset(&key).await.expect("reset"));
    assert!(check(b, &key, window, 2).await.allowed());
    let slots = Limit::concurrency(1, HOUR).expect("l");
    let key = b.fresh_key("reset-slots");
    assert!(check(b, &key, slots, 1).await.allowed());
    assert!(!check(b, &key, slots, 1).await.allowed());
    assert!(b.store.reset(&key).await.expect("reset"));
    assert!(check(b, &key, slots, 1).await.allowed());
    // Another identity's bucket of the same rule is untouched.
    let other = b.fresh_key("reset");
    assert!(check(b, &other, limit, 100).await.allowed());
    assert!(b.store.reset(&b.fresh_key("reset")).await.is_ok());
    assert_eq!(remaining(b, &other, limit).await, 0);
}

async fn late_return_adds_nothing(b: &Backend) {
    let key = b.fresh_key("late");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    let g = lease(b, &key, limit, 40, 1, 1.0, ms(100)).await;
    b.advance(ms(150)).await;
    assert_eq!(
        give_back(b, &key, limit, &g.lease.expect("lease"), 40).await,
        0
    );
    assert_eq!(remaining(b, &key, limit).await, 60);
}

async fn return_never_exceeds_capacity(b: &Backend) {
    let key = b.fresh_key("cap");
    let limit = Limit::token_bucket(10, 1000.0).expect("l");
    let g = lease(b, &key, limit, 10, 1, 1.0, HOUR).await;
    b.advance(ms(30)).await; // refilled to full meanwhile
    give_back(b, &key, limit, &g.lease.expect("lease"), 10).await;
    assert_eq!(
        remaining(b, &key, limit).await,
        10,
        "a return never fills past capacity"
    );
}

async fn window_lease_ends_with_its_window(b: &Backend) {
    let key = b.fresh_key("fw-lease");
    let w = ms(500);
    let limit = Limit::fixed_window(100, w).expect("l");
    b.start_of_window(w, ms(400)).await;
    let g = lease(b, &key, limit, 50, 1, 1.0, Duration::from_secs(1)).await;
    assert_eq!(g.units, 50);
    assert_eq!(
        g.valid_for, g.reset_after,
        "valid exactly until the window ends"
    );
    assert!(g.valid_for <= ms(100));
    let sw = Limit::sliding_window(100, w).expect("l");
    let skey = b.fresh_key("sw-lease");
    let g = lease(b, &skey, sw, 50, 1, 1.0, Duration::from_secs(1)).await;
    assert!(g.valid_for <= ms(100), "{:?}", g.valid_for);
    let log = Limit::sliding_window_log(100, ms(300)).expect("l");
    let lkey = b.fresh_key("log-lease");
    assert_eq!(
        lease(b, &lkey, log, 50, 1, 1.0, Duration::from_secs(1))
            .await
            .valid_for,
        ms(300)
    );
}

async fn window_return_credits_only_its_window(b: &Backend) {
    let key = b.fresh_key("fw-return");
    let w = Duration::from_secs(1);
    let limit = Limit::fixed_window(10, w).expect("l");
    b.start_of_window(w, ms(10)).await;
    let g = lease(b, &key, limit, 6, 1, 1.0, HOUR).await;
    assert_eq!(remaining(b, &key, limit).await, 4);
    assert_eq!(
        give_back(b, &key, limit, &g.lease.expect("lease"), 4).await,
        4
    );
    assert_eq!(remaining(b, &key, limit).await, 8);
    // A lease from this window, returned after it ended, adds nothing to the next one.
    let g = lease(b, &key, limit, 5, 1, 1.0, HOUR).await;
    b.start_of_window(w, ms(10)).await;
    assert!(check(b, &key, limit, 10).await.allowed());
    assert_eq!(
        give_back(b, &key, limit, &g.lease.expect("lease"), 5).await,
        0
    );
    assert_eq!(remaining(b, &key, limit).await, 0);
}

async fn log_lease_return_shrinks_its_entry(b: &Backend) {
    let key = b.fresh_key("log-return");
    let limit = Limit::sliding_window_log(10, HOUR).expect("l");
    let g = lease(b, &key, limit, 8, 1, 1.0, Duration::from_secs(60)).await;
    assert_eq!(remaining(b, &key, limit).await, 2);
    assert_eq!(
        give_back(b, &key, limit, &g.lease.expect("lease"), 5).await,
        5
    );
    assert_eq!(remaining(b, &key, limit).await, 7);
    assert_eq!(allowed_in_a_row(b, &key, limit, 8).await, 7);
}

// ---- debit ---------------------------------------------------------------------------------

async fn debit_can_drive_a_bucket_into_debt(b: &Backend) {
    let key = b.fresh_key("debt");
    let limit = Limit::token_bucket(10, 10.0).expect("l");
    assert_eq!(debit(b, &key, limit, 15, None).await, 15);
    let out = check(b, &key, limit, 1).await;
    assert!(!out.allowed());
    assert_eq!(out.buckets[0].remaining, 0);
    let retry = out.buckets[0].retry_after;
    assert!(retry <= ms(600) && retry > ms(450), "{retry:?}");
    // About 5 of debt left before the floor (more as the bucket refills meanwhile): what a
    // debit says it took is what the floor let in.
    let taken = debit(b, &key, limit, 1000, None).await;
    assert!((5..=7).contains(&taken), "{taken} taken of 1000");
    let floor = check(b, &key, limit, 1).await.buckets[0].retry_after;
    assert!(
        floor <= ms(1100) && floor > ms(950),
        "debt is floored at one bucket: {floor:?}"
    );
}

async fn debit_lands_in_its_own_window(b: &Backend) {
    let w = Duration::from_secs(2);
    let fw = Limit::fixed_window(10, w).expect("l");
    let sw = Limit::sliding_window(10, w).expect("l");
    let log = Limit::sliding_window_log(10, w).expect("l");
    b.start_of_window(w, ms(10)).await;
    let now = b.now();
    let old = now - 2 * w.as_micros() as u64;
    let previous = now - w.as_micros() as u64;
    let (kf, ks, kl) = (
        b.fresh_key("d-fw"),
        b.fresh_key("d-sw"),
        b.fresh_key("d-log"),
    );
    assert_eq!(debit(b, &kf, fw, 4, Some(old)).await, 0);
    assert_eq!(debit(b, &kf, fw, 4, Some(previous)).await, 0);
    assert_eq!(debit(b, &kf, fw, 4, None).await, 4);
    assert_eq!(
        debit(b, &kf, fw, 1, Some(now + 10_000_000)).await,
        1,
        "a future time counts as now"
    );
    assert_eq!(remaining(b, &kf, fw).await, 5);
    assert_eq!(debit(b, &ks, sw, 4, Some(old)).await, 0);
    assert_eq!(debit(b, &ks, sw, 8, Some(previous)).await, 8);
    // 8 from the previous window, still weighing almost fully (7.96): 2 units of room.
    assert_eq!(remaining(b, &ks, sw).await, 2);
    assert_eq!(debit(b, &kl, log, 3, Some(old)).await, 0);
    assert_eq!(debit(b, &kl, log, 3, Some(now - 1_000_000)).await, 3);
    assert_eq!(remaining(b, &kl, log).await, 7);
}

async fn debit_once_applies_running_totals_as_a_max(b: &Backend) {
    let key = b.fresh_key("once");
    let limit = Limit::token_bucket(100, 0.001).expect("l");
    let until = b.now() + 60_000_000;
    // Totals 5, 5 (a duplicate), 3 (an older one, late), 9: 9 in all.
    assert_eq!(debit_once(b, &key, limit, "us/1", until, 5, None).await, 5);
    assert_eq!(debit_once(b, &key, limit, "us/1", until, 5, None).await, 0);
    assert_eq!(debit_once(b, &key, limit, "us/1", until, 3, None).await, 0);
    assert_eq!(debit_once(b, &key, limit, "us/1", until, 9, None).await, 4);
    // Another origin (or the same node restarted) and another epoch count apart.
    assert_eq!(debit_once(b, &key, limit, "us/2", until, 6, None).await, 6);
    assert_eq!(
        debit_once(b, &key, limit, "us/1", until + 1, 2, None).await,
        2
    );
    assert_eq!(remaining(b, &key, limit).await, 100 - 9 - 6 - 2);
    // An epoch that has ended applies nothing, however large its total.
    let ended = b.now() - 1;
    assert_eq!(debit_once(b, &key, limit, "us/3", ended, 50, None).await, 0);
    assert_eq!(remaining(b, &key, limit).await, 83);
}

async fn debit_once_keeps_to_the_window_of_consumption(b: &Backend) {
    let w = Duration::from_secs(2);
    let fw = Limit::fixed_window(10, w).expect("l");
    b.start_of_window(w, ms(10)).await;
    let now = b.now();
    let window_end = now - now % w.as_micros() as u64 + w.as_micros() as u64;
    let previous = now - w.as_micros() as u64;
    let key = b.fresh_key("once-fw");
    // Consumed in the window before: recorded, never applied, and not applied later either.
    assert_eq!(
        debit_once(b, &key, fw, "eu/1", window_end, 4, Some(previous)).await,
        0
    );
    assert_eq!(
        debit_once(b, &key, fw, "eu/1", window_end, 4, None).await,
        0,
        "a total already recorded"
    );
    assert_eq!(
        debit_once(b, &key, fw, "eu/1", window_end, 7, None).await,
        3
    );
    assert_eq!(remaining(b, &key, fw).await, 7);
}

// ---- hostile input -------------------------------------------------------------------------

async fn hostile_identities_keep_separate_counters(b: &Backend) {
    let limit = Limit::token_bucket(3, 0.001).expect("l");
    let prefix = format!("{}-hostile", b.now());
    let big = vec![b'x'; tollgate_lease::key::MAX_IDENTITY_BYTES - prefix.len()];
    let identities: Vec<&[u8]> = vec![
        b"{}",
        b"foo{}{bar}",
        b"\r\n",
        b"\xff\xfe\x00",
        b"",
        b"%",
        b"a:b",
        &big,
    ];
    let keys: Vec<BucketKey> = identities
        .iter()
        .map(|id| BucketKey::new(&[prefix.as_bytes(), id].concat(), "r").expect("key"))
        .collect();
    for key in &keys {
        assert!(check(b, key, limit, 3).await.allowed(), "{key}");
    }
    for key in &keys {
        assert!(!check(b, key, limit, 1).await.allowed(), "{key}");
    }
}

async fn largest_cost_is_exact(b: &Backend) {
    let key = b.fresh_key("huge");
    let max = tollgate_lease::limit::MAX_UNITS;
    let w = Duration::from_secs(10);
    let limit = Limit::fixed_window(max, w).expect("l");
    b.room_in_window(w, Duration::from_secs(2)).await;
    assert!(check(b, &key, limit, max - 1).await.allowed());
    assert!(check(b, &key, limit, 1).await.allowed());
    assert!(!check(b, &key, limit, 1).await.allowed());
}

/// Instantiates every case for the memory, linked (memory behind the simulations' link) and
/// single-Redis backends (one test each), and runs
/// all of them in one test against one cluster (forming a cluster takes seconds).
/// A check of one unit of `key`'s bucket, marked as under a penalty.
fn penalized_check(key: &BucketKey, limit: Limit) -> CheckRequest {
    let item = CheckItem::new(key.clone(), limit, 1).with_penalty(true);
    CheckRequest::new(vec![item]).expect("valid request")
}

fn allowance(interval: Duration) -> Allowance {
    Allowance {
        region: "us".into(),
        interval_us: interval.as_micros() as u64,
        unknown_share: 0.5,
    }
}

async fn lease_under(b: &Backend, key: &BucketKey, limit: Limit, a: &Allowance) -> LeaseGrant {
    let req = LeaseRequest::new(
        vec![LeaseAsk {
            key: key.clone(),
            limit,
            want: limit.capacity(),
            min: 1,
            max_share: 1.0,
            allowance: Some(a.clone()),
            penalized: false,
        }],
        HOUR,
    )
    .expect("valid lease request");
    b.store.acquire_leases(&req).await.expect("lease").remove(0)
}

async fn report(b: &Backend, key: &BucketKey, region: &str, origin: &str, units: u64) {
    let req = DemandRequest::new(vec![DemandReport {
        key: key.clone(),
        origin: origin.into(),
        region: region.into(),
        units,
        interval_us: 10_000_000,
    }])
    .expect("valid report");
    b.store.report_demand(&req).await.expect("report");
}

async fn allowance_splits_a_burst_and_follows_demand(b: &Backend) {
    let key = b.fresh_key("synced");
    let limit = Limit::token_bucket(600, 10.0).expect("limit");
    let a = allowance(Duration::from_secs(10));
    // Nothing known of the peer: the cautious half.
    let first = lease_under(b, &key, limit, &a).await;
    assert_eq!(first.units, 300, "{first:?}");
    // Both regions report: 100 here against 300 there, a quarter: its 150 are spent.
    report(b, &key, "us", "us/1", 100).await;
    report(b, &key, "eu", "eu/1", 300).await;
    let held = lease_under(b, &key, limit, &a).await;
    assert_eq!(held.units, 0, "{held:?}");
    assert!(held.retry_after > Duration::ZERO);
    // Demand here triples (another node reports): 900 against 300, three quarters, and the
    // used tokens carry over: 450 − 300 at once.
    report(b, &key, "us", "us/2", 800).await;
    let more = lease_under(b, &key, limit, &a).await;
    assert!((150..=152).contains(&more.units), "{more:?}");
    // A return gives the units back to the allowance as well as to the view.
    let req = ReturnRequest::new(vec![LeaseReturn {
        key: key.clone(),
        limit,
        lease: more.lease.clone().expect("lease"),
        unspent: more.units,
        allowance: Some(a.clone()),
    }])
    .expect("valid return");
    assert_eq!(
        b.store.return_leases(&req).await.expect("return"),
        vec![more.units]
    );
    let again = lease_under(b, &key, limit, &a).await;
    assert!((150..=153).contains(&again.units), "{again:?}");
}

async fn an_idle_peer_leaves_nearly_everything(b: &Backend) {
    let key = b.fresh_key("synced");
    let limit = Limit::token_bucket(600, 10.0).expect("limit");
    let a = allowance(Duration::from_millis(100));
    assert_eq!(lease_under(b, &key, limit, &a).await.units, 300);
    // No report from the peer for an interval and a second: it is idle; the share rises to
    // 95 %, the 300 used carry over (570 − 300, plus the refill at the new rate).
    // (A gap longer than the horizon, 1.2 s here, would start a new stretch of asking.)
    b.advance(Duration::from_millis(1_150)).await;
    let rest = lease_under(b, &key, limit, &a).await;
    assert!((279..=284).contains(&rest.units), "{rest:?}");
}

fn penalty(after: u64, within: Duration, block: Duration) -> Penalty {
    Penalty::new(after, within, block).expect("penalty")
}

async fn a_penalty_blocks_at_its_count_and_a_blocked_identity_spends_nothing(b: &Backend) {
    let limit = Limit::token_bucket(10, 0.001).expect("l");
    let key = b.fresh_key("penalty");
    let p = penalty(3, HOUR, Duration::from_secs(2));
    let s = b.store.note_denials(&key, &p, 2, None).await.expect("note");
    assert_eq!((s.denials, s.blocked(), s.started), (2, false, false));
    let s = b.store.note_denials(&key, &p, 1, None).await.expect("note");
    assert!(s.started && s.blocked(), "{s:?}");
    assert_eq!(s.denials, 0, "a block clears the count");
    if b.exact_time() {
        assert_eq!(s.blocked_for, Duration::from_secs(2));
    }
    // A penalized check is denied, says so, and consumes nothing.
    let req = penalized_check(&key, limit);
    let out = b.store.check(&req).await.expect("check");
    let status = &out.buckets[0];
    assert!(!out.allowed() && !status.blocked_for.is_zero(), "{out:?}");
    assert!(status.retry_after >= status.blocked_for);
    assert!(
        status.retry_after > Duration::from_secs(1) && status.retry_after <= Duration::from_secs(2),
        "{status:?}"
    );
    assert_eq!(status.remaining, 10, "the bucket itself has room");
    assert_eq!(remaining(b, &key, limit).await, 10, "nothing was consumed");
    // So is a lease, and nothing is taken.
    let ask = LeaseAsk {
        key: key.clone(),
        limit,
        want: 5,
        min: 1,
        max_share: 1.0,
        allowance: None,
        penalized: true,
    };
    let req = LeaseRequest::new(vec![ask], ms(500)).expect("lease");
    let grant = &b.store.acquire_leases(&req).await.expect("lease")[0];
    assert_eq!(grant.units, 0, "{grant:?}");
    assert!(grant.blocked_for > Duration::from_secs(1), "{grant:?}");
    assert!(grant.retry_after > Duration::from_secs(1), "{grant:?}");
    assert_eq!(remaining(b, &key, limit).await, 10);
    // A caller that does not mark the item (a rule without the penalty) is not blocked.
    assert!(check(b, &key, limit, 1).await.allowed());
    // Denials during the block are not counted.
    let s = b
        .store
        .note_denials(&key, &p, 50, None)
        .await
        .expect("note");
    assert!(s.blocked() && !s.started);
    // The block ends on time, and the identity starts from a clean count.
    b.advance(Duration::from_millis(2_100)).await;
    let req = penalized_check(&key, limit);
    let out = b.store.check(&req).await.expect("check");
    assert!(
        out.allowed() && out.buckets[0].blocked_for.is_zero(),
        "{out:?}"
    );
    let s = b.store.penalty_standing(&key, &p).await.expect("read");
    assert_eq!(s, PenaltyState::default());
}

async fn penalty_denials_from_many_callers_add_up_to_one_block(b: &Backend) {
    let key = b.fresh_key("penalty-many");
    let p = penalty(10, HOUR, HOUR);
    let store = Arc::new(b.store.clone());
    let calls: Vec<_> = (0..25)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.note_denials(&key, &p, 1, None).await.expect("note") })
        })
        .collect();
    let mut states: Vec<PenaltyState> = vec![];
    for call in calls {
        states.push(call.await.expect("joined"));
    }
    assert_eq!(states.iter().filter(|s| s.started).count(), 1, "{states:?}");
    assert_eq!(
        states.iter().filter(|s| s.blocked()).count(),
        16,
        "{states:?}"
    );
    let mut counted: Vec<u64> = states
        .iter()
        .filter(|s| !s.blocked())
        .map(|s| s.denials)
        .collect();
    counted.sort_unstable();
    assert_eq!(
        counted,
        (1..=9).collect::<Vec<_>>(),
        "each denial counted once"
    );
    // A reset of the key lifts the block.
    assert!(b.store.reset(&key).await.expect("reset"));
    assert!(
        !b.store
            .penalty_standing(&key, &p)
            .await
            .expect("read")
            .blocked()
    );
}

async fn a_shadow_penalty_is_counted_apart_and_never_enforced(b: &Backend) {
    let limit = Limit::token_bucket(10, 0.001).expect("l");
    let key = b.fresh_key("penalty-shadow");
    let p = penalty(2, HOUR, HOUR);
    let s = b
        .store
        .note_denials(&key, &p.shadowed(), 5, None)
        .await
        .expect("note");
    assert!(
        s.started,
        "a shadow penalty blocks in its own record: {s:?}"
    );
    // The rule turned ENFORCE: its own record is clean, and nothing refuses the identity.
    assert_eq!(
        b.store.penalty_standing(&key, &p).await.expect("read"),
        PenaltyState::default()
    );
    let req = penalized_check(&key, limit);
    assert!(b.store.check(&req).await.expect("check").allowed());
    assert!(b.store.reset(&key).await.expect("reset"));
    assert!(
        !b.store
            .penalty_standing(&key, &p.shadowed())
            .await
            .expect("read")
            .blocked()
    );
}

async fn penalty_denials_count_within_their_window(b: &Backend) {
    let key = b.fresh_key("penalty-window");
    let p = penalty(3, Duration::from_secs(1), HOUR);
    b.store.note_denials(&key, &p, 2, None).await.expect("note");
    b.advance(Duration::from_millis(1_100)).await;
    let s = b.store.note_denials(&key, &p, 1, None).await.expect("note");
    assert_eq!(
        (s.denials, s.blocked()),
        (1, false),
        "the first window ended"
    );
    let s = b.store.note_denials(&key, &p, 2, None).await.expect("note");
    assert!(s.started, "{s:?}");
}

async fn denials_from_before_a_lift_count_nothing_after_it(b: &Backend) {
    let key = b.fresh_key("penalty-epoch");
    let p = penalty(3, HOUR, HOUR);
    // A node that has heard of no lift counts under epoch 0.
    let s = b
        .store
        .note_denials(&key, &p, 2, Some(0))
        .await
        .expect("note");
    assert_eq!((s.denials, s.epoch), (2, 0));
    let lift = b.store.lift_block(&key).await.expect("lift");
    assert!(!lift.was_blocked && lift.epoch > 0, "{lift:?}");
    // Denials handed out before the lift and flushed after it count nothing, however many;
    // the answer says the epoch, so the node counts its next ones under it.
    let s = b
        .store
        .note_denials(&key, &p, 5, Some(0))
        .await
        .expect("note");
    assert_eq!((s.denials, s.blocked(), s.epoch), (0, false, lift.epoch));
    let s = b
        .store
        .note_denials(&key, &p, 2, Some(lift.epoch))
        .await
        .expect("note");
    assert_eq!((s.denials, s.epoch), (2, lift.epoch));
    // A reset starts another epoch too.
    assert!(b.store.reset(&key).await.expect("reset"));
    let s = b
        .store
        .note_denials(&key, &p, 3, Some(lift.epoch))
        .await
        .expect("note");
    assert!(
        !s.blocked() && s.denials == 0 && s.epoch > lift.epoch,
        "{s:?}"
    );
    let again = b.store.lift_block(&key).await.expect("lift");
    assert!(
        again.epoch > s.epoch,
        "an epoch never comes back: {again:?}"
    );
    // Denials under the store's epoch block as ever, and the lift says it lifted a block.
    let s = b
        .store
        .note_denials(&key, &p, 3, Some(again.epoch))
        .await
        .expect("note");
    assert!(s.started, "{s:?}");
    assert!(b.store.lift_block(&key).await.expect("lift").was_blocked);
}

/// Reserves 1 of `limit` for `key` and settles 25 (10 a window, the limit: 15 past it); the
/// denial's Retry-After and reset for one more unit.
async fn settle_past_the_limit(b: &Backend, key: &BucketKey, limit: Limit) -> (Duration, Duration) {
    assert!(reserve(b, key, limit, 1, "under", HOUR).await.allowed());
    assert_eq!(
        settle(b, key, limit, "under", 25).await,
        Settlement::Settled {
            refunded: 0,
            charged: 24
        }
    );
    let denied = check(b, key, limit, 1).await;
    assert!(!denied.allowed());
    (denied.buckets[0].retry_after, denied.buckets[0].reset_after)
}

/// A settlement's excess past a fixed window's limit is a debt: it carries into the windows
/// after it (a limit's worth paid off by each), and the Retry-After says which has room.
async fn a_fixed_windows_debt_carries_into_the_windows_after_it(b: &Backend) {
    let key = b.fresh_key("fixed-debt");
    let w = Duration::from_secs(1);
    let limit = Limit::fixed_window(10, w).expect("l");
    b.start_of_window(w, ms(5)).await;
    // 25 counted against 10: the next window starts at 15 (full), the one after at 5.
    let (retry, reset) = settle_past_the_limit(b, &key, limit).await;
    if b.exact_time() {
        assert_eq!(retry, ms(1_995), "room in the window after next");
        assert_eq!(
            reset,
            ms(2_995),
            "nothing left of the debt after three windows"
        );
    } else {
        assert!(retry > ms(1_500) && retry <= ms(1_995), "{retry:?}");
        assert!(reset > ms(2_500) && reset <= ms(2_995), "{reset:?}");
    }
    b.advance(ms(1_000)).await;
    assert!(!check(b, &key, limit, 1).await.allowed(), "still in debt");
    b.advance(retry.saturating_sub(ms(1_000)) + ms(1)).await;
    assert_eq!(allowed_in_a_row(b, &key, limit, 10).await, 5);
}

/// The same for a sliding window: past the limit, a count carries on a limit's worth a window
/// (the decaying part), the rest still counted in the next window.
async fn a_sliding_windows_debt_carries_into_the_windows_after_it(b: &Backend) {
    let key = b.fresh_key("sliding-debt");
    let w = Duration::from_secs(1);
    let limit = Limit::sliding_window(10, w).expect("l");
    b.start_of_window(w, ms(5)).await;
    // 25 counted against 10: the next window counts 10 decaying and 15, the one after 10 and
    // 5, where one unit fits once 4 of the decaying 10 are gone (60 % into it).
    let (retry, reset) = settle_past_the_limit(b, &key, limit).await;
    if b.exact_time() {
        assert_eq!(retry, ms(2_595), "room 60 % into the window after next");
        assert_eq!(
            reset,
            ms(3_995),
            "the debt counted three windows, the last of them decays"
        );
    } else {
        assert!(retry > ms(2_100) && retry <= ms(2_595), "{retry:?}");
        assert!(reset > ms(3_500) && reset <= ms(3_995), "{reset:?}");
    }
    b.advance(ms(1_000)).await;
    assert!(!check(b, &key, limit, 1).await.allowed(), "still in debt");
    b.advance(ms(1_000)).await;
    assert!(
        !check(b, &key, limit, 1).await.allowed(),
        "the decaying part still fills it"
    );
    b.advance(retry.saturating_sub(ms(2_000)) + ms(1)).await;
    assert!(
        check(b, &key, limit, 1).await.allowed(),
        "room at the retry"
    );
}

/// And for the log: what is owed past the limit is dated a window on for each limit's worth,
/// so it counts until paid.
async fn a_logs_debt_counts_until_it_is_paid(b: &Backend) {
    let key = b.fresh_key("log-debt");
    let limit = Limit::sliding_window_log(10, Duration::from_secs(1)).expect("l");
    // 25 against 10: 10 count from now, the 15 owed from 2 s on, for a window.
    let (retry, reset) = settle_past_the_limit(b, &key, limit).await;
    if b.exact_time() {
        assert_eq!(retry, ms(3_000), "room when the debt's entry leaves");
        assert_eq!(reset, ms(3_000));
    } else {
        assert!(retry > ms(2_500) && retry <= ms(3_000), "{retry:?}");
        assert!(reset > ms(2_500) && reset <= ms(3_000), "{reset:?}");
    }
    b.advance(ms(1_500)).await;
    assert!(
        !check(b, &key, limit, 1).await.allowed(),
        "the debt still counts"
    );
    b.advance(retry.saturating_sub(ms(1_500)) + ms(1)).await;
    assert_eq!(allowed_in_a_row(b, &key, limit, 10).await, 10);
}

/// Calls the busy single Redis keeps in flight beside a case's.
const BUSY_LOOPS: usize = 2;
/// The busy cluster's: enough identities that every one of its 3 shards is busy.
const CLUSTER_BUSY_LOOPS: usize = 32;

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $case() { super::$case(&super::Backend::memory()).await } )*
        }
        mod linked {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $case() { super::$case(&super::Backend::linked()).await } )*
        }
        mod redis_single {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $case() { super::$case(&super::Backend::redis().await).await } )*
        }
        /// Every case again on a busy Redis: its checks and lease asks go in batches.
        mod redis_busy {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $case() {
                   super::$case(&super::Backend::redis().await.busy(super::BUSY_LOOPS)).await
               } )*
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_passes_every_case() {
            let backend = Backend::cluster().await;
            $(
                eprintln!("cluster case: {}", stringify!($case));
                $case(&backend).await;
            )*
        }
        /// Every case again on a busy cluster: batches of several slots of one node.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn busy_redis_cluster_passes_every_case() {
            let backend = Backend::cluster().await;
            // The slot map known (a node reads it at start): a cluster batches only then.
            backend.store.warm_up(Duration::from_secs(10)).await.expect("warm up");
            let backend = backend.busy(CLUSTER_BUSY_LOOPS);
            $(
                eprintln!("busy cluster case: {}", stringify!($case));
                $case(&backend).await;
            )*
            let counts = backend.store.batch_counts().expect("batching on");
            eprintln!("busy cluster: {counts:?}");
            assert!(counts.batches > 0, "{counts:?}");
        }
    };
}

conformance!(
    seed_twelve_calls,
    seed_two_hundred_concurrent_clients,
    all_rules_or_none,
    denied_request_spends_nothing,
    cost_zero_peeks,
    peek_tells_when_a_cost_fits_without_spending,
    token_bucket_refills_over_time,
    token_bucket_retry_is_exact_for_a_large_cost,
    lowered_capacity_applies_at_once,
    changing_algorithm_starts_fresh,
    gcra_admits_its_burst_then_one_per_interval,
    gcra_leases_returns_and_debits,
    gcra_returns_never_move_the_tat_behind_now,
    gcra_keeps_its_tat_when_its_parameters_change,
    leaky_bucket_fills_to_its_burst_and_leaks,
    leaky_bucket_leases_returns_and_debits,
    a_leaky_bucket_keeps_its_level_when_its_limit_changes,
    a_settle_below_the_estimate_gives_the_rest_back_once,
    a_settle_above_the_estimate_charges_the_excess_into_debt,
    a_refund_never_raises_a_bucket_above_capacity,
    an_expired_reservation_stays_charged_and_a_late_settle_charges_only_excess,
    a_denied_reservation_records_nothing,
    a_window_reservation_refunds_only_into_its_own_window,
    a_log_reservation_shrinks_its_own_entry,
    concurrent_settles_of_one_reservation_apply_once,
    a_reset_forgets_reservations,
    fixed_window_counts_and_resets,
    fixed_window_of_a_day,
    large_window_limits_count_exactly,
    sliding_window_weights_the_previous_window,
    sliding_log_is_exact,
    concurrency_slots_are_held_and_released,
    crashed_holders_slots_expire,
    a_denied_request_takes_no_slot,
    a_renewed_slot_outlives_its_ttl_and_an_expired_one_stays_gone,
    lease_takes_units_at_once,
    lease_leaves_a_share_for_others,
    lease_needs_its_minimum,
    lease_counts_the_live_leases_of_its_bucket,
    warming_up_makes_the_store_answer,
    lease_return_credits_unspent_units_once,
    held_leases_count_the_live_grants,
    a_reset_bucket_is_full_and_its_old_leases_credit_nothing,
    late_return_adds_nothing,
    return_never_exceeds_capacity,
    window_lease_ends_with_its_window,
    window_return_credits_only_its_window,
    log_lease_return_shrinks_its_entry,
    debit_can_drive_a_bucket_into_debt,
    debit_lands_in_its_own_window,
    debit_once_applies_running_totals_as_a_max,
    debit_once_keeps_to_the_window_of_consumption,
    hostile_identities_keep_separate_counters,
    largest_cost_is_exact,
    allowance_splits_a_burst_and_follows_demand,
    an_idle_peer_leaves_nearly_everything,
    a_penalty_blocks_at_its_count_and_a_blocked_identity_spends_nothing,
    penalty_denials_from_many_callers_add_up_to_one_block,
    penalty_denials_count_within_their_window,
    denials_from_before_a_lift_count_nothing_after_it,
    a_fixed_windows_debt_carries_into_the_windows_after_it,
    a_sliding_windows_debt_carries_into_the_windows_after_it,
    a_logs_debt_counts_until_it_is_paid,
    a_shadow_penalty_is_counted_apart_and_never_enforced,
);
