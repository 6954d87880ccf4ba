//! gRPC Envoy RLS throughput on loopback against the stack's own ceiling, in one run: a bare
//! tonic `ShouldRateLimit` server from the same protos (`tollgate-loadgen bare`, answering OK
//! with no limiter) beside Tollgate on the in-memory store and on Redis, all driven by h2load
//! with a real request body (one hot key, a limit never reached).
//!
//! - **The ceiling is the best build of the bare server.** The bench builds run with the
//!   shipped release profile (fat LTO, one codegen unit); the bare server is measured built so,
//!   and also built with `panic = "abort"` on top (`target/profiles/shipped+abort`, built here
//!   if missing: the fastest build of the stack found, see `scripts/bench-profiles`), which
//!   Tollgate does not ship (its key actors' supervisor contains a panic).
//! - **One core**: each server pinned to core 0, h2load (and Redis) on core 1. The bare server
//!   runs with a current-thread runtime and with two workers on the one core; Tollgate picks
//!   its runtime for the one CPU it is given (single-threaded).
//! - **Both cores**: nothing pinned, h2load (two threads) sharing the machine. The bare server
//!   again both ways; Tollgate with its default (one worker per CPU) and with one worker.
//!
//! - **The same answer, sent bare.** Tollgate answers with a status carrying the limit and five
//!   rate-limit headers (about 270 bytes against the bare OK's 9). The bench asks a Tollgate
//!   node once for its answer to the bench's request, and a bare server sends those very bytes
//!   back to every request (`--answer`, on Tollgate's coalesced connections): what the stack
//!   alone spends serving that answer. What is left between it and Tollgate is Tollgate's own.
//! - **Without the X- trio.** One more one-core row: Tollgate run with `--x-ratelimit-headers
//!   false` (for an Envoy that builds X-RateLimit-* itself), its answer two headers shorter.
//!
//! Every Tollgate figure is a ratio to the best bare figure of its section (of any build, and of
//! the shipped profile, both answering a bare OK) and to the best bare server sending
//! Tollgate's answer, measured in the
//! same round. Rounds alternate the servers so a noisy minute hits all of them; the median
//! round is reported.
//!
//! `cargo bench -p tollgate-server --bench rls_h2load` (needs `h2load` from nghttp2-client and
//! `taskset` from util-linux; builds `tollgate-loadgen` if it is not beside `tollgate`).
//! `BENCH_SECONDS` sets each measurement (default 5), `BENCH_ROUNDS` the rounds (default 3).
//! `BENCH_OTHER_TOLLGATE=/path/to/tollgate` measures another build beside this one in the
//! one-core section, in the same rounds (a change's before and after).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use prost::Message;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_testkit::RedisServer;
use tollgate_testkit::process::{free_port, wait_for};

const RULES: &str = "domain: rl\nrules:\n  - {id: per-address, match: {remote_address: '*'}, algorithm: TOKEN_BUCKET, capacity: 1000000000000, refillPerSecond: 1000000000}\n";

struct Server {
    child: Child,
    grpc: u16,
    http: Option<u16>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "rl".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: "10.1.2.3".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

fn grpc_body() -> Vec<u8> {
    let message = request().encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed
}

/// What a server is, and how it starts.
#[derive(Clone)]
enum Kind {
    Bare {
        runtime: &'static str,
        /// Built with `panic = "abort"` (else: as the bench, the shipped profile).
        abort: bool,
        /// Answers with Tollgate's own answer to the bench's request (else: a bare OK).
        full_answer: bool,
        /// On Tollgate's coalesced connections (`--coalesce`).
        coalesce: bool,
    },
    Tollgate {
        /// Another build of `tollgate` (`BENCH_OTHER_TOLLGATE`), else this one.
        binary: Option<PathBuf>,
        redis: Option<String>,
        threads: Option<usize>,
        /// Its answers carry the X-RateLimit trio (the default; else `--x-ratelimit-headers
        /// false`).
        x_trio: bool,
    },
}

#[derive(Clone)]
struct Setup {
    name: &'static str,
    kind: Kind,
}

fn loadgen() -> PathBuf {
    tollgate_testkit::process::loadgen_beside(Path::new(env!("CARGO_BIN_EXE_tollgate")))
        .expect("tollgate-loadgen")
}

/// `tollgate-loadgen` built with the shipped release profile and `panic = "abort"`: the
/// fastest bare server (built once per run; later runs find it, or rebuild what changed).
fn abort_loadgen() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_abort_loadgen).clone()
}

