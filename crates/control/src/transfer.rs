//! `tollgate rules import` and `export`: rule sets between files (Tollgate's format and
//! envoyproxy/ratelimit's YAML) and PostgreSQL. Every file is validated before anything is
//! written; an invalid file writes nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::store::{ControlError, RuleStore, Written};
use tollgate_node::rules::native::{RuleDoc, RulesFile};
use tollgate_node::rules::source::{self, RulesError};

/// What a transfer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Tollgate rules written (or exported).
    pub rules: usize,
    /// envoyproxy/ratelimit domains written (or exported).
    pub envoy_domains: usize,
    /// Rules deleted because the import did not name them (`--prune`).
    pub pruned: usize,
    /// Of those imported, the rules and domains that changed (the rest were already exactly
    /// as written: no new version, history entry or revision).
    pub changed: usize,
    /// Stored rules whose mode the import changed: id, mode before, mode after.
    pub modes_changed: Vec<(String, String, String)>,
    /// Imported rules a mode override holds in another mode than the file's: id, the
    /// override's mode, the file's. The override stands (import never lifts one).
    pub held_by_override: Vec<(String, String, String)>,
    /// Override files among those given, which import does not write (overrides are set
    /// through the admin API, or read by nodes from their rule files).
    pub override_files: Vec<PathBuf>,
}

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// A file is invalid.
    #[error("{0}")]
    Rules(#[from] RulesError),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] ControlError),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

enum Document {
    Overrides(PathBuf),
    Rules {
        docs: Vec<RuleDoc>,
        domain: Option<String>,
    },
    Envoy {
        domain: String,
        config: serde_json::Value,
    },
}

fn read(file: &Path) -> Result<Document, TransferError> {
    let io = |e: std::io::Error| RulesError {
        file: file.to_owned(),
        line: None,
        message: e.to_string(),
    };
    let text = std::fs::read_to_string(file).map_err(io)?;
    // Validate first, with errors naming the file, line and field.
    let loaded = source::parse(&text, file)?;
    if !loaded.overrides.is_empty() {
        return Ok(Document::Overrides(file.to_owned()));
    }
    let yaml_error = |e: yaml_serde::Error| RulesError {
        file: file.to_owned(),
        line: None,
        message: e.to_string(),
    };
    if let Some(envoy) = loaded.envoy.first() {
        let value: yaml_serde::Value = yaml_serde::from_str(&text).map_err(yaml_error)?;
        let config = serde_json::to_value(value).map_err(|e| RulesError {
            file: file.to_owned(),
            line: None,
            message: e.to_string(),
        })?;
        return Ok(Document::Envoy {
            domain: envoy.domain.clone(),
            config,
        });
    }
    let parsed: RulesFile = yaml_serde::from_str(&text).map_err(yaml_error)?;
    Ok(Document::Rules {
        docs: parsed.rules,
        domain: parsed.domain,
    })
}

/// Imports every file under `paths`: rules are created or replaced (their history names
/// `actor`); envoyproxy/ratelimit domains likewise. With `prune`, rules the files do not name
/// are deleted. A rule's mode is the file's, but a mode override (the kill switch) stands: the
/// summary names every stored rule whose mode the import changed, and every rule an override
/// still holds in another mode.
pub async fn import(
    store: &RuleStore,
    paths: &[PathBuf],
    actor: &str,
    prune: bool,
    default_domain: &str,
) -> Result<Summary, TransferError> {
    let mut documents = vec![];
    for path in paths {
        for file in source::rule_files(path)? {
            documents.push(read(&file)?);
        }
    }
    store.migrate().await?;
    let mut summary = Summary::default();
    let mut named = BTreeSet::new();
    let overrides: std::collections::HashMap<String, String> = store
        .mode_overrides()
        .await?
        .into_iter()
        .map(|o| (o.rule_id, o.mode))
        .collect();
    let mut rules = vec![];
    for document in documents {
        match document {
            Document::Overrides(file) => summary.override_files.push(file),
            Document::Rules { docs, domain } => {
                for mut doc in docs {
                    if doc.domain.is_none() {
                        doc.domain = domain.clone();
                    }
                    rules.push(doc);
                }
            }
            Document::Envoy { domain, config } => {
                let changed = store.put_envoy_domain(&domain, &config, actor).await?;
                summary.changed += usize::from(changed);
                summary.envoy_domains += 1;
            }
        }
    }
    for doc in replaced_first(rules) {
        let id = doc.id.clone().unwrap_or_default();
        let put = store
            .put(&id, doc, None, actor, Some(default_domain))
            .await?;
        let after = put.rule.doc.mode.unwrap_or_default();
        if let Some(before) = put.previous_mode
            && before != after
        {
            summary
                .modes_changed
                .push((id.clone(), before, after.clone()));
        }
        if let Some(held) = overrides.get(&id)
            && *held != after
        {
            summary
                .held_by_override
                .push((id.clone(), held.clone(), after));
        }
        summary.changed += usize::from(put.written != Written::Unchanged);
        named.insert(id);
        summary.rules += 1;
    }
    if prune {
        // A rule another replaces cannot go before it (409): the rest first, then again,
        // until a round deletes nothing more.
        let mut left: Vec<String> = store
            .rule_ids()
            .await?
            .into_iter()
            .filter(|id| !named.contains(id))
            .collect();
        while !left.is_empty() {
            let round = left.len();
            let mut kept = vec![];
            let mut last = None;
            for id in left {
                match store.delete(&id, None, actor).await {
                    Ok(()) => summary.pruned += 1,
                    Err(e @ ControlError::Conflict(_)) => {
                        last = Some(e);
                        kept.push(id);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(e) = last
                && kept.len() == round
            {
                return Err(e.into());
            }
            left = kept;
        }
    }
    Ok(summary)
}

/// The rules in their order, except that a rule comes after the rules it replaces that the
/// import also writes: each write is checked against the set before it (a rule replacing one
/// not written yet would be refused).
fn replaced_first(rules: Vec<RuleDoc>) -> Vec<RuleDoc> {
    let index: std::collections::HashMap<String, usize> = rules
        .iter()
        .enumerate()
        .filter_map(|(i, doc)| Some((doc.id.clone()?, i)))
        .collect();
    let mut placed = vec![false; rules.len()];
    let mut order = Vec::with_capacity(rules.len());
    fn place(
        i: usize,
        rules: &[RuleDoc],
        index: &std::collections::HashMap<String, usize>,
        placed: &mut [bool],
        order: &mut Vec<usize>,
    ) {
        if placed[i] {
            return;
        }
        // Placed before its walk: a circle (which the store refuses, naming it) ends here.
        placed[i] = true;
        for target in &rules[i].replaces {
            if let Some(&j) = index.get(target) {
                place(j, rules, index, placed, order);
            }
        }
        order.push(i);
    }
    for i in 0..rules.len() {
        place(i, &rules, &index, &mut placed, &mut order);
    }
    let mut slots: Vec<Option<RuleDoc>> = rules.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// Writes the store's rules to `out/rules.yaml` (Tollgate's format) and each envoyproxy/
/// ratelimit domain to `out/envoy-<domain>.yaml`.
pub async fn export(store: &RuleStore, out: &Path) -> Result<Summary, TransferError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| TransferError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let snapshot = store.snapshot().await?;
    let file = RulesFile {
        domain: None,
        rules: snapshot.rules.clone(),
    };
    let path = out.join("rules.yaml");
    let text = yaml_serde::to_string(&file).map_err(|e| TransferError::Io {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(
        &path,
        format!(
            "# Exported by tollgate rules export (revision {}).\n{text}",
            snapshot.revision
        ),
    )
    .map_err(io(&path))?;
    for config in &snapshot.envoy {
        let domain = config
            .get("domain")
            .and_then(|d| d.as_str())
            .unwrap_or("unnamed");
        let safe: String = domain
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = out.join(format!("envoy-{safe}.yaml"));
        let text = yaml_serde::to_string(config).map_err(|e| TransferError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(&path, text).map_err(io(&path))?;
    }
    Ok(Summary {
        rules: snapshot.rules.len(),
        envoy_domains: snapshot.envoy.len(),
        ..Summary::default()
    })
}
