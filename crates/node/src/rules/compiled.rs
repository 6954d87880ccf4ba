//! One compiled rule: what it does to a matching request (its limit, block or allowance), its
//! modes, where it came from and the counters it is decided under; and the rules a request
//! makes from its own limit override.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use tollgate_lease::{Limit, LimitSpec};
use tollgate_regionsync::{Placement, Role};

use crate::metrics::{RuleCounters, RuleLabels};
use crate::rules::model::{FailMode, Mode};

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
    /// The rule id, as operators and clients see it (metrics, headers, `matchedRule`).
    pub id: String,
    /// The rule part of its counters' store keys, unique across every source of rules: a
    /// Tollgate rule's id (ids are `[A-Za-z0-9._-]`), `envoy:` + the envoyproxy/ratelimit
    /// domain and descriptor path as length-prefixed pieces, `override:` + a request's limit.
    /// No two sources can produce the same key, so no two rules ever share a counter.
    pub key: String,
    /// Its domain.
    pub domain: String,
    /// The policy name in headers.
    pub name: String,
    /// What it does (a limit here is this region's share of it).
    pub kind: RuleKind,
    /// The limit before this region's share: what the home region enforces when it decides a
    /// forwarded HOME_REGION request (None: no limit).
    pub whole: Option<Limit>,
    /// ENFORCE or SHADOW (DISABLED rules are not compiled).
    pub mode: Mode,
    /// What happens when the store fails.
    pub fail_mode: FailMode,
    /// Names of limits this one replaces in a request (envoyproxy/ratelimit `replaces`).
    pub replaces: Vec<String>,
    /// The name `replaces` refers to (envoyproxy/ratelimit `rate_limit.name`).
    pub replace_name: Option<String>,
    /// Tollgate rules (their uids) this one takes the place of in a request that matches both,
    /// when it is enforced (`replaces` in Tollgate's format; `docs/rules-precedence.md`).
    pub replaces_rules: Vec<u64>,
    /// Decision counters.
    pub counters: RuleCounters,
    /// Where it was defined.
    pub origin: String,
    /// Where its limit is held across regions, at what share (the limit above is scaled).
    pub placement: Placement,
    /// The penalty box: after so many denials within a window, block the identity.
    pub penalty: Option<tollgate_lease::Penalty>,
    /// The rate-limit header text of its limit, written once (see [`crate::headers`]).
    pub header_text: std::sync::OnceLock<Option<crate::headers::HeaderText>>,
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

    /// Whether the store refuses its bucket while the identity is blocked: an ENFORCE rule
    /// with a penalty (a SHADOW rule's penalty only counts).
    pub fn enforces_penalty(&self) -> bool {
        self.penalty.is_some() && self.mode == Mode::Enforce
    }

    /// The limit, for rules the store decides.
    pub fn limit(&self) -> Option<Limit> {
        match self.kind {
            RuleKind::Limited(l) => Some(l),
            _ => None,
        }
    }

    /// A rule made at request time from an Envoy descriptor's `limit` override: `requests`
    /// per `unit` (0 blocks, as envoyproxy/ratelimit does). Every override of one limit is
    /// one rule; its counters are keyed by the request's domain and entries (the identity).
    pub fn for_override(
        requests: u32,
        unit: Duration,
        counters: RuleCounters,
    ) -> Result<Self, tollgate_lease::LimitError> {
        let key = format!("override:{requests}/{}s", unit.as_secs());
        let kind = if requests == 0 {
            RuleKind::Block(unit)
        } else {
            RuleKind::Limited(
                LimitSpec::FixedWindow {
                    limit: f64::from(requests),
                    window: unit,
                }
                .validate()?,
            )
        };
        Ok(CompiledRule {
            uid: uid_of(&(&key, format!("{kind:?}"))),
            id: format!("override.{requests}-per-{}s", unit.as_secs()),
            name: format!("override-{requests}-per-{}s", unit.as_secs()),
            key,
            domain: override_labels().domain,
            whole: match kind {
                RuleKind::Limited(l) => Some(l),
                _ => None,
            },
            kind,
            mode: Mode::Enforce,
            fail_mode: FailMode::Open,
            replaces: vec![],
            replaces_rules: vec![],
            replace_name: None,
            counters,
            origin: "request override".into(),
            placement: Placement::LOCAL,
            penalty: None,
            header_text: std::sync::OnceLock::new(),
        })
    }
}

/// The one label set every override's decisions are counted under: labels never come from
/// request content (a client could otherwise add series at will).
pub fn override_labels() -> RuleLabels {
    RuleLabels {
        domain: "*".into(),
        rule: "override".into(),
    }
}

/// The identity of a descriptor that carries its own limit: its domain and every entry, as
/// length-prefixed pieces (injective: `[("a", "b=c")]` and `[("a=b", "c")]` differ, and so do
/// the same entries in two domains).
pub fn override_identity(domain: &str, entries: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(domain.len() + 8 + entries.len() * 16);
    push_piece(&mut out, domain);
    for (k, v) in entries {
        push_piece(&mut out, k);
        push_piece(&mut out, v);
    }
    out
}

/// A stable id of a rule's definition: changes when anything that decides changes.
pub(crate) fn uid_of(value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// Length-prefixed pieces: injective whatever bytes the pieces hold.
pub(crate) fn push_piece(out: &mut Vec<u8>, piece: &str) {
    out.extend_from_slice(piece.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(piece.as_bytes());
}
