//! Lease store throughput and latency against a real local Redis, with the seed's per-request
//! script measured in the same run as the baseline, and the in-memory store's ops/s.
//!
//! `cargo bench -p tollgate-lease --bench store` starts its own `redis-server` on a free port
//! (or uses `TOLLGATE_BENCH_REDIS=redis://...`). `BENCH_SECONDS` sets the time per row
//! (default 3). Results go to stdout as a Markdown table; BENCHMARKS.md keeps a copy.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hdrhistogram::Histogram;
use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tollgate_lease::{
    BucketKey, CheckItem, CheckRequest, LeaseAsk, LeaseRequest, LeaseStore, Limit, MemoryStore,
    RedisConfig, RedisStore, Store,
};
use tollgate_testkit::RedisServer;

const IDENTITIES: usize = 1000;

struct Row {
    name: String,
    calls: u64,
    secs: f64,
    decisions_per_call: u64,
    latency: Histogram<u64>,
}

impl Row {
    fn print(&self, baseline: Option<f64>) {
        let per_sec = self.calls as f64 / self.secs;
        let vs = baseline.map_or(String::from("—"), |b| format!("{:.2}×", per_sec / b));
        println!(
            "| {} | {:.0} | {} | {:.1} | {:.1} | {:.0} |",
            self.name,
            per_sec,
            vs,
            self.latency.value_at_quantile(0.5) as f64 / 1000.0,
            self.latency.value_at_quantile(0.99) as f64 / 1000.0,
            per_sec * self.decisions_per_call as f64,
        );
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
}

/// Runs `call` from `inflight` concurrent tasks for `secs`, recording each call's latency (ns).
async fn drive<F, Fut>(
    name: &str,
    inflight: usize,
    secs: f64,
    decisions_per_call: u64,
    call: F,
) -> Row
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..inflight)
        .map(|task| {
            let (stop, call) = (stop.clone(), call.clone());
            tokio::spawn(async move {
                let mut h = histogram();
                let mut i = task;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    call(i % IDENTITIES).await;
                    h.record(t.elapsed().as_nanos() as u64).expect("record");
                    i += inflight;
                }
                h
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut latency = histogram();
    for t in tasks {
        latency.add(t.await.expect("join")).expect("add");
    }
    Row {
        name: name.to_owned(),
        calls: latency.len(),
        secs: start.elapsed().as_secs_f64(),
        decisions_per_call,
        latency,
    }
}

fn key(i: usize, rule: &str) -> BucketKey {
    BucketKey::new(format!("bench-{i}").as_bytes(), rule).expect("key")
}

/// Polls a future that is ready at once (the in-memory store never waits) without a runtime.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the in-memory store never waits"),
    }
}

fn memory_row(name: &str, threads: usize, secs: f64) -> Row {
    let store = MemoryStore::new();
    let limit = Limit::token_bucket(1_000_000_000_000, 1e9).expect("limit");
    let reqs: Arc<Vec<CheckRequest>> = Arc::new(
        (0..IDENTITIES)
            .map(|i| CheckRequest::single(key(i, "tb"), limit, 1).expect("req"))
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let start = std::time::SystemTime::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, reqs, stop) = (store.clone(), reqs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut h = histogram();
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    // Time batches of 64 calls: a single call is shorter than the clock's cost.
                    let clock = Instant::now();
                    for _ in 0..64 {
                        let out = ready(store.check(&reqs[i % IDENTITIES])).expect("check");
                        assert!(out.allowed());
                        i += threads;
                    }
                    h.record_n((clock.elapsed().as_nanos() as u64 / 64).max(1), 64)
                        .expect("record");
                }
                h
            })
        })
        .collect();
    #[allow(clippy::disallowed_methods)] // a benchmark's wall-clock duration
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut latency = histogram();
    for h in handles {
        latency.add(h.join().expect("join")).expect("add");
    }
    let secs = start.elapsed().expect("clock").as_secs_f64();
    Row {
        name: name.to_owned(),
        calls: latency.len(),
        secs,
        decisions_per_call: 1,
        latency,
    }
}

