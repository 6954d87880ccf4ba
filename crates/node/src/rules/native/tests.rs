use super::*;
use crate::rules::model::Mode;
use tollgate_lease::Limit;

fn doc(yaml: &str) -> RuleDoc {
    yaml_serde::from_str(yaml).expect("parses")
}

#[test]
fn the_seed_admin_body_is_a_valid_rule() {
    let body = r#"{ "match": { "plan": "gold", "route": "POST /orders" },
      "algorithm": "TOKEN_BUCKET", "capacity": 100, "refillPerSecond": 10,
      "mode": "ENFORCE", "failMode": "OPEN" }"#;
    let mut d: RuleDoc = serde_json::from_str(body).expect("json");
    d.id = Some("gold-orders-create".into());
    let rule = d
        .validate(Some("public-api"), "test".into())
        .expect("valid");
    assert_eq!(rule.identity, Identity::Default);
    assert_eq!(rule.limit.capacity(), 100);
    assert_eq!(rule.mode, Mode::Enforce);
    assert_eq!(
        RuleDoc::from_rule(&rule).validate(None, "again".into()),
        Ok(Rule {
            origin: "again".into(),
            ..rule
        })
    );
}

#[test]
fn star_keys_key_the_counters() {
    let rule = doc("{id: r, domain: d, match: {ip: '*', route: 'GET /x'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}")
        .validate(None, String::new())
        .expect("valid");
    assert_eq!(rule.identity, Identity::Keys(vec!["ip".into()]));
    assert_eq!(rule.limit.window(), Some(Duration::from_secs(60)));
}

#[test]
fn a_penalty_is_validated_field_by_field_and_round_trips() {
    let rule = doc("{id: login, domain: d, match: {ip: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m, penalty: {after: 10, within: 1m, block: 15m}}")
        .validate(None, String::new())
        .expect("valid");
    let p = rule.penalty.expect("penalty");
    assert_eq!(
        (p.after(), p.within(), p.block()),
        (10, Duration::from_secs(60), Duration::from_secs(900))
    );
    assert_eq!(
        RuleDoc::from_rule(&rule).validate(None, String::new()),
        Ok(rule)
    );
    let field = |penalty: &str| {
        doc(&format!("{{id: a, domain: d, algorithm: FIXED_WINDOW, limit: 5, window: 1m, penalty: {penalty}}}"))
            .validate(None, String::new())
            .expect_err("invalid")
            .field
    };
    assert_eq!(field("{after: 0, within: 1m, block: 1m}"), "penalty.after");
    assert_eq!(
        field("{after: 3, within: 0.5, block: 1m}"),
        "penalty.within"
    );
    assert_eq!(field("{after: 3, within: 1m, block: 8d}"), "penalty.block");
    assert_eq!(
        field("{after: 3, within: 1m, block: soon}"),
        "penalty.block"
    );
    let concurrency = doc("{id: a, domain: d, algorithm: CONCURRENCY, maxInFlight: 5, slotTtl: 1m, penalty: {after: 3, within: 1m, block: 1m}}")
        .validate(None, String::new())
        .expect_err("invalid");
    assert_eq!(concurrency.field, "penalty");
    let unknown: Result<RuleDoc, _> =
        yaml_serde::from_str("{id: a, penalty: {after: 3, within: 1m, block: 1m, ban: yes}}");
    assert!(unknown.is_err(), "unknown penalty fields are refused");
}

#[test]
fn gcra_and_leaky_bucket_rules_validate_name_their_fields_and_round_trip() {
    let valid = |yaml: &str| doc(yaml).validate(None, String::new()).expect("valid");
    let gcra = valid("{id: g, domain: d, algorithm: GCRA, burst: 20, ratePerSecond: 2.5}");
    assert_eq!(gcra.limit, Limit::gcra(20, 2.5).expect("limit"));
    let leaky = valid("{id: l, domain: d, algorithm: LEAKY_BUCKET, limit: 30, duration: 1m}");
    assert_eq!(
        leaky.limit,
        Limit::leaky_bucket(30, Duration::from_secs(60), None).expect("limit")
    );
    let deep =
        valid("{id: l, domain: d, algorithm: LEAKY_BUCKET, limit: 30, duration: 1m, burst: 5}");
    assert_eq!(deep.limit.capacity(), 5);
    for rule in [gcra, leaky, deep] {
        let written = RuleDoc::from_rule(&rule);
        assert_eq!(written.validate(None, String::new()), Ok(rule));
    }
    let field = |yaml: &str| {
        doc(yaml)
            .validate(Some("d"), String::new())
            .expect_err("invalid")
            .field
    };
    assert_eq!(field("{id: a, algorithm: GCRA, ratePerSecond: 1}"), "burst");
    assert_eq!(field("{id: a, algorithm: GCRA, burst: 3}"), "ratePerSecond");
    assert_eq!(
        field("{id: a, algorithm: GCRA, burst: 3, ratePerSecond: -1}"),
        "ratePerSecond"
    );
    assert_eq!(
        field("{id: a, algorithm: GCRA, capacity: 3, burst: 3, ratePerSecond: 1}"),
        "capacity"
    );
    assert_eq!(
        field("{id: a, algorithm: LEAKY_BUCKET, limit: 3}"),
        "duration"
    );
    assert_eq!(
        field("{id: a, algorithm: LEAKY_BUCKET, limit: 3, duration: 1m, burst: 0}"),
        "burst"
    );
    assert_eq!(
        field("{id: a, algorithm: LEAKY_BUCKET, limit: 3, window: 1m}"),
        "window"
    );
    assert_eq!(
        field("{id: a, algorithm: FIXED_WINDOW, limit: 3, window: 1m, duration: 1m}"),
        "duration"
    );
}

