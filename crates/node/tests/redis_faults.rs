//! Redis killed and Redis paused (SIGSTOP) while a node serves: every rule's fail mode is
//! honoured, no OPEN or LOCAL decision waits much past the store budget (a CLOSED one waits
//! through a stall, at most the store patience, until the store is known down), the breaker
//! opens, and decisions go back to the store on their own once Redis is back.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{RedisConfig, SharedClock, TokioClock};
use tollgate_node::runtime::Outcome;
use tollgate_node::runtime::store_health::breaker::BreakerState;
use tollgate_node::test_support::{check, node_on, redis_store};
use tollgate_node::{Node, Request, RuntimeConfig};
use tollgate_testkit::RedisServer;

/// The store budget under test: the default.
const BUDGET: Duration = Duration::from_millis(5);
/// No OPEN or LOCAL decision may take longer than this while Redis is down (the budget plus
/// scheduling on a loaded machine).
const WAIT_BOUND: Duration = Duration::from_millis(150);

const RULES: &str = "domain: api\nrules:\n\
  - {id: open, match: {kind: open, user: '*'}, per: [user], algorithm: FIXED_WINDOW, limit: 100, window: 1h, failMode: OPEN}\n\
  - {id: closed, match: {kind: closed, user: '*'}, per: [user], algorithm: FIXED_WINDOW, limit: 100, window: 1h, failMode: CLOSED}\n\
  - {id: local, match: {kind: local, user: '*'}, per: [user], algorithm: FIXED_WINDOW, limit: 10, window: 1h, failMode: LOCAL}\n";

async fn node(server: &RedisServer) -> Node {
    let clock: SharedClock = Arc::new(TokioClock::new());
    // Two nodes share the limits: LOCAL falls back to half of each limit.
    let config = RuntimeConfig {
        cluster_nodes: 2,
        ..RuntimeConfig::default()
    };
    node_on(
        redis_store(RedisConfig::single(server.url()), BUDGET),
        RULES,
        config,
        clock,
    )
    .await
}

fn request(kind: &str, user: &str) -> Request {
    Request::new("api").descriptor([("kind", kind), ("user", user)])
}

/// Decides `request`, timing it.
async fn timed(node: &Node, request: &Request) -> (bool, Duration) {
    let start = tokio::time::Instant::now();
    let allowed = check(node, request).await.allowed;
    (allowed, start.elapsed())
}

