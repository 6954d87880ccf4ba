//! What a request matches: for each descriptor, the rules that apply and the identity and
//! cost of each rule's bucket (`Hit`), a rule matched for one identity by several
//! descriptors charged once, `replaces` applied; and the rules made from Envoy's per-descriptor
//! limit overrides, cached (`OverrideRules`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use tollgate_lease::Micros;

use crate::metrics::RuleCounters;
use crate::rules::{CompiledRule, Mode, RuleKind, RuleSet};
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::outcome::Outcome;
use crate::runtime::request::{Matching, Request, RequestError};
use crate::runtime::verdict::{Denial, RuleStatus, reset_after};

/// The most rules made from descriptor limit overrides that a node keeps for reuse.
pub const MAX_OVERRIDE_RULES: usize = 1024;

/// What a request is charged at one matched rule ([`Node::charges`](crate::runtime::node::Node::charges)).
#[derive(Debug, Clone)]
pub struct Charge {
    /// The rule.
    pub rule: Arc<CompiledRule>,
    /// The identity of the rule's bucket (the values of the descriptor entries it counts by).
    pub identity: Vec<u8>,
    /// The units taken.
    pub cost: u64,
}

/// One rule matched by one descriptor.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) descriptor: usize,
    /// Other descriptors that matched the same rule for the same identity (charged once).
    pub(crate) also: Vec<usize>,
    pub(crate) rule: Arc<CompiledRule>,
    pub(crate) identity: Vec<u8>,
    pub(crate) cost: u64,
}

impl Hit {
    /// Which bucket the hit counts in.
    pub(crate) fn bucket_id(&self) -> BucketId<'_> {
        BucketId::new(&self.rule, &self.identity)
    }

    /// A status measured against this region's limit of the rule; the reset follows from
    /// `remaining` for a token bucket, and is the store's (`store_reset`) for windows.
    pub(crate) fn status(
        &self,
        outcome: Outcome,
        denial: Option<Denial>,
        remaining: u64,
        retry_after: Duration,
        store_reset: Duration,
    ) -> RuleStatus {
        let limit = self.rule.limit();
        RuleStatus {
            descriptor: self.descriptor,
            also: self.also.clone(),
            rule: self.rule.clone(),
            limit,
            allowed: denial.is_none(),
            remaining,
            retry_after,
            reset_after: limit.map_or(store_reset, |l| reset_after(&l, remaining, store_reset)),
            denial,
            outcome: Some(outcome),
            on_last_answer: false,
        }
    }

    pub(crate) fn admitted(
        &self,
        outcome: Outcome,
        remaining: u64,
        store_reset: Duration,
    ) -> RuleStatus {
        self.status(outcome, None, remaining, Duration::ZERO, store_reset)
    }

    pub(crate) fn denied(
        &self,
        outcome: Outcome,
        denial: Denial,
        retry_after: Duration,
        store_reset: Duration,
    ) -> RuleStatus {
        self.status(outcome, Some(denial), 0, retry_after, store_reset)
    }

    /// Over the limit: the request fits after `retry_after`.
    pub(crate) fn over_limit(&self, retry_after: Duration, store_reset: Duration) -> RuleStatus {
        self.denied(Outcome::Denied, Denial::OverLimit, retry_after, store_reset)
    }

    /// Admitted from `bucket`'s lease: what this node's view says remains.
    pub(crate) fn leased(&self, bucket: &Bucket, now: u64) -> RuleStatus {
        self.admitted(
            Outcome::Allowed,
            bucket.remaining(now),
            bucket.reset_after(now),
        )
    }

    /// Not evaluated (the request was decided before this rule was reached).
    pub(crate) fn unevaluated(&self) -> RuleStatus {
        let mut status = self.admitted(
            Outcome::Allowed,
            self.rule.limit().map_or(0, |l| l.capacity()),
            Duration::ZERO,
        );
        status.outcome = None;
        status
    }
}

