//! The simulator against real processes: the same small cases run both ways, and what each
//! gave, side by side. Shared by the test (`tests/fidelity/main.rs`, short runs on the test
//! profile's binary) and the bench (`benches/fidelity.rs`, the release binary; BENCHMARKS.md,
//! "The simulator against real processes").
//!
//! **Real**: a fresh `redis-server` and two fresh `tollgate` processes on it, closed-loop callers
//! starting the moment each node's gRPC port accepts, faults done to the real Redis (SIGSTOP,
//! a kill and a restart that loses its state). **Simulated**: `tollgate-sim`'s engine, the same
//! rules and callers on two simulated nodes and one store, the same faults at the same times.
//!
//! One calibration, from the real run of the same case: the simulated nodes' CPU is set so that
//! a simulated node decides as many requests per second as a real one did in that run (the
//! machine runs both nodes, Redis and the callers on its cores; what a node gets of them is what
//! its throughput says). Everything else (admissions, fail modes, store calls, and under a
//! saturating load how late answers are judged) is the simulator's own prediction.
//!
//! The load: on each node, [`HOT_CALLERS`] callers on one hot API key under a token bucket of
//! 100 + 50/s (`OPEN`), and [`USER_CALLERS`] callers over 200 users under a fixed window far
//! above what they send (`CLOSED`: any denial there is a fail mode's).

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_testkit::RedisServer;

#[path = "../support/node_process.rs"]
mod node_process;
use node_process::{NodeProcess, metric, request, started};

/// The rules both ways run.
pub const RULES: &str = "domain: api\nrules:\n  \
  - {id: hot, match: {kind: hot, api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 50, failMode: OPEN}\n  \
  - {id: users, match: {kind: user, user: '*'}, algorithm: FIXED_WINDOW, limit: 100000, window: 1m, failMode: CLOSED}\n";
const CAPACITY: f64 = 100.0;
const RATE: f64 = 50.0;
/// Callers per node on the hot key, and over the users.
pub const HOT_CALLERS: usize = 32;
pub const USER_CALLERS: usize = 8;
const USERS: u64 = 200;

/// How long a restart keeps Redis down before starting it again. Started again at once, it
/// was down 18-36 ms: about the time between the hot key's refills on a node, so whether an
/// outage caught one was a coin toss on each node, and a restart failed open 2 to 127 times
/// on the real nodes (in steps of the 32 callers waiting on a refill) against a simulated
/// 58-131, which failed CI once. Held down 200 ms, the breaker's first probe (160-240 ms
/// after it opened) raced the server's return: the second toss. Held down 100 ms, every
/// refill of the outage fails, the breaker opens within milliseconds (the users' calls fail
/// too) and its first probe finds the server back: one outcome, whatever the timing.
const RESTART_HELD: Duration = Duration::from_millis(100);

/// Fail-mode counts this close agree whatever their ratio.
const FEW: u64 = 10;

/// What is done to Redis during a case.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Nothing.
    None,
    /// SIGSTOP at `at`, SIGCONT `lasting` later.
    Stall { at: Duration, lasting: Duration },
    /// Killed at `at`, kept down for `held`, then started again on its port, empty.
    Restart { at: Duration, held: Duration },
}

/// One case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub name: &'static str,
    pub duration: Duration,
    pub fault: Fault,
    /// Callers on each node, hot key and users, as a multiple of the defaults.
    pub load: usize,
    /// Times it runs both ways; the medians are compared. A restart's fail-mode counts move
    /// in steps of the hot key's waiting callers (see [`RESTART_HELD`]).
    pub runs: usize,
}

/// The five cases: fresh nodes from their first request; a steady hot key; a 2 s stall; a
/// restart that loses the state; a load four times the callers (saturation).
pub fn cases(seconds: u64) -> Vec<Case> {
    let s = Duration::from_secs(seconds);
    vec![
        Case {
            name: "cold start",
            duration: Duration::from_secs(2),
            fault: Fault::None,
            load: 1,
            runs: 1,
        },
        Case {
            name: "steady hot key",
            duration: s,
            fault: Fault::None,
            load: 1,
            runs: 1,
        },
        Case {
            name: "2 s Redis stall (SIGSTOP)",
            duration: s.max(Duration::from_secs(4)),
            fault: Fault::Stall {
                at: Duration::from_secs(1),
                lasting: Duration::from_secs(2),
            },
            load: 1,
            runs: 1,
        },
        Case {
            name: "Redis restart, state lost",
            duration: s,
            fault: Fault::Restart {
                at: Duration::from_millis(1500),
                held: RESTART_HELD,
            },
            load: 1,
            runs: 3,
        },
        Case {
            name: "saturation (4x the callers)",
            duration: s,
            fault: Fault::None,
            load: 4,
            runs: 1,
        },
    ]
}

