use super::*;

const FILE: &str = "rules.yaml";

#[test]
fn envoy_errors_carry_the_line_of_the_descriptor_at_fault() {
    let text = "domain: e\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit:\n          unit: parsec\n          requests_per_unit: 1\n";
    let e = parse(text, Path::new(FILE)).expect_err("bad unit");
    assert_eq!(e.line, Some(8), "{e}");
    assert!(e.to_string().starts_with("rules.yaml:8: "), "{e}");
    let dup = "domain: e\ndescriptors:\n  - key: a\n    value: x\n  - key: a\n    value: x\n";
    assert_eq!(
        parse(dup, Path::new(FILE)).expect_err("duplicate").line,
        Some(5)
    );
    let syntax = "domain: e\ndescriptors:\n  - key: a\n   rate_limit: [\n";
    assert!(
        parse(syntax, Path::new(FILE))
            .expect_err("syntax")
            .line
            .is_some()
    );
}

#[test]
fn the_deploy_examples_load() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    for file in [
        "rules/example.yaml",
        "rules/envoy/config.yaml",
        "regions/rules.yaml",
    ] {
        let loaded = load(&[deploy.join(file)]).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            !loaded.native.is_empty() || !loaded.envoy.is_empty(),
            "{file}"
        );
    }
}

fn err(text: &str) -> RulesError {
    parse(text, Path::new(FILE)).expect_err("invalid")
}

#[test]
fn semantic_errors_name_the_file_line_and_field() {
    let text = "domain: public-api\nrules:\n  - id: ok\n    algorithm: FIXED_WINDOW\n    limit: 5\n    window: 1s\n  - id: broken\n    algorithm: TOKEN_BUCKET\n    capacity: -3\n    refillPerSecond: 1\n";
    let e = err(text);
    assert_eq!(e.line, Some(9), "{e}");
    assert!(
        e.to_string()
            .starts_with("rules.yaml:9: rule \"broken\" (rules[1]): field `capacity`"),
        "{e}"
    );
}

#[test]
fn missing_fields_point_at_their_rule() {
    let e = err("domain: d\nrules:\n  - id: a\n    algorithm: TOKEN_BUCKET\n    capacity: 3\n");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("refillPerSecond"), "{e}");
}

#[test]
fn syntax_and_unknown_field_errors_carry_their_line() {
    let (_, errors) = parse_all(
        "domain: d\nrules:\n  - id: a\n    capacty: 3\n",
        Path::new(FILE),
    );
    let e = errors
        .iter()
        .find(|e| e.message.contains("capacty"))
        .expect("the unknown field is said");
    assert_eq!(e.line, Some(4), "{e}");
    assert!(
        e.to_string().contains("did you mean `capacity`") && !e.to_string().contains("at line 4"),
        "the line is said once, in front: {e}"
    );
    let e = err("rules: [ {id: a, algorithm: }\n");
    assert!(e.to_string().contains("rules.yaml"), "{e}");
}

/// issue 48's file: a misspelled algorithm, an id used twice, a misspelled field and a
/// `capacity: 0` beside a `refillPerSecond: 0`: every one in one run, each at its line, and
/// the rules without a mistake still load.
#[test]
fn every_mistake_of_every_rule_is_said_in_one_run() {
    let text = "domain: public-api\nrules:\n\
        - id: orders\n  match: {route: POST /orders}\n  algorithm: TOKEN_BUKET\n  capacity: 10\n  refillPerSecond: 1\n\
        - id: logins\n  match: {route: POST /login}\n  algorithm: FIXED_WINDOW\n  limit: 5\n  window: 1m\n\
        - id: logins\n  match: {route: POST /logout}\n  algorithm: FIXED_WINDOW\n  limt: 5\n  window: 1m\n\
        - id: keys\n  match: {api_key: '*'}\n  algorithm: TOKEN_BUCKET\n  capacity: 0\n  refillPerSecond: 0\n\
        - id: typed\n  match: {api_key: '*'}\n  algorithm: TOKEN_BUCKET\n  capacity: many\n  refillPerSecond: [1]\n\
        - id: fine\n  match: {api_key: '*'}\n  algorithm: TOKEN_BUCKET\n  capacity: 5\n  refillPerSecond: 1\n";
    let (loaded, errors) = parse_all(text, Path::new(FILE));
    let said: Vec<(Option<usize>, &str)> = errors
        .iter()
        .map(|e| {
            (
                e.line,
                e.message.split(": field ").nth(1).unwrap_or(&e.message),
            )
        })
        .map(|(line, rest)| (line, rest.split(':').next().unwrap_or(rest)))
        .collect();
    assert_eq!(
        said,
        [
            (Some(5), "`algorithm`"),
            (Some(13), "`id`"),
            (Some(16), "`limt`"),
            (Some(21), "`capacity`"),
            (Some(22), "`refillPerSecond`"),
            (Some(26), "`capacity`"),
            (Some(27), "`refillPerSecond`"),
        ],
        "{errors:#?}"
    );
    let ids: Vec<&str> = loaded.native.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["logins", "fine"]);
}

#[test]
fn formats_are_told_apart() {
    let native = parse(
        "domain: d\nrules:\n  - {id: a, algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n",
        Path::new(FILE),
    )
    .expect("native");
    assert_eq!((native.native.len(), native.envoy.len()), (1, 0));
    let envoy = parse("domain: rl\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n", Path::new(FILE)).expect("envoy");
    assert_eq!((envoy.native.len(), envoy.envoy.len()), (0, 1));
    assert!(err("hello: world\n").message.contains("neither"));
    assert!(parse("", Path::new(FILE)).expect("empty").native.is_empty());
}
