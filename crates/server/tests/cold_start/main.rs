//! Exact from the first request: two fresh `tollgate` processes on a fresh `redis-server`,
//! callers starting the moment each gRPC port accepts, nobody warming anything up (see
//! `scenario.rs`). Ten runs, the last five with every core kept busy by another process: in
//! every run the OPEN rule admits within its exact bound, and the CLOSED rule denies none of
//! its new users while its window has room.
//!
//! The nodes are the binary of the test's own profile (unoptimised under `cargo test`): a
//! slower node is a harder case of the same thing. `cargo bench -p tollgate-server --bench
//! cold_start` runs the same scenario on the release binary (BENCHMARKS.md).

mod scenario;

use std::path::Path;
use std::time::Duration;

use scenario::{Report, Stress};

const RUNS: usize = 10;
const RUN: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_nodes_are_exact_from_their_first_request() {
    let binary = Path::new(env!("CARGO_BIN_EXE_tollgate"));
    let mut reports: Vec<(String, Report)> = vec![];
    for run in 1..=RUNS {
        let busy = run > RUNS / 2;
        let stress = busy.then(Stress::start);
        let report = scenario::run(binary, RUN, run).await;
        drop(stress);
        let name = format!("{run}{}", if busy { " (cores busy)" } else { "" });
        eprintln!("{}", report.row(&name));
        reports.push((name, report));
    }
    eprintln!("{}", Report::header());
    for (name, report) in &reports {
        eprintln!("{}", report.row(name));
    }
    for (name, r) in &reports {
        assert!(
            r.admitted <= r.bound,
            "run {name}: {} admitted under the OPEN rule, exact bound {} ({} failed open, {} on \
             a share of a last answer, {} owed units paid by a grant and {} debited of {})",
            r.admitted,
            r.bound,
            r.failed_open,
            r.on_last_answer,
            r.paid,
            r.debited,
            r.owed
        );
        assert_eq!(
            r.closed_denied, 0,
            "run {name}: {} of {} new users' requests denied under the CLOSED rule, whose \
             window had room ({} failed closed)",
            r.closed_denied, r.closed, r.failed_closed
        );
    }
}
