//! A hot key decided in a loop on the in-memory store (for profiling the decision path).
//! `cargo run --release -p tollgate-node --example hot_loop -- 2000000`

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{MemoryConfig, MemoryStore, SharedClock, Store, TokioClock};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::source;
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::{Node, Request, RuntimeConfig};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let rt = if std::env::var_os("MULTI").is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("runtime");
    rt.block_on(async {
        let clock: SharedClock = Arc::new(TokioClock::new());
        let metrics = Metrics::new();
        let rules = ActiveRules::new(metrics.clone());
        let yaml = "domain: api\nrules:\n  - {id: hot, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000000000000, refillPerSecond: 1000000000}\n";
        rules.install(&source::parse(yaml, std::path::Path::new("x.yaml")).expect("rules")).expect("install");
        let store = Store::Memory(MemoryStore::with_clock(clock.clone(), MemoryConfig::default()));
        let node = Node::start(store, rules, RuntimeConfig::default(), clock, metrics, Duration::from_millis(5)).await.expect("node");
        let request = Request::new("api").descriptor([("api_key", "hot")]);
        let start = tokio::time::Instant::now();
        for _ in 0..n {
            assert!(node.check(&request).await.expect("valid").allowed);
        }
        let secs = start.elapsed().as_secs_f64();
        println!("{n} decisions in {secs:.3} s: {:.0} ns each", secs * 1e9 / n as f64);
        node.shutdown().await;
    });
}
