//! The compiled rule set: every rule of every domain, indexed for matching, swapped atomically
//! as a whole (a request never sees half of an old set and half of a new one).

use std::collections::{BTreeMap, HashMap as StdHashMap};

/// Rule lookups on the decision path hash descriptor keys and values: a fast hasher. (Rule sets
/// are written by operators, not by clients, so hash flooding is not a concern.)
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

use tollgate_lease::LimitSpec;
use tollgate_regionsync::policy::{RegionView, place, scale};
use tollgate_regionsync::{Placement, RegionalPolicy};

use crate::metrics::{Metrics, RuleLabels};
pub use crate::rules::compiled::{CompiledRule, RuleKind, override_identity, override_labels};
use crate::rules::compiled::{push_piece, uid_of};
use crate::rules::envoy::{NodeLimit, ValidNode};
use crate::rules::errors::{CompileError, FailModesError};
use crate::rules::model::{DEFAULT_IDENTITY_KEYS, FailMode, Identity, Mode, Pattern, Rule};
use crate::rules::replaces::{Replacing, check_replaces};

/// A rule that matched a request: which rule, and the identity its counter is keyed by.
#[derive(Debug, Clone)]
pub struct Matched {
    /// The rule.
    pub rule: Arc<CompiledRule>,
    /// The identity (hash tag) of its bucket.
    pub identity: Vec<u8>,
}

#[derive(Debug)]
struct NativeRule {
    compiled: Arc<CompiledRule>,
    matches: Vec<(String, Pattern)>,
    /// Keys none of the request's descriptors may hold.
    without: Vec<String>,
    identity: Identity,
}

#[derive(Debug, Default)]
struct NativeDomain {
    rules: Vec<NativeRule>,
    /// Rules with at least one exact entry, by one of them: candidates for a request are the
    /// rules anchored by one of its entries, plus the unanchored ones.
    anchored: HashMap<String, HashMap<String, Vec<usize>>>,
    unanchored: Vec<usize>,
}

#[derive(Debug, Default)]
struct EnvoyLevel {
    exact: HashMap<String, HashMap<String, usize>>,
    wildcards: Vec<(String, String, usize)>,
    key_only: HashMap<String, usize>,
}

#[derive(Debug)]
struct EnvoyNode {
    rule: Option<Arc<CompiledRule>>,
    share_pattern: Option<String>,
    children: EnvoyLevel,
}

#[derive(Debug, Default)]
struct EnvoyDomain {
    nodes: Vec<EnvoyNode>,
    root: EnvoyLevel,
}

#[derive(Debug, Default)]
struct DomainRules {
    native: NativeDomain,
    envoy: Option<EnvoyDomain>,
}

/// Every active rule, compiled.
#[derive(Debug, Default)]
pub struct RuleSet {
    version: u64,
    domains: HashMap<String, DomainRules>,
    rules: Vec<Arc<CompiledRule>>,
    by_key: HashMap<String, Arc<CompiledRule>>,
}

/// An envoyproxy/ratelimit domain, validated.
#[derive(Debug, Clone)]
pub struct EnvoyDomainConfig {
    /// The domain.
    pub domain: String,
    /// Its tree.
    pub nodes: Vec<ValidNode>,
    /// Where it was defined.
    pub origin: String,
    /// What its rules do when the store cannot answer (the format has no field for it: set
    /// per domain by [`EnvoyFailModes`]).
    pub fail_mode: FailMode,
}

/// The fail mode of domains in envoyproxy/ratelimit's format, which has no field for one (and
/// whose own service refuses unknown keys): per domain, else a default, OPEN unless set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyFailModes {
    default: FailMode,
    domains: BTreeMap<String, FailMode>,
}

impl Default for EnvoyFailModes {
    fn default() -> Self {
        Self {
            default: FailMode::Open,
            domains: BTreeMap::new(),
        }
    }
}

