//! A late store, on paused time: the in-memory store behind a link that can be stalled (as a
//! `SIGSTOP`ped Redis: calls hang, and run when it resumes) or cut (as a killed Redis). What a
//! node admits while the store has stalled is debited in the store when it answers (the
//! store's own count ends up with every admission), and forgiven when the store turns out to
//! be down; nodes deciding on the same last answer each take their share of it; a CLOSED rule
//! waits through a stall and is decided by the store's answer.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{
    BucketKey, CheckRequest, Latency, LeaseStore, Limit, LinkCondition, LinkedStore, MemoryConfig,
    MemoryStore, SharedClock, Store, TokioClock,
};
use tollgate_node::runtime::Outcome;
use tollgate_node::test_support::{check, node_on};
use tollgate_node::{Node, Request, RuntimeConfig};

const OPEN: &str = "domain: api\nrules:\n  - {id: hot, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 0.001, failMode: OPEN}\n";
const CLOSED: &str = "domain: api\nrules:\n  - {id: login, match: {user: '*'}, algorithm: FIXED_WINDOW, limit: 1000, window: 1h, failMode: CLOSED}\n";

fn linked() -> (LinkedStore, SharedClock) {
    let clock: SharedClock = Arc::new(TokioClock::new());
    let memory = MemoryStore::with_clock(clock.clone(), MemoryConfig::default());
    (
        LinkedStore::new(memory, Latency::fixed(Duration::from_millis(1)), 7),
        clock,
    )
}

fn hot() -> Request {
    Request::new("api").descriptor([("api_key", "k")])
}

/// What the store itself says remains of the hot key's bucket.
async fn left_in_store(store: &LinkedStore) -> u64 {
    let key = BucketKey::new(b"k", "hot").expect("key");
    let limit = Limit::token_bucket(100, 0.001).expect("limit");
    let peek = CheckRequest::single(key, limit, 0).expect("peek").peek();
    store.memory().check(&peek).await.expect("peek").buckets[0].remaining
}

/// `n` requests at once; how many were admitted.
async fn burst(node: &Node, request: &Request, n: usize) -> u64 {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (node, request) = (node.clone(), request.clone());
            tokio::spawn(async move { check(&node, &request).await.allowed })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u64::from(task.await.expect("decision"));
    }
    admitted
}

/// One node on a linked store whose hot key has earned its actor and leases; what it admitted.
async fn one_node_leasing() -> (LinkedStore, Node, u64) {
    let (store, clock) = linked();
    let node = node_on(
        Store::Linked(store.clone()),
        OPEN,
        RuntimeConfig::default(),
        clock,
    )
    .await;
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(check(&node, &hot()).await.allowed);
    }
    (store, node, admitted)
}

#[tokio::test(start_paused = true)]
async fn what_a_stalled_store_admits_is_debited_in_it_when_it_answers() {
    let (store, node, mut admitted) = one_node_leasing().await;
    store.link().set_condition(LinkCondition::Stalled);
    // Decided while the store has stalled: the node's share of its last answer.
    for _ in 0..4 {
        admitted += burst(&node, &hot(), 20).await;
    }
    let metrics = node.metrics();
    assert!(
        metrics.slow_store_decisions.get() > 0,
        "decisions were made while the store had stalled"
    );
    store.link().set_condition(LinkCondition::Up);
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.shutdown().await;
    // Every admission is counted in the store: what it granted, and the debts.
    assert_eq!(
        100 - left_in_store(&store).await,
        admitted,
        "the store counts every admission (debited {}, paid by a grant {}, forgiven {})",
        metrics.owed_units_debited.get(),
        metrics.owed_units_paid_by_grant.get(),
        metrics.owed_units_forgiven.get()
    );
    assert!(
        metrics.owed_units_debited.get() + metrics.owed_units_paid_by_grant.get() > 0,
        "something was owed"
    );
    assert_eq!(metrics.owed_units_forgiven.get(), 0);
    assert!(admitted <= 100, "{admitted} admitted of a capacity of 100");
}

