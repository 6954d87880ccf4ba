//! A rule document validated into a rule: every field checked, and every mistake named at
//! once ([`RuleDoc::validate_all`]).

use tollgate_lease::{Algorithm, LimitSpec};

use super::*;
use crate::rules::errors::ValueError;
use crate::rules::model::{FailMode, Identity, Mode, Pattern, Rule};

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
    ///
    /// Longer than most functions here, on purpose: one field after another, in the order
    /// of the document, each error kept, so that it reads as the format does.
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
        // Every parameter at fault, each once.
        let limit = algorithm.and_then(|algorithm| {
            let (spec, mut wrong) = self.limit_spec(algorithm);
            let limit = match spec.validate_all() {
                Ok(limit) => Some(limit),
                Err(invalid) => {
                    for e in invalid {
                        if !wrong.iter().any(|w| w.field == e.field) {
                            wrong.push(field_error(e.field, e.reason));
                        }
                    }
                    None
                }
            };
            let fine = wrong.is_empty();
            errors.extend(wrong);
            limit.filter(|_| fine)
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
        for (i, target) in self.replaces.iter().enumerate() {
            let field = format!("replaces[{i}]");
            if let Err(e) = validate_id(target) {
                errors.push(field_error(field, e.reason));
            } else if Some(target) == self.id.as_ref() {
                errors.push(field_error(field, "a rule cannot replace itself"));
            } else if self.replaces[..i].contains(target) {
                errors.push(field_error(field, format!("{target:?} is named twice")));
            }
        }
        for (i, key) in self.without.iter().enumerate() {
            let field = format!("without[{i}]");
            if key.is_empty() {
                errors.push(field_error(field, "keys must not be empty"));
            } else if self.matches.contains_key(key) {
                errors.push(field_error(
                    field,
                    format!("{key:?} is in `match` too: no request could match the rule"),
                ));
            } else if self.per.iter().flatten().any(|k| k == key) {
                errors.push(field_error(
                    field,
                    format!("{key:?} is in `per` too: no request could match the rule"),
                ));
            } else if self.without[..i].contains(key) {
                errors.push(field_error(field, format!("{key:?} is named twice")));
            }
        }
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
                replaces: self.replaces.clone(),
                without: self.without.clone(),
                origin,
            }),
            _ => Err(errors),
        }
    }

    /// The limit's parameters for `algorithm`, and every one at fault: one that does not
    /// apply, one missing (read as a plain 1, or 1 s, so that the others are still checked).
    fn limit_spec(&self, algorithm: Algorithm) -> (LimitSpec, Vec<FieldError>) {
        let mut errors = vec![];
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
                errors.push(field_error(
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
        let missing = std::cell::RefCell::new(vec![]);
        let need = |v: Option<f64>, field: &str| {
            v.unwrap_or_else(|| {
                missing
                    .borrow_mut()
                    .push(field_error(field, format!("is required for {algorithm}")));
                1.0
            })
        };
        let need_duration = |v: &Option<DurationValue>, field: &str| {
            let found = match v {
                Some(d) => d.parse().map_err(|e| field_error(field, e.to_string())),
                None => Err(field_error(field, format!("is required for {algorithm}"))),
            };
            found.unwrap_or_else(|e| {
                missing.borrow_mut().push(e);
                std::time::Duration::from_secs(1)
            })
        };
        let spec = match algorithm {
            Algorithm::TokenBucket => LimitSpec::TokenBucket {
                capacity: need(self.capacity, "capacity"),
                refill_per_second: need(self.refill_per_second, "refillPerSecond"),
            },
            Algorithm::Gcra => LimitSpec::Gcra {
                burst: need(self.burst, "burst"),
                rate_per_second: need(self.rate_per_second, "ratePerSecond"),
            },
            Algorithm::LeakyBucket => LimitSpec::LeakyBucket {
                limit: need(self.limit, "limit"),
                duration: need_duration(&self.duration, "duration"),
                burst: self.burst,
            },
            Algorithm::Concurrency => LimitSpec::Concurrency {
                max_in_flight: need(self.max_in_flight, "maxInFlight"),
                slot_ttl: need_duration(&self.slot_ttl, "slotTtl"),
            },
            Algorithm::FixedWindow => LimitSpec::FixedWindow {
                limit: need(self.limit, "limit"),
                window: need_duration(&self.window, "window"),
            },
            Algorithm::SlidingWindow => LimitSpec::SlidingWindow {
                limit: need(self.limit, "limit"),
                window: need_duration(&self.window, "window"),
            },
            Algorithm::SlidingWindowLog => LimitSpec::SlidingWindowLog {
                limit: need(self.limit, "limit"),
                window: need_duration(&self.window, "window"),
            },
        };
        errors.extend(missing.into_inner());
        (spec, errors)
    }
}
