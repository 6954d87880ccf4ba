//! Idle keys vanish: each key's TTL is the time its state needs to become neutral (a bucket
//! refilled from empty, a window over, the last entry gone) plus a one-second margin.

mod support;

use std::time::Duration;

use support::{Backend, check1};
use tollgate_lease::{LeaseAsk, LeaseRequest, LeaseStore, Limit};

fn pttl(backend: &Backend, key: &str) -> i64 {
    let server = backend.redis.as_ref().expect("redis backend");
    server
        .cli(&["PTTL", key])
        .expect("pttl")
        .trim()
        .parse()
        .expect("number")
}

#[tokio::test]
async fn redis_keys_live_until_their_state_is_neutral_plus_a_margin() {
    let b = Backend::redis().await;
    let tb = Limit::token_bucket(10, 5.0).expect("l"); // empty → full in 2 s
    let key = b.fresh_key("ttl-tb");
    b.store.check(&check1(&key, tb, 10)).await.expect("check");
    let ttl = pttl(&b, key.as_str());
    assert!((2_900..=3_000).contains(&ttl), "token bucket PTTL {ttl}");

    let w = Duration::from_secs(60);
    b.room_in_window(w, Duration::from_secs(5)).await;
    let fw = Limit::fixed_window(10, w).expect("l");
    let fkey = b.fresh_key("ttl-fw");
    b.store.check(&check1(&fkey, fw, 1)).await.expect("check");
    let to_end = 60_000 - (b.now() / 1000 % 60_000) as i64;
    let ttl = pttl(&b, fkey.as_str());
    assert!(
        (ttl - (to_end + 1000)).abs() <= 50,
        "fixed window PTTL {ttl}, window ends in {to_end}"
    );

    let sw = Limit::sliding_window(10, w).expect("l");
    let skey = b.fresh_key("ttl-sw");
    b.store.check(&check1(&skey, sw, 1)).await.expect("check");
    let ttl = pttl(&b, skey.as_str());
    assert!(
        (ttl - (to_end + 61_000)).abs() <= 50,
        "sliding window PTTL {ttl}"
    );

    let log = Limit::sliding_window_log(10, Duration::from_secs(5)).expect("l");
    let lkey = b.fresh_key("ttl-log");
    b.store.check(&check1(&lkey, log, 1)).await.expect("check");
    let ttl = pttl(&b, &format!("{lkey}:log"));
    assert!((5_900..=6_000).contains(&ttl), "log PTTL {ttl}");

    let lease_key = b.fresh_key("ttl-lease");
    let ask = LeaseAsk {
        key: lease_key.clone(),
        limit: tb,
        want: 5,
        min: 1,
        max_share: 1.0,
    };
    b.store
        .acquire_leases(&LeaseRequest::new(vec![ask], Duration::from_secs(1)).expect("req"))
        .await
        .expect("lease");
    let ttl = pttl(&b, &format!("{lease_key}:leases"));
    assert!((1_900..=2_000).contains(&ttl), "lease table PTTL {ttl}");
}

#[tokio::test]
async fn memory_keys_are_swept_once_expired() {
    let b = Backend::memory();
    let tollgate_lease::Store::Memory(store) = &b.store else {
        unreachable!()
    };
    let tb = Limit::token_bucket(10, 5.0).expect("l");
    for i in 0..100 {
        let key = b.key(&format!("idle-{i}"), "r");
        b.store.check(&check1(&key, tb, 10)).await.expect("check");
    }
    assert_eq!(store.len(), 100);
    b.advance(Duration::from_millis(2_999)).await;
    store.purge_expired();
    assert_eq!(
        store.len(),
        100,
        "not yet: 2 s to refill plus the 1 s margin"
    );
    b.advance(Duration::from_millis(2)).await;
    store.purge_expired();
    assert!(store.is_empty());
}

#[tokio::test]
async fn a_full_memory_store_refuses_new_keys_with_a_transient_error() {
    use std::sync::Arc;
    use tollgate_lease::{ManualClock, MemoryConfig, MemoryStore};
    let clock = ManualClock::new(support::MEMORY_EPOCH);
    let store = MemoryStore::with_clock(
        Arc::new(clock.clone()),
        MemoryConfig {
            shards: 1,
            max_keys: 10,
            id_seed: None,
        },
    );
    let tb = Limit::token_bucket(10, 5.0).expect("l");
    let key =
        |i: usize| tollgate_lease::BucketKey::new(format!("k{i}").as_bytes(), "r").expect("key");
    for i in 0..10 {
        store.check(&check1(&key(i), tb, 1)).await.expect("room");
    }
    let err = store
        .check(&check1(&key(10), tb, 1))
        .await
        .expect_err("full");
    assert!(err.is_transient(), "{err}");
    // Known keys still work, and expired keys make room again.
    store
        .check(&check1(&key(3), tb, 1))
        .await
        .expect("existing key");
    clock.advance(Duration::from_secs(5));
    store
        .check(&check1(&key(10), tb, 1))
        .await
        .expect("room after expiry");
}
