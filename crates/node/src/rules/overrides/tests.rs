//! The overrides applied to rules as files load them.

use super::*;
use crate::rules::source::LoadedRules;
use crate::rules::source::parse;
use std::path::Path;

fn loaded(text: &str) -> LoadedRules {
    parse(text, Path::new("t.yaml")).expect("parses")
}

#[test]
fn an_override_sets_the_mode_of_a_file_rule_and_says_what_it_was() {
    let mut rules = loaded(
        "domain: d\nrules:\n  - {id: a, algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n  - {id: b, algorithm: FIXED_WINDOW, limit: 1, window: 1s, mode: SHADOW}\n",
    );
    rules.extend(loaded(
        "overrides:\n  - id: a\n    mode: disabled\n    reason: INC-1\n  - {id: c, mode: SHADOW}\n",
    ));
    let applied = apply_to(&mut rules).expect("applies");
    assert_eq!(rules.native[0].mode, Mode::Disabled);
    assert_eq!(rules.native[1].mode, Mode::Shadow);
    assert_eq!(applied.len(), 2);
    assert_eq!(applied[0].by.id, "a");
    assert_eq!(applied[0].by.reason.as_deref(), Some("INC-1"));
    assert_eq!(applied[0].by.origin, "t.yaml:2");
    assert_eq!(applied[0].rule_mode, Some(Mode::Enforce));
    assert_eq!(applied[0].rule_origin.as_deref(), Some("t.yaml:3"));
    assert_eq!(applied[1].by.id, "c");
    assert_eq!(applied[1].rule_mode, None, "no rule c: the override waits");
}

#[test]
fn a_file_override_wins_over_postgres_and_two_files_are_an_error() {
    let mut rules =
        loaded("domain: d\nrules:\n  - {id: a, algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n");
    rules.overrides.push(ModeOverride {
        id: "a".into(),
        mode: Mode::Shadow,
        reason: None,
        origin: "postgres (by ops)".into(),
    });
    rules.extend(loaded("overrides:\n  - {id: a, mode: DISABLED}\n"));
    let mut applied = rules.clone();
    apply_to(&mut applied).expect("applies");
    assert_eq!(applied.native[0].mode, Mode::Disabled);
    rules.extend(
        parse(
            "overrides:\n  - {id: a, mode: ENFORCE}\n",
            Path::new("u.yaml"),
        )
        .expect("parses"),
    );
    let e = apply_to(&mut rules).expect_err("two files override a");
    assert_eq!(e.id, "a");
    let e = e.to_string();
    assert!(e.contains("u.yaml:2") && e.contains("t.yaml:2"), "{e}");
}

#[test]
fn an_envoy_descriptor_is_overridden_by_its_path() {
    let mut rules = loaded(
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 5}\n    descriptors:\n      - key: path\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    let path = rules.envoy[0].nodes[0].path.clone();
    let child = rules.envoy[0].nodes[0].children[0].path.clone();
    rules.overrides.push(ModeOverride {
        id: path.clone(),
        mode: Mode::Disabled,
        reason: None,
        origin: "postgres".into(),
    });
    rules.overrides.push(ModeOverride {
        id: child,
        mode: Mode::Shadow,
        reason: None,
        origin: "postgres".into(),
    });
    let applied = apply_to(&mut rules).expect("applies");
    let node = &rules.envoy[0].nodes[0];
    assert!(node.limit.is_none(), "disabled: no limit at {path}");
    assert!(node.children[0].limit.is_some() && node.children[0].shadow);
    assert!(applied.iter().all(|a| a.rule_mode == Some(Mode::Enforce)));
}

#[test]
fn a_bad_override_names_its_field_and_line() {
    let e = parse(
        "overrides:\n  - id: a\n    mode: OFF\n",
        Path::new("o.yaml"),
    )
    .expect_err("OFF is no mode");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("mode"), "{e}");
}

fn apply_to(rules: &mut LoadedRules) -> Result<Vec<AppliedOverride>, OverrideError> {
    apply(&mut rules.native, &mut rules.envoy, &rules.overrides)
}
