//! The node: matches a request against the active rules and decides it, all or nothing.
//!
//! The decision path, for each matched bucket: the local pre-limit (a coarse per-node bucket
//! that rejects floods without touching the store); the lease, taken from one atomic counter
//! with no lock, mailbox hop or store call; a recent denial from the store for what the lease
//! lacks (answered locally for at most a lease TTL). Only when a lease cannot serve the request
//! does it go to the key's actor, which leases more. When the store cannot answer, each rule's
//! fail mode decides (an OPEN rule on a store that is only slow, its last answer). A denied
//! request spends nothing: whatever it took is given back.
//!
//! - this file: the node, starting it, `check` (validate, match, decide), buckets and actors
//!   made on demand, rolling an attempt back;
//! - `node/reserve.rs`: a request's buckets, one by one (region forwarding first, then the lease
//!   path, refills waited for, one actor call per identity);
//! - `node/direct.rs`: store checks without a lease (keys without a bucket, peeks, slots) and the
//!   store's word behind a pre-limit denial;
//! - `node/operator.rs`: the operator's face (`node.operator()`: counters, resets, lifts);
//! - `node/reservations.rs`: reserve and settle;
//! - `node/store_view.rs`: the store as the node sees it (`node.store()`: breakers, shards,
//!   the last answer's age, a cluster's settings);
//! - `node/region.rs`: the node's side of region sync;
//! - `../fail_modes.rs` (beside this file): what each rule does when the store cannot answer.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorRef};
use tollgate_lease::{BucketKey, Limit, SharedClock, SlotRelease, SlotRenew, Store, StoreError};

use crate::metrics::Metrics;
use crate::rules::watch::ActiveRules;
use crate::rules::{Mode, RuleKind};
use crate::runtime::attempt::{Attempt, Mark};
use crate::runtime::fallbacks::Fallbacks;
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::keys::bucket::KeyMsg;
use crate::runtime::keys::registry::Registry;
use crate::runtime::keys::supervisor::{KeySupervisor, SupervisorMsg};
use crate::runtime::matching::{self, Charge, Hit, OverrideRules};
use crate::runtime::outcome::Outcome;
use crate::runtime::request::{Request, RequestError};
use crate::runtime::shared::{RuntimeConfig, Shared, WarmUp};
use crate::runtime::store_health::debts::Debts;
use crate::runtime::store_health::guarded::GuardedStore;
use crate::runtime::top_denied::TopDenied;
use crate::runtime::verdict::{Denial, HeldSlot, RuleStatus, Verdict};

pub mod operator;
pub mod store_view;

mod direct;
pub(crate) mod region;
pub mod reservations;
mod reserve;

/// How the decision path reaches a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route<'a> {
    /// The node's lease where it has one, else the store: a request's path.
    Fastest,
    /// The store itself, waiting through a stall: a draw of many units at once, which a
    /// lease would not hold and no request waits on.
    Store,
    /// The store itself, recording a reservation of the request's cost (a request's path:
    /// its denials count towards penalties, its blocks deny it).
    Reserve(&'a tollgate_lease::Reserve),
}

