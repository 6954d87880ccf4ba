//! The simulator against real processes, on the release binary: every case of
//! `tests/fidelity/cases.rs` run on two real `tollgate` nodes and a real `redis-server`, then in
//! the simulator calibrated from that run. Prints a Markdown table and, per case, where the two
//! disagree beyond the stated tolerances (BENCHMARKS.md, "The simulator against real
//! processes").
//!
//! `cargo bench -p tollgate-server --bench fidelity`; `BENCH_SECONDS` sets the length of the
//! longer cases (default 5), `BENCH_RUNS` how many times each runs (default 1).

#[path = "../tests/fidelity/cases.rs"]
mod cases;

use std::path::Path;

use cases::Comparison;
use tollgate_testkit::process::env_or;

fn main() {
    let seconds = env_or("BENCH_SECONDS", 5);
    let runs = env_or("BENCH_RUNS", 1) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let binary = Path::new(env!("CARGO_BIN_EXE_tollgate"));
    let mut compared = vec![];
    for _ in 0..runs {
        for case in cases::cases(seconds) {
            let c = runtime.block_on(cases::compare(binary, case));
            eprintln!("{}", c.rows());
            compared.push(c);
        }
    }
    println!("{}", Comparison::header());
    for c in &compared {
        println!("{}", c.rows());
    }
    for c in &compared {
        for d in c.disagreements() {
            println!("- {}: {d}", c.case.name);
        }
    }
}
