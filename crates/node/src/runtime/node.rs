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
//! - this file: the node a gateway calls: starting it, `check` (validate, match, decide),
//!   prepared requests' buckets, draws, slots, stopping;
//! - `../decision.rs` and its folder: deciding a request's matched rules (the lease, the
//!   store, the fail modes, the region placement), all or nothing;
//! - `node/operator.rs` and `node/figures.rs`: the operator's face (`node.operator()`:
//!   counters, resets, lifts, what the node holds, its figures);
//! - `node/reservations.rs`: reserve and settle;
//! - `node/store_view.rs`: the store as the node sees it (`node.store()`: breakers, shards,
//!   the last answer's age, a cluster's settings);
//! - `node/region.rs`: the node's face to region sync (`node.region()`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::Actor;
use tollgate_lease::{BucketKey, Limit, SharedClock, SlotRenew, Store, StoreError};

use crate::metrics::Metrics;
use crate::rules::watch::ActiveRules;
use crate::runtime::decision::{Decider, Route};
use crate::runtime::keys::bucket::Bucket;
use crate::runtime::keys::bucket::KeyMsg;
use crate::runtime::keys::registry::Registry;
use crate::runtime::keys::supervisor::KeySupervisor;
use crate::runtime::matching::{self, Charge, Hit};
use crate::runtime::request::{Request, RequestError};
use crate::runtime::shared::{RuntimeConfig, Shared, WarmUp};
use crate::runtime::store_health::debts::Debts;
use crate::runtime::store_health::guarded::GuardedStore;
use crate::runtime::verdict::{HeldSlot, Verdict};

mod figures;
pub mod operator;
pub mod store_view;

pub mod region;
pub mod reservations;

/// A running node. Cheap to clone; every clone is the same node.
#[derive(Debug, Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rules: Arc<ActiveRules>,
    /// Deciding a request, and what it needs.
    decider: Decider,
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
        let (supervisor, _) = Actor::spawn(None, KeySupervisor, shared.clone()).await?;
        if let Some(memory) = shared.store.owned_memory() {
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
        Ok(Node {
            inner: Arc::new(Inner {
                rules,
                decider: Decider::new(shared, supervisor, store_timeout),
            }),
        })
    }

    /// Warms the store up before the node serves: connected (every shard of a cluster),
    /// scripts loaded, one round trip, waiting up to the start-up patience. A store that does
    /// not answer by then does not stop the node: it serves by its rules' fail modes, says so
    /// in its log and in `/readyz`, and connects in the background. Once per node.
    pub async fn warm_up(&self) -> WarmUp {
        let shared = &self.inner.decider.shared;
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

    /// The active rules.
    pub fn rules(&self) -> &Arc<ActiveRules> {
        &self.inner.rules
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.decider.shared.metrics
    }

    /// The node clock's now (µs), against which [`store_view::StoreView::shards`]' times are
    /// read.
    pub fn now_micros(&self) -> tollgate_lease::Micros {
        self.inner.decider.shared.clock.now_micros()
    }

    /// Decides `request` against every rule it matches: all of them admit it, or none spends.
    pub async fn check(&self, request: &Request) -> Result<Verdict, RequestError> {
        request.validate()?;
        if !self.inner.decider.shared.config.descriptor_overrides
            && let Some(index) = request.descriptors.iter().position(|d| d.limit.is_some())
        {
            return Err(RequestError::OverrideRefused { index });
        }
        let rules = self.inner.rules.load();
        // One clock read for matching and deciding: the decision is made at the instant
        // its rules were matched.
        let now = self.now();
        let hits = matching::hits(&rules, request, &self.inner.decider.overrides, now)?;
        if hits.is_empty() {
            self.inner.decider.shared.metrics.requests_unmatched.inc();
        }
        self.note_long_identities(&hits, &request.domain);
        Ok(self.inner.decider.decide(hits, Route::Fastest, now).await)
    }

    /// What the fail policy decides for each rule `request` matches, had the store not
    /// answered for `cause` (the buckets this node holds for them, if any, taken into account):
    /// the statuses and what was taken, nothing given back. For the policy's table test.
    #[cfg(test)]
    pub(crate) fn decide_without_store(
        &self,
        request: &Request,
        cause: crate::runtime::fail_modes::Cause,
    ) -> Vec<(
        crate::runtime::verdict::RuleStatus,
        Vec<crate::runtime::decision::attempt::Taken>,
    )> {
        let rules = self.inner.rules.load();
        let now = self.now();
        let hits =
            matching::hits(&rules, request, &self.inner.decider.overrides, now).expect("valid");
        hits.iter()
            .map(|hit| {
                let bucket = self
                    .inner
                    .decider
                    .shared
                    .registry
                    .bucket(&hit.bucket_id().local_key());
                crate::runtime::decision::without_store::decide(
                    &self.inner.decider.shared,
                    &self.inner.decider.fallbacks,
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
        self.inner.decider.shared.metrics.client_input.note(
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
        let hits = matching::hits(&rules, request, &self.inner.decider.overrides, self.now())?;
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
        self.inner
            .decider
            .decide(vec![hit], Route::Store, self.now())
            .await
    }

    /// The buckets of `request`'s matched rules, if every one can be decided by a lease alone,
    /// with the cost and, for an ASYNC_SYNC bucket, the identity its demand is reported under.
    pub(crate) async fn leased_buckets(
        &self,
        request: &Request,
    ) -> Option<Vec<(Arc<Bucket>, u64, Option<Vec<u8>>)>> {
        let rules = self.inner.rules.load();
        let now = self.now();
        let hits = matching::hits(&rules, request, &self.inner.decider.overrides, now).ok()?;
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
                self.inner
                    .decider
                    .keys()
                    .bucket(&hit.rule, &hit.identity, limit, now)
                    .await?,
                hit.cost,
                // The identity of a bucket whose demand goes to the peer region.
                hit.rule.synced().then(|| hit.identity.clone()),
            ));
        }
        Some(out)
    }

    /// What decides this node's requests (for the runtime's unit tests).
    #[cfg(test)]
    pub(crate) fn decider(&self) -> &crate::runtime::decision::Decider {
        &self.inner.decider
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.inner.decider.shared
    }

    /// Releases concurrency slots (idempotent). Returns how many were still held.
    pub async fn release_slots(&self, slots: &[HeldSlot]) -> Result<usize, StoreError> {
        crate::runtime::decision::store::release_slots(&self.inner.decider.shared, slots).await
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
                .decider
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
        self.inner.decider.stop_leasing();
        let actors = self.inner.decider.shared.registry.actors();
        let waits = actors.into_iter().map(|actor| async move {
            let _ = actor
                .call(KeyMsg::Shutdown, Some(Duration::from_secs(2)))
                .await;
        });
        futures::future::join_all(waits).await;
        self.inner.decider.supervisor.stop(None);
    }

    /// Stops the node as a crashed pod stops: every key actor and the supervisor are killed
    /// at once, and what they held (leased units, concurrency slots) is never returned; the
    /// store gets it back when the leases and slots expire. Only simulations and tests want
    /// this; a node that is asked to stop uses [`Node::shutdown`].
    pub fn crash(&self) {
        self.inner.decider.stop_leasing();
        for actor in self.inner.decider.shared.registry.actors() {
            actor.kill();
        }
        self.inner.decider.supervisor.kill();
    }

    pub(crate) fn now(&self) -> u64 {
        self.inner.decider.shared.clock.now_micros()
    }
}
