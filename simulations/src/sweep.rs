//! A sweep: one scenario run over a grid of settings (every combination of their values) and
//! several seeds, as a table with a line per rule. A setting is any field of the scenario
//! file, named by its path (`runtime.lease_ttl`, `topology.regions.0.nodes`, `traffic.1.rate`),
//! rules included: a path goes on into a field that holds YAML text (`rules.rules.0.failMode`,
//! `faults.2.rules.yaml.rules.0.limit`), and `rule.<id>.<field>` names a rule of `rules:` by
//! its id (`rule.login.failMode`). Each value is read as YAML.

use std::fmt::Write as _;

use yaml_serde::Value;

use crate::report::Report;
use crate::scenario::{Scenario, ScenarioError};

/// One setting and the values it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The field's path, dot-separated (list items by index).
    pub path: String,
    /// The values, as written.
    pub values: Vec<String>,
}

/// Reads `path=v1,v2,...`.
pub fn parse_param(text: &str) -> Result<Param, String> {
    let (path, values) = text
        .split_once('=')
        .ok_or_else(|| format!("--param {text:?}: expected PATH=V1,V2,..."))?;
    let values: Vec<String> = values
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(String::from)
        .collect();
    if path.trim().is_empty() || values.is_empty() {
        return Err(format!("--param {text:?}: expected PATH=V1,V2,..."));
    }
    Ok(Param {
        path: path.trim().into(),
        values,
    })
}

/// Reads `A..B` (inclusive) or `A,B,C`.
pub fn parse_seeds(text: &str) -> Result<Vec<u64>, String> {
    let bad = || format!("--seeds {text:?}: expected A..B or A,B,C");
    if let Some((a, b)) = text.split_once("..") {
        let (a, b): (u64, u64) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a > b || b - a >= 10_000 {
            return Err(bad());
        }
        return Ok((a..=b).collect());
    }
    text.split(',')
        .map(|s| s.trim().parse().map_err(|_| bad()))
        .collect()
}

/// The scenario in `text` with the field at `path` set to `value`.
pub fn variant(text: &str, file: &str, path: &str, value: &str) -> Result<Scenario, ScenarioError> {
    variants(text, file, &[(path, value)])
}

/// The scenario in `text` with each `(path, value)` set, in order.
pub fn variants(
    text: &str,
    file: &str,
    settings: &[(&str, &str)],
) -> Result<Scenario, ScenarioError> {
    let mut doc: Value = yaml_serde::from_str(text).map_err(|e| ScenarioError::Invalid {
        file: file.into(),
        field: String::new(),
        message: e.to_string(),
    })?;
    for (path, value) in settings {
        let invalid = |message: String| ScenarioError::Invalid {
            file: file.into(),
            field: (*path).into(),
            message,
        };
        let new: Value = yaml_serde::from_str(value).map_err(|e| invalid(e.to_string()))?;
        let parts = resolve_rule_id(&doc, path).map_err(invalid)?;
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        set(&mut doc, &parts, new).map_err(invalid)?;
    }
    let text = yaml_serde::to_string(&doc).map_err(|e| ScenarioError::Invalid {
        file: file.into(),
        field: String::new(),
        message: e.to_string(),
    })?;
    Scenario::parse(&text, file)
}

/// `rule.<id>.<field...>` as the path to that rule in `rules:` (`rules.rules.<index>....`);
/// any other path split at its dots.
fn resolve_rule_id(doc: &Value, path: &str) -> Result<Vec<String>, String> {
    let parts: Vec<String> = path.split('.').map(String::from).collect();
    if parts.first().map(String::as_str) != Some("rule") {
        return Ok(parts);
    }
    let (Some(id), true) = (parts.get(1), parts.len() > 2) else {
        return Err("write rule.<id>.<field>".into());
    };
    let rules_text = doc
        .get("rules")
        .and_then(Value::as_str)
        .ok_or("the scenario has no `rules:` text")?;
    let rules: Value = yaml_serde::from_str(rules_text).map_err(|e| e.to_string())?;
    let list = rules
        .get("rules")
        .and_then(Value::as_sequence)
        .ok_or("`rules:` is not in Tollgate's format (a `rules:` list); name the path instead")?;
    let index = list
        .iter()
        .position(|r| r.get("id").and_then(Value::as_str) == Some(id.as_str()))
        .ok_or_else(|| {
            let ids: Vec<&str> = list
                .iter()
                .filter_map(|r| r.get("id").and_then(Value::as_str))
                .collect();
            format!("no rule {id:?} in `rules:` (its rules: {ids:?})")
        })?;
    let mut out = vec!["rules".to_owned(), "rules".to_owned(), index.to_string()];
    out.extend(parts[2..].iter().cloned());
    Ok(out)
}

