//! The store as the runtime sees it: every call passes through the circuit breaker of the
//! shard its key lives on (one for a single Redis or the in-memory store, one per slot range
//! of a Redis Cluster: a failing shard opens its own breaker only), is timed, and, when it is
//! late, judged (`runtime/store_health/lateness.rs`): a store that answers other calls, or a node too busy
//! to read its answers, is waited for up to the patience; a store that answered nothing for a
//! budget has stalled, and callers that decide by a fail mode that does not wait stop waiting;
//! an open breaker means the store is down, and every caller stops waiting. Only failures count
//! against the breaker: a call that could not reach the store, or that it did not answer within
//! the patience.
//!
//! A call is started ([`GuardedStore::begin`]), waited for ([`GuardedStore::wait`], which
//! tells the caller when the call is late) and ended ([`GuardedStore::end`], which records
//! its outcome): a caller that stops waiting may hand the call to a task of its own, whose
//! late answer is still recorded (and settles what was admitted without it).
//!
//! This is the store's one way in: every operation the node makes, an operator's resets,
//! lifts and reads and the penalty box's counts included, is a method here, and the store
//! itself is not handed out (only what it says of itself: a Redis Cluster's settings, the
//! batch counts, the in-memory store's size).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tollgate_lease::{
    BucketKey, CheckOutcome, CheckRequest, DebitRequest, HeldLeases, LeaseGrant, LeaseRequest,
    LeaseStore, Lift, Micros, Penalty, PenaltyState, ReturnRequest, SettleRequest, Settlement,
    SharedClock, SlotRelease, SlotRenew, Store, StoreError,
};
use tracing::Instrument;

use crate::metrics::{Metrics, StoreFailure, StoreOp};
use crate::runtime::store_health::breaker::{Breaker, BreakerConfig, BreakerState};
use crate::runtime::store_health::lateness::{
    self, CallTimes, Judgement, Late, Limits, Pulse, Wait,
};

mod operations;
mod prober;
mod shards;

use prober::Prober;
use shards::Breakers;
pub use shards::ShardHealth;

/// The store behind per-shard circuit breakers, with metrics.
#[derive(Debug)]
pub struct GuardedStore {
    /// The store, with a budget of `patience` per call (the judging is done here).
    store: Store,
    budget: Duration,
    patience: Duration,
    breakers: Arc<Breakers>,
}

/// A call on its way: which shard it went to, when, and what was recorded of it so far.
#[derive(Debug)]
pub(crate) struct Call {
    op: StoreOp,
    shard: u16,
    started: Micros,
    /// Its failure was counted against the breaker already.
    counted: bool,
    /// It was judged stalled.
    stalled: bool,
    /// Calls to the same shard that were out when it went.
    ahead: u64,
    /// Its shard's calls out, which it leaves when dropped.
    in_flight: Arc<AtomicU64>,
    /// When the call is its shard's probe: what asks again if it does not report.
    probe: Option<Box<Prober>>,
    span: tracing::Span,
}

impl Drop for Call {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        // A probe dropped unanswered (its caller stopped waiting) said nothing of the store:
        // another is sent in its place, or the breaker would wait its longest cooldown.
        if let Some(prober) = self.probe.take() {
            prober.start();
        }
    }
}

/// The store's side of a call, owned (so that it can go on in a task of its own).
pub(crate) type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// What waiting for a call gave.
#[derive(Debug)]
pub(crate) enum Waited<T> {
    /// The store's answer (or its error).
    Answered(Result<T, StoreError>),
    /// The caller stopped waiting: the store stalled or is down (what the caller was told), or
    /// the patience ended. The call may still answer.
    Stopped(StoreError),
}