/// What one way of running a case gave.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// Decisions per second, both nodes together.
    pub decisions_per_s: f64,
    /// Admitted on the hot key, and the most an exact limiter admits over the run.
    pub hot_admitted: u64,
    pub hot_bound: u64,
    /// Decisions made by a fail mode: OPEN on the hot key, CLOSED on the users.
    pub failed_open: u64,
    pub failed_closed: u64,
    /// Store calls per decision, as the nodes count them (`tollgate_store_calls_total`).
    pub calls_per_decision: f64,
}

/// The middle of `v` (the lower middle of an even count).
fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).expect("a number"));
    v[(v.len() - 1) / 2]
}

impl Figures {
    /// Each figure's median over `runs`.
    fn median(runs: &[Figures]) -> Figures {
        let of = |f: fn(&Figures) -> f64| median(runs.iter().map(f).collect());
        let of_u = |f: fn(&Figures) -> u64| median(runs.iter().map(f).collect());
        Figures {
            decisions_per_s: of(|f| f.decisions_per_s),
            hot_admitted: of_u(|f| f.hot_admitted),
            hot_bound: of_u(|f| f.hot_bound),
            failed_open: of_u(|f| f.failed_open),
            failed_closed: of_u(|f| f.failed_closed),
            calls_per_decision: of(|f| f.calls_per_decision),
        }
    }

    /// Admitted on the hot key on the store's word: admitted less failed open.
    fn store_backed(&self) -> u64 {
        self.hot_admitted.saturating_sub(self.failed_open)
    }

    fn cells(&self) -> String {
        format!(
            "{:.0} | {} of {} | {} | {} | {:.4}",
            self.decisions_per_s,
            self.hot_admitted,
            self.hot_bound,
            self.failed_open,
            self.failed_closed,
            self.calls_per_decision
        )
    }
}

/// A case run both ways.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub case: Case,
    /// The medians of the runs, real and simulated.
    pub real: Figures,
    pub sim: Figures,
    /// Every run: real, and simulated from it.
    pub runs: Vec<(Figures, Figures)>,
    /// How long Redis was unreachable in a restart (the simulated store is down as long; the
    /// median over runs).
    pub down: Duration,
}

impl Comparison {
    /// The table's header.
    pub fn header() -> &'static str {
        "| case | way | decisions/s | hot key admitted of bound | failed open | failed closed | store calls per decision |\n\
         |---|---|---:|---:|---:|---:|---:|"
    }

    /// Two rows of the table: real, then simulated.
    pub fn rows(&self) -> String {
        let down = if self.down.is_zero() {
            String::new()
        } else {
            format!(" (down {} ms)", self.down.as_millis())
        };
        let median = if self.runs.len() > 1 {
            format!(", median of {} runs", self.runs.len())
        } else {
            String::new()
        };
        format!(
            "| {}{down}{median} | real | {} |\n| | simulated | {} |",
            self.case.name,
            self.real.cells(),
            self.sim.cells()
        )
    }

    /// Where the two disagree beyond the tolerances (empty: they agree). The tolerances, and
    /// why:
    /// - hot key admitted on the store's word (admitted less failed open): within 10 % of the
    ///   bound of each other (a limiter's admissions are set by its limit, not by the load:
    ///   both ways must land on it);
    /// - fail modes: within a factor of 3 of each other, or within [`FEW`] (how many requests
    ///   an outage catches depends on how many are out when it starts and how fast callers
    ///   come back, which the simulator models to the millisecond; a restart's 20-40 ms
    ///   catches a handful of CLOSED checks, and a handful is noise; its OPEN count is in
    ///   steps of the hot key's waiting callers, hence the median of three runs, see
    ///   [`Case::runs`]);
    /// - store calls per decision: within a factor of 2, and within 0.01 of each other when
    ///   both are below 0.01 (a hot key's calls are lease refills: one per lease of up to 50).
    ///   Through a stall they once swung 2x from run to run on both sides (real 0.08-0.17):
    ///   a probe whose caller stopped waiting left the breaker half-open for up to a second
    ///   after the store was back, by chance of which call the probe was. The breaker now keeps
    ///   a probe of its own out (`runtime/store_health/guarded.rs`) and both sides give 0.18-0.21.
    pub fn disagreements(&self) -> Vec<String> {
        let (r, s) = (&self.real, &self.sim);
        let mut out = vec![];
        // What the store decided: admissions less those the fail mode made (judged below).
        let slack = (r.hot_bound.max(s.hot_bound) as f64 * 0.10).max(10.0);
        // Per run, then the median (the medians of admitted and of failed open may come from
        // different runs).
        let (a, b) = (
            median(self.runs.iter().map(|(r, _)| r.store_backed()).collect()),
            median(self.runs.iter().map(|(_, s)| s.store_backed()).collect()),
        );
        if (a as f64 - b as f64).abs() > slack {
            out.push(format!(
                "hot key admitted by the store: real {a} and simulated {b} differ by more than \
                 {slack:.0}"
            ));
        }
        for (what, a, b) in [
            ("failed open", r.failed_open, s.failed_open),
            ("failed closed", r.failed_closed, s.failed_closed),
        ] {
            let ratio = (a.max(1) as f64 / b.max(1) as f64).max(b.max(1) as f64 / a.max(1) as f64);
            let agree = a.abs_diff(b) <= FEW || ratio <= 3.0;
            if !agree {
                out.push(format!("{what}: real {a}, simulated {b}"));
            }
        }
        let (a, b) = (r.calls_per_decision, s.calls_per_decision);
        let agree = if a < 0.01 && b < 0.01 {
            (a - b).abs() <= 0.01
        } else {
            a > 0.0 && b > 0.0 && (a / b).max(b / a) <= 2.0
        };
        if !agree {
            out.push(format!(
                "store calls per decision: real {a:.4}, simulated {b:.4}"
            ));
        }
        out
    }
}