fn build_abort_loadgen() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = root.join("target/profiles/shipped+abort");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .args([
            "build",
            "--release",
            "--locked",
            "-q",
            "-p",
            "tollgate-loadgen",
        ])
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("cargo build");
    assert!(
        status.success(),
        "building the panic=abort bare server failed"
    );
    target.join("release/tollgate-loadgen")
}

/// The bench's input files.
struct Files {
    body: PathBuf,
    rules: PathBuf,
    /// Tollgate's encoded answer to the bench's request, for the bare server to send back.
    answer: PathBuf,
}

/// Asks a fresh Tollgate node the bench's request once and keeps its answer in `files.answer`,
/// so the bare server can send the very same bytes: what serving that answer costs the stack.
fn capture_tollgate_answer(files: &Files) {
    use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let setup = Setup {
        name: "Tollgate (its answer)",
        kind: Kind::Tollgate {
            binary: None,
            redis: None,
            threads: None,
            x_trio: true,
        },
    };
    let server = start(&setup, false, files);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let answer = runtime.block_on(async {
        let mut client =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", server.grpc))
                .await
                .expect("connect");
        client
            .should_rate_limit(request())
            .await
            .expect("Tollgate's answer")
            .into_inner()
    });
    println!(
        "Tollgate's answer to the bench's request: {} bytes encoded, {} header(s) to add",
        answer.encoded_len(),
        answer.response_headers_to_add.len()
    );
    std::fs::write(&files.answer, answer.encode_to_vec()).expect("write the answer");
}

fn start(setup: &Setup, pin: bool, files: &Files) -> Server {
    let rules = &files.rules;
    let grpc = free_port(false).expect("port");
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", if pin { "0" } else { "0,1" }]);
    let http = match &setup.kind {
        Kind::Bare {
            runtime,
            abort,
            full_answer,
            coalesce,
        } => {
            cmd.arg(if *abort { abort_loadgen() } else { loadgen() })
                .args([
                    "bare",
                    "--listen",
                    &format!("127.0.0.1:{grpc}"),
                    "--runtime",
                    runtime,
                ]);
            if *full_answer {
                cmd.arg("--answer").arg(&files.answer);
            }
            if *coalesce {
                cmd.arg("--coalesce");
            }
            None
        }
        Kind::Tollgate {
            binary,
            redis,
            threads,
            x_trio,
        } => {
            let http = free_port(false).expect("port");
            cmd.arg(
                binary
                    .as_deref()
                    .unwrap_or(Path::new(env!("CARGO_BIN_EXE_tollgate"))),
            )
            .arg("--rules")
            .arg(rules)
            .args([
                "--grpc-listen",
                &format!("127.0.0.1:{grpc}"),
                "--http-listen",
                &format!("127.0.0.1:{http}"),
            ]);
            if let Some(url) = redis {
                cmd.args(["--redis-url", url]);
            }
            if let Some(n) = threads {
                cmd.args(["--worker-threads", &n.to_string()]);
            }
            if !x_trio {
                cmd.args(["--x-ratelimit-headers", "false"]);
            }
            Some(http)
        }
    };
    cmd.env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let server = Server {
        child: cmd.spawn().expect("start server"),
        grpc,
        http,
    };
    wait_for(setup.name, Duration::from_secs(30), || match server.http {
        Some(http) => tollgate_testkit::http::get(http, "/readyz", &[])
            .ok()
            .filter(|r| r.status == 200)
            .map(|_| ()),
        None => std::net::TcpStream::connect(("127.0.0.1", grpc))
            .ok()
            .map(|_| ()),
    })
    .expect("server ready");
    server
}