fn main() {
    let secs: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let server = match std::env::var("TOLLGATE_BENCH_REDIS") {
        Ok(_) => None,
        Err(_) => Some(RedisServer::start().expect("redis-server")),
    };
    let url = std::env::var("TOLLGATE_BENCH_REDIS")
        .unwrap_or_else(|_| server.as_ref().map(RedisServer::url).expect("url"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let config = RedisConfig {
            call_timeout: Duration::from_secs(2),
            ..RedisConfig::single(url.clone())
        };
        let store = Store::Redis(RedisStore::open(&config).expect("store"));
        let client = redis::Client::open(url.as_str()).expect("client");
        let conn = ConnectionManager::new(client).await.expect("connection");
        let seed = redis::Script::new(include_str!("seed_token_bucket.lua"));

        let huge = Limit::token_bucket(1_000_000_000_000, 1e9).expect("limit");
        let fw = Limit::fixed_window(1_000_000_000, Duration::from_secs(3600)).expect("limit");
        let one = Arc::new(
            (0..IDENTITIES)
                .map(|i| CheckRequest::single(key(i, "tb"), huge, 1).expect("req"))
                .collect::<Vec<_>>(),
        );
        let two = Arc::new(
            (0..IDENTITIES)
                .map(|i| {
                    CheckRequest::new(vec![
                        CheckItem {
                            key: key(i, "tb"),
                            limit: huge,
                            cost: 1,
                            allowance: None,
                            penalized: false,
                        },
                        CheckItem {
                            key: key(i, "fw"),
                            limit: fw,
                            cost: 1,
                            allowance: None,
                            penalized: false,
                        },
                    ])
                    .expect("req")
                })
                .collect::<Vec<_>>(),
        );
        let leases = Arc::new(
            (0..IDENTITIES)
                .map(|i| {
                    let ask = LeaseAsk {
                        key: key(i, "lease"),
                        limit: huge,
                        want: 50,
                        min: 1,
                        max_share: 0.5,
                        allowance: None,
                        penalized: false,
                    };
                    LeaseRequest::new(vec![ask], Duration::from_secs(1)).expect("req")
                })
                .collect::<Vec<_>>(),
        );

        println!("| operation | calls/s | vs baseline | p50 µs | p99 µs | decisions/s |");
        println!("|---|---:|---:|---:|---:|---:|");
        for (mode, inflight) in [("1 in flight", 1usize), ("64 in flight", 64)] {
            let baseline = {
                let (conn, seed) = (conn.clone(), Arc::new(seed.clone()));
                drive(
                    &format!("seed script, EVALSHA per check ({mode})"),
                    inflight,
                    secs,
                    1,
                    move |i| {
                        let (mut conn, seed) = (conn.clone(), seed.clone());
                        async move {
                            let _: Vec<i64> = seed
                                .key(format!("seed:{{bench-{i}}}"))
                                .arg(1_000_000_000_000u64)
                                .arg(1_000_000_000u64)
                                .arg(1)
                                .invoke_async(&mut conn)
                                .await
                                .expect("seed script");
                        }
                    },
                )
                .await
            };
            let base = baseline.calls as f64 / baseline.secs;
            baseline.print(None);
            let rows = [
                {
                    let (store, reqs) = (store.clone(), one.clone());
                    drive(
                        &format!("check, 1 rule ({mode})"),
                        inflight,
                        secs,
                        1,
                        move |i| {
                            let (store, reqs) = (store.clone(), reqs.clone());
                            async move {
                                assert!(store.check(&reqs[i]).await.expect("check").allowed());
                            }
                        },
                    )
                    .await
                },
                {
                    let (store, reqs) = (store.clone(), two.clone());
                    drive(
                        &format!("check, 2 rules atomically ({mode})"),
                        inflight,
                        secs,
                        1,
                        move |i| {
                            let (store, reqs) = (store.clone(), reqs.clone());
                            async move {
                                assert!(store.check(&reqs[i]).await.expect("check").allowed());
                            }
                        },
                    )
                    .await
                },
                {
                    let (store, reqs) = (store.clone(), leases.clone());
                    drive(
                        &format!("lease acquire, 50 units ({mode})"),
                        inflight,
                        secs,
                        50,
                        move |i| {
                            let (store, reqs) = (store.clone(), reqs.clone());
                            async move {
                                let grants = store.acquire_leases(&reqs[i]).await.expect("lease");
                                assert_eq!(grants[0].units, 50);
                            }
                        },
                    )
                    .await
                },
            ];
            for row in rows {
                row.print(Some(base));
            }
        }
    });
    memory_row("in-memory store check, 1 thread", 1, secs).print(None);
    memory_row("in-memory store check, 2 threads", 2, secs).print(None);
    drop(server);
}