/// Sets the field at `parts` under `at` to `new`; a text field met on the way is read as YAML,
/// changed, and written back as text.
fn set(at: &mut Value, parts: &[&str], new: Value) -> Result<(), String> {
    let Some((part, rest)) = parts.split_first() else {
        *at = new;
        return Ok(());
    };
    let part = *part;
    if let Value::String(text) = at {
        let mut inner: Value =
            yaml_serde::from_str(text).map_err(|e| format!("the text at {part:?}: {e}"))?;
        set(&mut inner, parts, new)?;
        *text = yaml_serde::to_string(&inner).map_err(|e| e.to_string())?;
        return Ok(());
    }
    let next = match at {
        Value::Mapping(m) => {
            let key = Value::String(part.into());
            if !m.contains_key(&key) {
                // A missing section is created (a setting left at its default).
                let empty = if rest.is_empty() {
                    Value::Null
                } else {
                    Value::Mapping(Default::default())
                };
                m.insert(key.clone(), empty);
            }
            m.get_mut(&key)
                .ok_or_else(|| format!("no field {part:?}"))?
        }
        Value::Sequence(items) => {
            let i: usize = part
                .parse()
                .map_err(|_| format!("{part:?} is not a list index"))?;
            let len = items.len();
            items
                .get_mut(i)
                .ok_or_else(|| format!("index {i} is past the list's {len} items"))?
        }
        _ => return Err(format!("{part:?} is inside a value that has no fields")),
    };
    set(next, rest, new)
}

/// One run of a sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// Each setting's value, in the order of the settings.
    pub values: Vec<String>,
    /// The report.
    pub report: Report,
}

/// Every combination of the settings' values, the first setting varying slowest.
pub fn grid(params: &[Param]) -> Vec<Vec<String>> {
    params.iter().fold(vec![vec![]], |combos, param| {
        combos
            .iter()
            .flat_map(|combo| {
                param.values.iter().map(move |v| {
                    let mut next = combo.clone();
                    next.push(v.clone());
                    next
                })
            })
            .collect()
    })
}