/// While Redis cannot answer: OPEN admits, CLOSED denies, LOCAL admits half the limit (two
/// nodes) then denies; nothing waits past the bound; the breaker ends up open.
async fn fail_modes_hold(node: &Node, round: &str) -> Duration {
    // A gateway's traffic: a burst of decisions at once. The breaker opens on a failure ratio
    // over at least 20 calls in a second, so a lone request now and then never opens it.
    let burst: Vec<_> = (0..40)
        .map(|i| {
            let node = node.clone();
            let request = request("open", &format!("{round}-burst-{i}"));
            tokio::spawn(async move { timed(&node, &request).await })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut slowest_closed = Duration::ZERO;
    for decision in burst {
        let (allowed, took) = decision.await.expect("decision");
        assert!(allowed, "OPEN admits while the store is down");
        slowest = slowest.max(took);
    }
    for i in 0..20 {
        // A new user each time: a cold key needs the store (a live lease would hide the outage).
        let (allowed, took) = timed(node, &request("open", &format!("{round}-open-{i}"))).await;
        assert!(allowed, "OPEN admits while the store is down");
        slowest = slowest.max(took);
        let (allowed, took) = timed(node, &request("closed", &format!("{round}-closed-{i}"))).await;
        assert!(!allowed, "CLOSED denies while the store is down");
        slowest_closed = slowest_closed.max(took);
    }
    let mut local_admitted = 0;
    for _ in 0..10 {
        let (allowed, took) = timed(node, &request("local", &format!("{round}-local"))).await;
        local_admitted += u32::from(allowed);
        slowest = slowest.max(took);
    }
    assert_eq!(
        local_admitted, 5,
        "LOCAL gives each of two nodes half of the limit"
    );
    assert!(
        slowest <= WAIT_BOUND,
        "an OPEN or LOCAL decision waited {slowest:?} while Redis was down"
    );
    let patience = RuntimeConfig::default().store_patience;
    assert!(
        slowest_closed <= patience + WAIT_BOUND,
        "a CLOSED decision waited {slowest_closed:?} while Redis was down (patience {patience:?})"
    );
    let m = node.metrics();
    assert!(m.breaker_opened.get() >= 1, "the breaker opened");
    assert!(matches!(
        node.store().breaker_state(),
        BreakerState::Open { .. } | BreakerState::HalfOpen { .. }
    ));
    assert!(m.decisions("api", "open", Outcome::FailedOpen) >= 20);
    assert!(m.decisions("api", "closed", Outcome::FailedClosed) >= 20);
    eprintln!("{round}: slowest CLOSED decision {slowest_closed:?}");
    slowest
}

/// A started node's first decision is the store's (it warmed its store up before deciding).
async fn store_backed_from_the_start(node: &Node) {
    let verdict = check(node, &request("closed", "first")).await;
    assert_eq!(
        verdict.statuses[0].outcome,
        Some(Outcome::Allowed),
        "the first decision of a started node is the store's"
    );
}

/// A fresh Redis and a node on it, whose first decision was the store's.
async fn serving() -> (RedisServer, Node) {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis");
    let node = node(&server).await;
    store_backed_from_the_start(&node).await;
    (server, node)
}

/// Waits until decisions are backed by the store again; returns how long that took.
async fn recovery(node: &Node, round: &str) -> Duration {
    let start = tokio::time::Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        let verdict = check(node, &request("closed", &format!("{round}-back-{i}"))).await;
        if verdict.allowed && verdict.statuses[0].outcome == Some(Outcome::Allowed) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "decisions did not return to the store"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run() {
    let (mut server, node) = serving().await;
    server.kill();
    let slowest = fail_modes_hold(&node, "killed").await;
    let server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .expect("join");
    let back = recovery(&node, "restarted").await;
    eprintln!(
        "Redis killed: slowest decision {slowest:?}; store-backed again {back:?} after the restart"
    );
    assert!(back < Duration::from_secs(5), "took {back:?} to recover");
    node.shutdown().await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_mid_run() {
    let (mut server, node) = serving().await;
    server.pause().expect("SIGSTOP");
    let slowest = fail_modes_hold(&node, "paused").await;
    server.resume().expect("SIGCONT");
    let back = recovery(&node, "resumed").await;
    eprintln!(
        "Redis paused: slowest decision {slowest:?}; store-backed again {back:?} after SIGCONT"
    );
    assert!(back < Duration::from_secs(5), "took {back:?} to recover");
    node.shutdown().await;
}

/// Sends a CLOSED request every 10 ms for `span` (a gateway's traffic keeps coming while the
/// store is away; each may be the breaker's probe).
async fn traffic_for(node: &Node, round: &str, span: Duration) {
    let start = tokio::time::Instant::now();
    let mut i = 0;
    while start.elapsed() < span {
        i += 1;
        check(node, &request("closed", &format!("{round}-{i}"))).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A stall long enough for the breaker's cooldown to reach its longest (1 s): once Redis
/// answers again, decisions are the store's within a few milliseconds, not a cooldown later.
/// The breaker keeps one probe out while the store does not answer (a probe that ran out of
/// time, or whose caller stopped waiting, is followed by another at once), and the store
/// answers it the moment it runs again. Before, a probe whose caller stopped waiting left the
/// breaker half-open for its longest cooldown, and a timed-out probe doubled it: decisions
/// came back up to a second after Redis did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_decides_again_as_soon_as_it_answers() {
    let (mut server, node) = serving().await;
    let mut backs = vec![];
    for round in 0..3 {
        server.pause().expect("SIGSTOP");
        fail_modes_hold(&node, &format!("paused-{round}")).await;
        traffic_for(
            &node,
            &format!("stalled-{round}"),
            Duration::from_millis(2500),
        )
        .await;
        server.resume().expect("SIGCONT");
        backs.push(recovery(&node, &format!("resumed-{round}")).await);
    }
    eprintln!("store-backed again after SIGCONT: {backs:?}");
    let probes = node
        .metrics()
        .store_failures_of(tollgate_node::metrics::StoreOp::Probe);
    assert!(
        probes > 0,
        "the breaker probed on its own while Redis was paused"
    );
    for back in backs {
        assert!(
            back <= Duration::from_millis(100),
            "decisions came back to the store {back:?} after Redis answered again: {:?}",
            node.store().breaker_state()
        );
    }
    node.shutdown().await;
}
