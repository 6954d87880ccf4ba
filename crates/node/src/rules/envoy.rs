//! envoyproxy/ratelimit's YAML configuration, so its users can move over unchanged.
//!
//! ```yaml
//! domain: rl
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: "/api/*"
//!     rate_limit: { unit: minute, requests_per_unit: 100, name: api }
//!     descriptors:
//!       - key: user
//!         rate_limit: { unit: hour, requests_per_unit: 1000, replaces: [{ name: api }] }
//! ```
//!
//! Semantics follow envoyproxy/ratelimit: at each level the entry `key=value` is looked up
//! exactly, then the level's wildcard values in order, then the key alone (which gives each
//! value its own counter); a limit applies only at the request descriptor's full depth; limits
//! are fixed windows of one unit (month = 30 days, year = 365 days); `unlimited` never touches
//! the store; `shadow_mode` never blocks; `replaces` drops the named limits from the request;
//! `share_threshold` makes all values matching a wildcard share one counter;
//! `requests_per_unit: 0` denies everything. `detailed_metric`, `value_to_metric` and
//! `metadata` are accepted and have no effect (Tollgate's metrics are per rule). `quota_mode` is
//! refused: Tollgate does not implement it.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use crate::rules::errors::EnvoyConfigError;

/// One configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyConfig {
    /// The domain, unique across files.
    pub domain: String,
    /// The descriptor tree.
    #[serde(default)]
    pub descriptors: Vec<EnvoyDescriptor>,
}

/// One node of the descriptor tree.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyDescriptor {
    /// The entry's key.
    pub key: String,
    /// The entry's value; absent matches any value (own counter per value); may hold `*`.
    #[serde(default)]
    pub value: Option<String>,
    /// The limit at this depth.
    #[serde(default)]
    pub rate_limit: Option<EnvoyRateLimit>,
    /// Tollgate's extension: the penalty box for the limit at this depth
    /// (`{after: 10, within: 1m, block: 15m}`). envoyproxy/ratelimit itself refuses the key.
    #[serde(default)]
    pub penalty: Option<crate::rules::native::PenaltyDoc>,
    /// Count but never block.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Not supported (refused).
    #[serde(default)]
    pub quota_mode: bool,
    /// Accepted, no effect.
    #[serde(default)]
    pub detailed_metric: bool,
    /// Accepted, no effect.
    #[serde(default)]
    pub value_to_metric: bool,
    /// All values matching this wildcard share one counter.
    #[serde(default)]
    pub share_threshold: bool,
    /// Accepted, no effect.
    #[serde(default)]
    pub metadata: Option<yaml_serde::Value>,
    /// Children.
    #[serde(default)]
    pub descriptors: Vec<EnvoyDescriptor>,
}

/// A limit in envoyproxy/ratelimit form.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyRateLimit {
    /// second, minute, hour, day, week, month, year (any case).
    #[serde(default)]
    pub unit: Option<String>,
    /// Requests per unit; 0 denies everything.
    #[serde(default)]
    pub requests_per_unit: Option<u32>,
    /// Never limited; must not have a unit.
    #[serde(default)]
    pub unlimited: bool,
    /// Name (the target of `replaces`, and the policy name in headers).
    #[serde(default)]
    pub name: Option<String>,
    /// Limits this one replaces when both match a request.
    #[serde(default)]
    pub replaces: Vec<EnvoyReplace>,
}

/// `replaces: [{ name: ... }]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyReplace {
    /// The replaced limit's name.
    pub name: String,
}

/// The length of a unit, as envoyproxy/ratelimit divides time.
pub fn unit_duration(unit: &str) -> Option<Duration> {
    let secs = match unit.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3600,
        "day" => 86_400,
        "week" => 604_800,
        "month" => 2_592_000,
        "year" => 31_536_000,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// What a tree node limits.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeLimit {
    /// `requests_per_unit` per `unit`.
    Limited {
        /// Requests per window.
        requests: u32,
        /// The window.
        unit: Duration,
        /// `name`, if given.
        name: Option<String>,
        /// Names this limit replaces.
        replaces: Vec<String>,
    },
    /// `unlimited: true`.
    Unlimited,
}