impl Route<'_> {
    /// Whether a client's request is decided (not a draw).
    fn is_request(self) -> bool {
        matches!(self, Route::Fastest | Route::Reserve(_))
    }

    /// Whether the store decides, not a lease.
    fn to_store(self) -> bool {
        matches!(self, Route::Store | Route::Reserve(_))
    }
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
    /// LOCAL fallback buckets of keys decided without an actor (an eighth of the key state
    /// budget).
    fallbacks: Fallbacks,
    stopping: AtomicBool,
    /// The most-denied keys, per rule and overall.
    top_denied: TopDenied,
    /// How long the decision path waits for an actor: the store patience plus a margin (the
    /// actor answers the requests that do not wait through a late call when it is judged).
    actor_wait: Duration,
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
                config.store_patience,
                config.breaker.clone(),
                clock.clone(),
                metrics.clone(),
                config.seed,
            ),
            // Seven eighths of the budget: the LOCAL fallbacks hold the rest.
            registry: Registry::new(config.max_key_state_bytes - config.max_key_state_bytes / 8),
            clock,
            metrics,
            debts: Debts::new(config.seed),
            config,
            region: std::sync::OnceLock::new(),
            warm_up: std::sync::OnceLock::new(),
            penalties: Default::default(),
        });
        let fallbacks = Fallbacks::new(shared.config.max_key_state_bytes / 8);
        let (supervisor, _) = Actor::spawn(None, KeySupervisor, shared.clone()).await?;
        if let Some(memory) = shared.store.memory() {
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
        if let Some(every) = shared.config.store_heartbeat {
            // An outage shows, and ends, at any traffic (`GuardedStore::heartbeat`).
            let shared = shared.clone();
            let handle = supervisor.clone();
            tokio::spawn(async move {
                // Until the supervisor stops (not "while it runs": it may still be starting
                // when this task first looks, and the heartbeat would never beat).
                shared
                    .store
                    .heartbeat(every, || {
                        !matches!(
                            handle.get_status(),
                            ractor::ActorStatus::Stopping | ractor::ActorStatus::Stopped
                        )
                    })
                    .await;
            });
        }
        let top_denied = TopDenied::new(shared.config.top_denied.clone());
        let overrides = OverrideRules::new(
            shared
                .metrics
                .rule_counters(&crate::rules::set::override_labels()),
        );
        let actor_wait =
            shared.config.store_patience.max(store_timeout) + Duration::from_millis(20);
        Ok(Node {
            inner: Arc::new(Inner {
                shared,
                rules,
                supervisor,
                overrides,
                fallbacks,
                stopping: AtomicBool::new(false),
                top_denied,
                actor_wait,
            }),
        })
    }

    /// Warms the store up before the node serves: connected (every shard of a cluster),
    /// scripts loaded, one round trip, waiting up to the start-up patience. A store that does
    /// not answer by then does not stop the node: it serves by its rules' fail modes, says so
    /// in its log and in `/readyz`, and connects in the background. Once per node.
    pub async fn warm_up(&self) -> WarmUp {
        let shared = &self.inner.shared;
        if let Some(done) = shared.warm_up.get() {
            return done.clone();
        }
        let patience = shared.config.startup_patience;
        let start = tokio::time::Instant::now();
        let outcome = match shared.store.warm_up(patience).await {
            Ok(()) => {
                let took = start.elapsed();
                tracing::info!(took_ms = took.as_millis() as u64, "the store answers");
                WarmUp::Answered(took)
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    patience_ms = patience.as_millis() as u64,
                    "the store did not answer within the start-up patience: serving anyway, \
                     deciding by each rule's fail mode until it does"
                );
                WarmUp::Unanswered(e.to_string())
            }
        };
        shared.warm_up.get_or_init(|| outcome).clone()
    }

    /// LOCAL fallback buckets held for keys without an actor, and overflow buckets (per rule).
    pub fn fallback_buckets(&self) -> (usize, usize) {
        self.inner.fallbacks.counts()
    }

    /// The active rules.
    pub fn rules(&self) -> &Arc<ActiveRules> {
        &self.inner.rules
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.shared.metrics
    }

    /// The node clock's now (µs), against which [`store_view::StoreView::shards`]' times are
    /// read.
    pub fn now_micros(&self) -> tollgate_lease::Micros {
        self.inner.shared.clock.now_micros()
    }

    /// Rules made from descriptor limit overrides, held for reuse.
    pub fn override_rules(&self) -> usize {
        self.inner.overrides.len()
    }

    /// Brings the metrics read from their owners up to date: the memory figures (the registry,
    /// the fallbacks, the in-memory store) and the store's batching.
    pub fn refresh_figures(&self) {
        let shared = &self.inner.shared;
        let metrics = &shared.metrics;
        let _one_at_a_time = metrics.refreshing.lock();
        let key_state = shared.registry.bytes() + self.inner.fallbacks.bytes();
        if let Some(settings) = shared.store.cluster_settings() {
            use tollgate_lease::redis::ClusterSettings;
            metrics
                .store_cluster_full_coverage_required
                .set(match settings {
                    ClusterSettings::Read {
                        require_full_coverage,
                        ..
                    } => i64::from(require_full_coverage),
                    ClusterSettings::Unreadable(_) => -1,
                });
        }
        let health = shared.store.shard_health();
        metrics
            .store_answering
            .set(i64::from(health.iter().all(|s| s.answering())));
        let oldest = self.store().last_answer_age().unwrap_or_default();
        metrics
            .store_last_answer_age_seconds
            .set(oldest.as_secs_f64());
        metrics.key_state_bytes.set(key_state as i64);
        if let Some(memory) = shared.store.memory() {
            metrics.memory_store_bytes.set(memory.bytes() as i64);
            metrics.memory_store_keys.set(memory.len() as i64);
            let evicted = memory.evictions();
            let counted = metrics.memory_store_evictions.get();
            metrics
                .memory_store_evictions
                .inc_by(evicted.saturating_sub(counted));
        }
        if let Some(counts) = shared.store.batch_counts() {
            let catch_up = |counter: &prometheus_client::metrics::counter::Counter, to: u64| {
                counter.inc_by(to.saturating_sub(counter.get()));
            };
            catch_up(&metrics.store_batches, counts.batches);
            catch_up(&metrics.store_batched_requests, counts.batched_requests);
        }
    }

    /// Key actors alive and buckets held.
    pub fn held(&self) -> (usize, usize) {
        let registry = &self.inner.shared.registry;
        (registry.live_actors(), registry.buckets())
    }

    /// Decides `request` against every rule it matches: all of them admit it, or none spends.
    pub async fn check(&self, request: &Request) -> Result<Verdict, RequestError> {
        request.validate()?;
        if !self.inner.shared.config.descriptor_overrides
            && let Some(index) = request.descriptors.iter().position(|d| d.limit.is_some())
        {
            return Err(RequestError::OverrideRefused { index });
        }
        let rules = self.inner.rules.load();
        // One clock read for matching and deciding: the decision is made at the instant
        // its rules were matched.
        let now = self.now();
        let hits = matching::hits(&rules, request, &self.inner.overrides, now)?;
        if hits.is_empty() {
            self.inner.shared.metrics.requests_unmatched.inc();
        }
        self.note_long_identities(&hits, &request.domain);
        Ok(self.decide_at(hits, Route::Fastest, now).await)
    }

    /// What the fail policy decides for each rule `request` matches, had the store not
    /// answered for `cause` (the buckets this node holds for them, if any, taken into account):
    /// the statuses and what was taken, nothing given back. For the policy's table test.
    #[cfg(test)]
    pub(crate) fn decide_without_store(
        &self,
        request: &Request,
        cause: crate::runtime::fail_modes::Cause,
    ) -> Vec<(RuleStatus, Vec<crate::runtime::attempt::Taken>)> {
        let rules = self.inner.rules.load();
        let now = self.now();
        let hits = matching::hits(&rules, request, &self.inner.overrides, now).expect("valid");
        hits.iter()
            .map(|hit| {
                let bucket = self
                    .inner
                    .shared
                    .registry
                    .bucket(&hit.bucket_id().local_key());
                crate::runtime::fail_modes::decide(
                    &self.inner.shared,
                    &self.inner.fallbacks,
                    hit,
                    bucket.as_ref(),
                    cause,
                    now,
                )
            })
            .collect()
    }

    /// Counts (and now and then logs) the buckets of a request keyed by a digest: their
    /// identity was longer than [`crate::rules::identity::MAX_LITERAL_IDENTITY_BYTES`].
    pub(crate) fn note_long_identities(&self, hits: &[Hit], domain: &str) {
        let long = hits
            .iter()
            .filter(|h| crate::rules::identity::is_digest(&h.identity))
            .count();
        self.inner.shared.metrics.client_input.note(
            crate::metrics::client_input::Adjustment::LongIdentity,
            long as u64,
            domain,
        );
    }

    /// What `request` would be charged, without deciding it: each matched rule with the
    /// identity of its bucket and the cost it takes (for explaining a decision, and for the
    /// simulations' exact bounds).
    pub fn charges(&self, request: &Request) -> Result<Vec<Charge>, RequestError> {
        request.validate()?;
        let rules = self.inner.rules.load();
        let hits = matching::hits(&rules, request, &self.inner.overrides, self.now())?;
        Ok(hits
            .into_iter()
            .map(|h| Charge {
                rule: h.rule,
                identity: h.identity,
                cost: h.cost,
            })
            .collect())
    }

    /// Takes `units` from one charge's bucket, all or nothing, in the store itself (no lease,
    /// no memory of a recent denial: a refused draw of many units says nothing about a smaller
    /// one), with the rule's region placement and fail mode: how a quota handed to someone
    /// else (an RLQS Envoy's share) is paid for out of the same limit every other caller draws
    /// from. Off any request's path, a draw waits through a stalled store; only a store that
    /// is down brings in the fail mode. A refused draw's status says what the store holds
    /// (`remaining`), so that a smaller draw can take it.
    pub async fn draw(&self, charge: &Charge, units: u64) -> Verdict {
        let hit = Hit {
            descriptor: 0,
            also: vec![],
            rule: charge.rule.clone(),
            identity: charge.identity.clone(),
            cost: units,
        };
        self.decide(vec![hit], Route::Store).await
    }

    /// The buckets of `request`'s matched rules, if every one can be decided by a lease alone,
    /// with the cost and, for an ASYNC_SYNC bucket, the identity its demand is reported under.
    pub(crate) async fn leased_buckets(
        &self,
        request: &Request,
    ) -> Option<Vec<(Arc<Bucket>, u64, Option<Vec<u8>>)>> {
        let rules = self.inner.rules.load();
        let now = self.now();
        let hits = matching::hits(&rules, request, &self.inner.overrides, now).ok()?;
        // A rule with a penalty counts its denials and knows its blocks: the full path.
        if hits.is_empty()
            || !hits
                .iter()
                .all(|h| matching::leasable(&h.rule, h.cost) && h.rule.penalty.is_none())
        {
            return None;
        }
        let mut out = Vec::with_capacity(hits.len());
        for hit in &hits {
            let limit = hit.rule.limit()?;
            out.push((
                self.keys()
                    .bucket(&hit.rule, &hit.identity, limit, now)
                    .await?,
                hit.cost,
                // The identity of a bucket whose demand goes to the peer region.
                hit.rule.synced().then(|| hit.identity.clone()),
            ));
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

    /// Renews concurrency slots a request still running holds, for their rule's slot TTL from
    /// now (a request that runs past the TTL would lose its slot to another). Returns how many
    /// were still held; a slot already released or expired, or of a rule that is gone, is
    /// not renewed.
    pub async fn renew_slots(&self, slots: &[HeldSlot]) -> Result<usize, StoreError> {
        let rules = self.inner.rules.load();
        let mut by_identity: HashMap<&str, Vec<(BucketKey, Limit, tollgate_lease::SlotId)>> =
            HashMap::new();
        for s in slots {
            // The TTL is the rule's, never the caller's.
            let Some(limit) = rules
                .rules()
                .iter()
                .filter(|r| s.key.is_of_rule(&r.key))
                .find_map(|r| r.limit().filter(|l| l.slot_ttl().is_some()))
            else {
                continue;
            };
            by_identity
                .entry(s.key.identity_prefix())
                .or_default()
                .push((s.key.clone(), limit, s.slot.clone()));
        }
        let mut renewed = 0;
        for (_, items) in by_identity {
            let req = SlotRenew::new(items)?;
            renewed += self
                .inner
                .shared
                .store
                .renew_slots(&req)
                .await?
                .into_iter()
                .filter(|held| *held)
                .count();
        }
        Ok(renewed)
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

    /// Stops the node as a crashed pod stops: every key actor and the supervisor are killed
    /// at once, and what they held (leased units, concurrency slots) is never returned; the
    /// store gets it back when the leases and slots expire. Only simulations and tests want
    /// this; a node that is asked to stop uses [`Node::shutdown`].
    pub fn crash(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        for actor in self.inner.shared.registry.actors() {
            actor.kill();
        }
        self.inner.supervisor.kill();
    }

    fn now(&self) -> u64 {
        self.inner.shared.clock.now_micros()
    }

    async fn decide(&self, hits: Vec<Hit>, route: Route<'_>) -> Verdict {
        self.decide_at(hits, route, self.now()).await
    }

    /// [`Self::decide`], at `now` (a clock read the caller already made).
    async fn decide_at(&self, hits: Vec<Hit>, route: Route<'_>, now: u64) -> Verdict {
        let mut attempt = Attempt::new(hits.len());
        let (mut enforce, mut shadow) = (vec![], vec![]);
        let mut blocked = false;
        if let Some(region) = self.inner.shared.region.get() {
            // Demand for ASYNC_SYNC buckets, admitted or not: the regional allowances' shares.
            for hit in hits.iter().filter(|h| h.rule.synced()) {
                region.ask(&hit.rule.key, &hit.identity, hit.cost);
            }
        }
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
                RuleKind::Limited(_) => match self.known_block(hit, route, now) {
                    Some(left) => {
                        blocked = true;
                        crate::runtime::penalties::count_penalized(&self.inner.shared, &hit.rule);
                        attempt.record(
                            i,
                            hit.denied(Outcome::Denied, Denial::Penalized, left, left),
                        );
                    }
                    None => enforce.push(i),
                },
            }
        }
        let start = attempt.mark();
        let allowed = !blocked
            && self
                .reserve(&hits, &enforce, &mut attempt, now, route)
                .await;
        if !allowed {
            self.roll_back(&mut attempt, start);
        } else {
            for i in shadow {
                let mark = attempt.mark();
                if !self.reserve(&hits, &[i], &mut attempt, now, route).await {
                    self.roll_back(&mut attempt, mark);
                    if let Some(s) = attempt.status_mut(i) {
                        s.outcome = Some(Outcome::ShadowDenied);
                    }
                }
            }
        }
        let (statuses, slots) = attempt.finish();
        let mut statuses: Vec<RuleStatus> = statuses
            .into_iter()
            .zip(&hits)
            .map(|(s, hit)| s.unwrap_or_else(|| hit.unevaluated()))
            .collect();
        for (s, hit) in statuses.iter_mut().zip(&hits) {
            // A denial the store's answer showed to be a block (learnt while this request
            // waited for it) says so.
            if s.denial == Some(Denial::OverLimit)
                && s.outcome == Some(Outcome::Denied)
                && hit.rule.penalty.is_some()
                && let Some(left) = self.known_block(hit, route, self.now())
            {
                crate::runtime::penalties::count_penalized(&self.inner.shared, &hit.rule);
                s.denial = Some(Denial::Penalized);
                s.retry_after = left;
            }
        }
        for (s, hit) in statuses.iter().zip(&hits) {
            if s.outcome == Some(Outcome::Denied) && s.rule.mode == Mode::Enforce {
                self.inner.top_denied.record(&s.rule.id, &hit.identity);
            }
            if route.is_request()
                && s.rule.penalty.is_some()
                && matches!(s.outcome, Some(Outcome::Denied | Outcome::ShadowDenied))
                && matches!(s.denial, Some(Denial::OverLimit) | None)
                && let Ok(key) = hit.bucket_id().store_key()
            {
                // A denial of a client counts towards its rule's penalty (a draw's does not).
                let shared = &self.inner.shared;
                shared.penalties.count(shared, &s.rule, &hit.identity, key);
            }
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

    /// The time left of a block this node knows `hit`'s identity is under, for a request (a
    /// draw is not a client's request).
    fn known_block(&self, hit: &Hit, route: Route<'_>, now: u64) -> Option<Duration> {
        if !route.is_request() || hit.rule.penalty.is_none() {
            return None;
        }
        let key = hit.bucket_id().store_key().ok()?;
        self.inner.shared.penalties.blocked_for(&key, now)
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
