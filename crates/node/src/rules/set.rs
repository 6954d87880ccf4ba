//! The compiled rule set: every rule of every domain, indexed for matching, swapped atomically
//! as a whole (a request never sees half of an old set and half of a new one).

use std::collections::HashMap as StdHashMap;

/// Rule lookups on the decision path hash descriptor keys and values: a fast hasher. (Rule sets
/// are written by operators, not by clients, so hash flooding is not a concern.)
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{Limit, LimitSpec};
use tollgate_regionsync::policy::{RegionView, place, scale};
use tollgate_regionsync::{Placement, RegionalPolicy, Role};

use crate::metrics::{Metrics, RuleCounters, RuleLabels};
use crate::rules::envoy::{NodeLimit, ValidNode};
use crate::rules::model::{DEFAULT_IDENTITY_KEYS, FailMode, Identity, Mode, Pattern, Rule};

/// What a compiled rule does to a matching request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RuleKind {
    /// Limited by the store.
    Limited(Limit),
    /// Never limited (envoyproxy/ratelimit `unlimited: true`).
    Unlimited,
    /// Always denied (envoyproxy/ratelimit `requests_per_unit: 0`), with its window.
    Block(Duration),
}

/// A rule ready for the decision path.
#[derive(Debug)]
pub struct CompiledRule {
    /// Changes whenever anything about the rule changes; keys the node's per-bucket state.
    pub uid: u64,
    /// The rule id (the rule part of its Redis keys).
    pub id: String,
    /// Its domain.
    pub domain: String,
    /// The policy name in headers.
    pub name: String,
    /// What it does.
    pub kind: RuleKind,
    /// ENFORCE or SHADOW (DISABLED rules are not compiled).
    pub mode: Mode,
    /// What happens when the store fails.
    pub fail_mode: FailMode,
    /// Names of limits this one replaces in a request (envoyproxy/ratelimit `replaces`).
    pub replaces: Vec<String>,
    /// The name `replaces` refers to (envoyproxy/ratelimit `rate_limit.name`).
    pub replace_name: Option<String>,
    /// Decision counters.
    pub counters: RuleCounters,
    /// Where it was defined.
    pub origin: String,
    /// Where its limit is held across regions, at what share (the limit above is scaled).
    pub placement: Placement,
}

impl CompiledRule {
    /// Whether its consumption is shipped to the peer region (ASYNC_SYNC).
    pub fn synced(&self) -> bool {
        self.placement.role == Role::Synced
    }

    /// Whether the peer region decides it (a HOME_REGION rule homed there).
    pub fn forwarded(&self) -> bool {
        matches!(self.placement.role, Role::Forwarded { .. })
    }

    /// The limit, for rules the store decides.
    pub fn limit(&self) -> Option<Limit> {
        match self.kind {
            RuleKind::Limited(l) => Some(l),
            _ => None,
        }
    }

    /// A rule made at request time (an Envoy descriptor's `limit` override).
    pub fn dynamic(domain: &str, id: String, limit: Limit, counters: RuleCounters) -> Self {
        CompiledRule {
            uid: uid_of(&(&id, domain, format!("{limit:?}"))),
            name: id.clone(),
            id,
            domain: domain.to_owned(),
            kind: RuleKind::Limited(limit),
            mode: Mode::Enforce,
            fail_mode: FailMode::Open,
            replaces: vec![],
            replace_name: None,
            counters,
            origin: "request override".into(),
            placement: Placement::LOCAL,
        }
    }
}

fn uid_of(value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

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
    by_id: HashMap<String, Arc<CompiledRule>>,
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
}

