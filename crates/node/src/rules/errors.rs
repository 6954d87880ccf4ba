//! Why rules are refused, as types: a value a field cannot take, an envoyproxy/ratelimit tree
//! that does not validate, a mode override given twice, a set that does not compile. Each
//! names where it comes from (a file and line, a descriptor path, a field), and reads as the
//! message an operator sees (config errors, the admin API's problem+json).

/// A value a rule field cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// A name that is not one of those allowed (`mode`, `failMode`).
    #[error("unknown {what} {value:?}; expected one of {expected}")]
    UnknownName {
        /// The field's name.
        what: &'static str,
        /// What was written.
        value: String,
        /// The names allowed.
        expected: &'static str,
    },
    /// Text that is not a duration.
    #[error("{text:?} is not a duration (write e.g. 500ms, 30s, 5m, 1h, 1d)")]
    NotADuration {
        /// What was written.
        text: String,
    },
    /// A duration with a unit that is not one.
    #[error("unknown duration unit {unit:?} in {text:?} (use ms, s, m, h, d, w)")]
    UnknownUnit {
        /// The unit.
        unit: String,
        /// What was written.
        text: String,
    },
    /// A duration of zero, below it, or past what a limit can hold.
    #[error("{text} is not a positive {what}")]
    NotPositive {
        /// What was written (quoted when it was text).
        text: String,
        /// `duration`, or `number of seconds`.
        what: &'static str,
    },
}

/// Why `--envoy-fail-modes` (or its setting) cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailModesError {
    /// `=MODE`.
    #[error("{item:?} names no domain")]
    NoDomain {
        /// The item.
        item: String,
    },
    /// `a=OPEN,a=CLOSED`.
    #[error("domain {domain:?} is named twice")]
    DomainTwice {
        /// The domain.
        domain: String,
    },
    /// `OPEN,CLOSED`.
    #[error("{item:?}: a second default (name a domain: domain=MODE)")]
    SecondDefault {
        /// The item.
        item: String,
    },
    /// A mode that is not one.
    #[error(transparent)]
    Mode(#[from] ValueError),
}

/// Where an envoyproxy/ratelimit configuration does not validate, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", if at.is_empty() { String::new() } else { format!("{at}: ") })]
pub struct EnvoyConfigError {
    /// The path in the file (`descriptors[0].descriptors[1].rate_limit`); empty for the
    /// whole file.
    pub at: String,
    /// What is wrong.
    pub reason: String,
}

impl EnvoyConfigError {
    pub(crate) fn at(at: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            at: at.into(),
            reason: reason.into(),
        }
    }
}

/// Two mode overrides of one rule from files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: a second mode override of rule {id:?} (the first is at {first})")]
pub struct OverrideError {
    /// Where the second is.
    pub origin: String,
    /// The rule.
    pub id: String,
    /// Where the first is.
    pub first: String,
}

/// Why validated rules do not compile into a set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// Two rules of one id.
    #[error("{origin}: duplicate rule id {id:?} (first defined at {first})")]
    DuplicateId {
        /// Where the second is.
        origin: String,
        /// The id.
        id: String,
        /// Where the first is.
        first: String,
    },
    /// A rule replaces one its domain does not have.
    #[error("{origin}: rule {id:?} replaces {target:?}, which is no rule of domain {domain:?}")]
    UnknownReplace {
        /// Where the replacing rule is.
        origin: String,
        /// The replacing rule.
        id: String,
        /// The rule it names.
        target: String,
        /// Their domain.
        domain: String,
    },
    /// Rules that replace each other in a circle (each would drop the other: nothing would
    /// limit a request that matches them all).
    #[error("{origin}: rules replace each other in a circle: {}", cycle.join(" → "))]
    ReplaceCycle {
        /// Where the first rule of the circle is.
        origin: String,
        /// The ids around the circle, the first again at the end.
        cycle: Vec<String>,
    },
    /// Two envoyproxy/ratelimit configurations of one domain.
    #[error("{origin}: domain {domain:?} is configured twice")]
    DomainTwice {
        /// Where the second is.
        origin: String,
        /// The domain.
        domain: String,
    },
    /// A descriptor's limit that no counter can hold.
    #[error("{origin}: descriptor {path}: rate_limit cannot be held: {reason}")]
    LimitUnheld {
        /// The file.
        origin: String,
        /// The descriptor's path.
        path: String,
        /// Why.
        reason: String,
    },
    /// A descriptor path too long to key a counter.
    #[error(
        "{origin}: descriptor {path}: the path is too long to key a counter ({bytes} bytes, at most {most})"
    )]
    PathTooLong {
        /// The file.
        origin: String,
        /// The descriptor's path.
        path: String,
        /// Its key's length.
        bytes: usize,
        /// The longest a key may be.
        most: usize,
    },
    /// A counter key that is not UTF-8.
    #[error("a counter key is not UTF-8")]
    KeyNotUtf8,
    /// Mode overrides that cannot apply.
    #[error(transparent)]
    Override(#[from] OverrideError),
}
