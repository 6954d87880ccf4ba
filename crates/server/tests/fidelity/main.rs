//! The simulator against real processes (see `cases.rs`): each case run on two real nodes and
//! a real `redis-server`, then in the simulator calibrated from that run; the two agree within
//! the tolerances `Comparison::disagreements` states. Short runs on the test profile's binary
//! (a slower node: the calibration follows it); `cargo bench -p tollgate-server --bench
//! fidelity` runs the same cases on the release binary for BENCHMARKS.md.

mod cases;

use std::path::Path;

use cases::Comparison;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_agrees_with_real_processes() {
    let binary = Path::new(env!("CARGO_BIN_EXE_tollgate"));
    let mut compared = vec![];
    for case in cases::cases(3) {
        let c = cases::compare(binary, case).await;
        eprintln!("{}", c.rows());
        compared.push(c);
    }
    eprintln!("{}", Comparison::header());
    for c in &compared {
        eprintln!("{}", c.rows());
    }
    let disagreements: Vec<String> = compared
        .iter()
        .flat_map(|c| {
            c.disagreements()
                .into_iter()
                .map(move |d| format!("{}: {d}", c.case.name))
        })
        .collect();
    assert!(
        disagreements.is_empty(),
        "the simulator and the real processes disagree:\n{}",
        disagreements.join("\n")
    );
}