/// A validated node of the tree, ready to compile.
#[derive(Debug, Clone)]
pub struct ValidNode {
    /// Entry key.
    pub key: String,
    /// Entry value (None: key only).
    pub value: Option<String>,
    /// The limit at this depth.
    pub limit: Option<NodeLimit>,
    /// Its penalty box.
    pub penalty: Option<tollgate_lease::Penalty>,
    /// Shadow mode.
    pub shadow: bool,
    /// Wildcard values share one counter.
    pub share_threshold: bool,
    /// `domain.key_value.key...`, unique within the domain.
    pub path: String,
    /// Children.
    pub children: Vec<ValidNode>,
}

impl EnvoyConfig {
    /// Validates the tree as envoyproxy/ratelimit does, naming the path of any error.
    pub fn validate(&self) -> Result<Vec<ValidNode>, EnvoyConfigError> {
        if self.domain.is_empty() {
            return Err(EnvoyConfigError::at("", "`domain` must not be empty"));
        }
        validate_level(&self.descriptors, &self.domain, "descriptors")
    }
}

fn validate_level(
    level: &[EnvoyDescriptor],
    parent: &str,
    at: &str,
) -> Result<Vec<ValidNode>, EnvoyConfigError> {
    let mut seen = HashMap::new();
    let mut out = Vec::with_capacity(level.len());
    for (i, d) in level.iter().enumerate() {
        let here = format!("{at}[{i}]");
        if d.key.is_empty() {
            return Err(EnvoyConfigError::at(here, "`key` must not be empty"));
        }
        let composite = match &d.value {
            Some(v) => format!("{}_{v}", d.key),
            None => d.key.clone(),
        };
        if let Some(first) = seen.insert(composite.clone(), i) {
            return Err(EnvoyConfigError::at(
                here,
                format!("duplicate descriptor {composite:?} (also at {at}[{first}])"),
            ));
        }
        if d.quota_mode {
            return Err(EnvoyConfigError::at(
                here,
                "`quota_mode` is not supported by Tollgate",
            ));
        }
        if d.share_threshold && !d.value.as_deref().is_some_and(|v| v.contains('*')) {
            return Err(EnvoyConfigError::at(
                here,
                "`share_threshold` needs a wildcard `*` in `value`",
            ));
        }
        let limit = match &d.rate_limit {
            None => None,
            Some(rl) => Some(validate_limit(rl, &format!("{here}.rate_limit"))?),
        };
        let penalty = match (&d.penalty, &limit) {
            (None, _) => None,
            (Some(p), Some(NodeLimit::Limited { requests, .. })) if *requests > 0 => Some(
                p.validate(tollgate_lease::Algorithm::FixedWindow)
                    .map_err(|e| EnvoyConfigError::at(format!("{here}.{}", e.field), e.reason))?,
            ),
            (Some(_), _) => {
                return Err(EnvoyConfigError::at(
                    format!("{here}.penalty"),
                    "needs a `rate_limit` with `requests_per_unit` above 0 at the same \
                     descriptor",
                ));
            }
        };
        let path = format!("{parent}.{composite}");
        let children = validate_level(&d.descriptors, &path, &format!("{here}.descriptors"))?;
        out.push(ValidNode {
            key: d.key.clone(),
            value: d.value.clone(),
            limit,
            penalty,
            shadow: d.shadow_mode,
            share_threshold: d.share_threshold,
            path,
            children,
        });
    }
    Ok(out)
}

