//! Fresh nodes under load from their first request: a new `redis-server`, two `tollgate`
//! processes started on it, and callers that start the moment each node's gRPC port accepts,
//! nobody warming anything up (a rolling deploy with traffic on it). Shared by the test
//! (`tests/cold_start/main.rs`, the binary of the test profile) and the bench
//! (`benches/cold_start.rs`, the release binary).
//!
//! Two rules at once, as a gateway has them:
//! - `open`: a token bucket of 50 + 10/s, OPEN, one hot API key, 32 callers per node in a
//!   closed loop: what both nodes admit together must stay within the exact bound
//!   (50 + 10/s × the run);
//! - `closed`: a fixed window of 1,000 a minute, CLOSED, 20 new users decided at once on
//!   each node (3 requests each, far below the limit): none may be denied.

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_testkit::RedisServer;

#[path = "../support/node_process.rs"]
mod node_process;
use node_process::{NodeProcess, metric, request, started};

/// The rules both nodes run.
pub const RULES: &str = "domain: api\nrules:\n\
  - {id: open, match: {kind: open, api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 50, refillPerSecond: 10, failMode: OPEN}\n\
  - {id: closed, match: {kind: closed, user: '*'}, algorithm: FIXED_WINDOW, limit: 1000, window: 1m, failMode: CLOSED}\n";
const CAPACITY: f64 = 50.0;
const RATE: f64 = 10.0;
/// Callers per node on the OPEN rule's hot key.
pub const CALLERS: usize = 32;
/// New users per node on the CLOSED rule, and requests each.
pub const NEW_USERS: usize = 20;
pub const PER_USER: usize = 3;

/// What one run gave.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Admitted under the OPEN rule, both nodes together.
    pub admitted: u64,
    /// The most the OPEN rule's bucket admits over the run.
    pub bound: u64,
    /// Requests under the CLOSED rule, and how many were denied.
    pub closed: u64,
    pub closed_denied: u64,
    /// From the nodes' metrics: decisions made by a fail mode, on a share of the store's last
    /// answer, store calls judged stalled, breaker openings, units owed, and how they were
    /// settled (paid out of a late grant, or debited).
    pub failed_open: u64,
    pub failed_closed: u64,
    pub on_last_answer: u64,
    pub stalls: u64,
    pub breaker_opened: u64,
    pub owed: u64,
    pub paid: u64,
    pub debited: u64,
    /// How long the run lasted.
    pub elapsed: Duration,
}

impl Report {
    /// A row of the Markdown table ([`Report::header`]).
    pub fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {} | {} | {} of {} | {} | {} | {} | {} | {} | {} + {} / {} |",
            self.admitted,
            self.bound,
            self.closed_denied,
            self.closed,
            self.failed_open,
            self.failed_closed,
            self.on_last_answer,
            self.stalls,
            self.breaker_opened,
            self.paid,
            self.debited,
            self.owed,
        )
    }

    /// The table's header.
    pub fn header() -> &'static str {
        "| run | OPEN admitted | exact bound | CLOSED denied | failed open | failed closed | on a last answer | store stalls | breaker opened | owed: paid by a grant + debited / owed |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    }
}

#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    closed: AtomicU64,
    closed_denied: AtomicU64,
}

/// Drives one node from the moment it accepts until `end`.
async fn load(node: &NodeProcess, tally: Arc<Tally>, end: Instant, run: usize) {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", node.grpc))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
    let mut tasks = vec![];
    for user in 0..NEW_USERS {
        let (mut client, tally) = (RateLimitServiceClient::new(channel.clone()), tally.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..PER_USER {
                let r = client
                    .should_rate_limit(request("closed", "user", &format!("new-{run}-{user}")))
                    .await
                    .expect("an answer");
                tally.closed.fetch_add(1, Ordering::Relaxed);
                if r.into_inner().overall_code != Code::Ok as i32 {
                    tally.closed_denied.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for _ in 0..CALLERS {
        let (mut client, tally) = (RateLimitServiceClient::new(channel.clone()), tally.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let r = client
                    .should_rate_limit(request("open", "api_key", "hot"))
                    .await
                    .expect("an answer");
                if r.into_inner().overall_code == Code::Ok as i32 {
                    tally.admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("caller");
    }
}

/// One run: a fresh `redis-server`, two fresh `binary` nodes, load for `duration` from the
/// moment each accepts. `run` names the CLOSED rule's users apart.
pub async fn run(binary: &Path, duration: Duration, run: usize) -> Report {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let start = Instant::now();
    let end = start + duration;
    let tally = Arc::new(Tally::default());
    let (a, b) = tokio::join!(
        async {
            let node = started(binary, &redis.url(), dir.path(), "a", RULES).await;
            load(&node, tally.clone(), end, run).await;
            node
        },
        async {
            let node = started(binary, &redis.url(), dir.path(), "b", RULES).await;
            load(&node, tally.clone(), end, run).await;
            node
        },
    );
    let elapsed = start.elapsed();
    let text = a.metrics() + &b.metrics();
    let decisions = "tollgate_decisions_total";
    Report {
        admitted: tally.admitted.load(Ordering::Relaxed),
        bound: (CAPACITY + RATE * elapsed.as_secs_f64()).floor() as u64,
        closed: tally.closed.load(Ordering::Relaxed),
        closed_denied: tally.closed_denied.load(Ordering::Relaxed),
        failed_open: metric(&text, decisions, "outcome=\"failed_open\""),
        failed_closed: metric(&text, decisions, "outcome=\"failed_closed\""),
        on_last_answer: metric(&text, "tollgate_slow_store_decisions_total", ""),
        stalls: metric(&text, "tollgate_store_stalls_total", ""),
        breaker_opened: metric(&text, "tollgate_breaker_opened_total", ""),
        owed: metric(&text, "tollgate_lease_units_owed_total", ""),
        paid: metric(&text, "tollgate_owed_units_paid_by_grant_total", ""),
        debited: metric(&text, "tollgate_owed_units_debited_total", ""),
        elapsed,
    }
}

/// Processes that keep every core busy (a busy machine), stopped when dropped.
pub struct Stress(Vec<Child>);

impl Stress {
    /// One busy loop per core.
    pub fn start() -> Stress {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Stress(
            (0..cores)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Stress {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
