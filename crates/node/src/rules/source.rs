//! Loading rule files: Tollgate's format or envoyproxy/ratelimit's, told apart by their
//! top-level keys. A directory loads every `.yaml`, `.yml` and `.json` file in it. Errors name
//! the file, the line and the field.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::rules::envoy::EnvoyConfig;
use crate::rules::model::Rule;
use crate::rules::native::RulesFile;
use crate::rules::set::EnvoyDomainConfig;

/// Rules read from files, validated but not compiled.
#[derive(Debug, Clone, Default)]
pub struct LoadedRules {
    /// Tollgate rules.
    pub native: Vec<Rule>,
    /// envoyproxy/ratelimit domains.
    pub envoy: Vec<EnvoyDomainConfig>,
}

impl LoadedRules {
    /// Adds another source's rules.
    pub fn extend(&mut self, other: LoadedRules) {
        self.native.extend(other.native);
        self.envoy.extend(other.envoy);
    }
}

/// A rule file that cannot be used, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RulesError {
    /// The file.
    pub file: PathBuf,
    /// The line, when known.
    pub line: Option<usize>,
    /// What is wrong (naming the field).
    pub message: String,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// The files a path stands for: itself, or a directory's rule files in name order.
pub fn rule_files(path: &Path) -> Result<Vec<PathBuf>, RulesError> {
    let err = |e: std::io::Error| RulesError {
        file: path.to_owned(),
        line: None,
        message: e.to_string(),
    };
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Reads and validates every rule file under `paths`.
pub fn load(paths: &[PathBuf]) -> Result<LoadedRules, RulesError> {
    let mut out = LoadedRules::default();
    for path in paths {
        for file in rule_files(path)? {
            let text = std::fs::read_to_string(&file).map_err(|e| RulesError {
                file: file.clone(),
                line: None,
                message: e.to_string(),
            })?;
            out.extend(parse(&text, &file)?);
        }
    }
    Ok(out)
}

/// Parses one file's text.
pub fn parse(text: &str, file: &Path) -> Result<LoadedRules, RulesError> {
    let error = |line, message| RulesError {
        file: file.to_owned(),
        line,
        message,
    };
    let yaml_error = |e: yaml_serde::Error| error(e.location().map(|l| l.line()), e.to_string());
    let top: yaml_serde::Value = yaml_serde::from_str(text).map_err(yaml_error)?;
    let has = |key: &str| top.as_mapping().is_some_and(|m| m.contains_key(key));
    if has("rules") {
        let parsed: RulesFile = yaml_serde::from_str(text).map_err(yaml_error)?;
        let items = item_lines(text, "rules");
        let mut native = Vec::with_capacity(parsed.rules.len());
        for (i, doc) in parsed.rules.iter().enumerate() {
            let block = items.get(i).copied();
            let origin = format!("{}:{}", file.display(), block.map_or(0, |b| b.0));
            let rule = doc
                .validate(parsed.domain.as_deref(), origin)
                .map_err(|e| {
                    let line = block.map(|b| field_line(text, b, &e.field).unwrap_or(b.0));
                    let named = doc
                        .id
                        .as_deref()
                        .map(|id| format!("rule {id:?} "))
                        .unwrap_or_default();
                    error(line, format!("{named}(rules[{i}]): {e}"))
                })?;
            native.push(rule);
        }
        Ok(LoadedRules {
            native,
            envoy: vec![],
        })
    } else if has("descriptors") || has("domain") {
        let config: EnvoyConfig = yaml_serde::from_str(text).map_err(yaml_error)?;
        let nodes = config.validate().map_err(|e| {
            // The message starts with the path at fault (`descriptors[0].rate_limit: ...`).
            let path = e.split(": ").next().unwrap_or_default();
            error(path_line(text, path), e.clone())
        })?;
        Ok(LoadedRules {
            native: vec![],
            envoy: vec![EnvoyDomainConfig {
                domain: config.domain,
                nodes,
                origin: file.display().to_string(),
                // The format has none: ActiveRules sets the node's (EnvoyFailModes).
                fail_mode: crate::rules::model::FailMode::Open,
            }],
        })
    } else if top.is_null() {
        Ok(LoadedRules::default())
    } else {
        Err(error(
            None,
            "neither Tollgate rules (a top-level `rules:` list) nor an envoyproxy/ratelimit config \
             (`domain:` and `descriptors:`)"
                .into(),
        ))
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The lines (1-based, `[start, end)`) of each item of the block list under top-level `key`.
/// Flow-style lists give nothing; errors then carry serde's location only.
fn item_lines(text: &str, key: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(open) = lines.iter().position(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .is_some_and(|r| r.trim().is_empty() || r.trim().starts_with('#'))
    }) else {
        return vec![];
    };
    let mut starts = vec![];
    let mut item_indent = None;
    let mut end = lines.len();
    for (i, line) in lines.iter().enumerate().skip(open + 1) {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if indent(line) == 0 && !t.starts_with('-') {
            end = i;
            break;
        }
        if t.starts_with("- ") || t == "-" {
            let at = indent(line);
            if *item_indent.get_or_insert(at) == at {
                starts.push(i);
            }
        }
    }
    starts
        .iter()
        .enumerate()
        .map(|(n, &s)| (s + 1, starts.get(n + 1).map_or(end, |&e| e) + 1))
        .collect()
}

/// The 1-based line where the value at `path` (`descriptors[0].descriptors[2].rate_limit`)
/// is written in a block-style YAML document: the deepest part of the path that can be found
/// (flow-style parts give the line they start on).
fn path_line(text: &str, path: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    // The region searched and the indentation of its keys.
    let (mut start, mut end, mut key_indent) = (0, lines.len(), 0);
    let mut found = None;
    for segment in path.split('.') {
        let (key, index) = match segment.split_once('[') {
            Some((key, rest)) => (key, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        let key_at = (start..end).find(|&i| {
            let line = lines[i];
            let (at, body) = match line.trim_start().strip_prefix("- ") {
                Some(body) => (indent(line) + 2, body.trim_start()),
                None => (indent(line), line.trim_start()),
            };
            at == key_indent && body.starts_with(&format!("{key}:"))
        })?;
        found = Some(key_at + 1);
        let Some(index) = index else {
            // Deeper keys of a mapping value are indented under it.
            start = key_at + 1;
            end = (start..end)
                .find(|&i| !lines[i].trim().is_empty() && indent(lines[i]) <= key_indent)
                .unwrap_or(end);
            key_indent += 2;
            continue;
        };
        // The list's items: lines starting `- ` at the first item's indentation.
        let mut dash = None;
        let mut items = vec![];
        let mut list_end = end;
        for (i, line) in lines.iter().enumerate().take(end).skip(key_at + 1) {
            let t = line.trim_start();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            if indent(line) < key_indent || (indent(line) == key_indent && !t.starts_with('-')) {
                list_end = i;
                break;
            }
            if t.starts_with("- ") || t == "-" {
                let at = indent(line);
                if *dash.get_or_insert(at) == at {
                    items.push(i);
                }
            }
        }
        let item = *items.get(index)?;
        found = Some(item + 1);
        start = item;
        end = items.get(index + 1).copied().unwrap_or(list_end);
        key_indent = dash.unwrap_or(0) + 2;
    }
    found
}

/// The line of `field:` within an item's lines, if written there.
fn field_line(text: &str, (start, end): (usize, usize), field: &str) -> Option<usize> {
    let top = field.split('.').next().unwrap_or(field);
    text.lines()
        .enumerate()
        .skip(start - 1)
        .take(end - start)
        .find_map(|(i, line)| {
            let t = line.trim_start().trim_start_matches("- ");
            let flow = line.contains(&format!("{top}:")) && line.contains('{');
            (t.starts_with(&format!("{top}:")) || flow).then_some(i + 1)
        })
}

#[cfg(test)]
mod tests {
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
    fn syntax_and_unknown_field_errors_carry_serdes_location() {
        let e = err("domain: d\nrules:\n  - id: a\n    capacty: 3\n");
        assert!(
            e.to_string().contains("capacty") && e.to_string().contains("line 4"),
            "{e}"
        );
        let e = err("rules: [ {id: a, algorithm: }\n");
        assert!(e.to_string().contains("rules.yaml"), "{e}");
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
}
