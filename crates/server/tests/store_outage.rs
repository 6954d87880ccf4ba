//! A dead or stalled Redis shows at any traffic: a real `tollgate` process on the example rules
//! and a real `redis-server`, Redis killed (SIGKILL) or stalled (SIGSTOP) while the node takes
//! no request, 1, 10 or 100 login attempts a second (the CLOSED rule). Within 2 s of the fault
//! `/readyz`'s body says the store is not answering, the log says so and the metrics too;
//! CLOSED requests stop waiting the store's patience once the breaker knows; within 2 s of
//! Redis answering again, all of it says so.
//!
//! Before: at 10 requests a second a killed Redis left `/readyz` saying `"answering": true`
//! for the whole outage and the log empty (the breaker needed 20 failed calls within a
//! second), and during a stall every CLOSED request waited 257 ms.

#[path = "support/node_process.rs"]
mod node_process;
mod support;

use std::time::Duration;

use node_process::{NodeProcess, started};
use support::rls_request;
use tokio::time::Instant;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_testkit::RedisServer;

const RULES: &str = include_str!("../../../deploy/rules/example.yaml");

/// How long Redis stays down (or stalled).
const OUTAGE_SECONDS: f64 = 3.0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Killed,
    Stalled,
}

/// One login attempt sent during the run: when (from the fault), what came back, how long it
/// took.
#[derive(Debug)]
struct Sent {
    at: f64,
    code: Option<i32>,
    took: Duration,
}

/// How one case went (seconds from the fault, or from the recovery).
#[derive(Debug)]
struct Seen {
    rate: u32,
    shown_after: Option<f64>,
    logged_after: Option<f64>,
    metric_after: Option<f64>,
    back_after: Option<f64>,
    logged_back: bool,
    sent: Vec<Sent>,
    /// The node's log lines about its store.
    log: String,
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("join")
}

fn answering(node: &NodeProcess) -> Option<bool> {
    node.readyz()["store"]["answering"].as_bool()
}