/// A descriptor's `rate_limit`, at `here` in the file.
fn validate_limit(rl: &EnvoyRateLimit, here: &str) -> Result<NodeLimit, EnvoyConfigError> {
    let wrong = |reason: String| EnvoyConfigError::at(here, reason);
    for r in &rl.replaces {
        if r.name.is_empty() {
            return Err(wrong("`replaces` names must not be empty".into()));
        }
    }
    if rl.unlimited {
        if rl.unit.is_some() {
            return Err(wrong(
                "`unlimited` must not be set together with `unit`".into(),
            ));
        }
        return Ok(NodeLimit::Unlimited);
    }
    let unit_name = rl
        .unit
        .as_deref()
        .ok_or_else(|| wrong("`unit` is required".into()))?;
    let unit = unit_duration(unit_name).ok_or_else(|| {
        wrong(format!(
            "invalid `unit` {unit_name:?}; expected second, minute, hour, day, week, month or year"
        ))
    })?;
    let requests = rl
        .requests_per_unit
        .ok_or_else(|| wrong("`requests_per_unit` is required".into()))?;
    Ok(NodeLimit::Limited {
        requests,
        unit,
        name: rl.name.clone(),
        replaces: rl.replaces.iter().map(|r| r.name.clone()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree of `yaml`, which parses; the error as the operator reads it.
    fn validate(yaml: &str) -> Result<Vec<ValidNode>, EnvoyConfigError> {
        yaml_serde::from_str::<EnvoyConfig>(yaml)
            .expect("parses")
            .validate()
    }

    #[test]
    fn the_readme_examples_validate() {
        let nodes = validate(
            "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n  - key: database\n    value: default\n    rate_limit:\n      unit: SECOND\n      requests_per_unit: 500\n",
        )
        .expect("valid");
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].path, "mongo_cps.database_users");
    }

    #[test]
    fn config_errors_are_those_of_envoyproxy_ratelimit() {
        // As the operator reads it (a field the format does not have fails to parse).
        let err = |yaml: &str| match yaml_serde::from_str::<EnvoyConfig>(yaml) {
            Ok(config) => config.validate().expect_err("invalid").to_string(),
            Err(e) => e.to_string(),
        };
        let duplicate =
            validate("domain: d\ndescriptors:\n  - key: a\n  - key: a\n").expect_err("duplicate");
        assert_eq!(duplicate.at, "descriptors[1]", "{duplicate}");
        assert!(err("domain: d\ndescriptors:\n  - key: a\n  - key: a\n").contains("duplicate"));
        assert!(err("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").contains("unit"));
        assert!(err("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unlimited: true}\n").contains("unlimited"));
        assert!(err("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n").contains("replaces"));
        assert!(
            err("domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n")
                .contains("wildcard")
        );
        assert!(
            err("domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n")
                .contains("quota_mode")
        );
        assert!(err("domain: d\ndescriptors:\n  - key: a\n    colour: blue\n").contains("colour"));
    }

    #[test]
    fn a_penalty_sits_beside_a_limit() {
        let nodes = validate("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    penalty: {after: 10, within: 1m, block: 15m}\n")
            .expect("valid");
        assert_eq!(nodes[0].penalty.map(|p| p.after()), Some(10));
        // As the operator reads it (a field the format does not have fails to parse).
        let err = |yaml: &str| match yaml_serde::from_str::<EnvoyConfig>(yaml) {
            Ok(config) => config.validate().expect_err("invalid").to_string(),
            Err(e) => e.to_string(),
        };
        let duplicate =
            validate("domain: d\ndescriptors:\n  - key: a\n  - key: a\n").expect_err("duplicate");
        assert_eq!(duplicate.at, "descriptors[1]", "{duplicate}");
        let alone = err(
            "domain: d\ndescriptors:\n  - key: ip\n    penalty: {after: 10, within: 1m, block: 15m}\n",
        );
        assert!(
            alone.contains("descriptors[0].penalty") && alone.contains("rate_limit"),
            "{alone}"
        );
        let bad = err(
            "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5}\n    penalty: {after: 0, within: 1m, block: 15m}\n",
        );
        assert!(bad.contains("penalty.after"), "{bad}");
    }
}
