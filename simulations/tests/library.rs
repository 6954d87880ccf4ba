//! The scenario library runs and keeps its invariants, and a run repeats byte for byte. CI
//! runs every scenario with its pinned seed (the slow ones shortened; `tollgate-sim run` runs
//! them whole); a seed a sweep found breaking an invariant joins `REGRESSION_SEEDS`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_simulations::{Scenario, run, sweep};

fn library() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// Runs `name` with `seed`, shortened to `seconds` of virtual time when given.
fn check(name: &str, seed: u64, seconds: Option<u64>) {
    let path = library().join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).expect("scenario");
    let scenario = match seconds {
        Some(s) => sweep::variant(&text, name, "duration", &format!("{s}s")).expect("variant"),
        None => Scenario::parse(&text, name).expect("scenario parses"),
    };
    let report = run(&scenario, seed, &mut |_| {}).expect("runs");
    assert!(report.passed(), "{}", report.table());
    assert!(report.decisions > 0, "{name}: no decision was made");
}

/// Seeds that once broke an invariant, by scenario, kept so they never do again.
const REGRESSION_SEEDS: &[(&str, u64)] = &[];

#[test]
fn the_seed_case_admits_exactly_the_limit() {
    check("seed-50-pods", 1, Some(10));
}

#[test]
fn hot_and_trickle_keys() {
    check("hot-vs-trickle", 1, Some(10));
}

#[test]
fn a_redis_stall_under_each_fail_mode() {
    check("redis-stall-fail-modes", 1, None);
}

#[test]
fn redis_killed() {
    check("redis-down", 1, None);
}

#[test]
fn a_redis_failover_that_loses_state() {
    check("redis-failover", 1, None);
}

#[test]
fn a_capacity_cut_mid_window() {
    check("capacity-cut", 1, None);
}

#[test]
fn a_pod_crash_holding_slots() {
    check("pod-crash-slots", 1, None);
}

#[test]
fn a_key_flood_shortened() {
    // The library's flood is 1M new keys in a second; CI floods 100,000.
    let path = library().join("key-flood.yaml");
    let text = std::fs::read_to_string(&path).expect("scenario");
    let scenario = sweep::variant(&text, "key-flood", "traffic.1.rate", "100000").expect("variant");
    let report = run(&scenario, 1, &mut |_| {}).expect("runs");
    assert!(report.passed(), "{}", report.table());
    assert!(
        report.rules["per-ip"].identities > 100_000,
        "{}",
        report.table()
    );
}

#[test]
fn regression_seeds_keep_their_invariants() {
    for (name, seed) in REGRESSION_SEEDS {
        check(name, *seed, None);
    }
}

#[test]
fn every_library_scenario_parses() {
    let mut n = 0;
    for entry in std::fs::read_dir(library()).expect("library") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                !s.description.is_empty(),
                "{}: says what it shows",
                path.display()
            );
            n += 1;
        }
    }
    assert!(n >= 8, "the library has {n} scenarios");
}

/// One seed, two processes, the same bytes: nothing in a run reads the wall clock or the OS's
/// randomness where it could reach the report.
#[test]
fn one_seed_gives_a_byte_identical_report_across_processes() {
    let dir = tempfile::tempdir().expect("dir");
    let scenario = library().join("redis-stall-fail-modes.yaml");
    let run = |out: &Path| {
        let status = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
            .arg("run")
            .arg(&scenario)
            .args(["--seed", "7", "--quiet", "--report"])
            .arg(out)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("tollgate-sim runs");
        assert!(status.success(), "{status}");
        std::fs::read(out).expect("report")
    };
    let (a, b) = (
        run(&dir.path().join("a.json")),
        run(&dir.path().join("b.json")),
    );
    assert!(a.len() > 1000, "a whole report");
    assert!(a == b, "two runs of seed 7 differ");
    // And another seed gives another run.
    let other = dir.path().join("c.json");
    let status = Command::new(env!("CARGO_BIN_EXE_tollgate-sim"))
        .arg("run")
        .arg(&scenario)
        .args(["--seed", "8", "--quiet", "--report"])
        .arg(&other)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("tollgate-sim runs");
    assert!(status.success());
    assert_ne!(a, std::fs::read(&other).expect("report"));
}