impl GuardedStore {
    /// Wraps `store`: a store that answers nothing is waited for `budget`; a call at most
    /// `patience`.
    pub fn new(
        store: Store,
        budget: Duration,
        patience: Duration,
        breaker: BreakerConfig,
        clock: SharedClock,
        metrics: Arc<Metrics>,
        seed: Option<u64>,
    ) -> Self {
        let patience = patience.max(budget);
        Self {
            store: store.with_budget(patience),
            budget,
            patience,
            breakers: Arc::new(Breakers {
                shards: DashMap::new(),
                config: breaker,
                clock,
                metrics,
                jitter: parking_lot::Mutex::new(match seed {
                    Some(seed) => StdRng::seed_from_u64(seed),
                    None => StdRng::from_os_rng(),
                }),
            }),
        }
    }

    /// The in-memory store behind the guard, if that is what it guards (for its sweeper and
    /// its size): not a way to call it.
    pub fn memory(&self) -> Option<&tollgate_lease::MemoryStore> {
        self.store.memory()
    }

    /// The in-memory store this node owns and sweeps ([`tollgate_lease::Store::owned_memory`]).
    pub fn owned_memory(&self) -> Option<&tollgate_lease::MemoryStore> {
        self.store.owned_memory()
    }

    /// A Redis Cluster's settings, as last read (None for any other store).
    pub fn cluster_settings(&self) -> Option<tollgate_lease::ClusterSettings> {
        self.store.cluster_settings()
    }

    /// How the Redis store batched its calls (None for any other store).
    pub fn batch_counts(&self) -> Option<tollgate_lease::BatchCounts> {
        self.store.batch_counts()
    }

    /// How long a store that answers nothing is waited for.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// How long a call is waited for at most.
    pub fn patience(&self) -> Duration {
        self.patience
    }

    /// Where the breaker of `key`'s shard stands.
    pub fn breaker_state_of(&self, key: &BucketKey) -> BreakerState {
        self.breakers
            .shards
            .get(&self.store.shard_of(key))
            .map_or(BreakerState::Closed, |s| s.breaker.state())
    }

    /// Every shard's breaker that has seen a call, by shard.
    pub fn breaker_states(&self) -> Vec<(u16, BreakerState)> {
        let mut states: Vec<_> = self
            .breakers
            .shards
            .iter()
            .map(|s| (*s.key(), s.breaker.state()))
            .collect();
        states.sort_by_key(|(shard, _)| *shard);
        states
    }

    /// Every shard that has seen a call: its breaker, its last answer, its outage.
    pub fn shard_health(&self) -> Vec<ShardHealth> {
        let mut shards: Vec<_> = self
            .breakers
            .shards
            .iter()
            .map(|s| ShardHealth {
                shard: *s.key(),
                breaker: s.breaker.state(),
                last_answer: s.last_answer,
                health: s.health.clone(),
            })
            .collect();
        shards.sort_by_key(|s| s.shard);
        shards
    }

