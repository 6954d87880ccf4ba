//! The node's own cost for the seed's peak, without the simulator: the traffic of
//! `simulations/scenarios/seed-full-load.yaml` (two rules, Zipf keys over 2 M identities, each
//! request to one of 50 nodes at random) decided one after another through `Node::check` on
//! the in-memory store, no link latency, in real time on one thread. The simulator's wall time
//! per decision is measured against this floor (BENCHMARKS.md, "The seed's whole peak").
//!
//! `cargo bench -p tollgate-simulations --bench seed_peak_node` (`BENCH_DECISIONS`, default
//! 3,000,000: the seed's peak for 6 s in one region).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tollgate_lease::{MemoryStore, SharedClock, Store, TokioClock};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::source;
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::{Node, Request, RuntimeConfig};

const RULES: &str = r#"
domain: public-api
rules:
  - id: api-key
    match: { api_key: "*" }
    algorithm: TOKEN_BUCKET
    capacity: 60
    refillPerSecond: 6
  - id: orders-per-key
    match: { route: "POST /orders" }
    per: [api_key]
    algorithm: FIXED_WINDOW
    limit: 72
    window: 1m
"#;

const NODES: usize = 50;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let decisions: u64 = std::env::var("BENCH_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let clock: SharedClock = Arc::new(TokioClock::starting_at(1_767_225_600_000_000));
        let store = Store::Memory(MemoryStore::with_clock(
            clock.clone(),
            tollgate_lease::MemoryConfig {
                max_bytes: 4 << 30,
                ..Default::default()
            },
        ));
        let loaded = source::parse(RULES, std::path::Path::new("seed.yaml")).expect("rules");
        let mut nodes = vec![];
        for _ in 0..NODES {
            let metrics = Metrics::new();
            let rules = ActiveRules::new(metrics.clone());
            rules.install(&loaded).expect("install");
            let config = RuntimeConfig {
                cluster_nodes: NODES as u32,
                ..RuntimeConfig::default()
            };
            let node = Node::start(
                store.clone(),
                rules,
                config,
                clock.clone(),
                metrics,
                Duration::from_millis(250),
            )
            .await
            .expect("node");
            nodes.push(node);
        }
        let zipf = Zipf::new(2_000_000.0, 1.0).expect("zipf");
        let mut rng = StdRng::seed_from_u64(1);
        let started = Instant::now();
        let mut admitted = 0u64;
        for _ in 0..decisions {
            let key = zipf.sample(&mut rng) as u64;
            let node = &nodes[rng.random_range(0..NODES)];
            let request = Request::new("public-api".to_owned()).descriptor([
                ("api_key".to_owned(), format!("k{key}")),
                ("route".to_owned(), "POST /orders".to_owned()),
            ]);
            if node.check(&request).await.is_ok_and(|v| v.allowed) {
                admitted += 1;
            }
        }
        let took = started.elapsed();
        println!(
            "| node alone (50 nodes, in-memory store, no latency) | {decisions} | {:.2} s | {:.2} µs | {admitted} admitted |",
            took.as_secs_f64(),
            took.as_secs_f64() * 1e6 / decisions as f64
        );
    });
}
