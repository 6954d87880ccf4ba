//! Region sync under load, two regions on loopback (each its own `redis-server` and two
//! nodes, as in `tests/regions`):
//!
//! 1. Sync traffic: 10,000 active ASYNC_SYNC keys at a 2 s interval: bytes and batches per
//!    second one region ships.
//! 2. Overshoot: both regions offering a steady load to one ASYNC_SYNC key, per window, at
//!    sync intervals of 1 s, 2 s and 5 s, against the bound `L + rate × (interval + delivery)`.
//!
//! `cargo bench -p tollgate-tests --bench regions`. `BENCH_WINDOW_S` sets the overshoot
//! window (default 60; each interval runs one whole window).

#[path = "../regions/support.rs"]
#[allow(dead_code)]
mod support;

use std::time::Duration;

use support::{TwoRegions, window_start_in};
use tollgate_node::Request;

async fn traffic() {
    const KEYS: usize = 10_000;
    let interval = Duration::from_secs(2);
    let rules = "domain: api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: FIXED_WINDOW, limit: 1000000, window: 1h, regional: {policy: ASYNC_SYNC}}\n";
    let regions = TwoRegions::start(rules, interval).await;
    let requests: Vec<Request> = (0..KEYS)
        .map(|i| Request::new("api").descriptor([("api_key", format!("key-{i:05}"))]))
        .collect();
    // Warm up: every key once on each us node, so leases and actors exist.
    for r in &requests {
        for n in &regions.us.nodes {
            n.node.check(r).await.expect("valid");
        }
    }
    let sent = |regions: &TwoRegions| {
        regions.us.nodes.iter().fold((0, 0, 0), |(b, n, e), node| {
            let m = &node.node.metrics().region;
            (
                b + m.bytes_sent.get(),
                n + m.batches_sent.get(),
                e + m.entries_sent.get(),
            )
        })
    };
    let before = sent(&regions);
    let seconds = 20u64;
    let start = tokio::time::Instant::now();
    let mut decisions = 0u64;
    // Every key is decided again and again, round-robin, for `seconds` (each about once per
    // interval: every key is active in every interval).
    while start.elapsed() < Duration::from_secs(seconds) {
        for (i, r) in requests.iter().enumerate() {
            regions.us.nodes[i % 2].node.check(r).await.expect("valid");
            decisions += 1;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Let the last interval ship.
    tokio::time::sleep(interval + Duration::from_millis(500)).await;
    let after = sent(&regions);
    let (bytes, batches, entries) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    let window = elapsed + interval.as_secs_f64();
    println!(
        "traffic: {KEYS} active keys over 2 nodes in us, sync every {interval:?}, {:.0} decisions/s: us shipped {:.0} bytes/s in {:.2} batches/s, {:.0} key totals/s, {:.1} bytes per key total",
        decisions as f64 / elapsed,
        bytes as f64 / window,
        batches as f64 / window,
        entries as f64 / window,
        bytes as f64 / entries.max(1) as f64,
    );
    regions.stop().await;
}

async fn overshoot(interval: Duration, window_s: u64) {
    let limit = 100 * window_s;
    let rules = format!(
        "domain: api\nrules:\n  - {{id: shared, match: {{api_key: '*'}}, algorithm: FIXED_WINDOW, limit: {limit}, window: {window_s}s, regional: {{policy: ASYNC_SYNC}}}}\n"
    );
    let regions = TwoRegions::start(&rules, interval).await;
    let window = Duration::from_secs(window_s);
    tokio::time::sleep(window_start_in(window) + Duration::from_millis(50)).await;
    // Each region offers 100/s: together twice the limit's rate, so the limit is reached
    // halfway through the window and both regions press against it after that.
    let rate = 100.0;
    let run = window - Duration::from_millis(500);
    let key = Request::new("api").descriptor([("api_key", "hot")]);
    let (us, eu) = tokio::join!(
        regions.us.load(&key, rate, run),
        regions.eu.load(&key, rate, run)
    );
    let total = us + eu;
    let over = total as i64 - limit as i64;
    let bound = rate * (interval.as_secs_f64() + 0.5);
    println!(
        "overshoot, sync every {interval:?}, window {window_s} s, limit {limit}: admitted {total} (us {us}, eu {eu}); overshoot {over} = {:.2}% of the limit; bound rate × (interval + 0.5 s) = {bound:.0} = {:.2}%",
        100.0 * over as f64 / limit as f64,
        100.0 * bound / limit as f64
    );
    regions.stop().await;
}

fn main() {
    let window_s: u64 = std::env::var("BENCH_WINDOW_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        traffic().await;
        for seconds in [1, 2, 5] {
            overshoot(Duration::from_secs(seconds), window_s).await;
        }
    });
}