/// Requests per second h2load reaches against `server`, and its status-code line.
fn h2load(server: &Server, pin: bool, body: &Path, secs: u64) -> (f64, String) {
    let url = format!(
        "http://127.0.0.1:{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.grpc
    );
    let run = |extra: &[&str]| {
        let out = Command::new("taskset")
            .args(["-c", if pin { "1" } else { "0,1" }])
            .args(["h2load", "-t", if pin { "1" } else { "2" }])
            .args(["-c", "8", "-m", "32", "-d"])
            .arg(body)
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
            .args(extra)
            .arg(&url)
            .output()
            .expect("h2load");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&["-n", "30000"]);
    let out = run(&["-D", &secs.to_string()]);
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let rps = line("finished in")
        .split(", ")
        .nth(1)
        .and_then(|s| s.strip_suffix(" req/s"))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    (rps, line("status codes:"))
}

/// The node's decision and store-call counters, for the table.
fn counters(server: &Server) -> String {
    let Some(http) = server.http else {
        return "-".into();
    };
    let Ok(metrics) = tollgate_testkit::http::get(http, "/metrics", &[]) else {
        return "?".into();
    };
    let sum = |prefix: &str, has: &str| -> u64 {
        metrics
            .body
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(has))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    };
    format!(
        "allowed {}, failed open {}, store calls {}",
        sum("tollgate_decisions_total", "outcome=\"allowed\""),
        sum("tollgate_decisions_total", "outcome=\"failed_open\""),
        sum("tollgate_store_calls_total", ""),
    )
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn section(title: &str, pin: bool, setups: &[Setup], rounds: usize, files: &Files) {
    let secs: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let servers: Vec<Server> = setups.iter().map(|s| start(s, pin, files)).collect();
    let mut figures: Vec<Vec<f64>> = vec![vec![]; setups.len()];
    let mut codes: Vec<String> = vec![String::new(); setups.len()];
    for _ in 0..rounds {
        for (i, server) in servers.iter().enumerate() {
            let (rps, code) = h2load(server, pin, &files.body, secs);
            figures[i].push(rps);
            codes[i] = code;
        }
    }
    let medians: Vec<f64> = figures.iter().cloned().map(median).collect();
    // The ceilings: bare servers answering a bare OK (of any build, of the shipped profile),
    // and bare servers sending Tollgate's own answer.
    let best_of = |abort_too: bool, full: bool| {
        setups
            .iter()
            .zip(&medians)
            .filter(|(s, _)| match s.kind {
                Kind::Bare {
                    abort, full_answer, ..
                } => (abort_too || !abort) && full_answer == full,
                Kind::Tollgate { .. } => false,
            })
            .map(|(_, m)| *m)
            .fold(0.0, f64::max)
    };
    let (best_bare, best_shipped, best_full) = (
        best_of(true, false),
        best_of(false, false),
        best_of(true, true),
    );
    println!("\n{title}\n");
    println!(
        "| server | req/s (median of {rounds}) | rounds | vs best bare (any build) | vs best bare (shipped profile) | vs best bare sending Tollgate's answer | h2load status codes | node counters |"
    );
    println!("|---|---:|---|---:|---:|---:|---|---|");
    for (i, setup) in setups.iter().enumerate() {
        let rounds: Vec<String> = figures[i].iter().map(|f| format!("{f:.0}")).collect();
        println!(
            "| {} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {} | {} |",
            setup.name,
            medians[i],
            rounds.join(", "),
            medians[i] / best_bare,
            medians[i] / best_shipped,
            medians[i] / best_full,
            codes[i],
            counters(&servers[i]),
        );
    }
}