/// Runs `case` on real processes, then in the simulator calibrated from that run (the n-th
/// run with seed n), [`Case::runs`] times.
pub async fn compare(binary: &Path, case: Case) -> Comparison {
    let mut runs = vec![];
    let mut downs = vec![];
    for i in 0..case.runs {
        let (real, down) = real(binary, case).await;
        let sim = simulated(case, &real, down, 1 + i as u64);
        if case.runs > 1 {
            eprintln!(
                "{} run {i} (down {} ms): real {} / simulated {}",
                case.name,
                down.as_millis(),
                real.cells(),
                sim.cells()
            );
        }
        runs.push((real, sim));
        downs.push(down);
    }
    let reals: Vec<Figures> = runs.iter().map(|(r, _)| *r).collect();
    let sims: Vec<Figures> = runs.iter().map(|(_, s)| *s).collect();
    Comparison {
        case,
        real: Figures::median(&reals),
        sim: Figures::median(&sims),
        runs,
        down: median(downs),
    }
}

// ---- real processes ----

#[derive(Default)]
struct Tally {
    decisions: AtomicU64,
    hot_admitted: AtomicU64,
    /// Hot-key admissions per 250 ms from the start, shown with `FIDELITY_DEBUG`.
    hot_by_quarter: [AtomicU64; 32],
}