/// The sweep as a table: a line per combination, seed and rule.
pub fn table(params: &[Param], rows: &[Row]) -> String {
    let mut out = String::new();
    let names: Vec<&str> = params.iter().map(|p| p.path.as_str()).collect();
    let _ = writeln!(
        out,
        "| {} | seed | invariants | rule | admitted | exact | overshoot | false denials | failed open | failed closed | local | worst sync lag ms | store calls/decision | p99 µs |",
        names.join(" | ")
    );
    let _ = writeln!(
        out,
        "|{}---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "---|".repeat(names.len())
    );
    for row in rows {
        let r = &row.report;
        let lag = r
            .per_second
            .iter()
            .flat_map(|s| s.regions.values().filter_map(|region| region.lag_ms))
            .max()
            .map_or_else(|| "-".to_owned(), |ms| ms.to_string());
        for (rule, x) in &r.rules {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {rule} | {} | {} | {} | {} | {} | {} | {} | {lag} | {:.4} | {} |",
                row.values.join(" | "),
                r.seed,
                if r.passed() { "ok" } else { "BROKEN" },
                x.decided.admitted,
                x.exact,
                x.overshoot,
                x.false_denials,
                x.decided.failed_open,
                x.decided.failed_closed,
                x.decided.local_fallback,
                r.store_calls_per_decision,
                r.latency_us.p99
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_and_seeds_parse() {
        let p = parse_param("runtime.lease_ttl=500ms,1s").expect("param");
        assert_eq!(p.path, "runtime.lease_ttl");
        assert_eq!(p.values, ["500ms", "1s"]);
        assert!(parse_param("runtime.lease_ttl").is_err());
        assert_eq!(parse_seeds("3..5").expect("range"), [3, 4, 5]);
        assert_eq!(parse_seeds("1,7").expect("list"), [1, 7]);
        assert!(parse_seeds("5..3").is_err());
    }

    #[test]
    fn a_variant_sets_a_nested_field() {
        let text = "name: t\nduration: 2s\ntopology: {regions: [{name: eu, nodes: 2}]}\nrules: |\n  domain: d\n  rules: []\ntraffic: [{name: a, domain: d, rate: 10, descriptors: [{k: '{key}'}]}]\n";
        let s = variant(text, "t.yaml", "topology.regions.0.nodes", "7").expect("variant");
        assert_eq!(s.topology.regions[0].nodes, 7);
        let s = variant(text, "t.yaml", "runtime.lease_ttl", "250ms").expect("variant");
        assert_eq!(
            s.runtime.lease_ttl,
            Some(std::time::Duration::from_millis(250))
        );
        let e = variant(text, "t.yaml", "traffic.3.rate", "1").expect_err("no item 3");
        assert!(e.to_string().contains("past the list"), "{e}");
    }

    const RULES: &str = "name: t\nduration: 2s\ntopology: {regions: [{name: eu, nodes: 2}]}\nrules: |\n  domain: d\n  rules:\n    - {id: a, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}\n    - {id: login, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}\ntraffic: [{name: a, domain: d, rate: 10, descriptors: [{k: '{key}'}]}]\n";

    fn rule_field(s: &Scenario, id: &str, field: &str) -> Option<String> {
        let rules: Value = yaml_serde::from_str(&s.rules).ok()?;
        let rule = rules
            .get("rules")?
            .as_sequence()?
            .iter()
            .find(|r| r.get("id").and_then(Value::as_str) == Some(id))?;
        let v = rule.get(field)?;
        v.as_str()
            .map(String::from)
            .or_else(|| v.as_u64().map(|n| n.to_string()))
    }

    #[test]
    fn a_rule_is_swept_by_its_id_or_by_its_path_into_the_rules_text() {
        let s = variant(RULES, "t.yaml", "rule.login.failMode", "CLOSED").expect("variant");
        assert_eq!(
            rule_field(&s, "login", "failMode").as_deref(),
            Some("CLOSED")
        );
        assert_eq!(rule_field(&s, "a", "failMode"), None, "only that rule");
        let s = variant(RULES, "t.yaml", "rules.rules.0.limit", "7").expect("variant");
        assert_eq!(rule_field(&s, "a", "limit").as_deref(), Some("7"));
        let e = variant(RULES, "t.yaml", "rule.logn.failMode", "OPEN").expect_err("no rule");
        assert!(
            e.to_string().contains("logn") && e.to_string().contains("login"),
            "{e}"
        );
        // A value the rule refuses is refused as the scenario's rules are.
        let e = variant(RULES, "t.yaml", "rule.login.failMode", "SOMETIMES").expect_err("bad");
        assert!(e.to_string().contains("failMode"), "{e}");
    }

    #[test]
    fn several_settings_make_a_grid() {
        let params = [
            parse_param("rule.login.failMode=OPEN,CLOSED").expect("param"),
            parse_param("topology.regions.0.nodes=1,2,3").expect("param"),
        ];
        let combos = grid(&params);
        assert_eq!(combos.len(), 6);
        assert_eq!(combos[0], ["OPEN", "1"]);
        assert_eq!(combos[5], ["CLOSED", "3"]);
        let settings: Vec<(&str, &str)> = params
            .iter()
            .zip(&combos[4])
            .map(|(p, v)| (p.path.as_str(), v.as_str()))
            .collect();
        let s = variants(RULES, "t.yaml", &settings).expect("variants");
        assert_eq!(
            rule_field(&s, "login", "failMode").as_deref(),
            Some("CLOSED")
        );
        assert_eq!(s.topology.regions[0].nodes, 2);
    }
}
