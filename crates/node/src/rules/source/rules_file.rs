//! A file of Tollgate rules read field by field, so that every mistake of every rule is said
//! in one run: an unknown field (with the field it likely meant), a value of the wrong type,
//! an id used twice, and every invalid field `RuleDoc::validate_all` finds, each at its line.
//! Only a YAML syntax error stops the file.

use std::collections::HashMap;

use yaml_serde::{Mapping, Value};

use crate::rules::native::{FieldError, RULE_FIELDS, RuleDoc};

/// One rule as read: the document made of its readable fields, and every field at fault.
pub(super) struct ReadRule {
    /// Its index in `rules`.
    pub index: usize,
    /// The document (None: not a mapping at all).
    pub doc: Option<RuleDoc>,
    /// The fields that could not be read (unknown, or of the wrong type).
    pub unreadable: Vec<FieldError>,
}

/// The file's top level: its default domain, its rules, and what is wrong at the top (field,
/// reason).
pub(super) struct ReadFile {
    pub domain: Option<String>,
    pub rules: Vec<ReadRule>,
    pub top: Vec<FieldError>,
}

/// Reads a `rules:` file's top level and each rule, every field on its own.
pub(super) fn read(top: &Value) -> ReadFile {
    let mut out = ReadFile {
        domain: None,
        rules: vec![],
        top: vec![],
    };
    let Some(map) = top.as_mapping() else {
        return out;
    };
    for (key, value) in map {
        match key.as_str() {
            Some("domain") => match value {
                Value::String(domain) => out.domain = Some(domain.clone()),
                Value::Null => {}
                other => out.top.push(FieldError {
                    field: "domain".into(),
                    reason: format!("must be a string, not {}", kind(other)),
                }),
            },
            Some("rules") => match value {
                Value::Sequence(items) => {
                    out.rules = items.iter().enumerate().map(read_rule).collect();
                }
                Value::Null => {}
                other => out.top.push(FieldError {
                    field: "rules".into(),
                    reason: format!("must be a list of rules, not {}", kind(other)),
                }),
            },
            _ => out.top.push(FieldError {
                field: key.as_str().unwrap_or("?").to_owned(),
                reason: "unknown top-level field: a rule file has `domain` and `rules`".into(),
            }),
        }
    }
    out
}

fn read_rule((index, item): (usize, &Value)) -> ReadRule {
    let Some(fields) = item.as_mapping() else {
        return ReadRule {
            index,
            doc: None,
            unreadable: vec![FieldError {
                field: String::new(),
                reason: format!("a rule is a mapping of fields, not {}", kind(item)),
            }],
        };
    };
    let mut readable = Mapping::new();
    let mut unreadable = vec![];
    for (key, value) in fields {
        let name = key
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{key:?}"));
        if !RULE_FIELDS.contains(&name.as_str()) {
            unreadable.push(FieldError {
                reason: match likely(&name) {
                    Some(meant) => format!("unknown field; did you mean `{meant}`?"),
                    None => format!(
                        "unknown field; a rule's fields are {}",
                        RULE_FIELDS.join(", ")
                    ),
                },
                field: name,
            });
            continue;
        }
        let mut alone = Mapping::new();
        alone.insert(key.clone(), value.clone());
        match yaml_serde::from_value::<RuleDoc>(Value::Mapping(alone)) {
            Ok(_) => {
                readable.insert(key.clone(), value.clone());
            }
            Err(e) => unreadable.push(FieldError {
                field: name,
                reason: e.to_string(),
            }),
        }
    }
    // Each field read on its own: together they read too.
    let doc = yaml_serde::from_value::<RuleDoc>(Value::Mapping(readable))
        .map_err(|e| {
            unreadable.push(FieldError {
                field: String::new(),
                reason: e.to_string(),
            })
        })
        .ok();
    ReadRule {
        index,
        doc,
        unreadable,
    }
}

/// The rule field an unknown one most likely meant (`limt` → `limit`), if one is close.
fn likely(unknown: &str) -> Option<&'static str> {
    let lower = unknown.to_ascii_lowercase();
    RULE_FIELDS
        .iter()
        .map(|known| {
            (
                strsim::levenshtein(&lower, &known.to_ascii_lowercase()),
                *known,
            )
        })
        .filter(|(distance, known)| *distance <= 2.max(known.len() / 4))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// The rules (by index) whose `id` another rule before them in the file has: index, id and
/// the index of the first.
pub(super) fn duplicate_ids(rules: &[ReadRule]) -> Vec<(usize, String, usize)> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut twice = vec![];
    for rule in rules {
        let Some(id) = rule.doc.as_ref().and_then(|d| d.id.as_deref()) else {
            continue;
        };
        if let Some(&at) = first.get(id) {
            twice.push((rule.index, id.to_owned(), at));
        } else {
            first.insert(id, rule.index);
        }
    }
    twice
}

/// Whether a field `validate_all` says is at fault is one already said as unreadable (or
/// meant by an unknown one: `limt` makes `limit` missing): said once.
pub(super) fn said(unreadable: &[FieldError], field: &str) -> bool {
    let top = field.split(['.', '[']).next().unwrap_or(field);
    unreadable.iter().any(|u| {
        u.field == top || likely(&u.field) == Some(top) && !RULE_FIELDS.contains(&u.field.as_str())
    })
}
