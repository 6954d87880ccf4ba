//! What a rule is: which requests it matches, how it keys its counters, its limit, and what
//! happens when it would deny or when the store is down.

use crate::rules::errors::ValueError;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tollgate_lease::Limit;

/// How a rule treats a request it would deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Deny requests over the limit.
    Enforce,
    /// Run the full check, count "would deny", never block.
    Shadow,
    /// The kill switch: the rule matches nothing.
    Disabled,
}

/// What a rule does when the store cannot answer (timeout, outage, open breaker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailMode {
    /// Allow, and count a fail-open (the default: a limiter must not be less available than
    /// what it protects).
    Open,
    /// Deny (login attempts, SMS codes, coupons).
    Closed,
    /// Fall back to a local bucket of the global limit divided by the node count.
    Local,
}

macro_rules! named_enum {
    ($ty:ident, $what:literal, $($variant:ident = $name:literal),+ $(,)?) => {
        impl $ty {
            /// The name used in rule files and the admin API.
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = crate::rules::errors::ValueError;

            /// Case-insensitive (`closed` is `CLOSED`).
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.to_ascii_uppercase().as_str() {
                    $($name => Ok($ty::$variant),)+
                    other => Err(crate::rules::errors::ValueError::UnknownName {
                        what: $what,
                        value: other.to_owned(),
                        expected: concat!($($name, " "),+),
                    }),
                }
            }
        }
    };
}

named_enum!(
    Mode,
    "mode",
    Enforce = "ENFORCE",
    Shadow = "SHADOW",
    Disabled = "DISABLED"
);
named_enum!(
    FailMode,
    "failMode",
    Open = "OPEN",
    Closed = "CLOSED",
    Local = "LOCAL"
);

/// How a rule matches one descriptor entry's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Exactly this value.
    Exact(String),
    /// Any value; each distinct value gets its own counter.
    Any,
    /// A value matching a `*` wildcard pattern (`*` matches zero or more characters); each
    /// distinct value gets its own counter.
    Wildcard(String),
}

impl Pattern {
    /// `"*"` is any value, a value containing `*` is a wildcard, anything else is exact.
    pub fn parse(text: &str) -> Self {
        if text == "*" {
            Pattern::Any
        } else if text.contains('*') {
            Pattern::Wildcard(text.to_owned())
        } else {
            Pattern::Exact(text.to_owned())
        }
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Exact(v) => v == value,
            Pattern::Any => true,
            Pattern::Wildcard(p) => wildcard_matches(p, value),
        }
    }

    /// Whether each matching value gets its own counter.
    pub fn keys_counter(&self) -> bool {
        !matches!(self, Pattern::Exact(_))
    }
}

/// `*` matches zero or more characters; everything else matches itself.
pub(crate) fn wildcard_matches(pattern: &str, value: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == value;
    }
    if !value.starts_with(first) || value.len() < first.len() + last.len() || !value.ends_with(last)
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The descriptor keys that identify the client when a rule names none (`per` absent and no
/// `*` in its match): the first present of these, else one counter for the whole rule.
pub const DEFAULT_IDENTITY_KEYS: [&str; 3] = ["api_key", "user", "ip"];

/// Which descriptor values key a rule's counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The values of these keys, in this order (empty: one counter for the whole rule).
    Keys(Vec<String>),
    /// The first present of [`DEFAULT_IDENTITY_KEYS`], else one counter for the whole rule.
    Default,
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Unique id; also the rule part of its counters' keys.
    pub id: String,
    /// The domain it applies to.
    pub domain: String,
    /// The policy name in `RateLimit` headers (defaults to the id).
    pub name: String,
    /// Every listed key must be present in the descriptor with a matching value.
    pub matches: Vec<(String, Pattern)>,
    /// Which values key the counters.
    pub identity: Identity,
    /// The limit.
    pub limit: Limit,
    /// ENFORCE, SHADOW or DISABLED.
    pub mode: Mode,
    /// OPEN, CLOSED or LOCAL.
    pub fail_mode: FailMode,
    /// How the limit is held across two regions.
    pub regional: tollgate_regionsync::RegionalPolicy,
    /// After so many denials within a window, block the identity for a while (None: never).
    pub penalty: Option<tollgate_lease::Penalty>,
    /// Rules of its domain (by id) it takes the place of in a request that matches both, when
    /// it is enforced (`docs/rules-precedence.md`).
    pub replaces: Vec<String>,
    /// Keys that must be in none of a request's descriptors for the rule to match
    /// (`without: [api_key]`: anonymous traffic only).
    pub without: Vec<String>,
    /// Where it came from (file and line), for messages.
    pub origin: String,
}

/// Parses a duration written as `500ms`, `30s`, `5m`, `1h`, `1d`, `1w`, or a number of
/// seconds.
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| ValueError::NotADuration {
        text: text.to_owned(),
    })?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        "w" => value * 604_800.0,
        other => {
            return Err(ValueError::UnknownUnit {
                unit: other.to_owned(),
                text: text.to_owned(),
            });
        }
    };
    if !seconds.is_finite() || seconds <= 0.0 || seconds > 1e10 {
        return Err(ValueError::NotPositive {
            text: format!("{text:?}"),
            what: "duration",
        });
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_like_envoys_ratelimit() {
        assert!(wildcard_matches("/api/*", "/api/orders"));
        assert!(wildcard_matches("/api/*", "/api/"));
        assert!(!wildcard_matches("/api/*", "/ap"));
        assert!(wildcard_matches("*/orders", "/v1/orders"));
        assert!(wildcard_matches("a*b*c", "a123b45c"));
        assert!(!wildcard_matches("a*b*c", "a123c"));
        assert!(wildcard_matches("a**", "a"));
        assert!(!wildcard_matches("ab*ba", "aba"));
    }

    #[test]
    fn patterns_parse_by_their_stars() {
        assert_eq!(Pattern::parse("*"), Pattern::Any);
        assert_eq!(Pattern::parse("gold"), Pattern::Exact("gold".into()));
        assert!(matches!(
            Pattern::parse("POST /orders/*"),
            Pattern::Wildcard(_)
        ));
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn modes_parse_and_unknown_ones_say_what_is_expected() {
        assert_eq!("SHADOW".parse::<Mode>(), Ok(Mode::Shadow));
        assert_eq!("LOCAL".parse::<FailMode>(), Ok(FailMode::Local));
        assert_eq!(
            "closed".parse::<FailMode>(),
            Ok(FailMode::Closed),
            "any case"
        );
        assert_eq!("Disabled".parse::<Mode>(), Ok(Mode::Disabled));
        let err = "MAYBE".parse::<FailMode>().expect_err("unknown");
        assert_eq!(
            err,
            ValueError::UnknownName {
                what: "failMode",
                value: "MAYBE".into(),
                expected: "OPEN CLOSED LOCAL "
            }
        );
        let err = err.to_string();
        assert!(err.contains("OPEN") && err.contains("MAYBE"), "{err}");
    }
}