impl EnvoyFailModes {
    /// Reads `CLOSED` (every domain), `public-api=CLOSED,edge=LOCAL` (those domains, the rest
    /// OPEN) or both (`LOCAL,edge=OPEN`); modes in any case.
    pub fn parse(text: &str) -> Result<Self, FailModesError> {
        let mut modes = EnvoyFailModes::default();
        let mut default_seen = false;
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('=') {
                Some((domain, mode)) => {
                    let domain = domain.trim();
                    if domain.is_empty() {
                        return Err(FailModesError::NoDomain {
                            item: item.to_owned(),
                        });
                    }
                    let mode = mode.trim().parse()?;
                    if modes.domains.insert(domain.to_owned(), mode).is_some() {
                        return Err(FailModesError::DomainTwice {
                            domain: domain.to_owned(),
                        });
                    }
                }
                None if default_seen => {
                    return Err(FailModesError::SecondDefault {
                        item: item.to_owned(),
                    });
                }
                None => {
                    modes.default = item.parse()?;
                    default_seen = true;
                }
            }
        }
        Ok(modes)
    }

    /// The fail mode of `domain`'s rules.
    pub fn of(&self, domain: &str) -> FailMode {
        self.domains.get(domain).copied().unwrap_or(self.default)
    }
}

impl RuleSet {
    /// Compiles validated rules into a set for a single region. DISABLED rules are left out
    /// (the kill switch).
    pub fn compile(
        native: &[Rule],
        envoy: &[EnvoyDomainConfig],
        version: u64,
        metrics: &Metrics,
    ) -> Result<Self, CompileError> {
        Self::compile_for(native, envoy, version, metrics, None)
    }

    /// Compiles validated rules into a set for a node that sees the regions as `view`: each
    /// rule's limit is scaled to this region's share under its regional policy.
    pub fn compile_for(
        native: &[Rule],
        envoy: &[EnvoyDomainConfig],
        version: u64,
        metrics: &Metrics,
        view: Option<&RegionView>,
    ) -> Result<Self, CompileError> {
        let mut set = RuleSet {
            version,
            ..RuleSet::default()
        };
        let mut ids: HashMap<&str, &str> = HashMap::default();
        for rule in native {
            if let Some(first) = ids.insert(&rule.id, &rule.origin) {
                return Err(CompileError::DuplicateId {
                    origin: rule.origin.clone(),
                    id: rule.id.clone(),
                    first: first.to_owned(),
                });
            }
        }
        check_replaces(&native.iter().map(Replacing::from).collect::<Vec<_>>())?;
        // Each rule's uid first: a rule's `replaces` names others by their uids.
        let uids: HashMap<&str, u64> = native
            .iter()
            .filter(|r| r.mode != Mode::Disabled)
            .map(|rule| {
                let placement = place(&rule.regional, view);
                (rule.id.as_str(), native_uid(rule, &placement))
            })
            .collect();
        for rule in native {
            if rule.mode == Mode::Disabled {
                continue;
            }
            let placement = place(&rule.regional, view);
            let limit = scale(rule.limit, placement.share);
            let compiled = Arc::new(CompiledRule {
                uid: uids[rule.id.as_str()],
                id: rule.id.clone(),
                key: rule.id.clone(),
                domain: rule.domain.clone(),
                name: rule.name.clone(),
                kind: RuleKind::Limited(limit),
                whole: Some(rule.limit),
                placement,
                mode: rule.mode,
                fail_mode: rule.fail_mode,
                replaces: vec![],
                replace_name: None,
                // A DISABLED rule it names matches nothing: nothing to leave out.
                replaces_rules: rule
                    .replaces
                    .iter()
                    .filter_map(|id| uids.get(id.as_str()).copied())
                    .collect(),
                counters: metrics.rule_counters(&RuleLabels {
                    domain: rule.domain.clone(),
                    rule: rule.id.clone(),
                }),
                origin: rule.origin.clone(),
                penalty: rule.penalty,
                header_text: std::sync::OnceLock::new(),
            });
            set.rules.push(compiled.clone());
            let domain = &mut set.domains.entry(rule.domain.clone()).or_default().native;
            let index = domain.rules.len();
            match rule.matches.iter().find_map(|(k, p)| match p {
                Pattern::Exact(v) => Some((k.clone(), v.clone())),
                _ => None,
            }) {
                Some((k, v)) => domain
                    .anchored
                    .entry(k)
                    .or_default()
                    .entry(v)
                    .or_default()
                    .push(index),
                None => domain.unanchored.push(index),
            }
            domain.rules.push(NativeRule {
                compiled,
                matches: rule.matches.clone(),
                without: rule.without.clone(),
                identity: rule.identity.clone(),
            });
        }
        for config in envoy {
            let domain = set.domains.entry(config.domain.clone()).or_default();
            if domain.envoy.is_some() {
                return Err(CompileError::DomainTwice {
                    origin: config.origin.clone(),
                    domain: config.domain.clone(),
                });
            }
            let mut compiler = EnvoyCompiler {
                domain: &config.domain,
                origin: &config.origin,
                metrics,
                // envoyproxy/ratelimit configurations name no regional policy: the default.
                placement: place(&RegionalPolicy::default(), view),
                fail_mode: config.fail_mode,
                nodes: vec![],
                rules: vec![],
            };
            let mut root_key = b"envoy:".to_vec();
            push_piece(&mut root_key, &config.domain);
            let root_key = String::from_utf8(root_key).map_err(|_| CompileError::KeyNotUtf8)?;
            let root = compiler.level(&config.nodes, &root_key)?;
            domain.envoy = Some(EnvoyDomain {
                nodes: compiler.nodes,
                root,
            });
            set.rules.extend(compiler.rules);
        }
        set.by_key = set
            .rules
            .iter()
            .map(|r| (r.key.clone(), r.clone()))
            .collect();
        Ok(set)
    }

