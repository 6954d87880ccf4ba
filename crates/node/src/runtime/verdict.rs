//! What the runtime decided for a request: overall, and per matched rule.
//!
//! Every answer a client sees (headers, Envoy's descriptor statuses, `CheckRateLimit`) is read
//! from here, so limit, remaining, reset and retry-after come from one place: a
//! [`RuleStatus`] carries the limit that decided it with the remaining and reset measured
//! against that same limit.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{BucketKey, Limit, SlotId};

use crate::rules::{CompiledRule, Mode};
pub use crate::runtime::outcome::{Denial, Outcome};

/// One matched rule's part in a decision.
#[derive(Debug, Clone)]
pub struct RuleStatus {
    /// The request descriptor it matched (0 when descriptors are merged).
    pub descriptor: usize,
    /// Other descriptors of the request that matched the same rule for the same identity: the
    /// bucket is charged once per request, and this status answers for them too.
    pub also: Vec<usize>,
    /// The rule.
    pub rule: Arc<CompiledRule>,
    /// The limit `remaining` and `reset_after` are measured against: the rule's limit in this
    /// region, or the home region's whole limit when the home region decided (None: the rule
    /// has no limit, e.g. unlimited).
    pub limit: Option<Limit>,
    /// Whether this rule admitted the request (a SHADOW rule that would deny says false
    /// without blocking).
    pub allowed: bool,
    /// Units left (an estimate from this node's view: the store's last answer plus what this
    /// node holds).
    pub remaining: u64,
    /// When denied: how long until the request would fit (zero when it never will).
    pub retry_after: Duration,
    /// How long until the bucket is full again.
    pub reset_after: Duration,
    /// Why it denied (None when it admitted).
    pub denial: Option<Denial>,
    /// What was counted for the rule (None: not evaluated, the request was decided first).
    pub outcome: Option<Outcome>,
    /// Decided on the store's last answer because the store was slow (an OPEN rule, past the
    /// store budget): the store has not counted this decision, and counts it only if a later
    /// grant can pay for it.
    pub on_last_answer: bool,
}

impl RuleStatus {
    /// Whether this status answers for request descriptor `index`.
    pub fn covers(&self, index: usize) -> bool {
        self.descriptor == index || self.also.contains(&index)
    }

    /// Whether clients are told about it: evaluated, and not a SHADOW rule (shadow rules show
    /// in metrics and logs only).
    pub fn shown(&self) -> bool {
        self.outcome.is_some() && self.rule.mode == Mode::Enforce
    }

    /// A token bucket's (or a GCRA's) burst and refill rate per second (None for any other
    /// limit): what a denied client hit, where its policy states the sustained rate.
    pub fn token_bucket(&self) -> Option<(u64, f64)> {
        let limit = self.limit.filter(|l| l.algorithm().refills())?;
        Some((limit.capacity(), limit.refill_per_second()?))
    }

    /// Whether it denied the request (an ENFORCE rule that did not admit).
    pub fn denies(&self) -> bool {
        self.shown() && !self.allowed
    }
}

/// How long until a bucket with `remaining` of `limit` left is full again: a token bucket (or
/// GCRA) refills what is missing at its rate (units leased to nodes count as remaining, not spent);
/// windows reset when the store says (`store_reset`).
pub fn reset_after(limit: &Limit, remaining: u64, store_reset: Duration) -> Duration {
    match (limit.algorithm(), limit.refill_per_second()) {
        (algorithm, Some(rate)) if algorithm.refills() => {
            let missing = limit.capacity().saturating_sub(remaining);
            Duration::from_secs_f64(missing as f64 / rate)
        }
        _ => store_reset,
    }
}

/// A held concurrency slot: release it when the request completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSlot {
    /// The bucket.
    pub key: BucketKey,
    /// The slot.
    pub slot: SlotId,
}

impl HeldSlot {
    /// The slot as one opaque string for clients (`<bucket key>#<slot id>`).
    pub fn token(&self) -> String {
        format!("{}#{}", self.key, self.slot.as_str())
    }

    /// Reads a token back.
    pub fn from_token(token: &str) -> Option<Self> {
        let (key, slot) = token.split_once('#')?;
        Some(Self {
            key: BucketKey::parse(key)?,
            slot: SlotId::forged(slot),
        })
    }
}

/// A decision.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// When denied: the longest wait among the denying rules, the time at which the request
    /// can be admitted (zero when it never can: see [`Verdict::denial`]).
    pub retry_after: Duration,
    /// Per matched rule, in match order.
    pub statuses: Vec<RuleStatus>,
    /// Concurrency slots this admission holds.
    pub slots: Vec<HeldSlot>,
}

impl Verdict {
    /// How long the slots this admission holds live unless renewed: the shortest slot TTL
    /// among its concurrency rules (None: it holds none).
    pub fn slot_ttl(&self) -> Option<Duration> {
        if self.slots.is_empty() {
            return None;
        }
        self.statuses
            .iter()
            .filter_map(|s| s.rule.limit().and_then(|l| l.slot_ttl()))
            .min()
    }

    /// Whether the store's answer was missing from this decision, and how it was made
    /// instead (None: every rule was decided on what the store granted). The most telling
    /// way wins: `failed-open` (a rule admitted without the store counting it), then
    /// `last-answer` (a share of the store's last answer while it had stalled), then
    /// `local-fallback` (a rule's per-node LOCAL share), then `failed-closed`. What a load
    /// test reads to see whether its figures are the limiter's or its fail modes'.
    pub fn decided_without_store(&self) -> Option<&'static str> {
        let any = |way: fn(&RuleStatus) -> bool| self.statuses.iter().any(way);
        if any(|s| s.outcome == Some(Outcome::FailedOpen)) {
            Some("failed-open")
        } else if any(|s| s.on_last_answer) {
            Some("last-answer")
        } else if any(|s| s.outcome == Some(Outcome::LocalFallback)) {
            Some("local-fallback")
        } else if any(|s| s.outcome == Some(Outcome::FailedClosed)) {
            Some("failed-closed")
        } else {
            None
        }
    }

    /// Why the request was denied (None when admitted): a denial no wait can help
    /// outranks the others.
    pub fn denial(&self) -> Option<Denial> {
        self.decisive()
            .filter(|s| !s.allowed)
            .and_then(|s| s.denial)
    }

    /// The rule that decided: the denying ENFORCE rule no retry can help, else the one with
    /// the longest wait; when admitted, the ENFORCE rule closest to its limit. SHADOW rules
    /// never decide.
    pub fn decisive(&self) -> Option<&RuleStatus> {
        if !self.allowed {
            return self
                .statuses
                .iter()
                .filter(|s| s.denies())
                .max_by_key(|s| (!s.denial.is_some_and(Denial::retryable), s.retry_after));
        }
        self.statuses
            .iter()
            .filter(|s| s.shown() && s.limit.is_some())
            .min_by_key(|s| s.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_buckets_reset_refills_what_is_missing_at_its_rate() {
        let limit = Limit::token_bucket(50, 10.0).expect("limit");
        assert_eq!(
            reset_after(&limit, 48, Duration::from_secs(5)),
            Duration::from_millis(200),
            "two units missing at 10/s, whatever the store said of leased units"
        );
        let window = Limit::fixed_window(5, Duration::from_secs(60)).expect("limit");
        assert_eq!(
            reset_after(&window, 3, Duration::from_secs(7)),
            Duration::from_secs(7),
            "a window resets when it ends"
        );
    }
}