/// Every rule the request matches, with the identity and cost of its bucket.
pub(crate) fn hits(
    rules: &RuleSet,
    request: &Request,
    overrides: &OverrideRules,
    now: Micros,
) -> Result<Vec<Hit>, RequestError> {
    let mut hits = vec![];
    let mut push = |descriptor: usize, matched: crate::rules::Matched, cost: u64| {
        // Values are matched as sent; the bucket is keyed by a bounded identity.
        let identity = crate::rules::identity::bounded(matched.identity);
        // A request charges a bucket once: a rule matched for the same identity by several
        // descriptors (Envoy sends one per `rate_limits` entry) is one hit, at the largest
        // of their costs, answering for each of them.
        match hits
            .iter_mut()
            .find(|h: &&mut Hit| h.rule.uid == matched.rule.uid && h.identity == identity)
        {
            Some(hit) => {
                hit.cost = hit.cost.max(cost);
                if hit.descriptor != descriptor && !hit.also.contains(&descriptor) {
                    hit.also.push(descriptor);
                }
            }
            None => hits.push(Hit {
                descriptor,
                also: vec![],
                rule: matched.rule,
                identity,
                cost,
            }),
        }
    };
    let mut native = vec![];
    match request.matching {
        Matching::Merged => {
            let merged: Vec<&[(String, String)]> =
                request.descriptors.iter().map(|d| &d.entries[..]).collect();
            rules.match_native(&request.domain, &merged, &merged, &mut native);
            for m in native.drain(..) {
                push(0, m, request.cost_of(0));
            }
            for (i, d) in request.descriptors.iter().enumerate() {
                if let Some(m) = rules.match_envoy(&request.domain, &d.entries) {
                    push(i, m, request.cost_of(i));
                }
            }
        }
        Matching::PerDescriptor => {
            let whole: Vec<&[(String, String)]> =
                request.descriptors.iter().map(|d| &d.entries[..]).collect();
            for (i, d) in request.descriptors.iter().enumerate() {
                let cost = request.cost_of(i);
                if let Some(o) = d.limit {
                    let rule = overrides.rule(o.requests, o.unit, now).map_err(|e| {
                        RequestError::BadOverride {
                            index: i,
                            reason: e.to_string(),
                        }
                    })?;
                    let identity =
                        crate::rules::set::override_identity(&request.domain, &d.entries);
                    push(i, crate::rules::Matched { rule, identity }, cost);
                    continue;
                }
                if let Some(m) = rules.match_envoy(&request.domain, &d.entries) {
                    push(i, m, cost);
                }
                rules.match_native(&request.domain, &[&d.entries], &whole, &mut native);
                for m in native.drain(..) {
                    push(i, m, cost);
                }
            }
        }
    }
    // envoyproxy/ratelimit `replaces`: a matched limit drops the limits it names.
    let replaced: Vec<&String> = hits.iter().flat_map(|h| h.rule.replaces.iter()).collect();
    if !replaced.is_empty() {
        let replaced: Vec<String> = replaced.into_iter().cloned().collect();
        hits.retain(|h| {
            !h.rule
                .replace_name
                .as_ref()
                .is_some_and(|n| replaced.contains(n))
        });
    }
    // Tollgate's `replaces`: an enforced matched rule leaves out the rules it names (a SHADOW
    // one does not: trying a plan must not lift the default meanwhile). Every matched rule's
    // count, so a chain resolves to its head (docs/rules-precedence.md).
    if hits.iter().any(|h| !h.rule.replaces_rules.is_empty()) {
        let replaced: Vec<u64> = hits
            .iter()
            .filter(|h| h.rule.mode == Mode::Enforce)
            .flat_map(|h| h.rule.replaces_rules.iter().copied())
            .collect();
        hits.retain(|h| !replaced.contains(&h.rule.uid));
    }
    Ok(hits)
}

/// Rules made from descriptor limit overrides, by (requests, unit seconds); bounded by
/// [`MAX_OVERRIDE_RULES`] (a rule's uid is derived from its limit, so one built outside the
/// cache still finds the same buckets).
#[derive(Debug)]
pub(crate) struct OverrideRules {
    cache: DashMap<(u32, u64), Arc<CompiledRule>>,
    /// The counters every override's decisions share.
    counters: RuleCounters,
    /// When the cache was last swept of rules no bucket holds (node clock, µs).
    swept: AtomicU64,
}

impl OverrideRules {
    pub(crate) fn new(counters: RuleCounters) -> Self {
        Self {
            cache: DashMap::new(),
            counters,
            swept: AtomicU64::new(0),
        }
    }

    /// Rules held for reuse.
    pub(crate) fn len(&self) -> usize {
        self.cache.len()
    }

    /// The rule of a descriptor's limit override: cached up to [`MAX_OVERRIDE_RULES`]. When
    /// the cache is full it is swept (at most once a second) of rules no bucket holds any
    /// more; a rule that still finds no room is built for this request alone.
    pub(crate) fn rule(
        &self,
        requests: u32,
        unit: Duration,
        now: Micros,
    ) -> Result<Arc<CompiledRule>, tollgate_lease::LimitError> {
        let key = (requests, unit.as_secs());
        if let Some(rule) = self.cache.get(&key) {
            return Ok(rule.clone());
        }
        let rule = Arc::new(CompiledRule::for_override(
            requests,
            unit,
            self.counters.clone(),
        )?);
        if self.cache.len() >= MAX_OVERRIDE_RULES {
            let last = self.swept.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= 1_000_000
                && self
                    .swept
                    .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                self.cache.retain(|_, r| Arc::strong_count(r) > 1);
            }
            if self.cache.len() >= MAX_OVERRIDE_RULES {
                return Ok(rule);
            }
        }
        Ok(self.cache.entry(key).or_insert(rule).clone())
    }
}

/// Hits grouped by identity (one hash tag, one store call each), in first-seen order.
pub(crate) fn group_by_identity(hits: &[Hit], indices: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = vec![];
    for &i in indices {
        match groups
            .iter_mut()
            .find(|g| hits[g[0]].identity == hits[i].identity)
        {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// Whether a matched rule can be decided by a lease alone.
pub(crate) fn leasable(rule: &CompiledRule, cost: u64) -> bool {
    rule.mode == Mode::Enforce
        && cost > 0
        && !rule.forwarded()
        && matches!(rule.kind, RuleKind::Limited(l) if l.algorithm() != tollgate_lease::Algorithm::Concurrency && cost <= l.capacity())
}