fn main() {
    for (tool, package) in [("h2load", "nghttp2-client"), ("taskset", "util-linux")] {
        tollgate_testkit::process::require_binary(tool, package).expect("tool");
    }
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let files = Files {
        body: dir.path().join("request.bin"),
        rules: dir.path().join("rules.yaml"),
        answer: dir.path().join("answer.bin"),
    };
    std::fs::File::create(&files.body)
        .expect("body")
        .write_all(&grpc_body())
        .expect("write");
    std::fs::write(&files.rules, RULES).expect("rules");
    capture_tollgate_answer(&files);
    let redis = RedisServer::start().expect("redis-server");
    let redis_url = redis.url();
    let pin_redis = |cpus: &str| {
        let _ = Command::new("taskset")
            .args(["-p", "-c", cpus, &redis.pid().expect("pid").to_string()])
            .output();
    };
    let bare = |name, runtime| Setup {
        name,
        kind: Kind::Bare {
            runtime,
            abort: false,
            full_answer: false,
            coalesce: false,
        },
    };
    let bare_abort = |name, runtime, coalesce| Setup {
        name,
        kind: Kind::Bare {
            runtime,
            abort: true,
            full_answer: false,
            coalesce,
        },
    };
    let bare_full = |name, runtime| Setup {
        name,
        kind: Kind::Bare {
            runtime,
            abort: true,
            full_answer: true,
            coalesce: true,
        },
    };
    abort_loadgen();
    let tollgate = |name, redis: Option<&str>, threads| Setup {
        name,
        kind: Kind::Tollgate {
            binary: None,
            redis: redis.map(str::to_owned),
            threads,
            x_trio: true,
        },
    };
    // Another build of Tollgate measured beside this one, in the same rounds (a change's
    // before and after): `BENCH_OTHER_TOLLGATE=/path/to/tollgate`.
    let other = std::env::var_os("BENCH_OTHER_TOLLGATE").map(PathBuf::from);
    let other_tollgate = |name, redis: Option<&str>| Setup {
        name,
        kind: Kind::Tollgate {
            binary: other.clone(),
            redis: redis.map(str::to_owned),
            threads: None,
            x_trio: true,
        },
    };
    let tollgate_without_x_trio = Setup {
        name: "Tollgate, in-memory store (runtime for 1 CPU), --x-ratelimit-headers false",
        kind: Kind::Tollgate {
            binary: None,
            redis: None,
            threads: None,
            x_trio: false,
        },
    };
    pin_redis("1");
    let mut one_core = vec![
        bare("bare tonic, current-thread runtime", "current"),
        bare("bare tonic, 2 workers", "multi:2"),
        bare_abort("bare tonic, panic=abort, current-thread", "current", false),
        bare_abort(
            "bare tonic, panic=abort, coalesced, current-thread",
            "current",
            true,
        ),
        bare_full(
            "bare tonic sending Tollgate's answer, panic=abort, coalesced, current-thread",
            "current",
        ),
        tollgate("Tollgate, in-memory store (runtime for 1 CPU)", None, None),
        tollgate(
            "Tollgate, Redis store (runtime for 1 CPU)",
            Some(&redis_url),
            None,
        ),
        tollgate_without_x_trio,
    ];
    if other.is_some() {
        one_core.push(other_tollgate(
            "Tollgate, BENCH_OTHER_TOLLGATE's build, in-memory store (runtime for 1 CPU)",
            None,
        ));
        one_core.push(other_tollgate(
            "Tollgate, BENCH_OTHER_TOLLGATE's build, Redis store (runtime for 1 CPU)",
            Some(&redis_url),
        ));
    }
    section(
        "One core: servers on core 0, h2load (-t 1 -c 8 -m 32) and Redis on core 1",
        true,
        &one_core,
        rounds,
        &files,
    );
    pin_redis("0,1");
    section(
        "Both cores: nothing pinned, h2load (-t 2 -c 8 -m 32) and Redis sharing the machine",
        false,
        &[
            bare("bare tonic, current-thread runtime", "current"),
            bare("bare tonic, 2 workers", "multi:2"),
            bare_abort("bare tonic, panic=abort, current-thread", "current", false),
            bare_abort("bare tonic, panic=abort, 2 workers", "multi:2", false),
            bare_abort(
                "bare tonic, panic=abort, coalesced, 2 workers",
                "multi:2",
                true,
            ),
            bare_full(
                "bare tonic sending Tollgate's answer, panic=abort, coalesced, 2 workers",
                "multi:2",
            ),
            tollgate("Tollgate, in-memory store (default: 2 workers)", None, None),
            tollgate(
                "Tollgate, Redis store (default: 2 workers)",
                Some(&redis_url),
                None,
            ),
            tollgate("Tollgate, in-memory store, 1 worker", None, Some(1)),
            tollgate("Tollgate, Redis store, 1 worker", Some(&redis_url), Some(1)),
        ],
        rounds,
        &files,
    );
}