    /// Asks every shard that no call has answered or failed at for `every` whether it
    /// answers (a read of a key called there, through its breaker), so that an outage
    /// shows, and its end too, whatever the traffic: with no requests, the log, `/readyz` and
    /// the last answer's age still tell the truth. Runs until `running` says stop. The
    /// in-memory store is not asked: it cannot fail.
    pub async fn heartbeat(&self, every: Duration, running: impl Fn() -> bool) {
        if self.store.memory().is_some() {
            return;
        }
        // A shard that does not answer is asked as soon as its breaker lets a call through
        // (looked at ten times as often), so that its return shows within moments.
        let often = every / 10;
        let mut tick = tokio::time::interval(often);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (every_us, often_us) = (every.as_micros() as u64, often.as_micros() as u64);
        let mut ticks = 0u32;
        while running() {
            tick.tick().await;
            // Every shard the store has, also one no call reached yet (a node that has served
            // nothing): without a key of its own it would never be asked, its last answer
            // would only age, and its outage would not show. Looked for once per `every`:
            // listing a cluster's shards reads its whole slot table.
            ticks = ticks.wrapping_add(1);
            let shards = if ticks % 10 == 1 {
                self.store.shards()
            } else {
                vec![]
            };
            for shard in shards {
                let missing = self.breakers.shard(shard).probe_key.is_none();
                if missing && let Some(key) = self.heartbeat_key(shard) {
                    self.breakers.shard(shard).probe_key.get_or_insert(key);
                }
            }
            let now = self.breakers.clock.now_micros();
            let quiet: Vec<BucketKey> = self
                .breakers
                .shards
                .iter()
                .filter(|s| {
                    let quiet_for = now.saturating_sub(s.last_outcome);
                    match s.breaker.state() {
                        BreakerState::Closed if s.health.failing_since.is_none() => {
                            quiet_for >= every_us
                        }
                        BreakerState::Closed => quiet_for >= often_us,
                        // Not until it lets a call through (a probe is out, or its cooldown
                        // runs).
                        BreakerState::Open { until } | BreakerState::HalfOpen { until } => {
                            now >= until
                        }
                    }
                })
                .filter_map(|s| s.probe_key.clone())
                .collect();
            if !quiet.is_empty() {
                tracing::debug!(shards = quiet.len(), "heartbeat: asking the store");
            }
            futures::future::join_all(quiet.iter().map(|key| {
                self.call(
                    StoreOp::Probe,
                    key,
                    Wait::UntilDown,
                    self.store.held_leases(key),
                )
            }))
            .await;
        }
    }

    /// The worst breaker state over every shard (open, else half-open, else closed).
    pub fn breaker_state(&self) -> BreakerState {
        self.breakers
            .shards
            .iter()
            .map(|s| s.breaker.state())
            .max_by_key(|s| s.code())
            .unwrap_or(BreakerState::Closed)
    }

    /// A key on `shard` for the heartbeat of a shard no call reached yet (found among a few
    /// candidates: each lands on a slot range of a cluster's at random).
    fn heartbeat_key(&self, shard: u16) -> Option<BucketKey> {
        (0..4096u32)
            .filter_map(|i| BucketKey::new(format!("{i}").as_bytes(), "tollgate:heartbeat").ok())
            .find(|key| self.store.shard_of(key) == shard)
    }

