//! The node: matches a request against the active rules and decides it, all or nothing.
//!
//! The decision path, for each matched bucket: the local pre-limit (a coarse per-node bucket
//! that rejects floods without touching the store); the lease, taken from one atomic counter
//! with no lock, mailbox hop or store call; a recent denial from the store for what the lease
//! lacks (answered locally for at most a lease TTL). Only when a lease cannot serve the request
//! does it go to the key's actor, which leases more. When the store cannot answer, each rule's
//! fail mode decides (an OPEN rule on a store that is only slow, its last answer). A denied
//! request spends nothing: whatever it took is given back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tollgate_lease::{
    Algorithm, BucketKey, CheckItem, CheckRequest, Limit, SharedClock, SlotRelease, Store,
    StoreError,
};

use crate::metrics::Metrics;
use crate::rules::watch::ActiveRules;
use crate::rules::{CompiledRule, FailMode, Mode, RuleKind};
use crate::runtime::Outcome;
use crate::runtime::attempt::{Attempt, Mark, Taken};
use crate::runtime::breaker::BreakerState;
use crate::runtime::guarded::GuardedStore;
use crate::runtime::keys::bucket::{Bucket, LocalTake, RefillOutcome};
use crate::runtime::keys::messages::{AcquireOutcome, KeyMsg, Want};
use crate::runtime::keys::registry::{Registry, bucket_key};
use crate::runtime::keys::supervisor::{KeySupervisor, SupervisorMsg};
use crate::runtime::local::LocalBucket;
use crate::runtime::matching::{self, Hit, OverrideRules, group_by_identity};
use crate::runtime::request::{Request, RequestError};
use crate::runtime::shared::{RuntimeConfig, Shared};
use crate::runtime::verdict::{Denial, HeldSlot, RuleStatus, Verdict};
use tollgate_regionsync::RegionSync;
use tollgate_regionsync::messages::{ForwardReply, ForwardRequest};

thread_local! {
    /// The registry key of the bucket being looked up: built here, so a lookup allocates nothing.
    static LOOKUP: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A running node. Cheap to clone; every clone is the same node.
#[derive(Debug, Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    rules: Arc<ActiveRules>,
    supervisor: ActorRef<SupervisorMsg>,
    /// Rules made from descriptor limit overrides, held for reuse.
    overrides: OverrideRules,
    /// LOCAL fallback buckets of keys decided without an actor: at most `max_key_actors`,
    /// idle ones swept (see [`Node::fallback_for`]).
    fallbacks: DashMap<Vec<u8>, Fallback>,
    /// Per rule (by uid), the one fallback bucket keys share once `fallbacks` is full.
    overflow: DashMap<u64, Arc<LocalBucket>>,
    /// When `fallbacks` was last swept (node clock, µs).
    fallbacks_swept: std::sync::atomic::AtomicU64,
    stopping: AtomicBool,
    /// How long the decision path waits for an actor: the store budget plus a margin.
    actor_wait: Duration,
}

/// A LOCAL fallback bucket and when it was last used.
#[derive(Debug)]
struct Fallback {
    bucket: Arc<LocalBucket>,
    used: std::sync::atomic::AtomicU64,
}