    /// The rule whose counters are keyed by `key` ([`CompiledRule::key`]).
    pub fn rule(&self, key: &str) -> Option<&Arc<CompiledRule>> {
        self.by_key.get(key)
    }

    /// The set's version (increases with every successful reload).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Publishes the regional share of every rule held at less than its whole limit.
    pub fn publish_shares(&self, metrics: &Metrics) {
        metrics.region.share_permille.clear();
        for rule in self.rules() {
            if rule.placement.share < 1.0 {
                metrics
                    .region
                    .share_permille
                    .get_or_create(&tollgate_regionsync::metrics::RuleLabel {
                        rule: rule.id.clone(),
                    })
                    .set((rule.placement.share * 1000.0).round() as i64);
            }
        }
    }

    /// Every compiled rule.
    pub fn rules(&self) -> &[Arc<CompiledRule>] {
        &self.rules
    }

    /// The domains its rules apply to.
    pub fn domain_names(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Whether any rule applies to `domain`.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Tollgate's own rules that match a request's attributes: every rule whose match keys
    /// are all present with matching values, and whose identity keys are present. The
    /// attributes are one or more descriptors' entries, seen as one set (no copy is made).
    /// A rule's `without` keys must be in none of `request`'s descriptors: the whole request's,
    /// even where the attributes are one descriptor of it (a login descriptor `{route, ip}`
    /// of a request that also sent `{api_key}` is not anonymous).
    pub fn match_native(
        &self,
        domain: &str,
        attributes: &[&[(String, String)]],
        request: &[&[(String, String)]],
        out: &mut Vec<Matched>,
    ) {
        let Some(rules) = self.domains.get(domain) else {
            return;
        };
        let native = &rules.native;
        let all = || attributes.iter().flat_map(|entries| entries.iter());
        let mut consider = |index: usize| {
            let rule = &native.rules[index];
            let all_match = rule
                .matches
                .iter()
                .all(|(key, pattern)| all().any(|(k, v)| k == key && pattern.matches(v)));
            let in_request =
                |key: &String| request.iter().flat_map(|d| d.iter()).any(|(k, _)| k == key);
            if all_match
                && !rule.without.iter().any(in_request)
                && let Some(identity) = identity_of(&rule.identity, attributes)
            {
                out.push(Matched {
                    rule: rule.compiled.clone(),
                    identity,
                });
            }
        };
        for (k, v) in all() {
            if let Some(indices) = native
                .anchored
                .get(k.as_str())
                .and_then(|by_value| by_value.get(v.as_str()))
            {
                for &i in indices {
                    consider(i);
                }
            }
        }
        for &i in &native.unanchored {
            consider(i);
        }
    }

    /// The envoyproxy/ratelimit limit that matches one descriptor, walked level by level:
    /// `key=value`, else the level's wildcards in order, else the key alone. A limit applies
    /// only at the descriptor's full depth.
    pub fn match_envoy(&self, domain: &str, entries: &[(String, String)]) -> Option<Matched> {
        let tree = self.domains.get(domain)?.envoy.as_ref()?;
        let mut level = &tree.root;
        let mut node = None;
        let mut identity = Vec::new();
        for (key, value) in entries {
            let found = level
                .exact
                .get(key.as_str())
                .and_then(|by_value| by_value.get(value.as_str()))
                .or_else(|| {
                    level
                        .wildcards
                        .iter()
                        .find(|(k, p, _)| {
                            k == key && crate::rules::model::wildcard_matches(p, value)
                        })
                        .map(|(_, _, n)| n)
                })
                .or_else(|| level.key_only.get(key))?;
            let n = &tree.nodes[*found];
            let shown = n.share_pattern.as_deref().unwrap_or(value);
            push_piece(&mut identity, key);
            push_piece(&mut identity, shown);
            level = &n.children;
            node = Some(n);
        }
        let rule = node?.rule.clone()?;
        Some(Matched { rule, identity })
    }
}

/// Compiles one envoyproxy/ratelimit domain's tree into `nodes` (the arena) and `rules`.
struct EnvoyCompiler<'a> {
    domain: &'a str,
    origin: &'a str,
    metrics: &'a Metrics,
    placement: Placement,
    fail_mode: FailMode,
    nodes: Vec<EnvoyNode>,
    rules: Vec<Arc<CompiledRule>>,
}

