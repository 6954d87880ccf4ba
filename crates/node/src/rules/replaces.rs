//! Which rules a Tollgate rule replaces (`replaces: [id, ...]`, docs/rules-precedence.md),
//! checked over a whole set: every rule named is a rule of the replacing rule's domain, and no
//! rules replace each other in a circle. The rule set checks it when it compiles; the rule
//! store checks it before a write or a delete, over the rules the nodes would compile.

use std::collections::{HashMap, HashSet};

use super::errors::CompileError;

/// A rule as the check sees it.
#[derive(Debug, Clone, Copy)]
pub struct Replacing<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its domain.
    pub domain: &'a str,
    /// The ids of the rules it replaces.
    pub replaces: &'a [String],
    /// Where it is (`rules.yaml:12`, `postgres rule gold`), for the error.
    pub origin: &'a str,
}

impl<'a> From<&'a super::Rule> for Replacing<'a> {
    fn from(rule: &'a super::Rule) -> Self {
        Replacing {
            id: &rule.id,
            domain: &rule.domain,
            replaces: &rule.replaces,
            origin: &rule.origin,
        }
    }
}

/// Every rule a rule replaces is a rule of its domain, and no rules replace each other in a
/// circle. The first problem found, in the order of `rules`.
pub fn check_replaces(rules: &[Replacing<'_>]) -> Result<(), CompileError> {
    let by_id: HashMap<&str, &Replacing<'_>> = rules.iter().map(|r| (r.id, r)).collect();
    for rule in rules {
        for target in rule.replaces {
            if by_id
                .get(target.as_str())
                .is_none_or(|t| t.domain != rule.domain)
            {
                return Err(CompileError::UnknownReplace {
                    origin: rule.origin.to_owned(),
                    id: rule.id.to_owned(),
                    target: target.clone(),
                    domain: rule.domain.to_owned(),
                });
            }
        }
    }
    // A depth-first walk from each rule, in order; a rule met again on its own path closes a
    // circle.
    let mut done = HashSet::new();
    for rule in rules {
        let mut path = vec![];
        if let Some(cycle) = circle_from(rule.id, &by_id, &mut path, &mut done) {
            let origin = by_id[cycle[0].as_str()].origin.to_owned();
            return Err(CompileError::ReplaceCycle { origin, cycle });
        }
    }
    Ok(())
}

fn circle_from<'a>(
    id: &'a str,
    by_id: &HashMap<&'a str, &'a Replacing<'a>>,
    path: &mut Vec<&'a str>,
    done: &mut HashSet<&'a str>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|p| *p == id) {
        let mut cycle: Vec<String> = path[at..].iter().map(|s| (*s).to_owned()).collect();
        cycle.push(id.to_owned());
        return Some(cycle);
    }
    if done.contains(id) {
        return None;
    }
    path.push(id);
    for target in by_id[id].replaces {
        if let Some(cycle) = circle_from(target.as_str(), by_id, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(id);
    None
}