#[test]
fn errors_name_the_field() {
    let field = |yaml: &str| {
        doc(yaml)
            .validate(Some("d"), String::new())
            .expect_err("invalid")
            .field
    };
    assert_eq!(
        field("{algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 1}"),
        "id"
    );
    assert_eq!(field("{id: 'a b', algorithm: TOKEN_BUCKET}"), "id");
    assert_eq!(field("{id: a}"), "algorithm");
    assert_eq!(field("{id: a, algorithm: LEAKY}"), "algorithm");
    assert_eq!(
        field("{id: a, algorithm: TOKEN_BUCKET, refillPerSecond: 1}"),
        "capacity"
    );
    assert_eq!(
        field("{id: a, algorithm: TOKEN_BUCKET, capacity: 0, refillPerSecond: 1}"),
        "capacity"
    );
    assert_eq!(
        field("{id: a, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: .nan}"),
        "refillPerSecond"
    );
    assert_eq!(
        field("{id: a, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: 1, window: 5s}"),
        "window"
    );
    assert_eq!(
        field("{id: a, algorithm: FIXED_WINDOW, limit: 5, window: 5 parsecs}"),
        "window"
    );
    assert_eq!(
        field("{id: a, algorithm: FIXED_WINDOW, limit: 5, window: 1s, mode: LOUD}"),
        "mode"
    );
    assert_eq!(
        field("{id: a, algorithm: CONCURRENCY, maxInFlight: 2, slotTtl: 1s, failMode: X}"),
        "failMode"
    );
    assert_eq!(
        field("{id: a, algorithm: CONCURRENCY, maxInFlight: 2}"),
        "slotTtl"
    );
}

#[test]
fn a_nul_anywhere_is_refused_naming_the_field() {
    let mut d = doc("{id: a, domain: d, algorithm: FIXED_WINDOW, limit: 1, window: 1s}");
    d.matches.insert("route".into(), "GET /\0x".into());
    assert_eq!(
        d.validate(None, String::new()).expect_err("nul").field,
        "match.route"
    );
    let mut d = doc("{id: a, algorithm: FIXED_WINDOW, limit: 1, window: 1s}");
    d.domain = Some("a\0b".into());
    assert_eq!(
        d.validate(None, String::new()).expect_err("nul").field,
        "domain"
    );
}

#[test]
fn unknown_fields_are_refused() {
    let err = yaml_serde::from_str::<RuleDoc>("{id: a, capacty: 5}").expect_err("unknown field");
    assert!(err.to_string().contains("capacty"), "{err}");
}

#[test]
fn durations_format_in_their_largest_unit() {
    assert_eq!(format_duration(Duration::from_secs(60)), "1m");
    assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
}

#[test]
fn replaces_names_other_rules_once_each() {
    let rule = doc("{id: gold, match: {plan: gold}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [default, basic]}")
        .validate(Some("d"), "test".into())
        .expect("valid");
    assert_eq!(rule.replaces, ["default", "basic"]);
    let errors = doc("{id: gold, match: {plan: gold}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, replaces: [gold, 'no spaces', basic, basic]}")
        .validate_all(Some("d"), "test".into())
        .expect_err("three mistakes");
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["replaces[0]", "replaces[1]", "replaces[3]"],
        "{errors:?}"
    );
    assert!(errors[0].reason.contains("itself"), "{errors:?}");
    // Written back out as it was read.
    let back = RuleDoc::from_rule(&rule);
    assert_eq!(back.replaces, ["default", "basic"]);
}

#[test]
fn without_names_keys_no_request_of_the_rule_may_hold() {
    let rule = doc("{id: anonymous-ip, match: {ip: '*'}, without: [api_key], algorithm: FIXED_WINDOW, limit: 1, window: 1s}")
        .validate(Some("d"), "test".into())
        .expect("valid");
    assert_eq!(rule.without, ["api_key"]);
    assert_eq!(RuleDoc::from_rule(&rule).without, ["api_key"]);
    let errors = doc("{id: a, match: {ip: '*'}, per: [user], without: [ip, '', user, k, k], algorithm: FIXED_WINDOW, limit: 1, window: 1s}")
        .validate_all(Some("d"), "test".into())
        .expect_err("four mistakes");
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["without[0]", "without[1]", "without[2]", "without[4]"],
        "{errors:?}"
    );
    assert!(errors[0].reason.contains("`match`"), "{errors:?}");
}

/// RULE_FIELDS is exactly the fields serde reads: each one known, and an unknown one's error
/// lists the same fields.
#[test]
fn rule_fields_are_the_documents_fields() {
    let err = serde_json::from_str::<RuleDoc>(r#"{"limt": 1}"#).expect_err("unknown");
    let listed: Vec<String> = err
        .to_string()
        .split("expected one of ")
        .nth(1)
        .expect("the fields")
        .split(", ")
        .map(|f| {
            f.trim_matches(|c: char| c == '`' || !c.is_ascii() || c.is_whitespace())
                .split('`')
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(listed, RULE_FIELDS, "{err}");
}
