//! In-process decision latency and throughput against a real local Redis, with the seed's
//! per-request script (one EVALSHA per check) measured in the same run as the baseline.
//!
//! `cargo bench -p tollgate-node --bench decisions` starts its own `redis-server` on a free
//! port. `BENCH_DECISIONS` sets decisions per row (default 1,000,000 for leased rows).

use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tollgate_lease::{RedisConfig, RedisStore, SharedClock, Store, TokioClock};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::source;
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::{Node, Request, RuntimeConfig};
use tollgate_testkit::RedisServer;

const RULES: &str = "domain: api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000000000000, refillPerSecond: 1000000000}\n";

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
}

struct Row {
    name: &'static str,
    latency: Histogram<u64>,
    secs: f64,
    store_calls: u64,
}

impl Row {
    fn print(&self) {
        let n = self.latency.len();
        let q = |p| self.latency.value_at_quantile(p);
        println!(
            "| {} | {:.0} | {} | {} | {} | {:.4} |",
            self.name,
            n as f64 / self.secs,
            fmt_ns(q(0.5)),
            fmt_ns(q(0.99)),
            fmt_ns(q(0.999)),
            self.store_calls as f64 / n as f64,
        );
    }
}

fn fmt_ns(ns: u64) -> String {
    if ns < 10_000 {
        format!("{ns} ns")
    } else {
        format!("{:.1} µs", ns as f64 / 1000.0)
    }
}

async fn node(url: &str, clock: SharedClock) -> Node {
    let metrics = Metrics::new();
    let rules = ActiveRules::new(metrics.clone());
    rules
        .install(&source::parse(RULES, std::path::Path::new("bench.yaml")).expect("rules"))
        .expect("install");
    let store = Store::Redis(
        RedisStore::open(&RedisConfig {
            call_timeout: Duration::from_secs(1),
            ..RedisConfig::single(url)
        })
        .expect("redis"),
    );
    Node::start(
        store,
        rules,
        RuntimeConfig::default(),
        clock,
        metrics,
        Duration::from_secs(1),
    )
    .await
    .expect("node")
}

async fn measure_hot(name: &'static str, node: &Node, n: usize, paced: Option<Duration>) -> Row {
    let request = Request::new("api").descriptor([("api_key", name)]);
    for _ in 0..10_000 {
        node.check(&request).await.expect("valid");
    }
    let before = node.metrics().store_calls.get();
    let misses = node.metrics().lease_misses.get() + node.metrics().lease_waits.get();
    let mut latency = histogram();
    let start = Instant::now();
    let mut next = start;
    for _ in 0..n {
        if let Some(gap) = paced {
            next += gap;
            tokio::time::sleep_until(next).await;
        }
        let t = Instant::now();
        let verdict = node.check(&request).await.expect("valid");
        latency
            .record(t.elapsed().as_nanos().max(1) as u64)
            .expect("record");
        assert!(verdict.allowed);
    }
    let secs = start.elapsed().as_secs_f64();
    let waited = node.metrics().lease_misses.get() + node.metrics().lease_waits.get() - misses;
    eprintln!("{name}: {waited} of {n} decisions found no leased unit and waited for the store");
    Row {
        name,
        latency,
        secs,
        store_calls: node.metrics().store_calls.get() - before,
    }
}

/// A prepared request decided `n` times (from its leases while they last), back to back or
/// paced; only the decision is timed.
async fn measure_prepared(
    name: &'static str,
    node: &Node,
    prepared: &mut tollgate_node::Prepared,
    n: usize,
    paced: Option<Duration>,
) -> Row {
    for _ in 0..10_000 {
        prepared.decide().await;
    }
    let before = node.metrics().store_calls.get();
    let mut latency = histogram();
    let start = Instant::now();
    let mut next = start;
    let mut slow_path = 0u64;
    for _ in 0..n {
        if let Some(gap) = paced {
            next += gap;
            tokio::time::sleep_until(next).await;
        }
        let t = Instant::now();
        let decision = match prepared.try_check() {
            Some(d) => d,
            None => {
                slow_path += 1;
                prepared.decide().await
            }
        };
        latency
            .record(t.elapsed().as_nanos().max(1) as u64)
            .expect("record");
        assert_eq!(decision, tollgate_node::Decision::Allowed);
    }
    eprintln!("{name}: {slow_path} of {n} decisions left the atomic path");
    Row {
        name,
        latency,
        secs: start.elapsed().as_secs_f64(),
        store_calls: node.metrics().store_calls.get() - before,
    }
}

