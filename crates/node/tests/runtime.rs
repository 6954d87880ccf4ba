//! The decision runtime on the in-memory store: leases serve hot keys, every matched rule
//! decides together, SHADOW never blocks, slots are held and released, the pre-limit rejects
//! floods, and several nodes on paused time share one store without over-admitting.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{
    BucketKey, CheckRequest, LeaseStore, Limit, MemoryConfig, MemoryStore, SharedClock, Store,
    TokioClock,
};
use tollgate_node::runtime::Outcome;
use tollgate_node::test_support::{allowed, check, memory_node, node_on};
use tollgate_node::{Matching, Request, RuntimeConfig};

const HOT: &str = "domain: api\nrules:\n  - {id: hot, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000, refillPerSecond: 0.001}\n";

fn no_prelimit() -> RuntimeConfig {
    RuntimeConfig {
        prelimit_factor: None,
        ..RuntimeConfig::default()
    }
}

#[tokio::test]
async fn a_hot_key_is_served_from_leases_with_few_store_calls() {
    let (node, _) = memory_node(HOT, RuntimeConfig::default()).await;
    let request = Request::new("api").descriptor([("api_key", "k1")]);
    assert_eq!(
        allowed(&node, &request, 1200).await,
        1000,
        "exactly the capacity"
    );
    let m = node.metrics();
    let calls = m.leases_acquired.get() + m.lease_misses.get();
    assert!(
        m.lease_hits.get() >= 900,
        "most decisions came from a lease: {}",
        m.lease_hits.get()
    );
    assert!(
        m.leases_acquired.get() <= 40,
        "{} leases for 1000 units",
        m.leases_acquired.get()
    );
    eprintln!(
        "1000 admissions: {} leases, {} lease hits, {} slow-path trips ({calls} store-bound)",
        m.leases_acquired.get(),
        m.lease_hits.get(),
        m.lease_misses.get()
    );
    assert_eq!(m.decisions("api", "hot", Outcome::Allowed), 1000);
    assert_eq!(m.decisions("api", "hot", Outcome::Denied), 200);
}