#[tokio::test(start_paused = true)]
async fn what_is_admitted_while_the_store_turns_out_down_is_forgiven() {
    let (store, node, store_decided) = one_node_leasing().await;
    store.link().set_condition(LinkCondition::Stalled);
    let during = burst(&node, &hot(), 60).await;
    // The stalled calls are lost with the link: the store never counted what was admitted.
    store.link().set_condition(LinkCondition::Down);
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.link().set_condition(LinkCondition::Up);
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.shutdown().await;
    let metrics = node.metrics();
    assert!(during > 0);
    assert!(
        metrics.owed_units_forgiven.get() > 0,
        "what was admitted while the store turned out down was forgiven"
    );
    assert_eq!(metrics.owed_units_debited.get(), 0);
    assert!(100 - left_in_store(&store).await <= store_decided + 50);
}

const BIG: &str = "domain: api\nrules:\n  - {id: hot, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000, refillPerSecond: 0.001, failMode: OPEN}\n";

#[tokio::test(start_paused = true)]
async fn nodes_deciding_on_one_last_answer_take_their_shares_of_it() {
    let (store, clock) = linked();
    // Four nodes, as a deployment says (`--cluster-nodes`).
    let config = RuntimeConfig {
        cluster_nodes: 4,
        prelimit_factor: None,
        ..RuntimeConfig::default()
    };
    let mut nodes = vec![];
    for _ in 0..4 {
        nodes.push(
            node_on(
                Store::Linked(store.clone()),
                BIG,
                config.clone(),
                clock.clone(),
            )
            .await,
        );
    }
    // Every node leases.
    let mut before = 0;
    for _ in 0..3 {
        for node in &nodes {
            before += u64::from(check(node, &hot()).await.allowed);
        }
    }
    // What the store handed out (checks and leases) less what was admitted: held in leases.
    let key = BucketKey::new(b"k", "hot").expect("key");
    let limit = Limit::token_bucket(1000, 0.001).expect("limit");
    let peek = CheckRequest::single(key, limit, 0).expect("peek").peek();
    let taken = 1000 - store.memory().check(&peek).await.expect("peek").buckets[0].remaining;
    let held = taken - before;
    store.link().set_condition(LinkCondition::Stalled);
    let mut during = 0;
    for node in &nodes {
        during += burst(node, &hot(), 300).await;
    }
    let beyond = during.saturating_sub(held);
    let shared: u64 = nodes
        .iter()
        .map(|n| n.metrics().slow_store_decisions.get())
        .sum();
    assert!(shared > 0, "the leases ran dry during the stall");
    // Beyond what they held, the nodes admitted their shares of what remained in the store
    // when it stalled: at most that remainder between them, never one remainder per node.
    let remainder = 1000 - taken;
    assert!(
        beyond <= remainder,
        "{beyond} admitted beyond the {held} units held during the stall, of a remainder of \
         {remainder}"
    );
    assert!(beyond > 0, "shares of the remainder were admitted");
    store.link().set_condition(LinkCondition::Up);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for node in &nodes {
        node.shutdown().await;
    }
    // Then every admission is counted in the store, exactly once.
    let left = store.memory().check(&peek).await.expect("peek").buckets[0].remaining;
    assert_eq!(1000 - left, before + during, "held {held}, beyond {beyond}");
}

