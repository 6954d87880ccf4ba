//! What an operator does to a node's keys, through `node.operator()`: the counters a request
//! is charged against, as support meets them, read (`GET /admin/v1/counters`) and reset
//! (`POST /admin/v1/counters/reset`), penalties lifted, what this node holds of a key
//! forgotten when another node reset or lifted it, and the most-denied keys. A read peeks at
//! each matched rule's bucket in the store and at the leases nodes hold of it; a reset forgets
//! the bucket in the store (its leases too, so what nodes give back credits nothing) and drops
//! what this node holds of it. The other nodes drop theirs when told
//! ([`Operator::forget_held`]; the control plane tells them over PostgreSQL).

use std::time::Duration;

use tollgate_lease::{Algorithm, CheckRequest, HeldLeases, StoreError};

use super::Node;
use crate::rules::{Mode, RuleKind};
use crate::runtime::keys::bucket::KeyMsg;
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::matching::Charge;
use crate::runtime::request::{Request, RequestError};
use crate::runtime::store_health::lateness::Wait;

/// One matched rule's counter for one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    /// The rule's id.
    pub rule: String,
    /// Its domain.
    pub domain: String,
    /// The rule part of the bucket's store key (what a reset notification names).
    pub rule_key: String,
    /// The identity the rule counts this request under (the values of the entries it counts
    /// by).
    pub identity: Vec<u8>,
    /// The rule's mode.
    pub mode: Mode,
    /// What the rule is: a limit (its algorithm and size), or none.
    pub algorithm: Option<Algorithm>,
    /// The most the bucket holds (capacity, window limit, slots); None: not a limit.
    pub limit: Option<u64>,
    /// What the store says is left now; None: not a limit.
    pub remaining: Option<u64>,
    /// Until the bucket is full again.
    pub reset_after: Duration,
    /// The live leases nodes hold of the bucket.
    pub held: HeldLeases,
    /// The units this node holds of it, unspent.
    pub held_here: u64,
    /// The rule's penalty box for this identity (None: the rule has no penalty).
    pub penalty: Option<tollgate_lease::PenaltyState>,
}

/// One bucket a reset forgot, or one penalty block lifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    /// The rule's id.
    pub rule: String,
    /// The rule part of the bucket's store key.
    pub rule_key: String,
    /// The identity.
    pub identity: Vec<u8>,
    /// Whether the store had anything of it (for a lift: whether a block was lifted).
    pub existed: bool,
}

impl Reset {
    fn of(charge: Charge, existed: bool) -> Self {
        Self {
            rule: charge.rule.id.clone(),
            rule_key: charge.rule.key.clone(),
            identity: charge.identity,
            existed,
        }
    }
}

/// Why a counter could not be read or reset.
#[derive(Debug, thiserror::Error)]
pub enum CounterError {
    /// The descriptor is malformed.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The identity cannot make a store key (too long).
    #[error("{0}")]
    Key(String),
    /// No matched rule has that id.
    #[error("no rule {0:?} matches the descriptor")]
    NoSuchRule(String),
    /// The store did not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A node as its operator sees it (the admin API, the control plane's notices): borrowed from
/// the node by [`Node::operator`].
#[derive(Debug, Clone, Copy)]
pub struct Operator<'a> {
    pub(super) node: &'a Node,
}

impl Node {
    /// The operator's face of this node: counters, resets, penalty lifts, the most-denied keys.
    pub fn operator(&self) -> Operator<'_> {
        Operator { node: self }
    }
}

