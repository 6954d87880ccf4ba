//! Exact from the first request, on the release binary: two fresh `tollgate` processes on a
//! fresh `redis-server`, callers starting the moment each gRPC port accepts (the scenario of
//! `tests/cold_start`), ten runs of 5 s, the last five with every core kept busy by another
//! process. Prints a Markdown table (BENCHMARKS.md, "Exact from the first request").
//!
//! `cargo bench -p tollgate-server --bench cold_start`; `BENCH_RUNS` and `BENCH_SECONDS` change
//! the runs (default 10) and their length (default 5).

#[path = "../tests/cold_start/scenario.rs"]
mod scenario;

use std::path::Path;
use std::time::Duration;

use scenario::{Report, Stress};
use tollgate_testkit::process::env_or;

fn main() {
    let runs = env_or("BENCH_RUNS", 10) as usize;
    let seconds = env_or("BENCH_SECONDS", 5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let binary = Path::new(env!("CARGO_BIN_EXE_tollgate"));
    println!(
        "cold start: 2 nodes x {} callers on a token bucket of 50 + 10/s (OPEN) and {} new users x {} \
         on a fixed window of 1000/min (CLOSED), {seconds} s per run",
        scenario::CALLERS,
        scenario::NEW_USERS,
        scenario::PER_USER
    );
    println!("{}", Report::header());
    for run in 1..=runs {
        let busy = run > runs / 2;
        let stress = busy.then(Stress::start);
        let report = runtime.block_on(scenario::run(binary, Duration::from_secs(seconds), run));
        drop(stress);
        let name = format!("{run}{}", if busy { " (cores busy)" } else { "" });
        println!("{}", report.row(&name));
    }
}