impl Node {
    /// Starts a node on `store`, deciding with `rules`. `store_timeout` is the store's call
    /// budget (it bounds how long a decision waits for a lease).
    pub async fn start(
        store: Store,
        rules: Arc<ActiveRules>,
        config: RuntimeConfig,
        clock: SharedClock,
        metrics: Arc<Metrics>,
        store_timeout: Duration,
    ) -> Result<Self, ractor::SpawnErr> {
        let shared = Arc::new(Shared {
            store: GuardedStore::new(
                store,
                store_timeout,
                config.lease.patience,
                config.breaker.clone(),
                clock.clone(),
                metrics.clone(),
            ),
            registry: Registry::new(config.max_key_actors),
            clock,
            metrics,
            config,
            region: std::sync::OnceLock::new(),
        });
        let (supervisor, _) = Actor::spawn(None, KeySupervisor, shared.clone()).await?;
        if let Store::Memory(memory) = shared.store.inner() {
            // Sweep expired keys so an in-memory node's memory follows its live keys.
            let memory = memory.clone();
            let handle = supervisor.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(5));
                while handle.get_status() == ractor::ActorStatus::Running {
                    tick.tick().await;
                    memory.purge_expired();
                }
            });
        }
        let overrides = OverrideRules::new(
            shared
                .metrics
                .rule_counters(&crate::rules::set::override_labels()),
        );
        Ok(Node {
            inner: Arc::new(Inner {
                shared,
                rules,
                supervisor,
                overrides,
                fallbacks: DashMap::new(),
                overflow: DashMap::new(),
                fallbacks_swept: std::sync::atomic::AtomicU64::new(0),
                stopping: AtomicBool::new(false),
                actor_wait: store_timeout + Duration::from_millis(20),
            }),
        })
    }

    /// Attaches region sync: consumption of ASYNC_SYNC rules is recorded for the peer and
    /// HOME_REGION decisions are forwarded. Once per node.
    pub fn attach_region(&self, region: Arc<RegionSync>) -> Result<(), Arc<RegionSync>> {
        self.inner.shared.region.set(region)
    }

    /// Region sync, if attached.
    pub fn region(&self) -> Option<&Arc<RegionSync>> {
        self.inner.shared.region.get()
    }

    /// Records units this region's store handed out under a rule that syncs with the peer
    /// region (a lease granted, or a request admitted by a direct store check).
    pub(crate) fn record_consumption(
        &self,
        rule: &CompiledRule,
        identity: &[u8],
        cost: u64,
        now: u64,
    ) {
        if let (Some(region), Some(limit)) = (self.inner.shared.region.get(), rule.limit()) {
            region.record(&rule.key, identity, &limit, cost, now);
        }
    }

    /// Decides one rule for one identity, as the home region of a HOME_REGION rule does for
    /// the peer. None when the rule is unknown here or is not a HOME_REGION rule homed here.
    pub async fn check_rule(&self, rule_key: &str, identity: &[u8], cost: u64) -> Option<Verdict> {
        let rule = self.inner.rules.load().rule(rule_key)?.clone();
        // Only a HOME_REGION rule homed here is the peer's to ask about: any other rule's
        // counter is this region's own (a SPLIT share, an ASYNC_SYNC budget), not the peer's.
        if rule.placement.role != tollgate_regionsync::Role::Home || rule.limit().is_none() {
            return None;
        }
        let hit = Hit {
            descriptor: 0,
            also: vec![],
            rule,
            identity: identity.to_vec(),
            cost,
        };
        Some(self.decide(vec![hit]).await)
    }

    /// A handle region sync calls back into (holding the node weakly).
    pub fn region_host(&self) -> Arc<dyn tollgate_regionsync::RegionHost> {
        Arc::new(RegionHostOf {
            node: Arc::downgrade(&self.inner),
        })
    }

    /// The active rules.
    pub fn rules(&self) -> &Arc<ActiveRules> {
        &self.inner.rules
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.shared.metrics
    }

    /// The store's circuit breaker state: the worst over its shards.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.shared.store.breaker_state()
    }

    /// Each store shard's circuit breaker (those that have seen calls), by shard.
    pub fn breaker_states(&self) -> Vec<(u16, BreakerState)> {
        self.inner.shared.store.breaker_states()
    }

    /// The store (for readiness checks).
    pub fn store(&self) -> &Store {
        self.inner.shared.store.inner()
    }

    /// Rules made from descriptor limit overrides, held for reuse.
    pub fn override_rules(&self) -> usize {
        self.inner.overrides.len()
    }

    /// Key actors alive and buckets held.
    pub fn held(&self) -> (usize, usize) {
        let registry = &self.inner.shared.registry;
        (registry.live_actors(), registry.buckets())
    }

    /// Decides `request` against every rule it matches: all of them admit it, or none spends.
    pub async fn check(&self, request: &Request) -> Result<Verdict, RequestError> {
        request.validate()?;
        let rules = self.inner.rules.load();
        let hits = matching::hits(&rules, request, &self.inner.overrides, self.now())?;
        Ok(self.decide(hits).await)
    }

    /// The buckets of `request`'s matched rules, if every one can be decided by a lease alone.
    pub(crate) async fn leased_buckets(
        &self,
        request: &Request,
    ) -> Option<Vec<(Arc<Bucket>, u64)>> {
        let rules = self.inner.rules.load();
        let hits = matching::hits(&rules, request, &self.inner.overrides, self.now()).ok()?;
        if hits.is_empty() || !hits.iter().all(|h| matching::leasable(&h.rule, h.cost)) {
            return None;
        }
        let mut out = Vec::with_capacity(hits.len());
        for hit in &hits {
            let limit = hit.rule.limit()?;
            out.push((self.bucket(hit, limit).await?, hit.cost));
        }
        Some(out)
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Releases concurrency slots (idempotent). Returns how many were still held.
    pub async fn release_slots(&self, slots: &[HeldSlot]) -> Result<usize, StoreError> {
        let mut by_identity: HashMap<&str, Vec<(BucketKey, tollgate_lease::SlotId)>> =
            HashMap::new();
        for s in slots {
            by_identity
                .entry(s.key.identity_prefix())
                .or_default()
                .push((s.key.clone(), s.slot.clone()));
        }
        let mut released = 0;
        let metrics = &self.inner.shared.metrics;
        for (_, items) in by_identity {
            let req = SlotRelease::of_keys(items)?;
            for held in self.inner.shared.store.release_slots(&req).await? {
                if held {
                    released += 1;
                    metrics.slots_released.inc();
                } else {
                    metrics.slots_release_missed.inc();
                }
            }
        }
        Ok(released)
    }

    /// Stops the node: every key actor returns its unspent leased units to the store, then
    /// stops. Decisions after this are direct store checks (nothing is leased any more).
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        let actors = self.inner.shared.registry.actors();
        let waits = actors.into_iter().map(|actor| async move {
            let _ = actor
                .call(KeyMsg::Shutdown, Some(Duration::from_secs(2)))
                .await;
        });
        futures::future::join_all(waits).await;
        self.inner.supervisor.stop(None);
    }

    fn now(&self) -> u64 {
        self.inner.shared.clock.now_micros()
    }

    async fn decide(&self, hits: Vec<Hit>) -> Verdict {
        let now = self.now();
        let mut attempt = Attempt::new(hits.len());
        let (mut enforce, mut shadow) = (vec![], vec![]);
        let mut blocked = false;
        for (i, hit) in hits.iter().enumerate() {
            match hit.rule.kind {
                RuleKind::Unlimited => {
                    attempt.record(i, hit.admitted(Outcome::Allowed, u64::MAX, Duration::ZERO));
                }
                RuleKind::Block(window) => {
                    let shadowed = hit.rule.mode == Mode::Shadow;
                    let outcome = if shadowed {
                        Outcome::ShadowDenied
                    } else {
                        Outcome::Denied
                    };
                    blocked |= !shadowed;
                    attempt.record(
                        i,
                        hit.denied(outcome, Denial::Blocked, Duration::ZERO, window),
                    );
                }
                RuleKind::Limited(_) if hit.rule.mode == Mode::Shadow => shadow.push(i),
                RuleKind::Limited(_) => enforce.push(i),
            }
        }
        let start = attempt.mark();
        let allowed = !blocked && self.reserve(&hits, &enforce, &mut attempt, now).await;
        if !allowed {
            self.roll_back(&mut attempt, start);
        } else {
            for i in shadow {
                let mark = attempt.mark();
                if !self.reserve(&hits, &[i], &mut attempt, now).await {
                    self.roll_back(&mut attempt, mark);
                    if let Some(s) = attempt.status_mut(i) {
                        s.outcome = Some(Outcome::ShadowDenied);
                    }
                }
            }
        }
        let (statuses, slots) = attempt.finish();
        let statuses: Vec<RuleStatus> = statuses
            .into_iter()
            .zip(&hits)
            .map(|(s, hit)| s.unwrap_or_else(|| hit.unevaluated()))
            .collect();
        for s in &statuses {
            let counted = match s.outcome {
                // Rules that admitted a request another rule denied are not counted as allowing.
                Some(Outcome::Allowed) if !allowed => None,
                other => other,
            };
            if let Some(outcome) = counted {
                s.rule.counters.get(outcome).inc();
                if outcome == Outcome::ShadowDenied {
                    tracing::debug!(rule = %s.rule.id, "a SHADOW rule would have denied");
                }
            }
        }
        let mut verdict = Verdict {
            allowed,
            retry_after: Duration::ZERO,
            statuses,
            slots,
        };
        if !allowed && verdict.denial().is_some_and(Denial::retryable) {
            // The request fits when every denying rule has room: the longest wait.
            verdict.retry_after = verdict
                .statuses
                .iter()
                .filter(|s| s.denies())
                .map(|s| s.retry_after)
                .max()
                .unwrap_or_default();
        }
        verdict
    }

    /// Reserves every hit in `indices`, or returns false having filled the status of the hit
    /// that denied (what was reserved stays in `attempt` for the caller to roll back). Hits of
    /// HOME_REGION rules homed in the peer region are decided there, after the local ones
    /// (what the home region admits cannot be given back); when it cannot answer, here.
    async fn reserve(
        &self,
        hits: &[Hit],
        indices: &[usize],
        attempt: &mut Attempt,
        now: u64,
    ) -> bool {
        let Some(region) = self.inner.shared.region.get() else {
            return self.reserve_local(hits, indices, attempt, now).await;
        };
        let (forwarded, local): (Vec<usize>, Vec<usize>) = indices
            .iter()
            .partition(|&&i| hits[i].rule.forwarded() && hits[i].cost > 0);
        if !self.reserve_local(hits, &local, attempt, now).await {
            return false;
        }
        let mut unanswered = vec![];
        for i in forwarded {
            let hit = &hits[i];
            match region.forward(&hit.rule.key, &hit.identity, hit.cost).await {
                Some(reply) => {
                    // The home region decided on the whole limit: the answer is measured
                    // against it, not against this region's fallback share.
                    let mut status = if reply.allowed {
                        hit.admitted(Outcome::Allowed, reply.remaining, Duration::ZERO)
                    } else {
                        hit.denied(
                            Outcome::Denied,
                            Denial::OverLimit,
                            Duration::from_micros(reply.retry_after_us),
                            Duration::ZERO,
                        )
                    };
                    status.limit = hit.rule.whole;
                    status.reset_after = Duration::from_micros(reply.reset_after_us);
                    attempt.record(i, status);
                    if !reply.allowed {
                        return false;
                    }
                }
                None => unanswered.push(i),
            }
        }
        unanswered.is_empty() || self.reserve_local(hits, &unanswered, attempt, now).await
    }

    /// [`Node::reserve`] for hits decided on this region's store.
    async fn reserve_local(
        &self,
        hits: &[Hit],
        indices: &[usize],
        attempt: &mut Attempt,
        now: u64,
    ) -> bool {
        let shared = &self.inner.shared;
        let mut slow: Vec<(usize, Arc<Bucket>)> = vec![];
        let mut direct: Vec<usize> = vec![];
        for &i in indices {
            let hit = &hits[i];
            let Some(limit) = hit.rule.limit() else {
                continue;
            };
            if hit.cost > limit.capacity() {
                // Can never fit: refused as such, without asking anyone.
                attempt.record(
                    i,
                    hit.denied(
                        Outcome::Denied,
                        Denial::CostExceedsLimit,
                        Duration::ZERO,
                        Duration::ZERO,
                    ),
                );
                return false;
            }
            // Peeks and concurrency slots are store checks; so is everything while stopping.
            if hit.cost == 0
                || limit.algorithm() == Algorithm::Concurrency
                || self.inner.stopping.load(Ordering::Acquire)
            {
                direct.push(i);
                continue;
            }
            let Some(bucket) = self.bucket(hit, limit).await else {
                direct.push(i);
                continue;
            };
            let refill = |granted, left| shared.config.lease.should_refill(granted, left);
            match bucket.take_local(hit.cost, now, refill) {
                LocalTake::Took => {
                    shared.metrics.lease_hits.inc();
                    if bucket.prelimit.is_some() {
                        attempt.took(Taken::Prelimit(bucket.clone(), hit.cost));
                    }
                    attempt.took(Taken::Lease(bucket.clone(), hit.cost));
                    attempt.record(i, hit.leased(&bucket, now));
                    continue;
                }
                LocalTake::Prelimited(wait) => {
                    shared.metrics.prelimit_denied.inc();
                    let wait = wait.max(self.store_wait(&bucket, hit.cost, now, wait).await);
                    attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                    return false;
                }
                // The store said it has no room for what the lease lacks: answered here.
                LocalTake::Denied(wait) => {
                    attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                    return false;
                }
                LocalTake::Dry => {
                    if bucket.prelimit.is_some() {
                        attempt.took(Taken::Prelimit(bucket.clone(), hit.cost));
                    }
                }
            }
            // The lease ran dry: wait for the refill that is on its way (or queue one).
            shared.metrics.lease_waits.inc();
            let clock = &shared.clock;
            match bucket
                .take_after_refill(hit.cost, self.inner.actor_wait, || clock.now_micros())
                .await
            {
                RefillOutcome::Took => {
                    shared.metrics.lease_hits.inc();
                    attempt.took(Taken::Lease(bucket.clone(), hit.cost));
                    attempt.record(i, hit.leased(&bucket, now));
                }
                RefillOutcome::Denied(wait) => {
                    attempt.record(i, hit.over_limit(wait, bucket.reset_after(now)));
                    return false;
                }
                RefillOutcome::Failed { late } => {
                    let error = if late {
                        StoreError::Timeout {
                            budget: shared.store.budget(),
                        }
                    } else {
                        StoreError::Unavailable("the lease refill failed".into())
                    };
                    if !self.fail_mode(i, hit, Some(&bucket), &error, attempt) {
                        return false;
                    }
                }
                RefillOutcome::Missed => slow.push((i, bucket)),
            }
        }
        // Per identity, one actor call for every bucket that needs the store.
        while !slow.is_empty() {
            let actor = slow[0].1.actor.clone();
            let (group, rest): (Vec<_>, Vec<_>) = slow
                .into_iter()
                .partition(|(_, b)| b.actor.get_id() == actor.get_id());
            slow = rest;
            shared.metrics.lease_misses.inc_by(group.len() as u64);
            let wants: Vec<Want> = group
                .iter()
                .map(|(i, b)| Want {
                    bucket: b.clone(),
                    cost: hits[*i].cost,
                })
                .collect();
            let outcome = match actor
                .call(
                    |reply| KeyMsg::Acquire { wants, reply },
                    Some(self.inner.actor_wait),
                )
                .await
            {
                Ok(CallResult::Success(outcome)) => outcome,
                Ok(CallResult::Timeout) => AcquireOutcome::Failed(StoreError::Timeout {
                    budget: self.inner.actor_wait,
                }),
                Ok(CallResult::SenderError) | Err(_) => {
                    // The actor stopped (idle) after the bucket was looked up: forget it and
                    // decide these directly.
                    for (i, b) in &group {
                        shared
                            .registry
                            .remove_bucket(&bucket_key(b.rule.uid, &hits[*i].identity));
                        direct.push(*i);
                    }
                    continue;
                }
            };
            match outcome {
                AcquireOutcome::Reserved => {
                    let now = self.now();
                    for (i, b) in &group {
                        attempt.took(Taken::Lease(b.clone(), hits[*i].cost));
                        attempt.record(*i, hits[*i].leased(b, now));
                    }
                }
                AcquireOutcome::Denied { index, retry_after } => {
                    let (i, b) = &group[index];
                    attempt.record(
                        *i,
                        hits[*i].over_limit(retry_after, b.reset_after(self.now())),
                    );
                    return false;
                }
                AcquireOutcome::Failed(error) => {
                    for (i, b) in &group {
                        if !self.fail_mode(*i, &hits[*i], Some(b), &error, attempt) {
                            return false;
                        }
                    }
                }
            }
        }
        // Peeks, slots, and buckets without an actor (cap reached, or shutting down): a direct
        // check per identity, all or nothing within it.
        for group in group_by_identity(hits, &direct) {
            if !self.check_directly(hits, &group, attempt).await {
                return false;
            }
        }
        true
    }

    /// Decides hits by one store check (their buckets share an identity; a request charges a
    /// bucket once, so each bucket is one item).
    async fn check_directly(&self, hits: &[Hit], group: &[usize], attempt: &mut Attempt) -> bool {
        let mut items: Vec<CheckItem> = vec![];
        let mut item_of = Vec::with_capacity(group.len());
        for &i in group {
            let hit = &hits[i];
            let (Some(limit), Ok(key)) = (
                hit.rule.limit(),
                BucketKey::new(&hit.identity, &hit.rule.key),
            ) else {
                item_of.push(None);
                continue;
            };
            item_of.push(Some(items.len()));
            items.push(CheckItem {
                key,
                limit,
                cost: hit.cost,
            });
        }
        let request = match CheckRequest::new(items.clone()) {
            Ok(r) => r,
            Err(e) => {
                // Only a cost above a bucket's capacity is refused here: it can never fit.
                tracing::debug!(error = %e, "a request cannot be admitted");
                let i = group[0];
                attempt.record(
                    i,
                    hits[i].denied(
                        Outcome::Denied,
                        Denial::CostExceedsLimit,
                        Duration::ZERO,
                        Duration::ZERO,
                    ),
                );
                return false;
            }
        };
        match self.inner.shared.store.check(&request).await {
            Ok(outcome) => {
                let allowed = outcome.allowed();
                for (&i, at) in group.iter().zip(item_of) {
                    let Some(at) = at else { continue };
                    let b = &outcome.buckets[at];
                    attempt.record(
                        i,
                        if b.allowed {
                            hits[i].admitted(Outcome::Allowed, b.remaining, b.reset_after)
                        } else {
                            hits[i].over_limit(b.retry_after, b.reset_after)
                        },
                    );
                }
                if allowed {
                    // What the store admitted directly is this region's consumption.
                    let now = self.now();
                    for &i in group {
                        if hits[i].rule.synced() {
                            self.record_consumption(
                                &hits[i].rule,
                                &hits[i].identity,
                                hits[i].cost,
                                now,
                            );
                        }
                    }
                    for (item, b) in items.iter().zip(outcome.buckets) {
                        if let Some(slot) = b.slot {
                            self.inner.shared.metrics.slots_taken.inc();
                            attempt.took(Taken::Slot(HeldSlot {
                                key: item.key.clone(),
                                slot,
                            }));
                        }
                    }
                }
                allowed
            }
            Err(error) => group
                .iter()
                .all(|&i| self.fail_mode(i, &hits[i], None, &error, attempt)),
        }
    }

    /// When the store can admit `cost` of `bucket`, as far as a retry after `at_least` is
    /// concerned: the retry of a request the pre-limit denied must find room in the store
    /// too. Known from a recent denial, else asked with a peek for what the units held at
    /// retry time leave; the answer is kept (a denial until it ends, room for the wait), so a
    /// flood past the pre-limit stays off the store. Zero when the store has room or cannot
    /// say.
    async fn store_wait(
        &self,
        bucket: &Bucket,
        cost: u64,
        now: u64,
        at_least: Duration,
    ) -> Duration {
        let after = |wait: Duration| now + wait.max(at_least).as_micros() as u64;
        // What the store must provide at the retry: the cost less the units held then.
        let need = cost.saturating_sub(bucket.held_at(after(Duration::ZERO)));
        let wait = self
            .store_wait_for(bucket, need, after(Duration::ZERO), now)
            .await;
        if need < cost && bucket.held_at(after(wait)) < cost - need {
            // The held units die (with their window) before that retry: it needs all of it.
            return self.store_wait_for(bucket, cost, after(wait), now).await;
        }
        wait
    }

    /// When the store has room for `need` of `bucket`: from a recent denial, else a peek
    /// (whose answer is kept: a denial until it ends, room until `retry_at`).
    async fn store_wait_for(
        &self,
        bucket: &Bucket,
        need: u64,
        retry_at: u64,
        now: u64,
    ) -> Duration {
        if let Some(wait) = bucket.store_denies(need, now) {
            return wait;
        }
        if need == 0 || bucket.room_seen(need, now) {
            return Duration::ZERO;
        }
        let Ok(peek) = CheckRequest::single(bucket.key.clone(), bucket.limit, need) else {
            return Duration::ZERO;
        };
        match self.inner.shared.store.check(&peek.peek()).await {
            Ok(outcome) if outcome.allowed() => {
                bucket.saw_room(need, retry_at);
                Duration::ZERO
            }
            Ok(outcome) => {
                let retry = outcome.buckets[0].retry_after;
                bucket.deny_until(need, retry, self.inner.shared.config.lease.ttl, now);
                retry
            }
            Err(_) => Duration::ZERO,
        }
    }

    /// How long a request that failed closed should wait: until the breaker of its shard lets
    /// the node try the store again, and at least a second (headers carry whole seconds).
    fn store_retry(&self, hit: &Hit, now: u64) -> Duration {
        let state = BucketKey::new(&hit.identity, &hit.rule.key)
            .map(|key| self.inner.shared.store.breaker_state_of(&key))
            .unwrap_or(BreakerState::Closed);
        let probe = match state {
            BreakerState::Open { until } => Duration::from_micros(until.saturating_sub(now)),
            _ => Duration::ZERO,
        };
        probe.max(Duration::from_secs(1))
    }

    /// Decides a hit the store could not answer in time; false if it denies. Under an OPEN
    /// rule, a store that is only slow (a timeout) and answered this bucket recently is
    /// believed: its last answer decides (see [`Bucket::decide_while_slow`]), rather than
    /// admitting everything. Otherwise the rule's fail mode decides: CLOSED denies, LOCAL
    /// takes its local share.
    fn fail_mode(
        &self,
        index: usize,
        hit: &Hit,
        bucket: Option<&Arc<Bucket>>,
        error: &StoreError,
        attempt: &mut Attempt,
    ) -> bool {
        let now = self.now();
        if hit.rule.fail_mode == FailMode::Open
            && matches!(error, StoreError::Timeout { .. })
            && let Some(bucket) = bucket
            && let Some(decision) = bucket.decide_while_slow(hit.cost, now)
        {
            self.inner.shared.metrics.slow_store_decisions.inc();
            let status = match decision {
                Ok(()) => {
                    attempt.took(Taken::Owed(bucket.clone(), hit.cost));
                    hit.admitted(
                        Outcome::Allowed,
                        bucket.remaining(now),
                        bucket.reset_after(now),
                    )
                }
                Err(wait) => hit.over_limit(wait, bucket.reset_after(now)),
            };
            let allowed = status.allowed;
            attempt.record(index, status);
            return allowed;
        }
        let status = match hit.rule.fail_mode {
            FailMode::Open => hit.admitted(Outcome::FailedOpen, 0, Duration::ZERO),
            FailMode::Closed => hit.denied(
                Outcome::FailedClosed,
                Denial::StoreUnavailable,
                self.store_retry(hit, now),
                Duration::ZERO,
            ),
            FailMode::Local => match bucket
                .map(|b| b.fallback.clone())
                .or_else(|| self.fallback_for(hit))
            {
                Some(local) => match local.take(hit.cost, now) {
                    Ok(()) => {
                        attempt.took(Taken::Fallback(local, hit.cost));
                        hit.admitted(Outcome::LocalFallback, 0, Duration::ZERO)
                    }
                    Err(wait) => hit.denied(
                        Outcome::LocalFallback,
                        Denial::OverLimit,
                        wait,
                        Duration::ZERO,
                    ),
                },
                // A rule without a limit has nothing to fall back to.
                None => hit.admitted(Outcome::FailedOpen, 0, Duration::ZERO),
            },
        };
        tracing::debug!(rule = %hit.rule.id, %error, outcome = ?status.outcome, "store failed; the rule's fail mode decided");
        let allowed = status.allowed;
        if allowed && let Some(bucket) = bucket {
            // The bucket's next grant pays for this (given back if the request is denied).
            bucket.admitted_without_store(hit.cost);
            attempt.took(Taken::Owed(bucket.clone(), hit.cost));
        }
        attempt.record(index, status);
        allowed
    }

    /// The bucket for a hit, creating it (and its key's actor) on first use. None when the
    /// actor cap is reached: the hit is then decided directly.
    async fn bucket(&self, hit: &Hit, limit: Limit) -> Option<Arc<Bucket>> {
        let shared = &self.inner.shared;
        if let Some(bucket) = LOOKUP.with_borrow_mut(|key| {
            key.clear();
            key.extend_from_slice(&hit.rule.uid.to_le_bytes());
            key.extend_from_slice(&hit.identity);
            shared.registry.bucket(key)
        }) {
            return Some(bucket);
        }
        let key = bucket_key(hit.rule.uid, &hit.identity);
        let store_key = BucketKey::new(&hit.identity, &hit.rule.key).ok()?;
        let actor = match shared.registry.actor(&hit.identity) {
            // The identity's actor serves this bucket too (and settles what an older
            // definition of the rule holds before it leases).
            Some(actor) => actor,
            None => {
                // A key that does not come back within a lease lifetime is not worth an
                // actor: its decision is a store check, as its one-unit lease would be.
                let within = shared.config.lease.ttl.as_micros() as u64;
                if !shared.registry.seen_again(&key, self.now(), within) {
                    return None;
                }
                if !shared.registry.reserve_actor() {
                    shared.metrics.key_actors_refused.inc();
                    return None;
                }
                let spawned = self
                    .inner
                    .supervisor
                    .call(
                        |reply| SupervisorMsg::Spawn {
                            identity: hit.identity.clone(),
                            reply,
                        },
                        Some(Duration::from_secs(1)),
                    )
                    .await;
                let Ok(CallResult::Success(Some(actor))) = spawned else {
                    shared.registry.unreserve_actor();
                    return None;
                };
                let kept = shared
                    .registry
                    .insert_actor(hit.identity.clone(), actor.clone());
                if kept.get_id() != actor.get_id() {
                    // Another request spawned this identity's actor first.
                    actor.stop(None);
                    shared.registry.unreserve_actor();
                }
                kept
            }
        };
        // The LOCAL fail mode's count the key had without a bucket carries over.
        let fallback = match self.inner.fallbacks.remove(&key) {
            Some((_, kept)) => kept.bucket,
            None => Arc::new(LocalBucket::for_limit(
                &limit,
                1.0 / f64::from(shared.config.cluster_nodes.max(1)),
            )),
        };
        let bucket = Arc::new(Bucket::new(
            store_key,
            hit.rule.clone(),
            limit,
            actor,
            shared.config.prelimit_factor,
            fallback,
        ));
        Some(shared.registry.insert_bucket(key, bucket))
    }

    /// The LOCAL fallback bucket of a key that has no bucket on this node. They are bounded
    /// like the actors: when the map is full, buckets idle for `idle_timeout` are swept (at most
    /// once a second), as an actor's would be; if it is still full, the key shares its rule's
    /// overflow bucket with the other keys past the cap, so the rule still limits (it never
    /// fails open for want of room).
    fn fallback_for(&self, hit: &Hit) -> Option<Arc<LocalBucket>> {
        let limit = hit.rule.limit()?;
        let inner = &self.inner;
        let now = self.now();
        let key = bucket_key(hit.rule.uid, &hit.identity);
        if let Some(found) = inner.fallbacks.get(&key) {
            found.used.store(now, Ordering::Relaxed);
            return Some(found.bucket.clone());
        }
        let nodes = f64::from(inner.shared.config.cluster_nodes.max(1));
        let fresh = || Arc::new(LocalBucket::for_limit(&limit, 1.0 / nodes));
        let cap = inner.shared.config.max_key_actors;
        if inner.fallbacks.len() >= cap {
            let last = inner.fallbacks_swept.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= 1_000_000
                && inner
                    .fallbacks_swept
                    .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                let idle = inner.shared.config.idle_timeout.as_micros() as u64;
                inner
                    .fallbacks
                    .retain(|_, f| now.saturating_sub(f.used.load(Ordering::Relaxed)) < idle);
            }
            if inner.fallbacks.len() >= cap {
                return Some(
                    inner
                        .overflow
                        .entry(hit.rule.uid)
                        .or_insert_with(fresh)
                        .clone(),
                );
            }
        }
        let entry = inner.fallbacks.entry(key).or_insert_with(|| Fallback {
            bucket: fresh(),
            used: std::sync::atomic::AtomicU64::new(now),
        });
        Some(entry.bucket.clone())
    }

    /// LOCAL fallback buckets held for keys without an actor, and overflow buckets (per rule).
    pub fn fallback_buckets(&self) -> (usize, usize) {
        (self.inner.fallbacks.len(), self.inner.overflow.len())
    }

    /// Gives back what `attempt` took since `mark`; its slots are released in the store in
    /// the background.
    fn roll_back(&self, attempt: &mut Attempt, mark: Mark) {
        let slots = attempt.roll_back_to(mark);
        if !slots.is_empty() {
            let node = self.clone();
            tokio::spawn(async move {
                let _ = node.release_slots(&slots).await;
            });
        }
    }
}