#[tokio::test(start_paused = true)]
async fn a_trickle_is_decided_by_store_checks_without_an_actor() {
    let (node, memory) = memory_node(HOT, RuntimeConfig::default()).await;
    let request = Request::new("api").descriptor([("api_key", "slow")]);
    for _ in 0..3 {
        assert!(check(&node, &request).await.allowed);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // One request every two seconds: never back within a quarter lease lifetime, so each decision is
    // one store check and the key costs no actor and holds nothing.
    let key = BucketKey::new(b"slow", "hot").expect("key");
    let limit = Limit::token_bucket(1000, 0.001).expect("limit");
    let peek = memory
        .check(&CheckRequest::single(key, limit, 0).expect("peek"))
        .await
        .expect("check");
    assert_eq!(peek.buckets[0].remaining, 997, "nothing is stranded");
    assert_eq!(node.metrics().lease_units_acquired.get(), 0);
    assert_eq!(
        node.metrics().key_actors.get(),
        0,
        "a trickle needs no actor"
    );
    assert_eq!(node.metrics().store_calls.get(), 3);
}

#[tokio::test]
async fn every_matched_rule_decides_and_a_denied_request_spends_nothing() {
    let yaml = "domain: api\nrules:\n\
        - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: 0.001}\n\
        - {id: per-ip, match: {ip: '*'}, algorithm: FIXED_WINDOW, limit: 2, window: 1h}\n";
    let (node, _) = memory_node(yaml, no_prelimit()).await;
    let both = Request::new("api").descriptor([("api_key", "k"), ("ip", "1.1.1.1")]);
    assert_eq!(allowed(&node, &both, 3).await, 2);
    let denied = check(&node, &both).await;
    assert!(!denied.allowed);
    assert_eq!(
        denied.decisive().map(|s| s.rule.id.as_str()),
        Some("per-ip")
    );
    assert!(denied.retry_after > Duration::ZERO);
    // The per-key bucket lost nothing to the two denials: 3 left for another IP.
    let other_ip = Request::new("api").descriptor([("api_key", "k"), ("ip", "2.2.2.2")]);
    assert_eq!(
        allowed(&node, &other_ip, 4).await,
        2,
        "per-ip allows 2 for the new IP"
    );
    let key_only = Request::new("api").descriptor([("api_key", "k")]);
    assert_eq!(
        allowed(&node, &key_only, 5).await,
        1,
        "5 − 2 − 2 = 1 left on the key"
    );
}

#[tokio::test]
async fn shadow_rules_count_but_never_block() {
    let yaml = "domain: api\nrules:\n  - {id: trial, match: {plan: partner}, per: [api_key], algorithm: FIXED_WINDOW, limit: 2, window: 1h, mode: SHADOW}\n";
    let (node, _) = memory_node(yaml, no_prelimit()).await;
    let request = Request::new("api").descriptor([("api_key", "p1"), ("plan", "partner")]);
    assert_eq!(allowed(&node, &request, 5).await, 5);
    let m = node.metrics();
    assert_eq!(m.decisions("api", "trial", Outcome::Allowed), 2);
    assert_eq!(m.decisions("api", "trial", Outcome::ShadowDenied), 3);
}

#[tokio::test]
async fn disabled_rules_match_nothing() {
    let yaml = "domain: api\nrules:\n  - {id: off, match: {api_key: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1h, mode: DISABLED}\n";
    let (node, _) = memory_node(yaml, no_prelimit()).await;
    let request = Request::new("api").descriptor([("api_key", "k")]);
    assert_eq!(allowed(&node, &request, 3).await, 3);
    assert!(check(&node, &request).await.statuses.is_empty());
}

#[tokio::test]
async fn concurrency_slots_are_held_until_released() {
    let yaml = "domain: api\nrules:\n  - {id: reports, match: {route: GET /reports, api_key: '*'}, per: [api_key], algorithm: CONCURRENCY, maxInFlight: 2, slotTtl: 30s}\n";
    let (node, _) = memory_node(yaml, no_prelimit()).await;
    let request = Request::new("api").descriptor([("api_key", "k"), ("route", "GET /reports")]);
    let first = check(&node, &request).await;
    let second = check(&node, &request).await;
    assert!(first.allowed && second.allowed);
    assert!(!check(&node, &request).await.allowed);
    assert_eq!(node.release_slots(&first.slots).await.expect("release"), 1);
    assert_eq!(
        node.release_slots(&first.slots).await.expect("release"),
        0,
        "idempotent"
    );
    assert!(check(&node, &request).await.allowed);
}

#[tokio::test]
async fn the_prelimit_rejects_a_flood_without_the_store() {
    let yaml = "domain: api\nrules:\n  - {id: r, match: {ip: '*'}, algorithm: TOKEN_BUCKET, capacity: 10, refillPerSecond: 1}\n";
    let (node, _) = memory_node(yaml, RuntimeConfig::default()).await;
    let request = Request::new("api").descriptor([("ip", "6.6.6.6")]);
    assert_eq!(allowed(&node, &request, 200).await, 10);
    let m = node.metrics();
    // The key's first decision is a store check (it has no bucket yet, so no pre-limit
    // either): the pre-limit then holds the other nine and the store's denial, recorded on
    // the bucket, answers the rest of the flood. Either way the flood stays off the store.
    assert!(
        m.store_calls.get() <= 12,
        "the flood stayed off the store: {} store calls",
        m.store_calls.get()
    );
    assert!(m.leases_acquired.get() <= 10, "{}", m.leases_acquired.get());
    // A pre-limit below the store's count (half the limit per node): it refuses the flood
    // itself, before the leases run out.
    let half = RuntimeConfig {
        prelimit_factor: Some(0.5),
        ..RuntimeConfig::default()
    };
    let (node, _) = memory_node(yaml, half).await;
    assert_eq!(
        allowed(&node, &request, 200).await,
        6,
        "one store check, then five"
    );
    let m = node.metrics();
    assert!(
        m.prelimit_denied.get() >= 190,
        "the flood stopped at the pre-limit: {}",
        m.prelimit_denied.get()
    );
    assert!(m.store_calls.get() <= 7, "{}", m.store_calls.get());
}

#[tokio::test]
async fn merged_descriptors_match_rules_across_them() {
    let yaml = "domain: public-api\nrules:\n  - {id: gold-orders-create, name: gold-orders, match: {plan: gold, route: POST /orders}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 10}\n";
    let (node, _) = memory_node(yaml, no_prelimit()).await;
    let seed = Request::new("public-api")
        .descriptor([("api_key", "k_123"), ("plan", "gold")])
        .descriptor([("route", "POST /orders")]);
    let verdict = check(&node, &seed).await;
    assert_eq!(verdict.statuses.len(), 1);
    assert_eq!(
        verdict.decisive().map(|s| s.rule.id.as_str()),
        Some("gold-orders-create")
    );
    let per_descriptor = seed.clone().matching(Matching::PerDescriptor);
    assert!(
        check(&node, &per_descriptor).await.statuses.is_empty(),
        "no single descriptor has both keys"
    );
}

#[tokio::test]
async fn a_cost_above_capacity_is_denied_without_the_store() {
    let (node, _) = memory_node(HOT, RuntimeConfig::default()).await;
    let request = Request::new("api")
        .descriptor([("api_key", "k")])
        .cost(1001);
    let verdict = check(&node, &request).await;
    assert!(!verdict.allowed);
    assert_eq!(node.metrics().leases_acquired.get(), 0);
}

#[tokio::test]
async fn shutdown_returns_unspent_leases_to_the_store() {
    let (node, memory) = memory_node(HOT, no_prelimit()).await;
    let request = Request::new("api").descriptor([("api_key", "k")]);
    assert_eq!(allowed(&node, &request, 100).await, 100);
    // The key's first decision was a store check; the other 99 were spent from leases.
    let leased = node.metrics().lease_units_acquired.get();
    assert!(leased > 99, "the node holds units ahead: {leased}");
    node.shutdown().await;
    let peek = memory
        .check(
            &CheckRequest::single(
                BucketKey::new(b"k", "hot").expect("key"),
                Limit::token_bucket(1000, 0.001).expect("l"),
                0,
            )
            .expect("peek"),
        )
        .await
        .expect("check");
    assert_eq!(peek.buckets[0].remaining, 900, "every unspent unit is back");
    let m = node.metrics();
    assert_eq!(
        m.lease_units_returned.get(),
        m.lease_units_acquired.get() - 99,
        "a refill in flight at shutdown is returned too"
    );
}

/// Three nodes on tokio's paused clock share one in-memory store: the whole runtime (actors,
/// leases, expiries, the breaker) runs on virtual time, as the simulations will.
#[tokio::test(start_paused = true)]
async fn nodes_on_paused_time_share_a_store_without_over_admitting() {
    let clock: SharedClock = Arc::new(TokioClock::new());
    let memory = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    let yaml = "domain: api\nrules:\n  - {id: shared, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 300, refillPerSecond: 100}\n";
    let mut nodes = vec![];
    for _ in 0..3 {
        nodes.push(
            node_on(
                Store::Memory(memory.clone()),
                yaml,
                RuntimeConfig::default(),
                clock.clone(),
            )
            .await,
        );
    }
    let request = Request::new("api").descriptor([("api_key", "hot")]);
    let start = tokio::time::Instant::now();
    let mut admitted = 0;
    // 10 virtual seconds at ~600 requests/s across the nodes: twice the sustained rate.
    for step in 0..6000u64 {
        let node = &nodes[(step % 3) as usize];
        if check(node, &request).await.allowed {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_micros(1667)).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 300.0 + 100.0 * elapsed;
    eprintln!("paused time: {admitted} admitted in {elapsed:.1} virtual s (bound {bound:.0})");
    assert!(
        f64::from(admitted) <= bound,
        "over-admitted: {admitted} > {bound}"
    );
    assert!(
        f64::from(admitted) >= 0.9 * bound,
        "leases stranded units: {admitted} of {bound:.0}"
    );
    for node in &nodes {
        node.shutdown().await;
    }
}

/// A rule whose parameters change keeps its counter (the store key is the rule id): a lowered
/// capacity caps at once, and the leases taken under the old definition are neither spent
/// again nor lost: they are settled before the new definition leases anything.
#[tokio::test(start_paused = true)]
async fn a_changed_rule_keeps_its_counter_and_settles_old_leases() {
    let clock: SharedClock = Arc::new(TokioClock::new());
    let memory = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    let yaml = |capacity: u64| {
        format!(
            "domain: api\nrules:\n  - {{id: r, match: {{api_key: '*'}}, algorithm: TOKEN_BUCKET, capacity: {capacity}, refillPerSecond: 0.001}}\n"
        )
    };
    let node = node_on(
        Store::Memory(memory.clone()),
        &yaml(100),
        no_prelimit(),
        clock,
    )
    .await;
    let request = Request::new("api").descriptor([("api_key", "k")]);
    assert_eq!(allowed(&node, &request, 30).await, 30);
    let leased = node.metrics().lease_units_acquired.get();
    assert!(
        leased > 30,
        "the node holds units ahead of demand: {leased}"
    );
    let loaded =
        tollgate_node::rules::source::parse(&yaml(20), std::path::Path::new("changed.yaml"))
            .expect("rules");
    node.rules().install(&loaded).expect("installs");
    // 70 left in truth (what the node held unspent included): capped at the new capacity.
    let after_change = allowed(&node, &request, 40).await;
    assert_eq!(
        after_change, 20,
        "the key starts the new definition from its true count"
    );
    // The old leases were settled when the new definition took over: their end credits nothing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        allowed(&node, &request, 40).await,
        0,
        "old leases came back as fresh units"
    );
    let key = BucketKey::new(b"k", "r").expect("key");
    let limit = Limit::token_bucket(20, 0.001).expect("limit");
    let peek = memory
        .check(&CheckRequest::single(key, limit, 0).expect("peek"))
        .await
        .expect("check");
    assert_eq!(peek.buckets[0].remaining, 0, "every unit is accounted for");
    node.shutdown().await;
}

/// A draw (what RLQS pays an Envoy's share with) takes many units at once from the store:
/// one larger than what is left is refused and says what is left, a smaller one right after
/// takes exactly that (no lease holds units back, no memory of the refusal denies it), and
/// requests on the same key then find the bucket empty.
#[tokio::test]
async fn a_refused_draw_says_what_is_left_and_a_smaller_one_takes_it() {
    let (node, memory) = memory_node(HOT, RuntimeConfig::default()).await;
    let request = Request::new("api").descriptor([("api_key", "drawn")]);
    // Requests first, so the key has an actor and a lease of its own.
    assert_eq!(allowed(&node, &request, 300).await, 300);
    let charges = node.charges(&request).expect("charges");
    let charge = &charges[0];
    let key = BucketKey::new(b"drawn", "hot").expect("key");
    let limit = Limit::token_bucket(1000, 0.001).expect("limit");
    let peek = |memory: MemoryStore| {
        let request = CheckRequest::single(key.clone(), limit, 0).expect("peek");
        async move { memory.check(&request).await.expect("check").buckets[0].remaining }
    };
    let in_store = peek(memory.clone()).await;
    assert!(
        in_store <= 700,
        "the lease holds units: {in_store} left in the store"
    );
    let refused = node.draw(charge, in_store + 1).await;
    assert!(!refused.allowed);
    assert_eq!(refused.statuses[0].remaining, in_store);
    let taken = node.draw(charge, in_store).await;
    assert!(taken.allowed, "{taken:?}");
    assert_eq!(peek(memory.clone()).await, 0);
    assert!(!node.draw(charge, 1).await.allowed);
    // What the lease still held is all requests can have: 1000 in all.
    let more = allowed(&node, &request, 1000).await;
    assert_eq!(300 + in_store as usize + more, 1000);
}

/// A plan that replaces the default gives its customers more; the default still holds every
/// other key; a SHADOW plan replaces nothing (trying it must not lift the default).
#[tokio::test]
async fn a_plan_that_replaces_the_default_gives_its_keys_its_own_limit() {
    let yaml = "domain: api\nrules:\n  \
        - {id: gold, match: {plan: gold, route: 'POST /orders'}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 0.001, replaces: [default]}\n  \
        - {id: trial, match: {plan: trial}, per: [api_key], algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 0.001, mode: SHADOW, replaces: [default]}\n  \
        - {id: default, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 50, refillPerSecond: 0.001}\n";
    let (node, _) = memory_node(yaml, no_prelimit()).await;
    let order = |plan: &str, key: &str| {
        Request::new("api").descriptor([
            ("plan", plan),
            ("route", "POST /orders"),
            ("api_key", key),
        ])
    };
    assert_eq!(
        allowed(&node, &order("gold", "g1"), 120).await,
        100,
        "gold's own burst"
    );
    let verdict = check(&node, &order("gold", "g1")).await;
    assert_eq!(
        verdict
            .statuses
            .iter()
            .map(|s| s.rule.id.as_str())
            .collect::<Vec<_>>(),
        ["gold"],
        "the default is left out of the decision"
    );
    assert_eq!(
        allowed(&node, &order("silver", "s1"), 120).await,
        50,
        "the default"
    );
    assert_eq!(
        allowed(&node, &order("trial", "t1"), 120).await,
        50,
        "a SHADOW plan leaves the default in force"
    );
}