fn main() {
    let n: usize = std::env::var("BENCH_DECISIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    // Two workers run the actors and store calls; the measuring loop runs on the main thread.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rows = rt.block_on(async {
        let clock: SharedClock = Arc::new(TokioClock::new());
        let mut rows = vec![];

        // Baseline: the seed's script, one EVALSHA per decision, one connection.
        let seed = redis::Script::new(include_str!("../../lease/benches/seed_token_bucket.lua"));
        let mut conn = ConnectionManager::new(redis::Client::open(url.as_str()).expect("client"))
            .await
            .expect("conn");
        let calls = 20_000;
        let mut latency = histogram();
        let start = Instant::now();
        for i in 0..calls {
            let t = Instant::now();
            let _: Vec<i64> = seed
                .key(format!("seed:{{key-{}}}", i % 1000))
                .arg(1_000_000_000_000u64)
                .arg(1_000_000_000u64)
                .arg(1)
                .invoke_async(&mut conn)
                .await
                .expect("seed");
            latency
                .record(t.elapsed().as_nanos() as u64)
                .expect("record");
        }
        rows.push(Row {
            name: "baseline: seed script, one EVALSHA per decision",
            latency,
            secs: start.elapsed().as_secs_f64(),
            store_calls: calls,
        });

        // Paced first, on a fresh node: a back-to-back run leaves thousands of leases expiring
        // over the next second, which would measure that aftermath instead.
        let paced = node(&url, clock.clone()).await;
        rows.push(
            measure_hot(
                "hot key, Node::check, paced at 10,000/s",
                &paced,
                50_000,
                Some(Duration::from_micros(100)),
            )
            .await,
        );
        paced.shutdown().await;
        let hot = node(&url, clock.clone()).await;
        rows.push(measure_hot("hot key, Node::check, back to back", &hot, n, None).await);

        // The same hot key through a prepared request: atomics only while leases last.
        let mut prepared = hot
            .prepare(Request::new("api").descriptor([("api_key", "prepared")]))
            .await
            .expect("prepare");
        for _ in 0..10_000 {
            prepared.decide().await;
        }
        rows.push(
            measure_prepared(
                "hot key, Prepared::try_check, back to back",
                &hot,
                &mut prepared,
                n,
                None,
            )
            .await,
        );
        let mut paced = hot
            .prepare(Request::new("api").descriptor([("api_key", "prepared-paced")]))
            .await
            .expect("prepare");
        rows.push(
            measure_prepared(
                "hot key, Prepared::try_check, paced at 10,000/s",
                &hot,
                &mut paced,
                50_000,
                Some(Duration::from_micros(100)),
            )
            .await,
        );
        hot.shutdown().await;
        // Cold keys: every decision a new API key (actor, lease of one unit, store call).
        let cold = node(&url, clock.clone()).await;
        let keys = 20_000;
        let before = cold.metrics().store_calls.get();
        let mut latency = histogram();
        let start = Instant::now();
        for i in 0..keys {
            let request = Request::new("api").descriptor([("api_key", format!("cold-{i}"))]);
            let t = Instant::now();
            let verdict = cold.check(&request).await.expect("valid");
            latency
                .record(t.elapsed().as_nanos() as u64)
                .expect("record");
            assert!(verdict.allowed);
        }
        let secs = start.elapsed().as_secs_f64();
        rows.push(Row {
            name: "cold key (new identity each decision)",
            latency,
            secs,
            store_calls: cold.metrics().store_calls.get() - before,
        });
        cold.shutdown().await;
        rows
    });
    println!("| decision | decisions/s | p50 | p99 | p999 | store calls per decision |");
    println!("|---|---:|---:|---:|---:|---:|");
    for row in &rows {
        row.print();
    }
    let rate = |r: &Row| r.latency.len() as f64 / r.secs;
    let calls = |r: &Row| r.store_calls as f64 / r.latency.len() as f64;
    println!(
        "\nhot key (Node::check) vs baseline: {:.0}x the decisions/s, {:.0}x fewer store calls per decision",
        rate(&rows[2]) / rate(&rows[0]),
        1.0 / calls(&rows[2]).max(1e-9)
    );
    drop(server);
}
