//! Deciding a request: the one owner of a decision. A request's matched rules (its hits) come
//! in; a [`Verdict`] comes out, all or nothing: every enforced rule admits it, or whatever any
//! of them took is given back.
//!
//! The files read in the order a request goes:
//! - this file: the entry ([`Decider::decide`]): rules that need no store (unlimited, blocks,
//!   a known penalty block), the region placement (HOME_REGION hits forwarded to the peer),
//!   then each hit; the statuses counted and the verdict's retry;
//! - `decision/lease.rs`: a hit decided by the node's lease: the pre-limit, the lease taken
//!   with one atomic, a refill waited for, one actor call per identity;
//! - `decision/store.rs`: a hit decided by the store itself (keys without a bucket, peeks,
//!   concurrency slots, draws and reservations), and the store's word behind a pre-limit
//!   denial;
//! - `decision/attempt.rs`: what the request took so far, rolled back all or nothing;
//! - `../fail_modes.rs` (pure, beside this folder): what a rule does when the store cannot
//!   answer, for every path above.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::ActorRef;

use crate::rules::{Mode, RuleKind};
use crate::runtime::fallbacks::Fallbacks;
use crate::runtime::keys::lookup::Keys;
use crate::runtime::keys::supervisor::SupervisorMsg;
use crate::runtime::matching::{Hit, OverrideRules};
use crate::runtime::outcome::Outcome;
use crate::runtime::shared::Shared;
use crate::runtime::top_denied::TopDenied;
use crate::runtime::verdict::{Denial, RuleStatus, Verdict};

use attempt::{Attempt, Mark};

pub(crate) mod attempt;
mod lease;
pub(crate) mod penalties;
pub(crate) mod store;
pub(crate) mod without_store;

/// How the decision path reaches a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route<'a> {
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

/// A request's hits sorted by [`Decider::sort`].
struct Sorted {
    /// Enforced rules that need their bucket.
    enforce: Vec<usize>,
    /// SHADOW rules that need their bucket.
    shadow: Vec<usize>,
    /// An enforced rule denied without its bucket (a block rule, a known penalty block).
    blocked: bool,
}

/// What deciding needs, and nothing an operator or the region link needs: the shared state
/// (the guarded store, the registry of keys, the clock, the metrics, the region), the key
/// actors' supervisor, the LOCAL fallbacks, the override rules and the most-denied keys.
#[derive(Debug)]
pub(crate) struct Decider {
    pub(crate) shared: Arc<Shared>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
    /// Rules made from descriptor limit overrides, held for reuse.
    pub(crate) overrides: OverrideRules,
    /// LOCAL fallback buckets of keys decided without an actor (an eighth of the key state
    /// budget).
    pub(crate) fallbacks: Fallbacks,
    /// The node is stopping: decisions are direct store checks.
    stopping: AtomicBool,
    /// The most-denied keys, per rule and overall.
    pub(crate) top_denied: TopDenied,
    /// How long the decision path waits for an actor: the store patience plus a margin (the
    /// actor answers the requests that do not wait through a late call when it is judged).
    actor_wait: Duration,
}

impl Decider {
    pub(crate) fn new(
        shared: Arc<Shared>,
        supervisor: ActorRef<SupervisorMsg>,
        store_timeout: Duration,
    ) -> Self {
        let fallbacks = Fallbacks::new(shared.config.max_key_state_bytes / 8);
        let top_denied = TopDenied::new(shared.config.top_denied.clone());
        let overrides = OverrideRules::new(
            shared
                .metrics
                .rule_counters(&crate::rules::set::override_labels()),
        );
        let actor_wait =
            shared.config.store_patience.max(store_timeout) + Duration::from_millis(20);
        Decider {
            shared,
            supervisor,
            overrides,
            fallbacks,
            stopping: AtomicBool::new(false),
            top_denied,
            actor_wait,
        }
    }

