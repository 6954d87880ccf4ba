//! Loading rule files: Tollgate's format or envoyproxy/ratelimit's, told apart by their
//! top-level keys. A directory loads every `.yaml`, `.yml` and `.json` file in it. Errors name
//! the file, the line and the field.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::rules::envoy::EnvoyConfig;
use crate::rules::model::Rule;
use crate::rules::native::FieldError;
use crate::rules::overrides::{ModeOverride, OverridesFile};
use crate::rules::set::EnvoyDomainConfig;

mod rules_file;

/// Rules read from files, validated but not compiled.
#[derive(Debug, Clone, Default)]
pub struct LoadedRules {
    /// Tollgate rules.
    pub native: Vec<Rule>,
    /// envoyproxy/ratelimit domains.
    pub envoy: Vec<EnvoyDomainConfig>,
    /// Mode overrides (the kill switch), applied when the set is installed.
    pub overrides: Vec<ModeOverride>,
}

impl LoadedRules {
    /// Adds another source's rules.
    pub fn extend(&mut self, other: LoadedRules) {
        self.native.extend(other.native);
        self.envoy.extend(other.envoy);
        self.overrides.extend(other.overrides);
    }

    /// Whether nothing was loaded (no rule, domain or override).
    pub fn is_empty(&self) -> bool {
        self.native.is_empty() && self.envoy.is_empty() && self.overrides.is_empty()
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

/// Subfolders of `path` (a directory), which are not read: rules are only the directory's own
/// files.
pub fn skipped_folders(path: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Every rule file under `paths` read and checked, with every error found (not only the
/// first), the files that hold no rules, and the subfolders not read: what `tollgate rules
/// validate` reports.
#[derive(Debug, Default)]
pub struct Checked {
    /// What loads.
    pub loaded: LoadedRules,
    /// Every error, in file and line order.
    pub errors: Vec<RulesError>,
    /// Files with no rules in them (empty, or only comments).
    pub empty: Vec<PathBuf>,
    /// Subfolders of the directories given, which are not read.
    pub skipped: Vec<PathBuf>,
}

/// Reads and checks every rule file under `paths`, collecting every error.
pub fn check(paths: &[PathBuf]) -> Checked {
    let mut out = Checked::default();
    for path in paths {
        if path.is_dir() {
            out.skipped.extend(skipped_folders(path));
        }
        let files = match rule_files(path) {
            Ok(files) => files,
            Err(e) => {
                out.errors.push(e);
                continue;
            }
        };
        for file in files {
            let text = match std::fs::read_to_string(&file) {
                Ok(text) => text,
                Err(e) => {
                    out.errors.push(RulesError {
                        file: file.clone(),
                        line: None,
                        message: e.to_string(),
                    });
                    continue;
                }
            };
            let (loaded, errors) = parse_all(&text, &file);
            if errors.is_empty() && loaded.is_empty() {
                out.empty.push(file.clone());
            }
            out.loaded.extend(loaded);
            out.errors.extend(errors);
        }
    }
    out
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

/// Parses one file's text: its rules, or the first error ([`parse_all`] finds them all).
pub fn parse(text: &str, file: &Path) -> Result<LoadedRules, RulesError> {
    let (loaded, mut errors) = parse_all(text, file);
    if errors.is_empty() {
        Ok(loaded)
    } else {
        Err(errors.swap_remove(0))
    }
}

/// Parses one file's text: what is valid, and every error (each rule of Tollgate's format is
/// checked on its own, so a file with three bad rules gives three errors).
pub fn parse_all(text: &str, file: &Path) -> (LoadedRules, Vec<RulesError>) {
    let error = |line, message| RulesError {
        file: file.to_owned(),
        line,
        message,
    };
    let yaml_error = |e: yaml_serde::Error| {
        let message = e.to_string();
        match e.location() {
            // The line goes in front (file:line:), not again at the end of the message.
            Some(l) => error(Some(l.line()), without_location(&message, l.line())),
            // Several documents: serde says where none starts; the separator's line does.
            None if message.contains("more than one document") => error(
                document_separator(text),
                "more than one YAML document (`---`): a rule file holds one".into(),
            ),
            None => error(None, message),
        }
    };
    let top: yaml_serde::Value = match yaml_serde::from_str(text) {
        Ok(top) => top,
        Err(e) => return (LoadedRules::default(), vec![yaml_error(e)]),
    };
    let has = |key: &str| top.as_mapping().is_some_and(|m| m.contains_key(key));
    if has("rules") {
        rules_file(text, file, &top)
    } else if has("overrides") {
        let parsed: OverridesFile = match yaml_serde::from_str(text) {
            Ok(parsed) => parsed,
            Err(e) => return (LoadedRules::default(), vec![yaml_error(e)]),
        };
        let (overrides, errors) = each_item(
            text,
            file,
            "overrides",
            &parsed.overrides,
            |i, doc, origin| {
                doc.validate(origin).map_err(|(field, reason)| {
                    let message = format!(
                        "mode override of {:?} (overrides[{i}]): {field}: {reason}",
                        doc.id
                    );
                    vec![(field.to_owned(), message)]
                })
            },
        );
        (
            LoadedRules {
                overrides,
                ..LoadedRules::default()
            },
            errors,
        )
    } else if has("descriptors") || has("domain") {
        let config: EnvoyConfig = match yaml_serde::from_str(text) {
            Ok(config) => config,
            Err(e) => return (LoadedRules::default(), vec![yaml_error(e)]),
        };
        match config.validate() {
            Ok(nodes) => (
                LoadedRules {
                    envoy: vec![EnvoyDomainConfig {
                        domain: config.domain,
                        nodes,
                        origin: file.display().to_string(),
                        // The format has none: ActiveRules sets the node's (EnvoyFailModes).
                        fail_mode: crate::rules::model::FailMode::Open,
                    }],
                    ..LoadedRules::default()
                },
                vec![],
            ),
            // The error names the path at fault (`descriptors[0].rate_limit`): its line.
            Err(e) => (
                LoadedRules::default(),
                vec![error(path_line(text, &e.at), e.to_string())],
            ),
        }
    } else if top.is_null() {
        (LoadedRules::default(), vec![])
    } else {
        (
            LoadedRules::default(),
            vec![error(
                None,
                "neither Tollgate rules (a top-level `rules:` list), mode overrides (`overrides:`) \
                 nor an envoyproxy/ratelimit config (`domain:` and `descriptors:`)"
                    .into(),
            )],
        )
    }
}

/// A file of Tollgate rules: every mistake of every rule, each at its line (a rule with an
/// error is left out; the rest load).
fn rules_file(text: &str, file: &Path, top: &yaml_serde::Value) -> (LoadedRules, Vec<RulesError>) {
    let read = rules_file::read(top);
    let mut errors: Vec<RulesError> = read
        .top
        .iter()
        .map(|e| RulesError {
            file: file.to_owned(),
            line: path_line(text, &e.field),
            message: e.to_string(),
        })
        .collect();
    let twice = rules_file::duplicate_ids(&read.rules);
    let items = item_lines(text, "rules");
    let origin_of = |index: usize| {
        let line = items.get(index).map_or(0, |b| b.0);
        format!("{}:{line}", file.display())
    };
    let (native, item_errors) = each_item(text, file, "rules", &read.rules, |i, rule, origin| {
        let named = rule
            .doc
            .as_ref()
            .and_then(|d| d.id.as_deref())
            .map(|id| format!("rule {id:?} "))
            .unwrap_or_default();
        let mut fields = rule.unreadable.clone();
        if let Some((_, id, first)) = twice.iter().find(|(at, _, _)| *at == i) {
            fields.push(FieldError {
                field: "id".into(),
                reason: format!("{id:?} is used twice: first at {}", origin_of(*first)),
            });
        }
        let valid = rule.doc.as_ref().map(|doc| {
            doc.validate_all(read.domain.as_deref(), origin)
                .map_err(|invalid| {
                    fields.extend(
                        invalid
                            .into_iter()
                            .filter(|e| !rules_file::said(&rule.unreadable, &e.field)),
                    );
                })
        });
        match valid {
            Some(Ok(rule)) if fields.is_empty() => Ok(rule),
            _ => Err(fields
                .into_iter()
                .map(|e| {
                    let message = if e.field.is_empty() {
                        format!("{named}(rules[{i}]): {}", e.reason)
                    } else {
                        format!("{named}(rules[{i}]): {e}")
                    };
                    (e.field, message)
                })
                .collect()),
        }
    });
    errors.extend(item_errors);
    errors.sort_by_key(|e| e.line);
    (
        LoadedRules {
            native,
            ..LoadedRules::default()
        },
        errors,
    )
}

/// Validates each item of the block list under top-level `key` on its own: what is valid, and
/// every error at the line of the field it names (`validate` gets the item's index, the item
/// and its origin, `file:line`, and gives the fields at fault with their messages).
fn each_item<D, T>(
    text: &str,
    file: &Path,
    key: &str,
    docs: &[D],
    mut validate: impl FnMut(usize, &D, String) -> Result<T, Vec<(String, String)>>,
) -> (Vec<T>, Vec<RulesError>) {
    let items = item_lines(text, key);
    let mut valid = Vec::with_capacity(docs.len());
    let mut errors = vec![];
    for (i, doc) in docs.iter().enumerate() {
        let block = items.get(i).copied();
        let origin = format!("{}:{}", file.display(), block.map_or(0, |b| b.0));
        match validate(i, doc, origin) {
            Ok(item) => valid.push(item),
            Err(fields) => errors.extend(fields.into_iter().map(|(field, message)| RulesError {
                file: file.to_owned(),
                line: block.map(|b| field_line(text, b, &field).unwrap_or(b.0)),
                message,
            })),
        }
    }
    (valid, errors)
}

/// A YAML error's message without `at line L column C` where L is the line already said in
/// front (`file:L:`); another line it names (where a list began) stays.
fn without_location(message: &str, line: usize) -> String {
    let said = format!(" at line {line} column ");
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(&said) {
        out.push_str(&rest[..at]);
        let after = &rest[at + said.len()..];
        rest = after.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// The 1-based line of the first `---` that ends a document with content before it.
fn document_separator(text: &str) -> Option<usize> {
    let mut content = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_end();
        if t == "---" || t.starts_with("--- ") {
            if content {
                return Some(i + 1);
            }
        } else if !t.trim().is_empty() && !t.trim_start().starts_with('#') {
            content = true;
        }
    }
    None
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
    if field.is_empty() {
        return None;
    }
    let top = field.split(['.', '[']).next().unwrap_or(field);
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
mod tests;
