//! Tollgate's own rule format: one document per rule (also the admin API's body), and a file
//! holding a list of them.
//!
//! ```yaml
//! domain: public-api            # default domain for the rules below
//! rules:
//!   - id: gold-orders-create    # [A-Za-z0-9._-], up to 64 characters
//!     name: gold-orders         # policy name in RateLimit headers (default: the id)
//!     match:                    # every key must be present; "*" = any value, own counter
//!       plan: gold
//!       route: POST /orders
//!     per: [api_key]            # keys whose values key the counters (default: the "*"
//!                               # keys, else the first present of api_key, user, ip)
//!     algorithm: TOKEN_BUCKET   # or SLIDING_WINDOW, SLIDING_WINDOW_LOG, FIXED_WINDOW, CONCURRENCY
//!     capacity: 100             # TOKEN_BUCKET: capacity + refillPerSecond
//!     refillPerSecond: 10       # windows: limit + window ("30s", "5m", "1d" or seconds)
//!     mode: ENFORCE             # ENFORCE (default), SHADOW, DISABLED
//!     failMode: OPEN            # OPEN (default), CLOSED, LOCAL
//!     penalty:                  # optional: after 10 denials within 1m, block for 15m
//!       {after: 10, within: 1m, block: 15m}
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tollgate_lease::{Algorithm, InvalidInput, LimitSpec, Penalty};
use tollgate_regionsync::RegionalDoc;

use crate::rules::errors::ValueError;
use crate::rules::model::{Identity, Pattern, Rule, parse_duration};

/// A duration as written: `"30s"` or a number of seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DurationValue {
    /// A number of seconds.
    Seconds(f64),
    /// `500ms`, `30s`, `5m`, `1h`, `1d`, `1w`.
    Text(String),
}

impl DurationValue {
    fn parse(&self) -> Result<Duration, ValueError> {
        match self {
            DurationValue::Seconds(s) if s.is_finite() && *s > 0.0 && *s <= 1e10 => {
                Ok(Duration::from_secs_f64(*s))
            }
            DurationValue::Seconds(s) => Err(ValueError::NotPositive {
                text: s.to_string(),
                what: "number of seconds",
            }),
            DurationValue::Text(t) => parse_duration(t),
        }
    }
}

/// One rule as written in a file or an admin request. Unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleDoc {
    /// Unique id (in a file; the admin API takes it from the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Domain (defaults to the file's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Policy name in headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Descriptor entries to match: key → value, `*` or a wildcard.
    #[serde(rename = "match", default)]
    pub matches: BTreeMap<String, String>,
    /// Keys whose values key the counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<Vec<String>>,
    /// `TOKEN_BUCKET`, `GCRA`, `LEAKY_BUCKET`, `SLIDING_WINDOW`, `SLIDING_WINDOW_LOG`,
    /// `FIXED_WINDOW`, `CONCURRENCY`.
    #[serde(default)]
    pub algorithm: String,
    /// TOKEN_BUCKET: burst size.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole"
    )]
    pub capacity: Option<f64>,
    /// TOKEN_BUCKET: sustained rate.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole"
    )]
    pub refill_per_second: Option<f64>,
    /// GCRA: units admitted at once from rest. LEAKY_BUCKET: slots in the bucket (default:
    /// `limit`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole"
    )]
    pub burst: Option<f64>,
    /// GCRA: sustained rate (one unit every `1 / ratePerSecond` s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<f64>,
    /// Windows: units per window. LEAKY_BUCKET: hits that leak out every `duration`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole"
    )]
    pub limit: Option<f64>,
    /// Windows: window length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationValue>,
    /// LEAKY_BUCKET: the period `limit` leaks over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<DurationValue>,
    /// CONCURRENCY: slots.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole"
    )]
    pub max_in_flight: Option<f64>,
    /// CONCURRENCY: how long an unreleased slot lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_ttl: Option<DurationValue>,
    /// ENFORCE (default), SHADOW, DISABLED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// OPEN (default), CLOSED, LOCAL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_mode: Option<String>,
    /// How the limit is held across two regions (default: SPLIT with the node's shares).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regional: Option<RegionalDoc>,
    /// The penalty box: after `after` denials within `within`, block for `block`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub penalty: Option<PenaltyDoc>,
    /// Rules of its domain (by id) it takes the place of in a request that matches both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
    /// Keys that must be in none of the request's descriptors (`[api_key]`: only a request
    /// without an API key matches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub without: Vec<String>,
}

/// A rule's penalty as written: `{after: 10, within: 1m, block: 15m}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PenaltyDoc {
    /// Denials that start a block.
    pub after: u64,
    /// The window they are counted in (it opens at the first denial).
    pub within: DurationValue,
    /// How long a block lasts.
    pub block: DurationValue,
}

impl PenaltyDoc {
    /// Validates it for a rule of `algorithm`; the error names the field (`penalty.after`...).
    pub fn validate(&self, algorithm: Algorithm) -> Result<Penalty, FieldError> {
        if algorithm == Algorithm::Concurrency {
            return Err(field_error(
                "penalty",
                "does not apply to CONCURRENCY (a denied slot says nothing about abuse)",
            ));
        }
        let within = self
            .within
            .parse()
            .map_err(|e| field_error("penalty.within", e.to_string()))?;
        let block = self
            .block
            .parse()
            .map_err(|e| field_error("penalty.block", e.to_string()))?;
        Penalty::new(self.after, within, block).map_err(|e| match e {
            InvalidInput::BadPenalty { field, reason } => {
                field_error(format!("penalty.{field}"), reason)
            }
            other => field_error("penalty", other.to_string()),
        })
    }

