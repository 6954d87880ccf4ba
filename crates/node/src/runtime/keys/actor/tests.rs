//! The key actor's message cases, one at a time, on a node over the in-memory store: the
//! actor's state is plain data and its store calls are real (no stand-in store).

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;

use crate::runtime::fail_modes::Cause;
use crate::runtime::keys::bucket::{AcquireOutcome, Bucket, KeyMsg, Want};
use crate::runtime::store_health::lateness::Late;
use crate::test_support::memory_node;
use crate::{Node, Request, RuntimeConfig};

/// One user's bucket of 100 with a refill of one a second, failing OPEN; a CLOSED one; and a
/// window of 100 an hour (nothing comes back while a test reads it).
const RULES: &str = "domain: api\nrules:\n  \
    - {id: per-user, match: {user: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 1}\n  \
    - {id: logins, match: {login: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 1, failMode: CLOSED}\n  \
    - {id: hourly, match: {team: '*'}, algorithm: FIXED_WINDOW, limit: 100, window: 1h}\n";

fn request(key: &str, value: &str) -> Request {
    Request::new("api").descriptor([(key, value)])
}

/// `request`'s one bucket, with its actor started: a key earns them when it is seen again
/// soon after its first request (the first lookup is a store check's).
async fn bucket_of(node: &Node, request: &Request) -> Arc<Bucket> {
    let charge = node.charges(request).expect("valid").remove(0);
    let limit = charge.rule.limit().expect("limited");
    let keys = node.decider().keys();
    if let Some(bucket) = keys
        .bucket(&charge.rule, &charge.identity, limit, node.now())
        .await
    {
        // The identity's actor runs already (for another of its rules).
        return bucket;
    }
    keys.bucket(&charge.rule, &charge.identity, limit, node.now())
        .await
        .expect("a bucket, with its actor")
}

async fn acquire(bucket: &Arc<Bucket>, cost: u64) -> AcquireOutcome {
    let wants = vec![Want {
        bucket: bucket.clone(),
        cost,
    }];
    match bucket
        .actor
        .call(
            |reply| KeyMsg::Acquire { wants, reply },
            Some(Duration::from_secs(5)),
        )
        .await
    {
        Ok(CallResult::Success(outcome)) => outcome,
        other => panic!("the actor answers: {other:?}"),
    }
}

/// What the store holds for `request`'s bucket: units left, and units out on leases.
async fn in_store(node: &Node, request: &Request) -> (u64, u64) {
    let counter = node
        .operator()
        .counters(request)
        .await
        .expect("counters")
        .remove(0);
    (counter.remaining.expect("limited"), counter.held.units)
}

#[tokio::test]
async fn an_acquire_on_a_cold_key_leases_and_takes_the_request_from_the_lease() {
    let (node, _) = memory_node(RULES, RuntimeConfig::default()).await;
    let alice = request("user", "alice");
    let bucket = bucket_of(&node, &alice).await;
    assert!(matches!(
        acquire(&bucket, 3).await,
        AcquireOutcome::Reserved
    ));
    let (remaining, leased) = in_store(&node, &alice).await;
    assert!(leased >= 3, "the lease covers the request: {leased}");
    assert_eq!(remaining + leased, 100, "the store lent what it took");
    assert_eq!(
        bucket.held_at(node.now()),
        leased - 3,
        "the request's units are spent from the lease"
    );
}

#[tokio::test]
async fn an_acquire_the_store_has_no_room_for_is_denied_with_its_wait() {
    let (node, _) = memory_node(RULES, RuntimeConfig::default()).await;
    let bob = request("user", "bob");
    let charge = node.charges(&bob).expect("valid").remove(0);
    assert!(node.draw(&charge, 98).await.allowed, "two units left");
    let bucket = bucket_of(&node, &bob).await;
    match acquire(&bucket, 5).await {
        AcquireOutcome::Denied { index, retry_after } => {
            assert_eq!(index, 0);
            // Three more units at one a second.
            assert!(
                retry_after > Duration::from_secs(2) && retry_after <= Duration::from_secs(3),
                "{retry_after:?}"
            );
        }
        other => panic!("denied, not {other:?}"),
    }
    // A cost that fits is taken.
    assert!(matches!(
        acquire(&bucket, 2).await,
        AcquireOutcome::Reserved
    ));
}