/// What region sync calls back into: the node's rules and decisions.
struct RegionHostOf {
    node: std::sync::Weak<Inner>,
}

impl tollgate_regionsync::RegionHost for RegionHostOf {
    fn synced_limit(&self, rule: &str) -> Option<Limit> {
        let inner = self.node.upgrade()?;
        let rules = inner.rules.load();
        let rule = rules.rule(rule)?;
        if rule.synced() { rule.limit() } else { None }
    }

    fn decide_forwarded(
        &self,
        request: ForwardRequest,
    ) -> futures::future::BoxFuture<'static, Result<ForwardReply, String>> {
        let node = self.node.upgrade().map(|inner| Node { inner });
        Box::pin(async move {
            let node = node.ok_or("the node is stopping")?;
            let verdict = node
                .check_rule(&request.rule, &request.identity, request.cost)
                .await
                .ok_or_else(|| format!("rule {:?} is not held in this region", request.rule))?;
            let status = verdict.statuses.first().ok_or("no decision")?;
            // The rule's own answer: a SHADOW rule that would deny says so (the asking
            // region's decision path then counts it without blocking).
            Ok(ForwardReply {
                allowed: status.allowed,
                remaining: status.remaining,
                retry_after_us: verdict.retry_after.as_micros() as u64,
                reset_after_us: status.reset_after.as_micros() as u64,
            })
        })
    }
}