/// Drives one node with the case's callers from the moment it accepts until `end`.
async fn load(
    node: &NodeProcess,
    tally: Arc<Tally>,
    start: Instant,
    end: Instant,
    callers: (usize, usize),
) {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", node.grpc))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
    let mut tasks = vec![];
    if std::env::var_os("FIDELITY_DEBUG").is_some() {
        // What the node says of itself every 250 ms: hot-key fail-open decisions so far, and
        // its breaker's state (0 closed, 1 half-open, 2 open).
        let http = node.http;
        tasks.push(tokio::spawn(async move {
            let mut seen = vec![];
            let mut at = start;
            while at < end {
                at += Duration::from_millis(250);
                tokio::time::sleep_until(at).await;
                let text = tokio::task::spawn_blocking(move || {
                    tollgate_testkit::http::get(http, "/metrics", &[])
                        .map(|r| r.body)
                        .unwrap_or_default()
                })
                .await
                .expect("join");
                seen.push((
                    metric(
                        &text,
                        "tollgate_decisions_total",
                        "rule=\"hot\",outcome=\"failed_open\"",
                    ),
                    metric(&text, "tollgate_breaker_state", ""),
                ));
            }
            eprintln!("real node {http}: (failed open so far, breaker) per 250 ms {seen:?}");
        }));
    }
    for caller in 0..callers.0 + callers.1 {
        let hot = caller < callers.0;
        let (mut client, tally) = (RateLimitServiceClient::new(channel.clone()), tally.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                let req = if hot {
                    request("hot", "api_key", "k0")
                } else {
                    let user = rand::rng().random_range(0..USERS);
                    request("user", "user", &format!("u{user}"))
                };
                let Ok(r) = client.should_rate_limit(req).await else {
                    continue;
                };
                tally.decisions.fetch_add(1, Ordering::Relaxed);
                if hot && r.into_inner().overall_code == Code::Ok as i32 {
                    tally.hot_admitted.fetch_add(1, Ordering::Relaxed);
                    let quarter = (start.elapsed().as_millis() / 250) as usize;
                    if let Some(q) = tally.hot_by_quarter.get(quarter) {
                        q.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("caller");
    }
}

/// The case on real processes; also how long a restart left Redis unreachable.
async fn real(binary: &Path, case: Case) -> (Figures, Duration) {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .expect("join")
        .expect("redis-server");
    let redis = Arc::new(parking_lot::Mutex::new(redis));
    let url = redis.lock().url();
    let dir = tempfile::tempdir().expect("tempdir");
    let start = Instant::now();
    let end = start + case.duration;
    let tally = Arc::new(Tally::default());
    let callers = (HOT_CALLERS * case.load, USER_CALLERS * case.load);
    let fault = {
        let redis = redis.clone();
        tokio::spawn(async move {
            match case.fault {
                Fault::None => Duration::ZERO,
                Fault::Stall { at, lasting } => {
                    tokio::time::sleep_until(start + at).await;
                    redis.lock().pause().expect("SIGSTOP");
                    tokio::time::sleep(lasting).await;
                    redis.lock().resume().expect("SIGCONT");
                    Duration::ZERO
                }
                Fault::Restart { at, held } => {
                    tokio::time::sleep_until(start + at).await;
                    let killed = {
                        let redis = redis.clone();
                        tokio::task::spawn_blocking(move || {
                            let killed = Instant::now();
                            redis.lock().kill();
                            killed
                        })
                        .await
                        .expect("join")
                    };
                    tokio::time::sleep(held).await;
                    // Down as a client sees it: from the kill to the first connection the new
                    // server accepts, watched from a thread of its own (a task on this
                    // runtime, which the callers keep busy, saw it milliseconds late).
                    tokio::task::spawn_blocking(move || {
                        let mut redis = redis.lock();
                        let port = redis.port();
                        let accepting = std::thread::spawn(move || {
                            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                                std::thread::yield_now();
                            }
                            Instant::now()
                        });
                        redis.restart().expect("restart");
                        accepting.join().expect("join") - killed
                    })
                    .await
                    .expect("join")
                }
            }
        })
    };
    let (a, b) = tokio::join!(
        async {
            let node = started(binary, &url, dir.path(), "a", RULES).await;
            load(&node, tally.clone(), start, end, callers).await;
            node
        },
        async {
            let node = started(binary, &url, dir.path(), "b", RULES).await;
            load(&node, tally.clone(), start, end, callers).await;
            node
        },
    );
    let elapsed = start.elapsed();
    let down = fault.await.expect("fault");

    let text = a.metrics() + &b.metrics();
    if std::env::var_os("FIDELITY_DEBUG").is_some() {
        for line in text
            .lines()
            .filter(|l| l.starts_with("tollgate_store_call_seconds_count"))
        {
            eprintln!("real {line}");
        }
        let quarters: Vec<u64> = tally
            .hot_by_quarter
            .iter()
            .map(|q| q.load(Ordering::Relaxed))
            .take(case.duration.as_millis().div_ceil(250) as usize)
            .collect();
        eprintln!("real hot admitted per 250 ms {quarters:?}");
    }
    let decisions = tally.decisions.load(Ordering::Relaxed);
    let calls = metric(&text, "tollgate_store_calls_total", "");
    let refills = u64::from(matches!(case.fault, Fault::Restart { .. }));
    let figures = Figures {
        decisions_per_s: decisions as f64 / elapsed.as_secs_f64(),
        hot_admitted: tally.hot_admitted.load(Ordering::Relaxed),
        hot_bound: (CAPACITY * (1 + refills) as f64 + RATE * elapsed.as_secs_f64()).floor() as u64,
        failed_open: metric(
            &text,
            "tollgate_decisions_total",
            "rule=\"hot\",outcome=\"failed_open\"",
        ),
        failed_closed: metric(
            &text,
            "tollgate_decisions_total",
            "rule=\"users\",outcome=\"failed_closed\"",
        ),
        calls_per_decision: calls as f64 / decisions.max(1) as f64,
    };
    if std::env::var_os("FIDELITY_DEBUG").is_some() {
        drop((a, b));
        eprintln!("real nodes' logs kept in {}", dir.keep().display());
    }
    (figures, down)
}

// ---- the simulator ----

/// The case as a scenario, its nodes' CPU set from the real run's throughput.
pub fn scenario_yaml(case: Case, real: &Figures, down: Duration) -> String {
    // Each node decided half the real decisions; on one core, a decision and its share of
    // store answers then cost what one core's second holds divided by them. Reading an answer
    // is costed as a decision is (as the release node's own figures have it, 10 µs each).
    let per_node = (real.decisions_per_s / 2.0).max(1.0);
    let per_decision_us = (1e6 / per_node / (1.0 + real.calls_per_decision))
        .max(1.0)
        .round() as u64;
    let faults = match case.fault {
        Fault::None => String::new(),
        Fault::Stall { at, lasting } => format!(
            "faults:\n  - {{ at: {}ms, for: {}ms, store_stall: {{ region: local }} }}\n",
            at.as_millis(),
            lasting.as_millis()
        ),
        Fault::Restart { at, .. } => format!(
            "faults:\n  - {{ at: {}ms, for: {}ms, store_down: {{ region: local }} }}\n  - {{ at: {}ms, store_failover: {{ region: local }} }}\n",
            at.as_millis(),
            down.as_millis().max(1),
            (at + down).as_millis()
        ),
    };
    let indented: String = RULES.lines().map(|l| format!("  {l}\n")).collect();
    format!(
        "name: fidelity\n\
         description: {name}, as the fidelity suite runs it on real processes\n\
         duration: {duration}ms\n\
         topology:\n  regions:\n    - {{ name: local, nodes: 2, store_latency: {{ median: 100us, p99: 1ms }} }}\n\
         runtime:\n  cpu: {{ cores: 1, per_decision: {per_decision_us}us, per_store_answer: {per_decision_us}us }}\n\
         rules: |\n{indented}\
         traffic:\n  - {{ name: hot, domain: api, callers: {hot}, keys: hot, descriptors: [{{ kind: hot, api_key: \"{{key}}\" }}] }}\n  \
         - {{ name: users, domain: api, callers: {users}, keys: {{ uniform: {{ n: {USERS} }} }}, descriptors: [{{ kind: user, user: \"u{{key}}\" }}] }}\n\
         {faults}",
        name = case.name,
        duration = case.duration.as_millis(),
        hot = HOT_CALLERS * case.load,
        users = USER_CALLERS * case.load,
    )
}

fn simulated(case: Case, real: &Figures, down: Duration, seed: u64) -> Figures {
    let yaml = scenario_yaml(case, real, down);
    let scenario = tollgate_simulations::Scenario::parse(&yaml, "fidelity.yaml")
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    // The simulator runs on its own paused runtime, on a thread of its own.
    let report =
        std::thread::spawn(move || tollgate_simulations::run(&scenario, seed, &mut |_| {}))
            .join()
            .expect("the simulation ran")
            .expect("the simulation started");
    if std::env::var_os("FIDELITY_DEBUG").is_some() {
        eprintln!("simulated calls by op {:?}", report.store_calls_by_op);
        let seconds: Vec<(u64, u64)> = report
            .per_second
            .iter()
            .map(|s| {
                let hot = &s.rules["hot"].decided;
                (hot.admitted, hot.failed_open)
            })
            .collect();
        eprintln!("simulated hot (admitted, failed open) per second {seconds:?}");
    }
    let hot = &report.rules["hot"];
    let users = &report.rules["users"];
    let seconds = case.duration.as_secs_f64();
    let refills = u64::from(matches!(case.fault, Fault::Restart { .. }));
    Figures {
        decisions_per_s: report.decisions as f64 / seconds,
        hot_admitted: hot.decided.admitted,
        hot_bound: (CAPACITY * (1 + refills) as f64 + RATE * seconds).floor() as u64,
        failed_open: hot.decided.failed_open,
        failed_closed: users.decided.failed_closed,
        calls_per_decision: report.node_store_calls as f64 / report.decisions.max(1) as f64,
    }
}
