//! A sweep: one scenario run over several values of one setting and several seeds, as a table.
//! The setting is any field of the scenario file, named by its path (`runtime.lease_ttl`,
//! `topology.regions.0.nodes`, `traffic.1.rate`); each value is read as YAML.

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
    let invalid = |message: String| ScenarioError::Invalid {
        file: file.into(),
        field: path.into(),
        message,
    };
    let mut doc: Value = yaml_serde::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let new: Value = yaml_serde::from_str(value).map_err(|e| invalid(e.to_string()))?;
    let mut at = &mut doc;
    let parts: Vec<&str> = path.split('.').collect();
    for (depth, part) in parts.iter().enumerate() {
        let part = *part;
        at = match at {
            Value::Mapping(m) => {
                let key = Value::String(part.into());
                if !m.contains_key(&key) {
                    // A missing section is created (a setting left at its default).
                    let empty = if depth + 1 < parts.len() {
                        Value::Mapping(Default::default())
                    } else {
                        Value::Null
                    };
                    m.insert(key.clone(), empty);
                }
                m.get_mut(&key)
                    .ok_or_else(|| invalid(format!("no field {part:?}")))?
            }
            Value::Sequence(items) => {
                let i: usize = part
                    .parse()
                    .map_err(|_| invalid(format!("{part:?} is not a list index")))?;
                let len = items.len();
                items
                    .get_mut(i)
                    .ok_or_else(|| invalid(format!("index {i} is past the list's {len} items")))?
            }
            _ => {
                return Err(invalid(format!(
                    "{part:?} is inside a value that has no fields"
                )));
            }
        };
    }
    *at = new;
    let text = yaml_serde::to_string(&doc).map_err(|e| invalid(e.to_string()))?;
    Scenario::parse(&text, file)
}

/// One run of a sweep.
#[derive(Debug, Clone)]
pub struct Row {
    /// The setting's value.
    pub value: String,
    /// The report.
    pub report: Report,
}

/// The sweep as a table: a line per value and seed.
pub fn table(param: &Param, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| {} | seed | invariants | decisions | admitted | overshoot | false denials | failed open | failed closed | store calls/decision | p99 µs |",
        param.path
    );
    let _ = writeln!(
        out,
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for row in rows {
        let r = &row.report;
        let sum = |f: fn(&crate::report::RuleReport) -> u64| r.rules.values().map(f).sum::<u64>();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.4} | {} |",
            row.value,
            r.seed,
            if r.passed() { "ok" } else { "BROKEN" },
            r.decisions,
            r.admitted,
            sum(|x| x.overshoot),
            sum(|x| x.false_denials),
            sum(|x| x.decided.failed_open),
            sum(|x| x.decided.failed_closed),
            r.store_calls_per_decision,
            r.latency_us.p99
        );
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
}