impl EnvoyCompiler<'_> {
    /// One level of the tree; `parent_key` is the counter key of the path above it.
    fn level(&mut self, nodes: &[ValidNode], parent_key: &str) -> Result<EnvoyLevel, CompileError> {
        let mut level = EnvoyLevel::default();
        for node in nodes {
            // The counter key: `envoy:` and the domain, then each entry's key and value as
            // length-prefixed pieces (a dotted path is ambiguous; these are not).
            let mut key = parent_key.as_bytes().to_vec();
            push_piece(&mut key, &node.key);
            match &node.value {
                Some(v) => {
                    key.push(b'=');
                    push_piece(&mut key, v);
                }
                None => key.push(b'.'),
            }
            let key = String::from_utf8(key).map_err(|_| CompileError::KeyNotUtf8)?;
            let rule = match &node.limit {
                Some(limit) => Some(self.rule(node, limit, &key)?),
                None => None,
            };
            let children = self.level(&node.children, &key)?;
            let index = self.nodes.len();
            self.nodes.push(EnvoyNode {
                rule,
                share_pattern: if node.share_threshold {
                    node.value.clone()
                } else {
                    None
                },
                children,
            });
            match &node.value {
                None => {
                    level.key_only.insert(node.key.clone(), index);
                }
                Some(v) if v.contains('*') => {
                    level.wildcards.push((node.key.clone(), v.clone(), index))
                }
                Some(v) => {
                    level
                        .exact
                        .entry(node.key.clone())
                        .or_default()
                        .insert(v.clone(), index);
                }
            }
        }
        Ok(level)
    }

    fn rule(
        &mut self,
        node: &ValidNode,
        limit: &NodeLimit,
        key: &str,
    ) -> Result<Arc<CompiledRule>, CompileError> {
        let (kind, whole, name, replaces) = match limit {
            NodeLimit::Unlimited => (RuleKind::Unlimited, None, None, vec![]),
            NodeLimit::Limited {
                requests: 0,
                unit,
                name,
                replaces,
            } => (RuleKind::Block(*unit), None, name.clone(), replaces.clone()),
            NodeLimit::Limited {
                requests,
                unit,
                name,
                replaces,
            } => {
                let limit = LimitSpec::FixedWindow {
                    limit: f64::from(*requests),
                    window: *unit,
                }
                .validate()
                .map_err(|e| CompileError::LimitUnheld {
                    origin: self.origin.to_owned(),
                    path: node.path.clone(),
                    reason: e.to_string(),
                })?;
                (
                    RuleKind::Limited(scale(limit, self.placement.share)),
                    Some(limit),
                    name.clone(),
                    replaces.clone(),
                )
            }
        };
        if key.len() > tollgate_lease::key::MAX_RULE_BYTES {
            return Err(CompileError::PathTooLong {
                origin: self.origin.to_owned(),
                path: node.path.clone(),
                bytes: key.len(),
                most: tollgate_lease::key::MAX_RULE_BYTES,
            });
        }
        let id = node.path.clone();
        let compiled = Arc::new(CompiledRule {
            uid: uid_of(&(
                key,
                format!("{kind:?}"),
                &name,
                &replaces,
                node.shadow,
                node.share_threshold,
                format!("{:?}", self.placement),
                self.fail_mode,
                node.penalty,
            )),
            placement: self.placement.clone(),
            name: name.clone().unwrap_or_else(|| id.clone()),
            domain: self.domain.to_owned(),
            key: key.to_owned(),
            kind,
            whole,
            mode: if node.shadow {
                Mode::Shadow
            } else {
                Mode::Enforce
            },
            fail_mode: self.fail_mode,
            replaces,
            replace_name: name,
            replaces_rules: vec![],
            counters: self.metrics.rule_counters(&RuleLabels {
                domain: self.domain.to_owned(),
                rule: id.clone(),
            }),
            origin: self.origin.to_owned(),
            id,
            penalty: node.penalty,
            header_text: std::sync::OnceLock::new(),
        });
        self.rules.push(compiled.clone());
        Ok(compiled)
    }
}