/// Polls `what` every 50 ms for up to `within`: how long until it held.
async fn until(within: Duration, mut what: impl FnMut() -> bool) -> Option<f64> {
    let start = Instant::now();
    while start.elapsed() < within {
        if what() {
            return Some(start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A real `redis-server` and a real node on the example rules using it (its directory kept
/// while the node runs).
async fn node_on_its_own_redis() -> (RedisServer, NodeProcess, tempfile::TempDir) {
    let redis = blocking(RedisServer::start).await.expect("redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let node = started(
        std::path::Path::new(env!("CARGO_BIN_EXE_tollgate")),
        &redis.url(),
        dir.path(),
        "node",
        RULES,
    )
    .await;
    (redis, node, dir)
}

async fn case(fault: Fault, rate: u32) -> Seen {
    let (mut redis, node, _dir) = node_on_its_own_redis().await;
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", node.grpc))
        .await
        .expect("connect");
    let login = move |i: u32| {
        let ip = format!("10.{}.{}.{}", rate, i / 250, i % 250);
        rls_request(
            "public-api",
            &[&[("route", "POST /login"), ("ip", ip.as_str())]],
        )
    };
    // Healthy: a few logins, admitted.
    for i in 0..3 {
        let answer = client.should_rate_limit(login(i)).await.expect("answer");
        assert_eq!(
            answer.get_ref().overall_code,
            1,
            "admitted while Redis is up"
        );
    }
    let node = std::sync::Arc::new(node);
    assert_eq!(
        blocking({
            let node = node.clone();
            move || answering(&node)
        })
        .await,
        Some(true)
    );
    let fault_at = Instant::now();
    match fault {
        Fault::Killed => redis.kill(),
        Fault::Stalled => redis.pause().expect("SIGSTOP"),
    }
    // The traffic, from the fault on.
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let driver = tokio::spawn(async move {
        let mut sent = vec![];
        if rate == 0 {
            return sent;
        }
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
        let mut i = 3;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.changed() => return sent,
            }
            let started = Instant::now();
            let answer = client.should_rate_limit(login(i)).await;
            sent.push(Sent {
                at: started.duration_since(fault_at).as_secs_f64(),
                code: answer.ok().map(|a| a.get_ref().overall_code),
                took: started.elapsed(),
            });
            i += 1;
        }
    });
    let (mut shown_after, mut logged_after, mut metric_after) = (None, None, None);
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs_f64(OUTAGE_SECONDS) {
        let (ready, log, metrics) = blocking({
            let node = node.clone();
            move || (answering(&node), node.log(), node.metrics())
        })
        .await;
        let now = fault_at.elapsed().as_secs_f64();
        if shown_after.is_none() && ready == Some(false) {
            shown_after = Some(now);
        }
        if logged_after.is_none() && log.contains("the store is not answering") {
            logged_after = Some(now);
        }
        if metric_after.is_none() && metrics.contains("tollgate_store_answering 0") {
            metric_after = Some(now);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let back_at = Instant::now();
    match fault {
        Fault::Killed => redis.restart().expect("restarted"),
        Fault::Stalled => redis.resume().expect("SIGCONT"),
    }
    let back_after = until(Duration::from_secs(5), || answering(&node) == Some(true)).await;
    let logged_back = node.log().contains("the store answers again");
    let _ = back_at;
    stop.send_replace(true);
    let sent = driver.await.expect("driver");
    let log = node
        .log()
        .lines()
        .filter(|l| l.contains("store") || std::env::var("STORE_OUTAGE_LOG").is_ok())
        .collect::<Vec<_>>()
        .join("\n");
    Seen {
        log,
        rate,
        shown_after,
        logged_after,
        metric_after,
        back_after,
        logged_back,
        sent,
    }
}

async fn every_rate(fault: Fault) {
    let cases: Vec<_> = [0, 1, 10, 100]
        .into_iter()
        .map(|rate| tokio::spawn(case(fault, rate)))
        .collect();
    for case in cases {
        let seen = case.await.expect("a case");
        let rate = seen.rate;
        eprintln!(
            "{fault:?} at {rate}/s: readyz after {:?} s, log after {:?} s, metric after {:?} s, \
             back after {:?} s; {} requests",
            seen.shown_after,
            seen.logged_after,
            seen.metric_after,
            seen.back_after,
            seen.sent.len()
        );
        eprintln!("{}", seen.log);
        for (what, after) in [
            ("/readyz", seen.shown_after),
            ("the log", seen.logged_after),
            ("tollgate_store_answering", seen.metric_after),
        ] {
            assert!(
                after.is_some_and(|s| s <= 2.0),
                "{fault:?} at {rate}/s: {what} said the store was not answering after {after:?} s"
            );
        }
        assert!(
            seen.back_after.is_some_and(|s| s <= 2.0),
            "{fault:?} at {rate}/s: answering again after {:?} s",
            seen.back_after
        );
        assert!(
            seen.logged_back,
            "{fault:?} at {rate}/s: no line when it came back"
        );
        // Every login during the outage was denied (CLOSED), none an RPC error.
        let during: Vec<_> = seen.sent.iter().filter(|s| s.at < OUTAGE_SECONDS).collect();
        assert!(
            during.iter().all(|s| s.code == Some(2)),
            "{fault:?} at {rate}/s: {:?}",
            during.iter().find(|s| s.code != Some(2))
        );
        // Once the breaker knows (at once for a refused connection, within a second of
        // failures for a stall), a CLOSED request no longer waits the store's patience. A
        // stalled store is probed, and a request let through as the probe after a cooldown
        // waits for it: most do not (before, at 10 a second, every one waited 257 ms).
        let late: Vec<_> = during.iter().filter(|s| s.at >= 1.5).collect();
        let waited: Vec<_> = late
            .iter()
            .filter(|s| s.took >= Duration::from_millis(100))
            .collect();
        let allowed = match fault {
            Fault::Killed => 0,
            // At most one probe a second (the longest cooldown), or a quarter of them.
            Fault::Stalled => (late.len() / 4).max((OUTAGE_SECONDS - 1.5).ceil() as usize),
        };
        assert!(
            waited.len() <= allowed,
            "{fault:?} at {rate}/s: {} of {} requests still waited: {:?}",
            waited.len(),
            late.len(),
            waited.iter().take(5).collect::<Vec<_>>()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_shows_within_two_seconds_at_any_traffic() {
    every_rate(Fault::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_shows_within_two_seconds_at_any_traffic() {
    every_rate(Fault::Stalled).await;
}

/// A node that has served no request at all still asks its store: on a healthy Redis its last
/// answer stays fresh (no alert on an idle node), and a killed Redis shows within 2 s. Before,
/// the heartbeat asked only shards a call had reached: a fresh idle node's last answer aged
/// without end (`TollgateStoreNotAnswering` fires past 30 s) and a dead Redis never showed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_served_nothing_shows_a_healthy_store_and_its_outage() {
    let (mut redis, node, _dir) = node_on_its_own_redis().await;
    let node = std::sync::Arc::new(node);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let readyz = blocking({
        let node = node.clone();
        move || node.readyz()
    })
    .await;
    let age = readyz["store"]["lastAnswerAgeMs"].as_u64().expect("an age");
    assert!(
        age < 2_000 && readyz["store"]["answering"] == true,
        "idle on a healthy Redis: {}",
        readyz["store"]
    );
    blocking(move || redis.kill()).await;
    let shown = until(Duration::from_secs(2), || answering(&node) == Some(false)).await;
    assert!(
        shown.is_some(),
        "a killed Redis did not show on an idle node within 2 s: {}\n{}",
        node.readyz()["store"],
        node.log()
    );
}
