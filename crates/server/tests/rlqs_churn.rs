//! A long run of RLQS as the world sends it: a real Envoy 1.40 on the shipped
//! deploy/envoy/envoy-rlqs.yaml in front of a real `tollgate` process, 20,000 distinct API keys
//! over five minutes (`RLQS_CHURN_SECONDS` shortens it), each key new to the Envoy (one in a
//! hundred 3,000 bytes long, one in a hundred not UTF-8): every key is limited (it gets its share: at least one request admitted, never more than its bucket
//! and refill allow). Meanwhile, on the node's gRPC port from other hosts: one stream reporting
//! 100,000 buckets, one that does not read its answers, 2,000 that never report, and a report
//! over the size limit. The node's memory, read from /proc, stays within the shipped pod's
//! 1 GiB throughout.
//!
//! Before this was built, a stream's buckets were never forgotten: past 10,000 keys an Envoy's
//! new keys got no assignment, and the shipped ALLOW_ALL let them through unlimited.

mod support;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use support::rlqs_stream::{Stream, key, usage_reports};
use tokio::time::Instant;
use tollgate_proto::envoy::service::rate_limit_quota::v3::BucketId;

/// 2 a key, refilled at 1 a second (the smallest whole rate RLQS can share).
const RULES: &str = "domain: public-api\nrules:\n  - {id: per-key, match: {name: per-key, api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 2, refillPerSecond: 1}\n";

/// The process's resident memory, MB.
fn rss_mb(pid: u32) -> u64 {
    tollgate_testkit::process::rss_bytes(pid).unwrap_or(0) >> 20
}

/// An upstream that answers 200 to anything; its port.
async fn upstream() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "ok\n" });
        axum::serve(listener, app).await.expect("upstream");
    });
    port
}

fn host(last: u8) -> Option<IpAddr> {
    Some(IpAddr::from([127, 0, 0, last]))
}