impl RuleSet {
    /// Compiles validated rules into a set for a single region. DISABLED rules are left out
    /// (the kill switch).
    pub fn compile(
        native: &[Rule],
        envoy: &[EnvoyDomainConfig],
        version: u64,
        metrics: &Metrics,
    ) -> Result<Self, String> {
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
    ) -> Result<Self, String> {
        let mut set = RuleSet {
            version,
            ..RuleSet::default()
        };
        let mut ids: HashMap<&str, &str> = HashMap::default();
        for rule in native {
            if let Some(first) = ids.insert(&rule.id, &rule.origin) {
                return Err(format!(
                    "{}: duplicate rule id {:?} (first defined at {first})",
                    rule.origin, rule.id
                ));
            }
            if rule.mode == Mode::Disabled {
                continue;
            }
            let placement = place(&rule.regional, view);
            let limit = scale(rule.limit, placement.share);
            let compiled = Arc::new(CompiledRule {
                uid: uid_of(&(
                    &rule.id,
                    &rule.domain,
                    &rule.name,
                    format!("{limit:?} {placement:?}"),
                    rule.mode,
                    rule.fail_mode,
                    &rule.matches,
                    &rule.identity,
                )),
                id: rule.id.clone(),
                domain: rule.domain.clone(),
                name: rule.name.clone(),
                kind: RuleKind::Limited(limit),
                placement,
                mode: rule.mode,
                fail_mode: rule.fail_mode,
                replaces: vec![],
                replace_name: None,
                counters: metrics.rule_counters(&RuleLabels {
                    domain: rule.domain.clone(),
                    rule: rule.id.clone(),
                }),
                origin: rule.origin.clone(),
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
                identity: rule.identity.clone(),
            });
        }
        for config in envoy {
            let domain = set.domains.entry(config.domain.clone()).or_default();
            if domain.envoy.is_some() {
                return Err(format!(
                    "{}: domain {:?} is configured twice",
                    config.origin, config.domain
                ));
            }
            let mut tree = EnvoyDomain::default();
            let mut rules = vec![];
            tree.root = compile_level(
                &config.nodes,
                &config.domain,
                &config.origin,
                metrics,
                &mut tree.nodes,
                &mut rules,
                view,
            );
            domain.envoy = Some(tree);
            set.rules.extend(rules);
        }
        set.by_id = set
            .rules
            .iter()
            .map(|r| (r.id.clone(), r.clone()))
            .collect();
        Ok(set)
    }

    /// The rule with this id (envoyproxy/ratelimit limits are named by their descriptor path).
    pub fn rule(&self, id: &str) -> Option<&Arc<CompiledRule>> {
        self.by_id.get(id)
    }

    /// The set's version (increases with every successful reload).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every compiled rule.
    pub fn rules(&self) -> &[Arc<CompiledRule>] {
        &self.rules
    }