#[tokio::test(start_paused = true)]
async fn a_closed_rule_waits_through_a_stall_for_the_stores_answer() {
    let (store, clock) = linked();
    let node = node_on(
        Store::Linked(store.clone()),
        CLOSED,
        RuntimeConfig::default(),
        clock,
    )
    .await;
    let user = |u: &str| Request::new("api").descriptor([("user", u.to_owned())]);
    store.link().set_condition(LinkCondition::Stalled);
    let waiting = {
        let node = node.clone();
        tokio::spawn(async move { check(&node, &user("alice")).await })
    };
    // Far past the store budget, the request still waits (the store may answer).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "a CLOSED rule does not deny on a stall"
    );
    store.link().set_condition(LinkCondition::Up);
    let verdict = waiting.await.expect("decision");
    assert!(verdict.allowed, "the store's answer decided: {verdict:?}");
    assert_eq!(verdict.statuses[0].outcome, Some(Outcome::Allowed));
    // A stall that outlasts the patience: denied then.
    store.link().set_condition(LinkCondition::Stalled);
    let start = tokio::time::Instant::now();
    let verdict = check(&node, &user("bob")).await;
    assert!(!verdict.allowed);
    assert_eq!(verdict.statuses[0].outcome, Some(Outcome::FailedClosed));
    assert!(start.elapsed() >= RuntimeConfig::default().store_patience);
    // A store that is down: denied at once.
    store.link().set_condition(LinkCondition::Down);
    let start = tokio::time::Instant::now();
    let verdict = check(&node, &user("carol")).await;
    assert_eq!(verdict.statuses[0].outcome, Some(Outcome::FailedClosed));
    assert!(start.elapsed() < Duration::from_millis(10));
}

/// A key the store has never answered for has no last answer to take a share of: under an
/// OPEN rule its requests wait through a stall for the first answer, up to the patience (as
/// docs/fail-modes.md says), rather than being decided on nothing.
#[tokio::test(start_paused = true)]
async fn an_open_rule_waits_through_a_stall_for_a_keys_first_answer() {
    let (store, clock) = linked();
    let node = node_on(
        Store::Linked(store.clone()),
        OPEN,
        RuntimeConfig::default(),
        clock,
    )
    .await;
    // Seen once (checked in the store directly): the next requests earn the key its bucket
    // and actor, whose first lease call is the first the store would answer for it.
    assert!(check(&node, &hot()).await.allowed);
    store.link().set_condition(LinkCondition::Stalled);
    let waiting: Vec<_> = (0..5)
        .map(|_| {
            let node = node.clone();
            tokio::spawn(async move { check(&node, &hot()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let decided = waiting.iter().filter(|w| w.is_finished()).count();
    assert_eq!(decided, 0, "requests decided with no answer to decide by");
    store.link().set_condition(LinkCondition::Up);
    for w in waiting {
        let verdict = w.await.expect("decision");
        assert!(verdict.allowed, "{verdict:?}");
        assert_eq!(verdict.statuses[0].outcome, Some(Outcome::Allowed));
    }
    node.shutdown().await;
}

/// Every store call goes through the guard, an operator's too: with the store down, a reset,
/// a lift and a read of the counters fail as any call does, counted by their operation (they
/// used to go around the breaker, uncounted).
#[tokio::test(start_paused = true)]
async fn an_operators_calls_go_through_the_breaker() {
    use tollgate_node::metrics::StoreOp;
    const PENALIZED: &str = "domain: api\nrules:\n  - {id: login, match: {user: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m, penalty: {after: 3, within: 1m, block: 5m}}\n";
    let (store, clock) = linked();
    let node = node_on(
        Store::Linked(store.clone()),
        PENALIZED,
        RuntimeConfig::default(),
        clock,
    )
    .await;
    let alice = Request::new("api").descriptor([("user", "alice")]);
    assert!(check(&node, &alice).await.allowed);
    store.link().set_condition(LinkCondition::Down);
    let metrics = node.metrics();
    assert!(node.operator().reset_counters(&alice, None).await.is_err());
    assert_eq!(metrics.store_failures_of(StoreOp::Reset), 1, "reset");
    assert!(node.operator().lift_penalties(&alice, None).await.is_err());
    assert_eq!(metrics.store_failures_of(StoreOp::PenaltyLift), 1, "lift");
    assert!(node.operator().counters(&alice).await.is_err());
    assert_eq!(
        metrics.store_failures_of(StoreOp::Check),
        1,
        "counters' peek"
    );
    node.shutdown().await;
}
