//! What a scenario says that it may not mean, found before it runs:
//!
//! - a traffic stream none of whose requests matches a rule (a typo in a domain or a
//!   descriptor key makes a rule vanish from the table);
//! - a placeholder other than `{key}` in a descriptor (`{ky}` would be one literal key);
//! - in two regions, a rule split between them (SPLIT, the default) whose per-region share is
//!   below what one client of a stream sends: that client is denied in its region while
//!   within the whole limit (a 5/min login rule becomes 2.5/min per region).
//!
//! The first two are warnings, errors under `--strict`; the third is a note in the report.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tollgate_lease::{MemoryStore, SharedClock, Store, TokioClock};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::{Node, RuntimeConfig};
use tollgate_regionsync::policy::{PeerState, RegionView};
use tollgate_regionsync::{RegionConfig, Role};

use crate::run::RunError;
use crate::scenario::{Keys, Scenario};

/// What kind of finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A stream matches no rule (a warning; an error under `--strict`).
    Unmatched,
    /// A placeholder names no field (a warning; an error under `--strict`).
    Placeholder,
    /// A split rule's per-region share is below one client's rate (a note).
    SmallSplit,
}

/// One finding, with the field it is about.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Its kind.
    pub kind: FindingKind,
    /// The scenario field (`traffic[0].descriptors[1].route`).
    pub field: String,
    /// What it means, in a sentence.
    pub message: String,
}

impl Finding {
    /// Whether `--strict` refuses the scenario for it.
    pub fn is_warning(&self) -> bool {
        self.kind != FindingKind::SmallSplit
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.field, self.message)
    }
}

/// Every finding about `scenario`, in the order of its fields.
pub fn lint(scenario: &Scenario) -> Result<Vec<Finding>, RunError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    runtime.block_on(findings(scenario))
}

/// [`lint`], on the caller's runtime (a run's report carries them).
pub(crate) async fn findings(scenario: &Scenario) -> Result<Vec<Finding>, RunError> {
    let mut out = placeholders(scenario);
    out.extend(against_rules(scenario).await?);
    Ok(out)
}

/// `{...}` in a descriptor that is not `{key}`.
fn placeholders(scenario: &Scenario) -> Vec<Finding> {
    let mut out = vec![];
    for (i, t) in scenario.traffic.iter().enumerate() {
        for (j, d) in t.descriptors.iter().enumerate() {
            for (k, v) in d {
                for text in [k, v] {
                    let mut rest = text.as_str();
                    while let Some(open) = rest.find('{') {
                        let Some(close) = rest[open..].find('}') else {
                            break;
                        };
                        let name = &rest[open..open + close + 1];
                        if name != "{key}" {
                            out.push(Finding {
                                kind: FindingKind::Placeholder,
                                field: format!("traffic[{i}].descriptors[{j}].{k}"),
                                message: format!(
                                    "{name} is not a placeholder (only {{key}} is replaced): every \
                                     request of {:?} sends it as written",
                                    t.name
                                ),
                            });
                        }
                        rest = &rest[open + close + 1..];
                    }
                }
            }
        }
    }
    out
}

/// Streams that match no rule, and rules split below a client's rate.
async fn against_rules(scenario: &Scenario) -> Result<Vec<Finding>, RunError> {
    let metrics = Metrics::new();
    let loaded = crate::run::load_rules(&scenario.rules, "<scenario rules>")?;
    let rules = ActiveRules::new(metrics.clone());
    rules
        .install(&loaded)
        .map_err(|e| RunError::Rules(e.to_string()))?;
    if let [own, peer] = &scenario.topology.regions[..] {
        let config = RegionConfig::new(&own.name, &peer.name, "http://peer", "lint");
        rules
            .set_region_view(Some(RegionView {
                own: own.name.clone(),
                peer: peer.name.clone(),
                default_share: config.default_share,
                peer_state: PeerState::Up,
            }))
            .map_err(|e| RunError::Rules(e.to_string()))?;
    }
    let clock: SharedClock = Arc::new(TokioClock::new());
    let node = Node::start(
        Store::Memory(MemoryStore::with_clock(clock.clone(), Default::default())),
        rules,
        RuntimeConfig::default(),
        clock,
        metrics,
        Duration::from_millis(5),
    )
    .await
    .map_err(|e| RunError::Node {
        node: "lint".into(),
        reason: e.to_string(),
    })?;
    let two_regions = scenario.topology.regions.len() == 2;
    let mut out = vec![];
    for (i, t) in scenario.traffic.iter().enumerate() {
        let request = crate::run::stream_request(t, 0);
        let charges = match node.charges(&request) {
            Ok(charges) => charges,
            Err(e) => {
                out.push(Finding {
                    kind: FindingKind::Unmatched,
                    field: format!("traffic[{i}]"),
                    message: format!("its requests are refused: {e}"),
                });
                continue;
            }
        };
        if charges.is_empty() {
            out.push(Finding {
                kind: FindingKind::Unmatched,
                field: format!("traffic[{i}]"),
                message: format!(
                    "no rule matches {:?} (domain {:?}): its requests are admitted unlimited and \
                     no rule of the table counts them",
                    t.name, t.domain
                ),
            });
            continue;
        }
        let Some(client_rate) = busiest_client_rate(t).filter(|_| two_regions) else {
            continue;
        };
        for charge in charges {
            let rule = &charge.rule;
            let (Some(whole), Some(here)) = (rule.whole, rule.limit()) else {
                continue;
            };
            let share = rule.placement.share;
            if rule.placement.role != Role::Local || share >= 1.0 {
                continue;
            }
            let (Some(whole_rate), Some(share_rate)) =
                (whole.average_per_second(), here.average_per_second())
            else {
                continue;
            };
            if client_rate > share_rate && client_rate <= whole_rate * 1.000_001 {
                out.push(Finding {
                    kind: FindingKind::SmallSplit,
                    field: format!("traffic[{i}]"),
                    message: format!(
                        "rule {:?} is split between the two regions (SPLIT): each holds {:.0} % \
                         of it, {share_rate:.3}/s, while the busiest client of {:?} sends \
                         {client_rate:.3}/s, within the whole limit ({whole_rate:.3}/s): it is \
                         denied in its region. `regional: {{policy: ASYNC_SYNC}}` or \
                         HOME_REGION hold the whole limit for it",
                        rule.id,
                        share * 100.0,
                        t.name
                    ),
                });
            }
        }
    }
    node.crash();
    Ok(out)
}