#[tokio::test]
async fn a_shutdown_gives_back_what_the_leases_did_not_spend() {
    let (node, _) = memory_node(RULES, RuntimeConfig::default()).await;
    let carol = request("team", "carol");
    let bucket = bucket_of(&node, &carol).await;
    // A cold key's first lease is of one unit; asked again at once, it leases more.
    for _ in 0..2 {
        assert!(matches!(
            acquire(&bucket, 1).await,
            AcquireOutcome::Reserved
        ));
    }
    let (remaining, leased) = in_store(&node, &carol).await;
    assert!(
        leased > 2,
        "a lease of more than the two units spent: {leased}"
    );
    assert_eq!(remaining + leased, 100);
    bucket
        .actor
        .call(KeyMsg::Shutdown, Some(Duration::from_secs(5)))
        .await
        .expect("the actor answers");
    assert_eq!(
        in_store(&node, &carol).await.0,
        98,
        "only the two units spent stay spent"
    );
    assert_eq!(
        bucket.held_at(node.now()),
        0,
        "nothing held after a shutdown"
    );
}

#[tokio::test]
async fn a_forget_gives_back_the_leases_and_fills_what_the_node_keeps() {
    let (node, _) = memory_node(RULES, RuntimeConfig::default()).await;
    let dave = request("team", "dave");
    let bucket = bucket_of(&node, &dave).await;
    for _ in 0..2 {
        assert!(matches!(
            acquire(&bucket, 2).await,
            AcquireOutcome::Reserved
        ));
    }
    assert!(
        bucket.held_at(node.now()) > 0,
        "the lease holds more than was spent"
    );
    bucket
        .actor
        .cast(KeyMsg::Forget {
            bucket: bucket.clone(),
        })
        .expect("the actor is up");
    // The return rides out in a task of its own: read the store until it lands.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while in_store(&node, &dave).await.0 != 96 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease comes back: {:?}",
            in_store(&node, &dave).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(bucket.held_at(node.now()), 0, "nothing held after a forget");
}

#[tokio::test]
async fn while_a_call_is_late_only_requests_that_wait_through_it_queue() {
    let (node, _) = memory_node(RULES, RuntimeConfig::default()).await;
    let open = bucket_of(&node, &request("user", "erin")).await;
    let closed = bucket_of(&node, &request("login", "erin")).await;
    assert!(
        open.actor.get_id() == closed.actor.get_id(),
        "one actor per identity"
    );
    open.actor
        .cast(KeyMsg::Late {
            late: Late::Stalled,
            buckets: vec![],
        })
        .expect("the actor is up");
    // An OPEN rule's request is decided at once, by its fail mode.
    assert!(matches!(
        acquire(&open, 1).await,
        AcquireOutcome::Failed(Cause::Stalled)
    ));
    // A CLOSED rule's request waits through a stall: it queues, and is served by the lease
    // call it starts.
    assert!(matches!(
        acquire(&closed, 1).await,
        AcquireOutcome::Reserved
    ));
    // That call's answer ended the lateness: the OPEN rule's requests queue again.
    assert!(matches!(acquire(&open, 1).await, AcquireOutcome::Reserved));
}

#[tokio::test(start_paused = true)]
async fn an_actor_idle_past_its_timeout_stops_on_its_tick() {
    let config = RuntimeConfig {
        idle_timeout: Duration::from_secs(30),
        ..RuntimeConfig::default()
    };
    let (node, _) = memory_node(RULES, config).await;
    let bucket = bucket_of(&node, &request("user", "frank")).await;
    // It leases (a lease lives a second), then nothing more comes.
    assert!(matches!(
        acquire(&bucket, 1).await,
        AcquireOutcome::Reserved
    ));
    assert_eq!(node.operator().held(), (1, 1), "its actor runs");
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(node.operator().held().0, 1, "not idle long enough yet");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The stop is the actor's own: let it run.
    for _ in 0..100 {
        if node.operator().held().0 == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        node.operator().held(),
        (0, 0),
        "the actor and its bucket are gone"
    );
    drop(bucket);
}