    /// From now on, nothing is leased: decisions are direct store checks.
    pub(crate) fn stop_leasing(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Decides `hits` at `now` (the clock read their rules were matched at), all or nothing:
    /// every enforced rule admits, or what any took is given back. A SHADOW rule is tried only
    /// when the enforced ones admitted, and what it took is given back when it would deny.
    pub(crate) async fn decide(&self, hits: Vec<Hit>, route: Route<'_>, now: u64) -> Verdict {
        let mut attempt = Attempt::new(hits.len());
        if let Some(region) = self.shared.region.get() {
            // Demand for ASYNC_SYNC buckets, admitted or not: the regional allowances' shares.
            for hit in hits.iter().filter(|h| h.rule.synced()) {
                region.ask(&hit.rule.key, &hit.identity, hit.cost);
            }
        }
        let Sorted {
            enforce,
            shadow,
            blocked,
        } = self.sort(&hits, &mut attempt, route, now);
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
        self.verdict(&hits, attempt, allowed, route)
    }

    /// Decides the hits that need no store (unlimited rules, block rules, identities under a
    /// penalty block this node knows), and sorts the rest into enforced and SHADOW ones.
    fn sort(&self, hits: &[Hit], attempt: &mut Attempt, route: Route<'_>, now: u64) -> Sorted {
        let mut sorted = Sorted {
            enforce: vec![],
            shadow: vec![],
            blocked: false,
        };
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
                    sorted.blocked |= !shadowed;
                    attempt.record(
                        i,
                        hit.denied(outcome, Denial::Blocked, Duration::ZERO, window),
                    );
                }
                RuleKind::Limited(_) if hit.rule.mode == Mode::Shadow => sorted.shadow.push(i),
                RuleKind::Limited(_) => match self.known_block(hit, route, now) {
                    Some(left) => {
                        sorted.blocked = true;
                        crate::runtime::decision::penalties::count_penalized(
                            &self.shared,
                            &hit.rule,
                        );
                        attempt.record(
                            i,
                            hit.denied(Outcome::Denied, Denial::Penalized, left, left),
                        );
                    }
                    None => sorted.enforce.push(i),
                },
            }
        }
        sorted
    }

    /// The verdict of a finished attempt: every rule's status (a denial found to be a block
    /// says so), denials counted towards the most-denied keys and the penalties, outcomes
    /// counted per rule, and the retry of a denied request (its longest wait).
    fn verdict(&self, hits: &[Hit], attempt: Attempt, allowed: bool, route: Route<'_>) -> Verdict {
        let (statuses, slots) = attempt.finish();
        let mut statuses: Vec<RuleStatus> = statuses
            .into_iter()
            .zip(hits)
            .map(|(s, hit)| s.unwrap_or_else(|| hit.unevaluated()))
            .collect();
        for (s, hit) in statuses.iter_mut().zip(hits) {
            // A denial the store's answer showed to be a block (learnt while this request
            // waited for it) says so.
            if s.denial == Some(Denial::OverLimit)
                && s.outcome == Some(Outcome::Denied)
                && hit.rule.penalty.is_some()
                && let Some(left) = self.known_block(hit, route, self.shared.clock.now_micros())
            {
                crate::runtime::decision::penalties::count_penalized(&self.shared, &hit.rule);
                s.denial = Some(Denial::Penalized);
                s.retry_after = left;
            }
        }
        for (s, hit) in statuses.iter().zip(hits) {
            self.count(s, hit, allowed, route);
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

    /// One rule's status counted: a denial towards the most-denied keys and (a client's, not a
    /// draw's) towards its rule's penalty, the outcome in the rule's counters.
    fn count(&self, s: &RuleStatus, hit: &Hit, allowed: bool, route: Route<'_>) {
        if s.outcome == Some(Outcome::Denied) && s.rule.mode == Mode::Enforce {
            self.top_denied.record(&s.rule.id, &hit.identity);
        }
        if route.is_request()
            && s.rule.penalty.is_some()
            && matches!(s.outcome, Some(Outcome::Denied | Outcome::ShadowDenied))
            && matches!(s.denial, Some(Denial::OverLimit) | None)
            && let Ok(key) = hit.bucket_id().store_key()
        {
            let shared = &self.shared;
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
        route: Route<'_>,
    ) -> bool {
        let Some(region) = self.shared.region.get() else {
            return self.reserve_local(hits, indices, attempt, now, route).await;
        };
        let (forwarded, local): (Vec<usize>, Vec<usize>) = indices
            .iter()
            .partition(|&&i| hits[i].rule.forwarded() && hits[i].cost > 0);
        if !self.reserve_local(hits, &local, attempt, now, route).await {
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
        unanswered.is_empty()
            || self
                .reserve_local(hits, &unanswered, attempt, now, route)
                .await
    }

    /// The time left of a block this node knows `hit`'s identity is under, for a request (a
    /// draw is not a client's request).
    fn known_block(&self, hit: &Hit, route: Route<'_>, now: u64) -> Option<Duration> {
        if !route.is_request() || hit.rule.penalty.is_none() {
            return None;
        }
        let key = hit.bucket_id().store_key().ok()?;
        self.shared.penalties.blocked_for(&key, now)
    }

    /// Gives back what `attempt` took since `mark`; its slots are released in the store in
    /// the background.
    fn roll_back(&self, attempt: &mut Attempt, mark: Mark) {
        let slots = attempt.roll_back_to(mark);
        if !slots.is_empty() {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let _ = store::release_slots(&shared, &slots).await;
            });
        }
    }

    /// Where the decision path finds (or makes) the buckets of its hits.
    pub(crate) fn keys(&self) -> Keys<'_> {
        Keys {
            shared: &self.shared,
            supervisor: &self.supervisor,
            fallbacks: &self.fallbacks,
        }
    }
}
