//! What the runtime decided for a request: overall, and per matched rule.

use std::sync::Arc;
use std::time::Duration;

use tollgate_lease::{BucketKey, SlotId};

use crate::metrics::Outcome;
use crate::rules::CompiledRule;

/// One matched rule's part in a decision.
#[derive(Debug, Clone)]
pub struct RuleStatus {
    /// The request descriptor it matched (0 when descriptors are merged).
    pub descriptor: usize,
    /// The rule.
    pub rule: Arc<CompiledRule>,
    /// Whether this rule admitted the request (a SHADOW rule that would deny says false
    /// without blocking).
    pub allowed: bool,
    /// Units left (an estimate from this node's view: the store's last answer plus what this
    /// node holds).
    pub remaining: u64,
    /// When denied: how long until the request would fit.
    pub retry_after: Duration,
    /// How long until the bucket is full again.
    pub reset_after: Duration,
    /// What was counted for the rule (None: not evaluated, the request was decided first).
    pub outcome: Option<Outcome>,
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
    /// When denied: the longest wait among the denying rules.
    pub retry_after: Duration,
    /// Per matched rule, in match order.
    pub statuses: Vec<RuleStatus>,
    /// A CLOSED rule denied because the store could not answer (Envoy's API reports this as
    /// UNAVAILABLE).
    pub failed_closed: bool,
    /// Concurrency slots this admission holds.
    pub slots: Vec<HeldSlot>,
}

impl Verdict {
    /// The rule that decided: the denying ENFORCE rule with the longest wait, else the rule
    /// closest to its limit.
    pub fn decisive(&self) -> Option<&RuleStatus> {
        let enforcing = |s: &&RuleStatus| s.rule.mode == crate::rules::Mode::Enforce;
        if !self.allowed {
            return self
                .statuses
                .iter()
                .filter(enforcing)
                .filter(|s| !s.allowed)
                .max_by_key(|s| s.retry_after);
        }
        self.statuses
            .iter()
            .filter(|s| s.rule.limit().is_some())
            .min_by_key(|s| s.remaining)
    }
}