impl Operator<'_> {
    /// The `n` most-denied keys overall and per rule, since the node started.
    pub fn top_denied(&self, n: usize) -> crate::runtime::top_denied::TopDeniedReport {
        self.node.inner.decider.top_denied.report(n)
    }

    /// Every rule `request` matches, with its counter for the request's identity.
    pub async fn counters(&self, request: &Request) -> Result<Vec<Counter>, CounterError> {
        let store = &self.node.inner.decider.shared.store;
        let mut out = vec![];
        for charge in self.node.charges(request)? {
            let rule = &charge.rule;
            let id = BucketId::new(rule, &charge.identity);
            let mut counter = Counter {
                rule: rule.id.clone(),
                domain: rule.domain.clone(),
                rule_key: rule.key.clone(),
                identity: charge.identity.clone(),
                mode: rule.mode,
                algorithm: None,
                limit: None,
                remaining: None,
                reset_after: Duration::ZERO,
                held: HeldLeases::default(),
                held_here: 0,
                penalty: None,
            };
            if let RuleKind::Limited(limit) = rule.kind {
                let key = id
                    .store_key()
                    .map_err(|e| CounterError::Key(e.to_string()))?;
                let peek = CheckRequest::single(key.clone(), limit, 0).map_err(invalid)?;
                let peek = store.check(&peek, Wait::UntilDown).await?;
                counter.algorithm = Some(limit.algorithm());
                counter.limit = Some(limit.capacity());
                counter.remaining = Some(peek.buckets[0].remaining);
                counter.reset_after = peek.buckets[0].reset_after;
                counter.held = store.held_leases(&key).await?;
                if let Some(penalty) = rule.penalty {
                    // A SHADOW rule's record: what it would have blocked.
                    let penalty = if rule.mode == Mode::Shadow {
                        penalty.shadowed()
                    } else {
                        penalty
                    };
                    counter.penalty = Some(store.penalty_standing(&key, &penalty).await?);
                }
                counter.held_here = self
                    .node
                    .inner
                    .decider
                    .shared
                    .registry
                    .bucket(&id.local_key())
                    .map_or(0, |b| b.units().max(0) as u64);
            }
            out.push(counter);
        }
        Ok(out)
    }

    /// Resets the counters of `request`'s identity: of the matched rule with id `rule`, or of
    /// every matched limit when None. Each bucket is forgotten in the store, and this node
    /// drops what it holds of it.
    pub async fn reset_counters(
        &self,
        request: &Request,
        rule: Option<&str>,
    ) -> Result<Vec<Reset>, CounterError> {
        let store = &self.node.inner.decider.shared.store;
        let mut out = vec![];
        for (charge, key) in self.buckets_named(request, rule, |r| r.limit().is_some())? {
            let existed = store.reset(&key).await?;
            self.forget_held(&charge.rule.key, &charge.identity);
            out.push(Reset::of(charge, existed));
        }
        Ok(out)
    }

    /// Lifts the penalty blocks of `request`'s identity: under the matched rule with id `rule`,
    /// or under every matched rule with a penalty when None. Each block is lifted in the store
    /// (its denial count forgotten, the bucket untouched) and on this node; the other nodes
    /// forget it when told ([`Operator::forget_block`]).
    pub async fn lift_penalties(
        &self,
        request: &Request,
        rule: Option<&str>,
    ) -> Result<Vec<Reset>, CounterError> {
        let store = &self.node.inner.decider.shared.store;
        let mut out = vec![];
        for (charge, key) in self.buckets_named(request, rule, |r| r.penalty.is_some())? {
            // Forgotten here first, so that denials this node has not counted yet are not
            // flushed into the store after the lift; and those already on their way land
            // before it (both would count towards a fresh block and start it again).
            self.forget_block(&charge.rule.key, &charge.identity);
            self.node.inner.decider.shared.penalties.settled(&key).await;
            let lift = store.lift_block(&key).await?;
            self.forget_block(&charge.rule.key, &charge.identity);
            // The denials this node hands out from now on count under the lift's epoch;
            // those other nodes handed out before it count nothing (`penalties`).
            self.node
                .inner
                .decider
                .shared
                .penalties
                .learn_epoch(&key, lift.epoch);
            out.push(Reset::of(charge, lift.was_blocked));
        }
        Ok(out)
    }

    /// The charges of `request` whose rule is `kept`, of the rule with id `rule` only when
    /// given (an error if it matches none), each with its bucket's store key.
    fn buckets_named(
        &self,
        request: &Request,
        rule: Option<&str>,
        kept: impl Fn(&crate::rules::CompiledRule) -> bool,
    ) -> Result<Vec<(Charge, tollgate_lease::BucketKey)>, CounterError> {
        let charges: Vec<_> = self
            .node
            .charges(request)?
            .into_iter()
            .filter(|c| kept(&c.rule))
            .filter(|c| rule.is_none_or(|id| c.rule.id == id))
            .collect();
        if let Some(id) = rule
            && charges.is_empty()
        {
            return Err(CounterError::NoSuchRule(id.to_owned()));
        }
        charges
            .into_iter()
            .map(|charge| {
                let key = BucketId::new(&charge.rule, &charge.identity)
                    .store_key()
                    .map_err(|e| CounterError::Key(e.to_string()))?;
                Ok((charge, key))
            })
            .collect()
    }

    /// Forgets the block this node knows of the bucket of rule `rule_key` for `identity`,
    /// after it was lifted, and the store's refusal its bucket remembers (which the block
    /// made): the next request asks the store. Returns whether it knew a block.
    pub fn forget_block(&self, rule_key: &str, identity: &[u8]) -> bool {
        let Ok(key) = tollgate_lease::BucketKey::new(identity, rule_key) else {
            return false;
        };
        let penalties = &self.node.inner.decider.shared.penalties;
        let known = penalties.blocked_for(&key, self.node.now()).is_some();
        penalties.forget(&key);
        let rules = self.node.inner.rules.load();
        if let Some(rule) = rules.rule(rule_key)
            && let Some(bucket) = self
                .node
                .inner
                .decider
                .shared
                .registry
                .bucket(&BucketId::new(rule, identity).local_key())
        {
            bucket.clear_denial();
        }
        known
    }

    /// Drops what this node holds of the bucket of rule `rule_key` (a [`Counter::rule_key`])
    /// for `identity`, after its counter was reset: the units its leases still hold go back
    /// to the store (a lease from before the reset credits nothing; one taken since is
    /// credited, so hearing of a reset late, or twice, loses nothing), what it owed and any
    /// denial it remembers are forgotten, and its pre-limit and LOCAL fallback start full.
    /// The next request asks the store. Returns whether the node held the bucket.
    pub fn forget_held(&self, rule_key: &str, identity: &[u8]) -> bool {
        let rules = self.node.inner.rules.load();
        let Some(rule) = rules.rule(rule_key) else {
            return false;
        };
        let id = BucketId::new(rule, identity);
        if let Ok(key) = id.store_key() {
            // A reset lifts a block too.
            self.node.inner.decider.shared.penalties.forget(&key);
        }
        let local = id.local_key();
        let Some(bucket) = self.node.inner.decider.shared.registry.bucket(&local) else {
            return false;
        };
        // The bucket's actor gives back what the leases hold (a lease granted since the reset
        // is credited, not lost) and forgets the rest; the local stand-ins start full too.
        bucket
            .actor
            .cast(KeyMsg::Forget {
                bucket: bucket.clone(),
            })
            .is_ok()
    }
}

fn invalid(e: tollgate_lease::InvalidInput) -> CounterError {
    CounterError::Key(e.to_string())
}
