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
use crate::rules::model::{FailMode, Identity, Mode, Pattern, Rule, parse_duration};

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
    /// Validates the document into a rule. `default_domain` applies when it names none. The
    /// first error ([`RuleDoc::validate_all`] gives every one).
    pub fn validate(
        &self,
        default_domain: Option<&str>,
        origin: String,
    ) -> Result<Rule, FieldError> {
        self.validate_all(default_domain, origin)
            .map_err(|mut errors| errors.swap_remove(0))
    }

    /// Validates the document into a rule, or says every field at fault (each field on its
    /// own: a bad `capacity` and a bad `mode` are two errors, in the order of the fields).
    pub fn validate_all(
        &self,
        default_domain: Option<&str>,
        origin: String,
    ) -> Result<Rule, Vec<FieldError>> {
        // PostgreSQL stores no NUL in text or JSONB: refuse it here, naming the field, rather
        // than as a database error.
        if let Some(field) = serde_json::to_value(self)
            .ok()
            .and_then(|v| nul_field(&v, String::new()))
        {
            return Err(vec![field_error(field, "must not contain a NUL character")]);
        }
        let mut errors = vec![];
        fn keep<T>(errors: &mut Vec<FieldError>, result: Result<T, FieldError>) -> Option<T> {
            result.map_err(|e| errors.push(e)).ok()
        }
        let id = keep(
            &mut errors,
            self.id
                .clone()
                .ok_or_else(|| field_error("id", "is required"))
                .and_then(|id| validate_id(&id).map(|()| id)),
        );
        let domain = keep(
            &mut errors,
            self.domain
                .clone()
                .or_else(|| default_domain.map(str::to_owned))
                .ok_or_else(|| {
                    field_error(
                        "domain",
                        "is required (on the rule or at the top of the file)",
                    )
                })
                .and_then(|domain| {
                    if domain.is_empty() || domain.len() > 64 {
                        Err(field_error("domain", "must be 1 to 64 characters"))
                    } else {
                        Ok(domain)
                    }
                }),
        );
        let matches = keep(
            &mut errors,
            self.matches
                .iter()
                .map(|(key, value)| {
                    if key.is_empty() {
                        Err(field_error("match", "keys must not be empty"))
                    } else {
                        Ok((key.clone(), Pattern::parse(value)))
                    }
                })
                .collect::<Result<Vec<_>, _>>(),
        );
        let identity = keep(
            &mut errors,
            match &self.per {
                Some(keys) => match keys.iter().find(|k| k.is_empty()) {
                    Some(bad) => Err(field_error(
                        "per",
                        format!("keys must not be empty, got {bad:?}"),
                    )),
                    None => Ok(Identity::Keys(keys.clone())),
                },
                None => {
                    let keyed: Vec<String> = matches
                        .iter()
                        .flatten()
                        .filter(|(_, p)| p.keys_counter())
                        .map(|(k, _)| k.clone())
                        .collect();
                    Ok(if keyed.is_empty() {
                        Identity::Default
                    } else {
                        Identity::Keys(keyed)
                    })
                }
            },
        );
        let algorithm: Option<Algorithm> = keep(
            &mut errors,
            if self.algorithm.is_empty() {
                Err(field_error("algorithm", "is required"))
            } else {
                self.algorithm
                    .parse()
                    .map_err(|e: tollgate_lease::LimitError| field_error("algorithm", e.reason))
            },
        );
        // The limit's fields and the regional policy are read for an algorithm.
        let limit = algorithm.and_then(|algorithm| {
            keep(
                &mut errors,
                self.limit_spec(algorithm)
                    .and_then(|spec| spec.validate().map_err(|e| field_error(e.field, e.reason))),
            )
        });
        let mode = keep(
            &mut errors,
            match &self.mode {
                Some(m) => m
                    .parse()
                    .map_err(|e: ValueError| field_error("mode", e.to_string())),
                None => Ok(Mode::Enforce),
            },
        );
        let fail_mode = keep(
            &mut errors,
            match &self.fail_mode {
                Some(m) => m
                    .parse()
                    .map_err(|e: ValueError| field_error("failMode", e.to_string())),
                None => Ok(FailMode::Open),
            },
        );
        let regional = algorithm.and_then(|algorithm| {
            keep(
                &mut errors,
                match &self.regional {
                    Some(doc) => doc
                        .validate(algorithm)
                        .map_err(|e| field_error(e.field, e.reason)),
                    None => Ok(Default::default()),
                },
            )
        });
        let penalty = match (&self.penalty, algorithm) {
            (None, _) => Some(None),
            (Some(doc), Some(algorithm)) => keep(&mut errors, doc.validate(algorithm).map(Some)),
            (Some(_), None) => None,
        };
        let name = keep(&mut errors, {
            let name = self
                .name
                .clone()
                .or_else(|| self.id.clone())
                .unwrap_or_default();
            if name.is_empty()
                || name.len() > 128
                || name.contains(['"', '\\'])
                || name.chars().any(char::is_control)
            {
                // A missing id is said once, as the id's.
                if self.name.is_none() && self.id.is_none() {
                    Ok(name)
                } else {
                    Err(field_error(
                        "name",
                        "must be 1 to 128 printable characters without quotes or backslashes",
                    ))
                }
            } else {
                Ok(name)
            }
        });
        match (
            id, domain, matches, identity, limit, mode, fail_mode, regional, name, penalty,
        ) {
            (
                Some(id),
                Some(domain),
                Some(matches),
                Some(identity),
                Some(limit),
                Some(mode),
                Some(fail_mode),
                Some(regional),
                Some(name),
                Some(penalty),
            ) if errors.is_empty() => Ok(Rule {
                id,
                domain,
                name,
                matches,
                identity,
                limit,
                mode,
                fail_mode,
                regional,
                penalty,
                origin,
            }),
            _ => Err(errors),
        }
    }

    fn limit_spec(&self, algorithm: Algorithm) -> Result<LimitSpec, FieldError> {
        let given: [(&str, bool); 9] = [
            ("capacity", self.capacity.is_some()),
            ("refillPerSecond", self.refill_per_second.is_some()),
            ("burst", self.burst.is_some()),
            ("ratePerSecond", self.rate_per_second.is_some()),
            ("limit", self.limit.is_some()),
            ("window", self.window.is_some()),
            ("duration", self.duration.is_some()),
            ("maxInFlight", self.max_in_flight.is_some()),
            ("slotTtl", self.slot_ttl.is_some()),
        ];
        let wanted: &[&str] = match algorithm {
            Algorithm::TokenBucket => &["capacity", "refillPerSecond"],
            Algorithm::Gcra => &["burst", "ratePerSecond"],
            Algorithm::LeakyBucket => &["limit", "duration", "burst"],
            Algorithm::Concurrency => &["maxInFlight", "slotTtl"],
            _ => &["limit", "window"],
        };
        for (field, present) in given {
            if present && !wanted.contains(&field) {
                return Err(field_error(
                    field,
                    format!(
                        "does not apply to {algorithm}; it takes {}",
                        match wanted {
                            [one, two] => format!("{one} and {two}"),
                            _ => format!("{} (burst optional)", wanted.join(", ")),
                        }
                    ),
                ));
            }
        }
        let need = |v: Option<f64>, field: &str| {
            v.ok_or_else(|| field_error(field, format!("is required for {algorithm}")))
        };
        let need_duration = |v: &Option<DurationValue>, field: &str| match v {
            Some(d) => d.parse().map_err(|e| field_error(field, e.to_string())),
            None => Err(field_error(field, format!("is required for {algorithm}"))),
        };
        Ok(match algorithm {
            Algorithm::TokenBucket => LimitSpec::TokenBucket {
                capacity: need(self.capacity, "capacity")?,
                refill_per_second: need(self.refill_per_second, "refillPerSecond")?,
            },
            Algorithm::Gcra => LimitSpec::Gcra {
                burst: need(self.burst, "burst")?,
                rate_per_second: need(self.rate_per_second, "ratePerSecond")?,
            },
            Algorithm::LeakyBucket => LimitSpec::LeakyBucket {
                limit: need(self.limit, "limit")?,
                duration: need_duration(&self.duration, "duration")?,
                burst: self.burst,
            },
            Algorithm::Concurrency => LimitSpec::Concurrency {
                max_in_flight: need(self.max_in_flight, "maxInFlight")?,
                slot_ttl: need_duration(&self.slot_ttl, "slotTtl")?,
            },
            Algorithm::FixedWindow => LimitSpec::FixedWindow {
                limit: need(self.limit, "limit")?,
                window: need_duration(&self.window, "window")?,
            },
            Algorithm::SlidingWindow => LimitSpec::SlidingWindow {
                limit: need(self.limit, "limit")?,
                window: need_duration(&self.window, "window")?,
            },
            Algorithm::SlidingWindowLog => LimitSpec::SlidingWindowLog {
                limit: need(self.limit, "limit")?,
                window: need_duration(&self.window, "window")?,
            },
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_lease::Limit;

    fn doc(yaml: &str) -> RuleDoc {
        yaml_serde::from_str(yaml).expect("parses")
    }

    #[test]
    fn the_seed_admin_body_is_a_valid_rule() {
        let body = r#"{ "match": { "plan": "gold", "route": "POST /orders" },
          "algorithm": "TOKEN_BUCKET", "capacity": 100, "refillPerSecond": 10,
          "mode": "ENFORCE", "failMode": "OPEN" }"#;
        let mut d: RuleDoc = serde_json::from_str(body).expect("json");
        d.id = Some("gold-orders-create".into());
        let rule = d
            .validate(Some("public-api"), "test".into())
            .expect("valid");
        assert_eq!(rule.identity, Identity::Default);
        assert_eq!(rule.limit.capacity(), 100);
        assert_eq!(rule.mode, Mode::Enforce);
        assert_eq!(
            RuleDoc::from_rule(&rule).validate(None, "again".into()),
            Ok(Rule {
                origin: "again".into(),
                ..rule
            })
        );
    }

    #[test]
    fn star_keys_key_the_counters() {
        let rule = doc("{id: r, domain: d, match: {ip: '*', route: 'GET /x'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}")
            .validate(None, String::new())
            .expect("valid");
        assert_eq!(rule.identity, Identity::Keys(vec!["ip".into()]));
        assert_eq!(rule.limit.window(), Some(Duration::from_secs(60)));
    }

    #[test]
    fn a_penalty_is_validated_field_by_field_and_round_trips() {
        let rule = doc("{id: login, domain: d, match: {ip: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m, penalty: {after: 10, within: 1m, block: 15m}}")
            .validate(None, String::new())
            .expect("valid");
        let p = rule.penalty.expect("penalty");
        assert_eq!(
            (p.after(), p.within(), p.block()),
            (10, Duration::from_secs(60), Duration::from_secs(900))
        );
        assert_eq!(
            RuleDoc::from_rule(&rule).validate(None, String::new()),
            Ok(rule)
        );
        let field = |penalty: &str| {
            doc(&format!("{{id: a, domain: d, algorithm: FIXED_WINDOW, limit: 5, window: 1m, penalty: {penalty}}}"))
                .validate(None, String::new())
                .expect_err("invalid")
                .field
        };
        assert_eq!(field("{after: 0, within: 1m, block: 1m}"), "penalty.after");
        assert_eq!(
            field("{after: 3, within: 0.5, block: 1m}"),
            "penalty.within"
        );
        assert_eq!(field("{after: 3, within: 1m, block: 8d}"), "penalty.block");
        assert_eq!(
            field("{after: 3, within: 1m, block: soon}"),
            "penalty.block"
        );
        let concurrency = doc("{id: a, domain: d, algorithm: CONCURRENCY, maxInFlight: 5, slotTtl: 1m, penalty: {after: 3, within: 1m, block: 1m}}")
            .validate(None, String::new())
            .expect_err("invalid");
        assert_eq!(concurrency.field, "penalty");
        let unknown: Result<RuleDoc, _> =
            yaml_serde::from_str("{id: a, penalty: {after: 3, within: 1m, block: 1m, ban: yes}}");
        assert!(unknown.is_err(), "unknown penalty fields are refused");
    }

    #[test]
    fn gcra_and_leaky_bucket_rules_validate_name_their_fields_and_round_trip() {
        let valid = |yaml: &str| doc(yaml).validate(None, String::new()).expect("valid");
        let gcra = valid("{id: g, domain: d, algorithm: GCRA, burst: 20, ratePerSecond: 2.5}");
        assert_eq!(gcra.limit, Limit::gcra(20, 2.5).expect("limit"));
        let leaky = valid("{id: l, domain: d, algorithm: LEAKY_BUCKET, limit: 30, duration: 1m}");
        assert_eq!(
            leaky.limit,
            Limit::leaky_bucket(30, Duration::from_secs(60), None).expect("limit")
        );
        let deep =
            valid("{id: l, domain: d, algorithm: LEAKY_BUCKET, limit: 30, duration: 1m, burst: 5}");
        assert_eq!(deep.limit.capacity(), 5);
        for rule in [gcra, leaky, deep] {
            let written = RuleDoc::from_rule(&rule);
            assert_eq!(written.validate(None, String::new()), Ok(rule));
        }
        let field = |yaml: &str| {
            doc(yaml)
                .validate(Some("d"), String::new())
                .expect_err("invalid")
                .field
        };
        assert_eq!(field("{id: a, algorithm: GCRA, ratePerSecond: 1}"), "burst");
        assert_eq!(field("{id: a, algorithm: GCRA, burst: 3}"), "ratePerSecond");
        assert_eq!(
            field("{id: a, algorithm: GCRA, burst: 3, ratePerSecond: -1}"),
            "ratePerSecond"
        );
        assert_eq!(
            field("{id: a, algorithm: GCRA, capacity: 3, burst: 3, ratePerSecond: 1}"),
            "capacity"
        );
        assert_eq!(
            field("{id: a, algorithm: LEAKY_BUCKET, limit: 3}"),
            "duration"
        );
        assert_eq!(
            field("{id: a, algorithm: LEAKY_BUCKET, limit: 3, duration: 1m, burst: 0}"),
            "burst"
        );
        assert_eq!(
            field("{id: a, algorithm: LEAKY_BUCKET, limit: 3, window: 1m}"),
            "window"
        );
        assert_eq!(
            field("{id: a, algorithm: FIXED_WINDOW, limit: 3, window: 1m, duration: 1m}"),
            "duration"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let field = |yaml: &str| {
            doc(yaml)
                .validate(Some("d"), String::new())
                .expect_err("invalid")
                .field
        };
        assert_eq!(
            field("{algorithm: TOKEN_BUCKET, capacity: 1, refillPerSecond: 1}"),
            "id"
        );
        assert_eq!(field("{id: 'a b', algorithm: TOKEN_BUCKET}"), "id");
        assert_eq!(field("{id: a}"), "algorithm");
        assert_eq!(field("{id: a, algorithm: LEAKY}"), "algorithm");
        assert_eq!(
            field("{id: a, algorithm: TOKEN_BUCKET, refillPerSecond: 1}"),
            "capacity"
        );
        assert_eq!(
            field("{id: a, algorithm: TOKEN_BUCKET, capacity: 0, refillPerSecond: 1}"),
            "capacity"
        );
        assert_eq!(
            field("{id: a, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: .nan}"),
            "refillPerSecond"
        );
        assert_eq!(
            field("{id: a, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: 1, window: 5s}"),
            "window"
        );
        assert_eq!(
            field("{id: a, algorithm: FIXED_WINDOW, limit: 5, window: 5 parsecs}"),
            "window"
        );
        assert_eq!(
            field("{id: a, algorithm: FIXED_WINDOW, limit: 5, window: 1s, mode: LOUD}"),
            "mode"
        );
        assert_eq!(
            field("{id: a, algorithm: CONCURRENCY, maxInFlight: 2, slotTtl: 1s, failMode: X}"),
            "failMode"
        );
        assert_eq!(
            field("{id: a, algorithm: CONCURRENCY, maxInFlight: 2}"),
            "slotTtl"
        );
    }

    #[test]
    fn a_nul_anywhere_is_refused_naming_the_field() {
        let mut d = doc("{id: a, domain: d, algorithm: FIXED_WINDOW, limit: 1, window: 1s}");
        d.matches.insert("route".into(), "GET /\0x".into());
        assert_eq!(
            d.validate(None, String::new()).expect_err("nul").field,
            "match.route"
        );
        let mut d = doc("{id: a, algorithm: FIXED_WINDOW, limit: 1, window: 1s}");
        d.domain = Some("a\0b".into());
        assert_eq!(
            d.validate(None, String::new()).expect_err("nul").field,
            "domain"
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err =
            yaml_serde::from_str::<RuleDoc>("{id: a, capacty: 5}").expect_err("unknown field");
        assert!(err.to_string().contains("capacty"), "{err}");
    }

    #[test]
    fn durations_format_in_their_largest_unit() {
        assert_eq!(format_duration(Duration::from_secs(60)), "1m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
    }
}