/// Requests per second the stream's busiest key sends (None when every request is a new
/// key: no client repeats).
fn busiest_client_rate(t: &crate::scenario::Traffic) -> Option<f64> {
    let rate = t.ramp_to.unwrap_or(t.rate).max(t.rate);
    match t.keys {
        Keys::Hot => Some(rate),
        Keys::Uniform { n } => Some(rate / n as f64),
        Keys::Zipf { n, s } => {
            // The first key's share: 1 / H(n, s), the tail summed to a million keys.
            let h: f64 = (1..=n.min(1_000_000)).map(|k| (k as f64).powf(-s)).sum();
            Some(rate / h)
        }
        Keys::New => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(traffic: &str, regions: &str, rules: &str) -> Scenario {
        let text = format!(
            "name: t\nduration: 2s\ntopology: {{regions: [{regions}]}}\nrules: |\n{rules}traffic: [{traffic}]\n"
        );
        Scenario::parse(&text, "t.yaml").expect("parses")
    }

    const LOGIN: &str = "  domain: auth\n  rules:\n    - {id: login, match: {route: login}, per: [ip], algorithm: FIXED_WINDOW, limit: 5, window: 1m}\n";

    #[test]
    fn a_stream_no_rule_matches_and_a_placeholder_typo_are_found() {
        let s = scenario(
            "{name: typo, domain: auth, rate: 1, descriptors: [{route: login, ip: '{ky}'}]}, {name: other, domain: authn, rate: 1, descriptors: [{route: login, ip: '{key}'}]}",
            "{name: eu, nodes: 1}",
            LOGIN,
        );
        let findings = lint(&s).expect("lint");
        let kinds: Vec<(FindingKind, &str)> = findings
            .iter()
            .map(|f| (f.kind, f.field.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (FindingKind::Placeholder, "traffic[0].descriptors[0].ip"),
                (FindingKind::Unmatched, "traffic[1]"),
            ],
            "{findings:?}"
        );
        assert!(findings[0].message.contains("{ky}"), "{}", findings[0]);
    }

    #[test]
    fn a_small_limit_split_below_one_clients_rate_is_noted() {
        // 5/min split in two: 2.5/min per region; one client sends 4/min.
        let traffic = "{name: logins, domain: auth, rate: 0.0667, descriptors: [{route: login, ip: '{key}'}]}";
        let two = "{name: us, nodes: 1}, {name: eu, nodes: 1}";
        let findings = lint(&scenario(traffic, two, LOGIN)).expect("lint");
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].kind, FindingKind::SmallSplit);
        assert!(findings[0].message.contains("login"), "{}", findings[0]);
        // One region: nothing is split.
        let one = lint(&scenario(traffic, "{name: eu, nodes: 1}", LOGIN)).expect("lint");
        assert!(one.is_empty(), "{one:?}");
        // ASYNC_SYNC holds the whole limit in each region.
        let synced = LOGIN.replace("window: 1m}", "window: 1m, regional: {policy: ASYNC_SYNC}}");
        let synced = lint(&scenario(traffic, two, &synced)).expect("lint");
        assert!(synced.is_empty(), "{synced:?}");
    }
}