    /// The document of a validated penalty.
    pub fn from_penalty(p: &Penalty) -> Self {
        Self {
            after: p.after(),
            within: DurationValue::Text(format_duration(p.within())),
            block: DurationValue::Text(format_duration(p.block())),
        }
    }
}

/// Writes whole numbers as integers (`100`, not `100.0`).
fn whole<S: serde::Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) if v.fract() == 0.0 && v.abs() < 9e15 => s.serialize_some(&(*v as i64)),
        Some(v) => s.serialize_some(v),
        None => s.serialize_none(),
    }
}

/// A rule field that is missing or wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct FieldError {
    /// The field as written (`capacity`, `match.route`, ...).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn field_error(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The path of the first string (key or value) in `value` holding a NUL, if any.
fn nul_field(value: &serde_json::Value, path: String) -> Option<String> {
    let at = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        serde_json::Value::String(s) if s.contains('\0') => {
            Some(if path.is_empty() { "body".into() } else { path })
        }
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| nul_field(v, format!("{path}[{i}]"))),
        serde_json::Value::Object(fields) => fields.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                Some(at(k))
            } else {
                nul_field(v, at(k))
            }
        }),
        _ => None,
    }
}

/// Checks a rule id: 1 to 64 characters of `[A-Za-z0-9._-]`.
pub fn validate_id(id: &str) -> Result<(), FieldError> {
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(field_error(
            "id",
            format!("{id:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ -"),
        ));
    }
    Ok(())
}

impl RuleDoc {
    /// The document a rule was made from (for export and the admin API).
    pub fn from_rule(rule: &Rule) -> Self {
        let secs = |d: Duration| DurationValue::Text(format_duration(d));
        let mut doc = RuleDoc {
            id: Some(rule.id.clone()),
            domain: Some(rule.domain.clone()),
            name: (rule.name != rule.id).then(|| rule.name.clone()),
            matches: rule
                .matches
                .iter()
                .map(|(k, p)| {
                    let text = match p {
                        Pattern::Exact(v) | Pattern::Wildcard(v) => v.clone(),
                        Pattern::Any => "*".into(),
                    };
                    (k.clone(), text)
                })
                .collect(),
            per: match &rule.identity {
                Identity::Keys(keys) => Some(keys.clone()),
                Identity::Default => None,
            },
            algorithm: rule.limit.algorithm().to_string(),
            mode: Some(rule.mode.to_string()),
            fail_mode: Some(rule.fail_mode.to_string()),
            regional: (rule.regional != tollgate_regionsync::RegionalPolicy::default())
                .then(|| rule.regional.to_doc()),
            penalty: rule.penalty.as_ref().map(PenaltyDoc::from_penalty),
            replaces: rule.replaces.clone(),
            without: rule.without.clone(),
            ..RuleDoc::default()
        };
        match rule.limit.spec() {
            LimitSpec::TokenBucket {
                capacity,
                refill_per_second,
            } => {
                doc.capacity = Some(capacity);
                doc.refill_per_second = Some(refill_per_second);
            }
            LimitSpec::Gcra {
                burst,
                rate_per_second,
            } => {
                doc.burst = Some(burst);
                doc.rate_per_second = Some(rate_per_second);
            }
            LimitSpec::LeakyBucket {
                limit,
                duration,
                burst,
            } => {
                doc.limit = Some(limit);
                doc.duration = Some(secs(duration));
                // The burst is written only when it is not the default.
                doc.burst = burst.filter(|b| *b != limit);
            }
            LimitSpec::Concurrency {
                max_in_flight,
                slot_ttl,
            } => {
                doc.max_in_flight = Some(max_in_flight);
                doc.slot_ttl = Some(secs(slot_ttl));
            }
            LimitSpec::FixedWindow { limit, window }
            | LimitSpec::SlidingWindow { limit, window }
            | LimitSpec::SlidingWindowLog { limit, window } => {
                doc.limit = Some(limit);
                doc.window = Some(secs(window));
            }
        }
        doc
    }
}

/// Writes a duration in the largest unit that divides it (`90s`, `5m`, `1d`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("w", 604_800_000u128),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Every field of a rule as written (camelCase), in the order of [`RuleDoc`].
pub const RULE_FIELDS: &[&str] = &[
    "id",
    "domain",
    "name",
    "match",
    "per",
    "algorithm",
    "capacity",
    "refillPerSecond",
    "burst",
    "ratePerSecond",
    "limit",
    "window",
    "duration",
    "maxInFlight",
    "slotTtl",
    "mode",
    "failMode",
    "regional",
    "penalty",
    "replaces",
    "without",
];

/// A rules file in Tollgate's format.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesFile {
    /// The default domain of the rules below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The rules.
    #[serde(default)]
    pub rules: Vec<RuleDoc>,
}

mod validate;

#[cfg(test)]
mod tests;
