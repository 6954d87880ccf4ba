#[test]
fn envoy_fail_modes_read_a_default_and_domains() {
    let modes = EnvoyFailModes::parse("local, edge=closed ,api=OPEN").expect("valid");
    assert_eq!(
        (modes.of("edge"), modes.of("api"), modes.of("other")),
        (FailMode::Closed, FailMode::Open, FailMode::Local)
    );
    let unset = EnvoyFailModes::parse("").expect("valid");
    assert_eq!(unset.of("any"), FailMode::Open);
    for (bad, says) in [
        ("edge=MAYBE", "expected one of OPEN CLOSED LOCAL"),
        ("=CLOSED", "names no domain"),
        ("edge=CLOSED,edge=OPEN", "named twice"),
        ("CLOSED,LOCAL", "a second default"),
    ] {
        let err = EnvoyFailModes::parse(bad).expect_err(bad).to_string();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

use super::*;
use crate::rules::envoy::EnvoyConfig;
use crate::rules::native::RulesFile;

fn native(yaml: &str) -> Vec<Rule> {
    let file: RulesFile = yaml_serde::from_str(yaml).expect("yaml");
    file.rules
        .iter()
        .map(|d| {
            d.validate(file.domain.as_deref(), "test".into())
                .expect("valid")
        })
        .collect()
}

fn envoy(yaml: &str) -> EnvoyDomainConfig {
    let config: EnvoyConfig = yaml_serde::from_str(yaml).expect("yaml");
    EnvoyDomainConfig {
        domain: config.domain.clone(),
        nodes: config.validate().expect("valid"),
        origin: "test".into(),
        fail_mode: FailMode::Open,
    }
}

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn matched(set: &RuleSet, domain: &str, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out = vec![];
    let one = entries(pairs);
    set.match_native(domain, &[&one], &[&one], &mut out);
    out.into_iter()
        .map(|m| {
            (
                m.rule.id.clone(),
                String::from_utf8_lossy(&m.identity).into_owned(),
            )
        })
        .collect()
}

#[test]
fn native_rules_match_on_every_key_and_key_by_identity() {
    let rules = native(
        "domain: public-api\nrules:\n\
         - {id: gold-orders, match: {plan: gold, route: POST /orders}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 10}\n\
         - {id: per-ip, match: {ip: '*'}, algorithm: SLIDING_WINDOW, limit: 60, window: 1m}\n\
         - {id: off, match: {plan: gold}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, mode: DISABLED}\n\
         - {id: global-route, match: {route: 'GET /*'}, per: [], algorithm: FIXED_WINDOW, limit: 1000, window: 1s}\n",
    );
    let set = RuleSet::compile(&rules, &[], 1, &Metrics::new()).expect("compiles");
    assert_eq!(set.rules().len(), 3, "the DISABLED rule is not compiled");
    assert_eq!(
        matched(
            &set,
            "public-api",
            &[
                ("api_key", "k_123"),
                ("plan", "gold"),
                ("route", "POST /orders"),
                ("ip", "1.2.3.4")
            ]
        ),
        vec![
            ("gold-orders".into(), "api_key=k_123".into()),
            ("per-ip".into(), "1.2.3.4".into())
        ]
    );
    assert_eq!(
        matched(
            &set,
            "public-api",
            &[("plan", "gold"), ("route", "POST /orders")]
        ),
        vec![("gold-orders".into(), "".into())]
    );
    assert_eq!(
        matched(&set, "public-api", &[("route", "GET /x")]),
        vec![("global-route".into(), "".into())]
    );
    assert!(
        matched(
            &set,
            "public-api",
            &[("plan", "silver"), ("route", "POST /orders")]
        )
        .is_empty()
    );
    assert!(matched(&set, "other", &[("ip", "1.2.3.4")]).is_empty());
}

#[test]
fn duplicate_ids_are_refused() {
    let rules = native(
        "domain: d\nrules:\n- {id: a, algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n- {id: a, algorithm: FIXED_WINDOW, limit: 2, window: 1s}\n",
    );
    let err = RuleSet::compile(&rules, &[], 1, &Metrics::new()).expect_err("duplicate");
    assert!(
        matches!(&err, CompileError::DuplicateId { id, .. } if id == "a"),
        "{err:?}"
    );
    assert!(err.to_string().contains("duplicate rule id"), "{err}");
}

#[test]
fn envoy_precedence_is_exact_then_wildcard_then_key_only_at_full_depth() {
    let set = RuleSet::compile(
        &[],
        &[envoy(
            "domain: rl\ndescriptors:\n\
             - key: path\n  value: /api/orders\n  rate_limit: {unit: second, requests_per_unit: 1}\n\
             - key: path\n  value: /api/*\n  rate_limit: {unit: second, requests_per_unit: 2}\n\
             - key: path\n  rate_limit: {unit: second, requests_per_unit: 3}\n  descriptors:\n\
             \x20   - key: user\n      rate_limit: {unit: minute, requests_per_unit: 4}\n\
             - key: shared\n  value: 'x*'\n  share_threshold: true\n  rate_limit: {unit: second, requests_per_unit: 5}\n\
             - key: nolimit\n  descriptors:\n    - key: sub\n      rate_limit: {unit: second, requests_per_unit: 6}\n",
        )],
        1,
        &Metrics::new(),
    )
    .expect("compiles");
    let hit = |pairs: &[(&str, &str)]| {
        set.match_envoy("rl", &entries(pairs))
            .map(|m| m.rule.limit().map(|l| l.capacity()))
    };
    assert_eq!(hit(&[("path", "/api/orders")]), Some(Some(1)));
    assert_eq!(hit(&[("path", "/api/users")]), Some(Some(2)));
    assert_eq!(hit(&[("path", "/other")]), Some(Some(3)));
    assert_eq!(hit(&[("path", "/other"), ("user", "u1")]), Some(Some(4)));
    assert_eq!(
        hit(&[("nolimit", "a")]),
        None,
        "a limit applies only at full depth"
    );
    assert_eq!(hit(&[("nolimit", "a"), ("sub", "b")]), Some(Some(6)));
    assert_eq!(hit(&[("path", "/api/orders"), ("user", "u1")]), None);
    let a = set
        .match_envoy("rl", &entries(&[("shared", "x1")]))
        .expect("match")
        .identity;
    let b = set
        .match_envoy("rl", &entries(&[("shared", "x2")]))
        .expect("match")
        .identity;
    assert_eq!(
        a, b,
        "share_threshold: one counter for every value matching the wildcard"
    );
    let c = set
        .match_envoy("rl", &entries(&[("path", "/x")]))
        .expect("match")
        .identity;
    let d = set
        .match_envoy("rl", &entries(&[("path", "/y")]))
        .expect("match")
        .identity;
    assert_ne!(c, d, "key only: one counter per value");
}

#[test]
fn identities_are_injective() {
    let keys = Identity::Keys(vec!["a".into(), "b".into()]);
    let x = identity_of(&keys, &[&entries(&[("a", "1:2"), ("b", "3")])]);
    let y = identity_of(&keys, &[&entries(&[("a", "1"), ("b", "2:3")])]);
    assert_ne!(x, y);
}

#[test]
fn a_replaced_rule_must_exist_in_its_domain_and_no_circle_is_allowed() {
    let unknown = native(
        "domain: d\nrules:\n- {id: gold, match: {plan: gold}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [defualt]}\n- {id: default, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 2, window: 1s}\n",
    );
    let err = RuleSet::compile(&unknown, &[], 1, &Metrics::new()).expect_err("unknown");
    assert!(
        matches!(&err, CompileError::UnknownReplace { id, target, .. } if id == "gold" && target == "defualt"),
        "{err:?}"
    );
    // Another domain's rule of that id is not this domain's.
    let elsewhere = native(
        "rules:\n- {id: gold, domain: d, match: {plan: gold}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [default]}\n- {id: default, domain: e, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 2, window: 1s}\n",
    );
    let err = RuleSet::compile(&elsewhere, &[], 1, &Metrics::new()).expect_err("elsewhere");
    assert!(
        matches!(err, CompileError::UnknownReplace { .. }),
        "{err:?}"
    );
    let circle = native(
        "domain: d\nrules:\n- {id: a, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [b]}\n- {id: b, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [c]}\n- {id: c, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [a]}\n",
    );
    let err = RuleSet::compile(&circle, &[], 1, &Metrics::new()).expect_err("circle");
    assert!(
        matches!(&err, CompileError::ReplaceCycle { cycle, .. } if cycle == &["a", "b", "c", "a"]),
        "{err:?}"
    );
    assert!(err.to_string().contains("a → b → c → a"), "{err}");
    // A chain without a circle compiles.
    let chain = native(
        "domain: d\nrules:\n- {id: a, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [b]}\n- {id: b, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [c]}\n- {id: c, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n",
    );
    assert!(RuleSet::compile(&chain, &[], 1, &Metrics::new()).is_ok());
}

/// `without` keys must be in none of the request's descriptors: the login descriptor of a
/// request that also sent an API key is not anonymous, merged or one descriptor at a time.
#[test]
fn a_without_key_anywhere_in_the_request_keeps_the_rule_out() {
    let rules = native(
        "domain: d\nrules:\n- {id: anonymous-ip, match: {ip: '*'}, without: [api_key], algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n",
    );
    let set = RuleSet::compile(&rules, &[], 1, &Metrics::new()).expect("compiles");
    let login = entries(&[("route", "POST /login"), ("ip", "203.0.113.7")]);
    let key = entries(&[("api_key", "k2")]);
    let ids = |attributes: &[&[(String, String)]], request: &[&[(String, String)]]| {
        let mut out = vec![];
        set.match_native("d", attributes, request, &mut out);
        out.into_iter()
            .map(|m| m.rule.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&[&login], &[&login]), vec!["anonymous-ip"]);
    assert!(
        ids(&[&login], &[&key, &login]).is_empty(),
        "one descriptor of a keyed request"
    );
    assert!(ids(&[&key, &login], &[&key, &login]).is_empty(), "merged");
    assert!(
        ids(&[&login], &[&login, &entries(&[("api_key", "")])]).is_empty(),
        "an empty key is a key sent"
    );
}