    /// Whether any rule applies to `domain`.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Tollgate's own rules that match a request's attributes: every rule whose match keys
    /// are all present with matching values, and whose identity keys are present. The
    /// attributes are one or more descriptors' entries, seen as one set (no copy is made).
    pub fn match_native(
        &self,
        domain: &str,
        attributes: &[&[(String, String)]],
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
            if all_match && let Some(identity) = identity_of(&rule.identity, attributes) {
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

fn compile_level(
    nodes: &[ValidNode],
    domain: &str,
    origin: &str,
    metrics: &Metrics,
    arena: &mut Vec<EnvoyNode>,
    rules: &mut Vec<Arc<CompiledRule>>,
    view: Option<&RegionView>,
) -> EnvoyLevel {
    // envoyproxy/ratelimit configurations name no regional policy: the default (SPLIT).
    let placement = place(&RegionalPolicy::default(), view);
    let mut level = EnvoyLevel::default();
    for node in nodes {
        let rule = node.limit.as_ref().map(|limit| {
            let (kind, name, replaces) = match limit {
                NodeLimit::Unlimited => (RuleKind::Unlimited, None, vec![]),
                NodeLimit::Limited {
                    requests: 0,
                    unit,
                    name,
                    replaces,
                } => (RuleKind::Block(*unit), name.clone(), replaces.clone()),
                NodeLimit::Limited {
                    requests,
                    unit,
                    name,
                    replaces,
                } => {
                    let spec = LimitSpec::FixedWindow {
                        limit: f64::from(*requests),
                        window: *unit,
                    };
                    // Validated: at least 1 request per a whole-second unit.
                    let limit = spec.validate().map_or(RuleKind::Block(*unit), |l| {
                        RuleKind::Limited(scale(l, placement.share))
                    });
                    (limit, name.clone(), replaces.clone())
                }
            };
            let id = node.path.clone();
            let compiled = Arc::new(CompiledRule {
                uid: uid_of(&(
                    &id,
                    domain,
                    format!("{kind:?}"),
                    &name,
                    &replaces,
                    node.shadow,
                    node.share_threshold,
                    format!("{placement:?}"),
                )),
                placement: placement.clone(),
                name: name.clone().unwrap_or_else(|| id.clone()),
                domain: domain.to_owned(),
                kind,
                mode: if node.shadow {
                    Mode::Shadow
                } else {
                    Mode::Enforce
                },
                fail_mode: FailMode::Open,
                replaces,
                replace_name: name,
                counters: metrics.rule_counters(&RuleLabels {
                    domain: domain.to_owned(),
                    rule: id.clone(),
                }),
                origin: origin.to_owned(),
                id,
            });
            rules.push(compiled.clone());
            compiled
        });
        let children = compile_level(&node.children, domain, origin, metrics, arena, rules, view);
        let index = arena.len();
        arena.push(EnvoyNode {
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
    level
}

/// Length-prefixed pieces: injective whatever bytes the pieces hold.
fn push_piece(out: &mut Vec<u8>, piece: &str) {
    out.extend_from_slice(piece.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(piece.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::envoy::EnvoyConfig;
    use crate::rules::native::RulesFile;

    fn native(yaml: &str) -> Vec<Rule> {
        let file: RulesFile = yaml_serde::from_str(yaml).expect("yaml");
        file.rules
            .iter()
            .map(|d| {
                d.validate(file.domain.as_deref(), "test".into())
                    .expect("valid")
            })
            .collect()
    }

    fn envoy(yaml: &str) -> EnvoyDomainConfig {
        let config: EnvoyConfig = yaml_serde::from_str(yaml).expect("yaml");
        EnvoyDomainConfig {
            domain: config.domain.clone(),
            nodes: config.validate().expect("valid"),
            origin: "test".into(),
        }
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn matched(set: &RuleSet, domain: &str, pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut out = vec![];
        set.match_native(domain, &[&entries(pairs)], &mut out);
        out.into_iter()
            .map(|m| {
                (
                    m.rule.id.clone(),
                    String::from_utf8_lossy(&m.identity).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn native_rules_match_on_every_key_and_key_by_identity() {
        let rules = native(
            "domain: public-api\nrules:\n\
             - {id: gold-orders, match: {plan: gold, route: POST /orders}, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 10}\n\
             - {id: per-ip, match: {ip: '*'}, algorithm: SLIDING_WINDOW, limit: 60, window: 1m}\n\
             - {id: off, match: {plan: gold}, algorithm: FIXED_WINDOW, limit: 1, window: 1s, mode: DISABLED}\n\
             - {id: global-route, match: {route: 'GET /*'}, per: [], algorithm: FIXED_WINDOW, limit: 1000, window: 1s}\n",
        );
        let set = RuleSet::compile(&rules, &[], 1, &Metrics::new()).expect("compiles");
        assert_eq!(set.rules().len(), 3, "the DISABLED rule is not compiled");
        assert_eq!(
            matched(
                &set,
                "public-api",
                &[
                    ("api_key", "k_123"),
                    ("plan", "gold"),
                    ("route", "POST /orders"),
                    ("ip", "1.2.3.4")
                ]
            ),
            vec![
                ("gold-orders".into(), "api_key=k_123".into()),
                ("per-ip".into(), "1.2.3.4".into())
            ]
        );
        assert_eq!(
            matched(
                &set,
                "public-api",
                &[("plan", "gold"), ("route", "POST /orders")]
            ),
            vec![("gold-orders".into(), "".into())]
        );
        assert_eq!(
            matched(&set, "public-api", &[("route", "GET /x")]),
            vec![("global-route".into(), "".into())]
        );
        assert!(
            matched(
                &set,
                "public-api",
                &[("plan", "silver"), ("route", "POST /orders")]
            )
            .is_empty()
        );
        assert!(matched(&set, "other", &[("ip", "1.2.3.4")]).is_empty());
    }

    #[test]
    fn duplicate_ids_are_refused() {
        let rules = native(
            "domain: d\nrules:\n- {id: a, algorithm: FIXED_WINDOW, limit: 1, window: 1s}\n- {id: a, algorithm: FIXED_WINDOW, limit: 2, window: 1s}\n",
        );
        assert!(
            RuleSet::compile(&rules, &[], 1, &Metrics::new())
                .expect_err("duplicate")
                .contains("duplicate rule id")
        );
    }

    #[test]
    fn envoy_precedence_is_exact_then_wildcard_then_key_only_at_full_depth() {
        let set = RuleSet::compile(
            &[],
            &[envoy(
                "domain: rl\ndescriptors:\n\
                 - key: path\n  value: /api/orders\n  rate_limit: {unit: second, requests_per_unit: 1}\n\
                 - key: path\n  value: /api/*\n  rate_limit: {unit: second, requests_per_unit: 2}\n\
                 - key: path\n  rate_limit: {unit: second, requests_per_unit: 3}\n  descriptors:\n\
                 \x20   - key: user\n      rate_limit: {unit: minute, requests_per_unit: 4}\n\
                 - key: shared\n  value: 'x*'\n  share_threshold: true\n  rate_limit: {unit: second, requests_per_unit: 5}\n\
                 - key: nolimit\n  descriptors:\n    - key: sub\n      rate_limit: {unit: second, requests_per_unit: 6}\n",
            )],
            1,
            &Metrics::new(),
        )
        .expect("compiles");
        let hit = |pairs: &[(&str, &str)]| {
            set.match_envoy("rl", &entries(pairs))
                .map(|m| m.rule.limit().map(|l| l.capacity()))
        };
        assert_eq!(hit(&[("path", "/api/orders")]), Some(Some(1)));
        assert_eq!(hit(&[("path", "/api/users")]), Some(Some(2)));
        assert_eq!(hit(&[("path", "/other")]), Some(Some(3)));
        assert_eq!(hit(&[("path", "/other"), ("user", "u1")]), Some(Some(4)));
        assert_eq!(
            hit(&[("nolimit", "a")]),
            None,
            "a limit applies only at full depth"
        );
        assert_eq!(hit(&[("nolimit", "a"), ("sub", "b")]), Some(Some(6)));
        assert_eq!(hit(&[("path", "/api/orders"), ("user", "u1")]), None);
        let a = set
            .match_envoy("rl", &entries(&[("shared", "x1")]))
            .expect("match")
            .identity;
        let b = set
            .match_envoy("rl", &entries(&[("shared", "x2")]))
            .expect("match")
            .identity;
        assert_eq!(
            a, b,
            "share_threshold: one counter for every value matching the wildcard"
        );
        let c = set
            .match_envoy("rl", &entries(&[("path", "/x")]))
            .expect("match")
            .identity;
        let d = set
            .match_envoy("rl", &entries(&[("path", "/y")]))
            .expect("match")
            .identity;
        assert_ne!(c, d, "key only: one counter per value");
    }

    #[test]
    fn identities_are_injective() {
        let keys = Identity::Keys(vec!["a".into(), "b".into()]);
        let x = identity_of(&keys, &[&entries(&[("a", "1:2"), ("b", "3")])]);
        let y = identity_of(&keys, &[&entries(&[("a", "1"), ("b", "2:3")])]);
        assert_ne!(x, y);
    }
}
