use super::*;

#[test]
fn a_rule_error_names_the_scenario_files_line() {
    let text = MINIMAL.replace(
        "  rules: []\n",
        "  rules:\n    - {id: ok, algorithm: FIXED_WINDOW, limit: 5, window: 1m}\n    - {id: bad, algorithm: FIXED_WINDOW, limit: -5, window: 1m}\n",
    );
    let e = Scenario::parse(&text, "t.yaml").expect_err("a bad limit");
    let message = e.to_string();
    // The scenario's line 8 (the block starts at line 5, `domain: d`; the bad rule is
    // its fourth line).
    assert!(message.starts_with("t.yaml:8: `rules`: "), "{message}");
    assert!(message.contains("limit"), "{message}");
    let change = format!(
        "{MINIMAL}faults:\n  - at: 1s\n    rules:\n      yaml: |\n        domain: d\n        rules:\n          - {{id: x, algorithm: NOPE}}\n"
    );
    let e = Scenario::parse(&change, "t.yaml").expect_err("a bad algorithm");
    let message = e.to_string();
    assert!(
        message.starts_with("t.yaml:14: `faults[0].rules.yaml`: "),
        "{message}"
    );
}

const MINIMAL: &str = "name: t\nduration: 2s\ntopology: {regions: [{name: eu, nodes: 2}]}\nrules: |\n  domain: d\n  rules: []\ntraffic: [{name: a, domain: d, rate: 10, descriptors: [{k: '{key}'}]}]\n";

#[test]
fn a_minimal_scenario_parses_with_defaults() {
    let s = Scenario::parse(MINIMAL, "t.yaml").expect("parses");
    assert_eq!(s.seed, 1);
    assert_eq!(s.tick, Duration::from_millis(1));
    assert_eq!(s.runtime.store_timeout, Duration::from_millis(5));
    assert!(matches!(s.traffic[0].keys, Keys::Hot));
}

#[test]
fn an_unknown_field_names_its_path() {
    let text = MINIMAL.replace("rate: 10", "rate: 10, rat: 3");
    let e = Scenario::parse(&text, "t.yaml").expect_err("unknown field");
    let message = e.to_string();
    assert!(message.contains("traffic[0]"), "{message}");
    assert!(message.contains("rat"), "{message}");
}

#[test]
fn a_fault_on_a_missing_node_is_refused() {
    let text = format!("{MINIMAL}faults: [{{at: 1s, crash: {{node: eu-7}}}}]\n");
    let e = Scenario::parse(&text, "t.yaml").expect_err("no such node");
    assert!(e.to_string().contains("faults[0].node"), "{e}");
}

#[test]
fn a_store_outage_needs_a_duration() {
    let text = format!("{MINIMAL}faults: [{{at: 1s, store_down: {{region: eu}}}}]\n");
    let e = Scenario::parse(&text, "t.yaml").expect_err("no duration");
    assert!(e.to_string().contains("faults[0].for"), "{e}");
}