/// The identity a rule keys its counter by, or `None` if a key it needs is absent.
fn identity_of(identity: &Identity, attributes: &[&[(String, String)]]) -> Option<Vec<u8>> {
    let value_of = |key: &str| {
        attributes
            .iter()
            .flat_map(|e| e.iter())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    match identity {
        Identity::Keys(keys) if keys.len() == 1 => {
            value_of(&keys[0]).map(|v| v.as_bytes().to_vec())
        }
        Identity::Keys(keys) => {
            let mut out = Vec::new();
            for key in keys {
                push_piece(&mut out, value_of(key)?);
            }
            Some(out)
        }
        Identity::Default => Some(
            DEFAULT_IDENTITY_KEYS
                .iter()
                .find_map(|k| value_of(k).map(|v| format!("{k}={v}").into_bytes()))
                .unwrap_or_default(),
        ),
    }
}

/// A Tollgate rule's uid: it changes whenever anything about the rule changes.
fn native_uid(rule: &Rule, placement: &Placement) -> u64 {
    let limit = scale(rule.limit, placement.share);
    uid_of(&(
        &rule.id,
        &rule.domain,
        &rule.name,
        format!("{limit:?} {placement:?}"),
        rule.mode,
        rule.fail_mode,
        &rule.matches,
        &rule.identity,
        rule.penalty,
    ))
}

#[cfg(test)]
mod tests;
