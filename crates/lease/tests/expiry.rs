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
        allowance: None,
        penalized: false,
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

/// A store of `max_bytes` on a manual clock, one shard (so every key competes for it).
fn small_store(max_bytes: usize) -> (tollgate_lease::MemoryStore, tollgate_lease::ManualClock) {
    use std::sync::Arc;
    use tollgate_lease::{ManualClock, MemoryConfig, MemoryStore};
    let clock = ManualClock::new(support::MEMORY_EPOCH);
    let store = MemoryStore::with_clock(
        Arc::new(clock.clone()),
        MemoryConfig {
            shards: 1,
            max_bytes,
            id_seed: None,
        },
    );
    (store, clock)
}

fn key_of(identity: &str, rule: &str) -> tollgate_lease::BucketKey {
    tollgate_lease::BucketKey::new(identity.as_bytes(), rule).expect("key")
}

/// What the store counts one token bucket of a short identity as.
async fn bytes_per_key() -> usize {
    let (store, _) = small_store(1 << 20);
    let tb = Limit::token_bucket(10, 5.0).expect("l");
    store
        .check(&check1(&key_of("k0", "flood"), tb, 1))
        .await
        .expect("room");
    store.bytes()
}

/// A flood of new keys under one rule fills the store: the store evicts that rule's keys, the
/// ones that expire soonest first, and never refuses; another rule's keys keep their state and
/// a new key under it is decided by the store.
#[tokio::test]
async fn a_full_memory_store_evicts_the_rule_holding_the_most_soonest_expiring_first() {
    let per_key = bytes_per_key().await;
    let max_bytes = 60 * per_key;
    let (store, clock) = small_store(max_bytes);
    let tb = Limit::token_bucket(10, 5.0).expect("l");
    // Ten keys of a steady rule (slow to refill), half spent.
    let slow = Limit::token_bucket(10, 0.01).expect("l");
    for i in 0..10 {
        let key = key_of(&format!("steady-{i}"), "steady");
        store.check(&check1(&key, slow, 5)).await.expect("room");
    }
    // A thousand new keys under the flooding rule, a millisecond apart: none refused.
    for i in 0..1000 {
        let key = key_of(&format!("flood-{i}"), "flood");
        store
            .check(&check1(&key, tb, 1))
            .await
            .unwrap_or_else(|e| panic!("flood key {i} refused: {e}"));
        clock.advance(Duration::from_millis(1));
        assert!(
            store.bytes() <= max_bytes,
            "{} > {max_bytes}",
            store.bytes()
        );
    }
    assert!(store.evictions() >= 900, "{} evicted", store.evictions());
    let remaining = |key, limit| {
        let store = store.clone();
        async move {
            let peek = check1(&key, limit, 1).peek();
            store.check(&peek).await.expect("peek").buckets[0].remaining
        }
    };
    for i in 0..10 {
        let key = key_of(&format!("steady-{i}"), "steady");
        assert_eq!(remaining(key, slow).await, 5, "steady-{i} kept its state");
    }
    // The oldest flood keys went; the newest is still counted (9 of 10 left).
    assert_eq!(remaining(key_of("flood-0", "flood"), tb).await, 10);
    assert_eq!(remaining(key_of("flood-999", "flood"), tb).await, 9);
    // A new key under another rule is decided by the store.
    let other = key_of("someone-new", "other");
    let status = &store
        .check(&check1(&other, tb, 10))
        .await
        .expect("room")
        .buckets[0];
    assert!(status.allowed);
    assert_eq!(status.remaining, 0);
}

/// Only an identity whose own keys fill the store is refused (a transient error); others'
/// new keys still find room, and expired keys make room again.
#[tokio::test]
async fn an_identity_that_fills_the_store_alone_is_refused_with_a_transient_error() {
    let per_key = bytes_per_key().await;
    let (store, clock) = small_store(8 * per_key);
    let tb = Limit::token_bucket(10, 5.0).expect("l");
    let mut refused = None;
    for rule in 0..50 {
        let key = key_of("greedy", &format!("rule-{rule}"));
        if let Err(e) = store.check(&check1(&key, tb, 1)).await {
            refused = Some(e);
            break;
        }
    }
    let err = refused.expect("one identity cannot hold more than the store");
    assert!(err.is_transient(), "{err}");
    store
        .check(&check1(&key_of("someone-else", "rule-0"), tb, 1))
        .await
        .expect("another identity evicts the greedy one's keys");
    clock.advance(Duration::from_secs(5));
    store
        .check(&check1(&key_of("greedy", "rule-49"), tb, 1))
        .await
        .expect("room after expiry");
}