/// Streams a hostile or broken world opens on the node's gRPC port, from hosts of their own:
/// held until the run ends.
async fn hostile_streams(grpc: std::net::SocketAddr) -> Vec<Stream> {
    let mut held = vec![];
    // One stream reporting 100,000 buckets, 4,000 a report.
    let ids: Vec<BucketId> = (0..100_000).map(|i| key(&format!("flood-{i}"))).collect();
    let chunks: Vec<Vec<(&BucketId, u64, u64)>> = ids
        .chunks(4_000)
        .map(|c| c.iter().map(|id| (id, 1, 0)).collect())
        .collect();
    let flood = Stream::try_open_from(
        host(20),
        grpc,
        Some(usage_reports("public-api", &chunks[0])),
    )
    .await
    .expect("flood opened");
    for chunk in &chunks[1..] {
        flood.report("", chunk).await;
    }
    held.push(flood);
    // One that does not read: HTTP/2's smallest windows, never read.
    let unread: Vec<BucketId> = (0..10_000).map(|i| key(&format!("unread-{i}"))).collect();
    let report: Vec<(&BucketId, u64, u64)> = unread.iter().map(|id| (id, 1, 0)).collect();
    held.push(
        Stream::try_open_with(
            tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
                .expect("endpoint")
                .local_address(host(21))
                .initial_stream_window_size(Some(65_535))
                .initial_connection_window_size(Some(65_535)),
            Some(usage_reports("public-api", &report)),
        )
        .await
        .expect("unread opened"),
    );
    // A report over the limit (4 MiB): 30,000 keys of 150 bytes.
    let big: Vec<BucketId> = (0..30_000).map(|i| key(&format!("{i:0>150}"))).collect();
    let report: Vec<(&BucketId, u64, u64)> = big.iter().map(|id| (id, 1, 0)).collect();
    if let Ok(stream) =
        Stream::try_open_from(host(22), grpc, Some(usage_reports("public-api", &report))).await
    {
        held.push(stream);
    }
    // 2,000 streams that never report, 20 from each of 100 hosts.
    for h in 0..100u8 {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .expect("endpoint")
            .local_address(host(30 + h));
        for _ in 0..20 {
            if let Ok(stream) = Stream::try_open_with(channel.clone(), None).await {
                held.push(stream);
            }
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_keys_through_the_shipped_rlqs_config_each_limited() {
    // 2,000 streams and their connections here, and the node's.
    tollgate_testkit::process::raise_open_files(16_384).expect("open files");
    let seconds: u64 = std::env::var("RLQS_CHURN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let keys = 20_000 * seconds / 300;
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let (grpc, http) = (
        tollgate_testkit::process::free_port(false).expect("port"),
        tollgate_testkit::process::free_port(false).expect("port"),
    );
    let log = dir.path().join("node.log");
    let node = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--rules")
        .arg(&rules)
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("tollgate starts");
    let node = tollgate_testkit::process::Killed(node);
    let pid = node.id();
    let grpc_addr: std::net::SocketAddr = format!("127.0.0.1:{grpc}").parse().expect("addr");
    let ready = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(grpc_addr).await.is_err() {
        assert!(Instant::now() < ready, "the node never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            let mut printed = Instant::now();
            loop {
                peak.fetch_max(rss_mb(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
                if printed.elapsed() >= Duration::from_secs(15) {
                    printed = Instant::now();
                    // The node's RLQS figures as the run goes, for whoever reads the output.
                    let text = tokio::task::spawn_blocking(move || {
                        tollgate_testkit::http::get(http, "/metrics", &[])
                            .map(|r| r.body)
                            .unwrap_or_default()
                    })
                    .await
                    .unwrap_or_default();
                    let figure = |name: &str| tollgate_testkit::http::metric_sum(&text, name, "");
                    let refused = |reason: &str| {
                        tollgate_testkit::http::metric_sum(
                            &text,
                            "tollgate_rlqs_buckets_refused_total",
                            &format!("reason=\"{reason}\""),
                        )
                    };
                    eprintln!(
                        "node: RSS {} MB, {} streams, {} buckets, {} bytes of RLQS state; \
                         refused: {} stream full, {} node full; ended unread {}",
                        rss_mb(pid),
                        figure("tollgate_rlqs_streams "),
                        figure("tollgate_rlqs_buckets "),
                        figure("tollgate_rlqs_state_bytes "),
                        refused("stream_full"),
                        refused("node_full"),
                        tollgate_testkit::http::metric_sum(
                            &text,
                            "tollgate_rlqs_streams_ended_total",
                            "reason=\"unread\""
                        ),
                    );
                }
            }
        })
    };
    let upstream = upstream().await;
    let (envoy, port) = tokio::task::spawn_blocking(move || {
        tollgate_testkit::envoy::start_shipped("envoy-rlqs.yaml", upstream, grpc, &[])
    })
    .await
    .expect("join");
    let hostile = hostile_streams(grpc_addr).await;

    // The churn: keys at an even pace. Each is new to the Envoy: its first request meets the
    // no-assignment behaviour, and its client tries again as a client honouring Retry-After
    // would (every 200 ms here, for up to 5 s) until one is admitted, then sends five more.
    // Per key: (admitted, the most its bucket allowed over the time it was asked).
    let admitted: Arc<parking_lot::Mutex<HashMap<u64, (u64, u64)>>> = Arc::default();
    let started = Instant::now();
    let mut lanes = vec![];
    for k in 0..keys {
        let at = started + Duration::from_secs_f64(k as f64 * seconds as f64 / keys as f64);
        tokio::time::sleep_until(at).await;
        let admitted = admitted.clone();
        lanes.push(tokio::spawn(async move {
            // One key in a hundred is 3,000 bytes long, and another is not UTF-8: their
            // buckets are shared like any other.
            let name: Vec<u8> = match k % 100 {
                0 => format!("churn-{k}-{}", "x".repeat(3000)).into_bytes(),
                50 => [format!("churn-{k}-").as_bytes(), b"\xff\xfe"].concat(),
                _ => format!("churn-{k}").into_bytes(),
            };
            let send = |name: Vec<u8>| {
                tokio::task::spawn_blocking(move || {
                    tollgate_testkit::http::request_with_raw_headers(
                        port,
                        "GET",
                        "/v1",
                        &[("x-api-key", &name)],
                        None,
                    )
                    .map(|r| r.status)
                })
            };
            let name_shown = String::from_utf8_lossy(&name[..name.len().min(40)]).into_owned();
            let first = Instant::now();
            let mut statuses = vec![];
            loop {
                let status = send(name.clone()).await.expect("join");
                statuses.push(status);
                if matches!(statuses.last(), Some(Ok(200)))
                    || first.elapsed() >= Duration::from_secs(5)
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            for _ in 0..5 {
                statuses.push(send(name.clone()).await.expect("join"));
            }
            let ok = statuses.iter().filter(|s| matches!(s, Ok(200))).count() as u64;
            assert!(
                statuses.iter().all(|s| matches!(s, Ok(200 | 429))),
                "{name_shown}: {statuses:?}"
            );
            // The bucket's 2, and 1 a second refilled since the key's first request.
            let bound = 2 + first.elapsed().as_secs_f64().ceil() as u64;
            admitted.lock().insert(k, (ok, bound));
        }));
        lanes.retain(|l| !l.is_finished());
    }
    for lane in lanes {
        lane.await.expect("a key's requests");
    }
    let churn_took = started.elapsed();
    drop(hostile);
    // The churn over, every bucket goes: each key's Envoy is told to abandon it after three
    // reports without a request, and the hostile streams' shares went with them.
    let forgotten = Instant::now() + Duration::from_secs(60);
    let held = loop {
        let text = tokio::task::spawn_blocking(move || {
            tollgate_testkit::http::get(http, "/metrics", &[])
                .map(|r| r.body)
                .unwrap_or_default()
        })
        .await
        .expect("join");
        let held = tollgate_testkit::http::metric_sum(&text, "tollgate_rlqs_buckets ", "");
        if held == 0.0 || Instant::now() > forgotten {
            break held;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    sampler.abort();
    let admitted = admitted.lock();
    // Keys that are not printable ASCII share one bucket (the shipped config's second
    // matcher): together they are held to its 2 and 1 a second over the run; each of the
    // others to its own.
    let not_printable = |k: &u64| k % 100 == 50;
    let shared: u64 = admitted
        .iter()
        .filter(|(k, _)| not_printable(k))
        .map(|(_, (n, _))| n)
        .sum();
    // Its 2, 1 a second, and what docs/rlqs.md allows on credit (a tick of the rate and a
    // unit).
    let shared_bound = 2 + churn_took.as_secs() + 1 + 2;
    let unlimited: Vec<_> = admitted
        .iter()
        .filter(|(k, (n, most))| !not_printable(k) && n > most)
        .collect();
    let never: Vec<_> = admitted
        .iter()
        .filter(|(k, (n, _))| !not_printable(k) && *n == 0)
        .collect();
    let peak = peak.load(Ordering::Relaxed);
    let metrics = tollgate_testkit::http::get(http, "/metrics", &[])
        .map(|r| r.body)
        .unwrap_or_default();
    let figure =
        |name: &str, labels: &str| tollgate_testkit::http::metric_sum(&metrics, name, labels);
    eprintln!(
        "{} keys over {seconds} s: {} admitted in all, peak RSS {peak} MB; streams ended: \
         unread {}, no first report {}, too large {}, too many from a host {}; buckets refused {}",
        admitted.len(),
        admitted.values().map(|(n, _)| n).sum::<u64>(),
        figure("tollgate_rlqs_streams_ended_total", "reason=\"unread\""),
        figure(
            "tollgate_rlqs_streams_ended_total",
            "reason=\"no_first_report\""
        ),
        figure(
            "tollgate_rlqs_streams_ended_total",
            "reason=\"report_too_large\""
        ),
        figure(
            "tollgate_rlqs_streams_ended_total",
            "reason=\"too_many_from_host\""
        ),
        figure("tollgate_rlqs_buckets_refused_total", ""),
    );
    assert_eq!(admitted.len() as u64, keys);
    assert_eq!(held, 0.0, "buckets still held a minute after the last key");
    assert!(
        unlimited.is_empty(),
        "{} keys admitted more than their 2 and 1 a second: {:?}",
        unlimited.len(),
        unlimited.iter().take(10).collect::<Vec<_>>()
    );
    assert!(
        never.is_empty(),
        "{} keys never got a share: {:?}\n{}",
        never.len(),
        never.iter().take(10).collect::<Vec<_>>(),
        envoy
            .log()
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(peak < 1024, "the node's memory peaked at {peak} MB");
    assert!(
        shared <= shared_bound,
        "keys that are not printable ASCII, together: {shared} admitted, at most {shared_bound}"
    );
    assert_eq!(
        figure(
            "tollgate_rlqs_streams_ended_total",
            "reason=\"report_too_large\""
        ),
        1.0
    );
    drop(node);
}
