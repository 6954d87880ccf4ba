//! The client: `connections` HTTP/2 connections, each carrying `streams` requests in flight
//! (a closed loop), or requests at a fixed rate; every request a real `ShouldRateLimit` with
//! the chosen key distribution. Latency is from when a request was due (at a fixed rate, a
//! late send counts against the server: no coordinated omission).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::time::Instant;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::cli::Run;
use crate::keys::Keys;
use crate::report::Report;

/// Counts shared by every client task.
#[derive(Debug, Default)]
struct Tally {
    measuring: AtomicBool,
    sent: AtomicU64,
    ok: AtomicU64,
    over_limit: AtomicU64,
    unknown: AtomicU64,
    /// Answers the node made without its store's answer, by how (the node's
    /// `tollgate-decided-without-store` response header): see [`WITHOUT_STORE`].
    without_store: [AtomicU64; WITHOUT_STORE.len()],
    statuses: std::sync::Mutex<BTreeMap<String, u64>>,
}

/// The response header a Tollgate node sets on an answer made without its store's answer,
/// and the ways it names (other servers never set it).
const DECIDED_WITHOUT_STORE: &str = "tollgate-decided-without-store";
const WITHOUT_STORE: [&str; 4] = [
    "failed-open",
    "last-answer",
    "local-fallback",
    "failed-closed",
];

impl Tally {
    fn without_store_total(&self) -> u64 {
        self.without_store
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// Runs `run` on its own runtime and prints the report.
pub(crate) fn main(run: Run) -> anyhow::Result<()> {
    let threads = match run.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    let report = runtime.block_on(drive(&run))?;
    println!("{}", Report::table_header());
    println!("{}", report.table_row());
    if let Some(warning) = report.without_store_warning() {
        eprintln!("{warning}");
    }
    if let Some(path) = &run.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

fn request(run: &Run, key: String) -> RateLimitRequest {
    let mut descriptors = Vec::with_capacity(run.descriptors.max(1));
    descriptors.push(RateLimitDescriptor {
        entries: vec![Entry {
            key: run.key.clone(),
            value: key.clone().into_bytes(),
        }],
        ..Default::default()
    });
    for d in 1..run.descriptors {
        descriptors.push(RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: run.key.clone(),
                    value: key.clone().into_bytes(),
                },
                Entry {
                    key: "d".into(),
                    value: d.to_string().into_bytes(),
                },
            ],
            ..Default::default()
        });
    }
    RateLimitRequest {
        domain: run.domain.clone(),
        descriptors,
        hits_addend: 1,
    }
}

/// Drives the server; the report of the measured part.
///
/// One load test from warm-up to report in the order it runs (connections, the warm-up, the
/// measured part, the counts read back): longer than most, read top to bottom.
pub(crate) async fn drive(run: &Run) -> anyhow::Result<Report> {
    let keys = Arc::new(Keys::parse(&run.keys, run.zipf_s)?);
    let endpoint = Endpoint::from_shared(run.target.clone())?
        .tcp_nodelay(true)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(1 << 22);
    let mut channels: Vec<Channel> = Vec::with_capacity(run.connections);
    for _ in 0..run.connections.max(1) {
        channels.push(
            endpoint
                .connect()
                .await
                .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", run.target))?,
        );
    }
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let measure_from = start + run.warmup;
    let end = measure_from + run.duration;
    // At a fixed rate, tasks take the next due time from one counter (ns since `start`).
    let interval_ns = run.rate.map(|r| (1e9 / r.max(1e-3)) as u64);
    let next_due = Arc::new(AtomicU64::new(0));
    let mut tasks = vec![];
    for channel in &channels {
        for _ in 0..run.streams.max(1) {
            let (run, keys, tally, next_due) =
                (run.clone(), keys.clone(), tally.clone(), next_due.clone());
            let mut client = RateLimitServiceClient::new(channel.clone());
            tasks.push(tokio::spawn(async move {
                let mut histogram =
                    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
                let mut rng = SmallRng::from_rng(&mut rand::rng());
                loop {
                    let due = match interval_ns {
                        Some(step) => {
                            let at = start
                                + Duration::from_nanos(next_due.fetch_add(step, Ordering::Relaxed));
                            tokio::time::sleep_until(at).await;
                            at
                        }
                        None => Instant::now(),
                    };
                    if due >= end {
                        break;
                    }
                    let body = request(
                        &run,
                        padded(
                            format!("{}{}", run.key_prefix, keys.next(&mut rng)),
                            run.key_bytes,
                        ),
                    );
                    let answer = client.should_rate_limit(body).await;
                    if !tally.measuring.load(Ordering::Relaxed) {
                        continue;
                    }
                    let _ = histogram.record(due.elapsed().as_nanos().max(1) as u64);
                    tally.sent.fetch_add(1, Ordering::Relaxed);
                    match answer {
                        Ok(r) => {
                            if let Some(how) = r
                                .metadata()
                                .get(DECIDED_WITHOUT_STORE)
                                .and_then(|v| v.to_str().ok())
                                && let Some(i) = WITHOUT_STORE.iter().position(|w| *w == how)
                            {
                                tally.without_store[i].fetch_add(1, Ordering::Relaxed);
                            }
                            let code = r.into_inner().overall_code;
                            let counter = if code == Code::Ok as i32 {
                                &tally.ok
                            } else if code == Code::OverLimit as i32 {
                                &tally.over_limit
                            } else {
                                &tally.unknown
                            };
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(status) => {
                            let mut statuses = tally.statuses.lock().expect("statuses");
                            *statuses.entry(format!("{:?}", status.code())).or_default() += 1;
                        }
                    }
                }
                histogram
            }));
        }
    }
    tokio::time::sleep_until(measure_from).await;
    tally.measuring.store(true, Ordering::Relaxed);
    let measured = Instant::now();
    if !run.quiet {
        let (tally, every) = (tally.clone(), Duration::from_secs(1));
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval_at(Instant::now() + every, every);
            loop {
                tick.tick().await;
                let sent = tally.sent.load(Ordering::Relaxed);
                eprintln!(
                    "{:>5.1}s {:>9} req/s  ok {}  over {}  decided without the store {}",
                    measured.elapsed().as_secs_f64(),
                    sent - last,
                    tally.ok.load(Ordering::Relaxed),
                    tally.over_limit.load(Ordering::Relaxed),
                    tally.without_store_total(),
                );
                last = sent;
            }
        });
    }
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    for task in tasks {
        histogram.add(task.await?)?;
    }
    let seconds = measured
        .elapsed()
        .as_secs_f64()
        .min(run.duration.as_secs_f64().max(1e-9));
    let statuses = tally.statuses.lock().expect("statuses").clone();
    let without_store = WITHOUT_STORE
        .iter()
        .zip(&tally.without_store)
        .map(|(how, n)| ((*how).to_owned(), n.load(Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .collect();
    Ok(Report::new(
        run,
        seconds,
        &histogram,
        [
            ("OK", tally.ok.load(Ordering::Relaxed)),
            ("OVER_LIMIT", tally.over_limit.load(Ordering::Relaxed)),
            ("UNKNOWN", tally.unknown.load(Ordering::Relaxed)),
        ],
        statuses,
        without_store,
    ))
}

/// `key` padded to `bytes` (unchanged if it is that long already).
fn padded(mut key: String, bytes: usize) -> String {
    if key.len() < bytes {
        key.push('-');
        let fill = bytes - key.len();
        key.extend(std::iter::repeat_n('x', fill));
    }
    key
}