    /// Starts a call to `key`'s shard, if its breaker lets it through.
    pub(crate) fn begin(&self, op: StoreOp, key: &BucketKey) -> Result<Call, StoreError> {
        let shard = self.store.shard_of(key);
        let now = self.breakers.clock.now_micros();
        let (allowed, changed, in_flight) = {
            let mut s = self.breakers.shard(shard);
            // Once per shard: no compare or copy on every call.
            if s.probe_key.is_none() {
                s.probe_key = Some(key.clone());
            }
            let before = s.breaker.state();
            let allowed = s.breaker.allow(now);
            (allowed, before != s.breaker.state(), s.in_flight.clone())
        };
        // A call let through a breaker that was not closed is its probe.
        let probe = (allowed && changed).then(|| {
            Box::new(Prober {
                breakers: self.breakers.clone(),
                store: self.store.clone(),
                key: key.clone(),
                shard,
                every: self.patience,
            })
        });
        if changed {
            self.breakers.publish_state();
        }
        if !allowed {
            self.breakers
                .metrics
                .count_failure(op, StoreFailure::BreakerOpen);
            return Err(StoreError::Unavailable("circuit breaker open".into()));
        }
        self.breakers.metrics.store_calls.inc();
        let ahead = in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Call {
            op,
            shard,
            started: now,
            counted: false,
            stalled: false,
            ahead,
            in_flight,
            probe,
            span: crate::telemetry::child_of_current(|| {
                tracing::debug_span!("store", op = op.as_str(), shard)
            }),
        })
    }

    fn pulse(&self, shard: u16) -> Pulse {
        self.breakers
            .shards
            .get(&shard)
            .map_or(Pulse::default(), |s| Pulse {
                last_answer: s.last_answer,
                breaker_open: matches!(s.breaker.state(), BreakerState::Open { .. }),
            })
    }

    /// Counts a failure of `call` at its shard's breaker (once per call).
    fn count_failure(&self, call: &mut Call, error: &StoreError) {
        if call.counted {
            return;
        }
        call.counted = true;
        let now = self.breakers.clock.now_micros();
        let failure = match error {
            StoreError::Timeout { .. } => StoreFailure::Timeout,
            _ => StoreFailure::Unavailable,
        };
        self.breakers.metrics.count_failure(call.op, failure);
        // A probe that failed is taken either way: refused, it reopens the breaker below.
        if let Some(prober) = call.probe.take()
            && failure == StoreFailure::Timeout
        {
            // The store took the probe and did not answer: ask again at once (the breaker
            // stays half-open), so that it closes as soon as the store answers.
            self.breakers
                .shard(call.shard)
                .failed(call.shard, now, error);
            prober.start();
            return;
        }
        let (opened, changed, before_state) = {
            let mut s = self.breakers.shard(call.shard);
            s.failed(call.shard, now, error);
            let before = s.breaker.state();
            let jitter = self.breakers.jitter.lock().random();
            let opened = if matches!(error, StoreError::Refused(_)) {
                s.breaker.on_refusal(now, jitter)
            } else {
                s.breaker.on_failure(now, jitter)
            };
            (opened, s.breaker.state() != before, before)
        };
        if opened {
            self.breakers.metrics.breaker_opened.inc();
            // Opened anew after a failed probe: the outage's own lines say it goes on.
            if matches!(before_state, BreakerState::Closed) {
                tracing::warn!(shard = call.shard, error = %error, "store circuit breaker opened");
            } else {
                tracing::debug!(shard = call.shard, error = %error, "store circuit breaker opened again");
            }
        }
        if changed {
            self.breakers.publish_state();
        }
    }

    /// Waits for `future`, the store's side of `call`, judging it at every budget it is late
    /// (see `runtime/store_health/lateness.rs`). `on_late` is told once that the store stalled and once
    /// that it is down, and says whether the caller stops waiting then.
    pub(crate) async fn wait<T, F>(
        &self,
        call: &mut Call,
        mut future: Pin<&mut F>,
        mut on_late: impl FnMut(Late) -> bool,
    ) -> Waited<T>
    where
        F: Future<Output = Result<T, StoreError>> + ?Sized,
    {
        // The in-memory store answers at once: no timer.
        if let Some(result) = future.as_mut().now_or_never() {
            return Waited::Answered(result);
        }
        let limits = Limits {
            budget: self.budget.as_micros() as u64,
            patience: self.patience.as_micros() as u64,
        };
        let (mut stalled, mut down) = (false, false);
        let mut due = call.started + limits.budget;
        loop {
            let wait = Duration::from_micros(due.saturating_sub(self.breakers.clock.now_micros()));
            let span = call.span.clone();
            tokio::select! {
                biased;
                result = future.as_mut().instrument(span) => return Waited::Answered(result),
                () = tokio::time::sleep(wait) => {}
            }
            // Answers that arrived meanwhile are read before the call is judged: a yield lets
            // the runtime poll its I/O driver and the connection's reader first (and how long
            // it takes says how long the runnable tasks queue). A batched call's answer takes
            // one more hop (the connection's reader, then the task that sent the batch, then
            // this caller), hence two yields: with one, the cold-start test's fresh nodes took
            // batches still being handed out for a stalled store, and 3 of 5 runs decided
            // enough on last answers to admit past the exact bound; with two, 8 of 8 held.
            let woke = self.breakers.clock.now_micros();
            self.store.yield_to_runtime().await;
            if let Some(result) = future.as_mut().now_or_never() {
                return Waited::Answered(result);
            }
            let now = self.breakers.clock.now_micros();
            let times = CallTimes {
                started: call.started,
                due,
                yielded: now.saturating_sub(woke),
                ahead: call.ahead,
                now,
            };
            match lateness::judge(self.pulse(call.shard), times, limits) {
                Judgement::Busy => {}
                Judgement::OutOfPatience => {
                    let error = StoreError::Timeout {
                        budget: self.patience,
                    };
                    self.count_failure(call, &error);
                    return Waited::Stopped(error);
                }
                Judgement::Stalled if !stalled => {
                    stalled = true;
                    call.stalled = true;
                    self.breakers.metrics.store_stalls.inc();
                    let pulse = self.pulse(call.shard);
                    tracing::debug!(
                        op = call.op.as_str(),
                        out_us = now - call.started,
                        late_us = woke.saturating_sub(due),
                        yielded_us = now - woke,
                        ahead = call.ahead,
                        answer_age_us = now.saturating_sub(pulse.last_answer),
                        "the store stalled"
                    );
                    if on_late(Late::Stalled) {
                        return Waited::Stopped(StoreError::Timeout {
                            budget: self.budget,
                        });
                    }
                }
                Judgement::Down if !down => {
                    down = true;
                    if on_late(Late::Down) {
                        return Waited::Stopped(StoreError::Unavailable(
                            "circuit breaker open".into(),
                        ));
                    }
                }
                Judgement::Stalled | Judgement::Down => {}
            }
            due = now + limits.budget;
        }
    }

    /// Records how `call` ended (when it answered late, after its caller stopped waiting, too).
    pub(crate) fn end<T>(&self, mut call: Call, result: &Result<T, StoreError>) {
        let now = self.breakers.clock.now_micros();
        if call.stalled {
            tracing::debug!(
                op = call.op.as_str(),
                took_us = now - call.started,
                ok = result.is_ok(),
                "a stalled call ended"
            );
        }
        self.breakers
            .metrics
            .observe_store(call.op, now.saturating_sub(call.started) as f64 / 1e6);
        match result {
            Err(e) if e.is_transient() && !matches!(e, StoreError::Full(_)) => {
                self.count_failure(&mut call, e);
            }
            _ => {
                call.probe = None;
                // The store answered: it is up (a full store refused a new key; a rejected
                // call was wrong, not the store).
                match result {
                    Err(StoreError::Full(_)) => {
                        self.breakers
                            .metrics
                            .count_failure(call.op, StoreFailure::Full);
                    }
                    Err(e) => {
                        self.breakers
                            .metrics
                            .count_failure(call.op, StoreFailure::Other);
                        tracing::warn!(error = %e, "store rejected a call");
                    }
                    Ok(_) => {}
                }
                let changed = {
                    let mut s = self.breakers.shard(call.shard);
                    s.answered(call.shard, now);
                    let before = s.breaker.state();
                    if before != BreakerState::Closed {
                        tracing::info!(shard = call.shard, "store circuit breaker closed");
                    }
                    s.breaker.on_success(now);
                    s.breaker.state() != before
                };
                if changed {
                    self.breakers.publish_state();
                }
            }
        }
    }

    /// Makes the store's next call one round trip (connected, scripts loaded, a cluster's
    /// slot ranges read), trying until `patience` has passed. A store that answered is known
    /// to every shard's judge as answering.
    pub async fn warm_up(&self, patience: Duration) -> Result<(), StoreError> {
        let start = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let left = patience.saturating_sub(start.elapsed());
            let attempt = self.store.warm_up(left.max(Duration::from_millis(1))).await;
            match attempt {
                Ok(()) => {
                    let now = self.breakers.clock.now_micros();
                    for shard in self.store.shards() {
                        self.breakers.shard(shard).answered(shard, now);
                    }
                    return Ok(());
                }
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) => {
                    let left = patience.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "the store does not answer yet");
                    tokio::time::sleep(pause.min(left)).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }
}
