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

/// One shard as the runtime sees it: its breaker, its pulse and its calls out.
#[derive(Debug)]
struct Shard {
    breaker: Breaker,
    /// Calls out to it now (a call going out counts those ahead of it).
    in_flight: Arc<AtomicU64>,
    /// When it last answered a call (node clock, µs; 0: never).
    last_answer: Micros,
    /// A [`Prober`] is out.
    probing: bool,
    /// Whether it answers, as the log and `/readyz` tell it.
    health: Health,
    /// A key a call went to there (the first): what the heartbeat asks about.
    probe_key: Option<BucketKey>,
    /// When a call to it last answered or failed.
    last_outcome: Micros,
}

/// A shard's outage as operators see it: from its first failed call to its next answer.
#[derive(Debug, Default, Clone)]
pub struct Health {
    /// When calls began failing with no answer since (None: it answers).
    pub failing_since: Option<Micros>,
    /// Calls failed since.
    pub failed: u64,
    /// The last failure.
    pub last_error: String,
    /// When the outage was last written to the log.
    logged: Micros,
}

/// How often an outage that lasts is written to the log again.
const OUTAGE_LOGGED_EVERY: Duration = Duration::from_secs(5);

/// A shard as `/readyz` and the metrics show it.
#[derive(Debug, Clone)]
pub struct ShardHealth {
    /// The shard (its first slot in a Redis Cluster; 0 otherwise).
    pub shard: u16,
    /// Its breaker.
    pub breaker: BreakerState,
    /// When it last answered (node clock, µs; 0: never).
    pub last_answer: Micros,
    /// Its outage, if it has one.
    pub health: Health,
}

impl ShardHealth {
    /// Whether it answers: no call has failed since its last answer, and its breaker is
    /// closed.
    pub fn answering(&self) -> bool {
        self.health.failing_since.is_none() && self.breaker == BreakerState::Closed
    }
}

impl Shard {
    /// A call failed at `now`: the outage starts (logged at once) or goes on (logged every
    /// few seconds).
    fn failed(&mut self, shard: u16, now: Micros, error: &StoreError) {
        self.last_outcome = self.last_outcome.max(now);
        let h = &mut self.health;
        h.failed += 1;
        h.last_error = error.to_string();
        match h.failing_since {
            None => {
                h.failing_since = Some(now);
                h.logged = now;
                let since_answer_ms =
                    (self.last_answer > 0).then(|| now.saturating_sub(self.last_answer) / 1000);
                tracing::warn!(
                    shard,
                    error = %error,
                    since_answer_ms,
                    "the store is not answering: requests are decided by their rules' fail \
                     modes until it does"
                );
            }
            Some(since)
                if now.saturating_sub(h.logged) >= OUTAGE_LOGGED_EVERY.as_micros() as u64 =>
            {
                h.logged = now;
                tracing::warn!(
                    shard,
                    error = %error,
                    for_ms = now.saturating_sub(since) / 1000,
                    failed_calls = h.failed,
                    "the store is still not answering"
                );
            }
            Some(_) => {}
        }
    }

    /// The store answered at `now`: an outage ends (logged).
    fn answered(&mut self, shard: u16, now: Micros) {
        self.last_answer = self.last_answer.max(now);
        self.last_outcome = self.last_outcome.max(now);
        if let Some(since) = self.health.failing_since.take() {
            tracing::info!(
                shard,
                after_ms = now.saturating_sub(since) / 1000,
                failed_calls = self.health.failed,
                "the store answers again"
            );
        }
        self.health.failed = 0;
    }
}

/// The store behind per-shard circuit breakers, with metrics.
#[derive(Debug)]
pub struct GuardedStore {
    /// The store, with a budget of `patience` per call (the judging is done here).
    store: Store,
    budget: Duration,
    patience: Duration,
    breakers: Arc<Breakers>,
}

/// Every shard's breaker and pulse (shared with the probes that run on their own).
#[derive(Debug)]
struct Breakers {
    shards: DashMap<u16, Shard>,
    config: BreakerConfig,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    /// Cooldown jitter (seeded, so a simulation repeats).
    jitter: parking_lot::Mutex<StdRng>,
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

/// What keeps one probe out to a shard whose probe ran out of time or was dropped
/// unanswered, until the store answers one (the breaker closes) or refuses it (the breaker
/// opens again, for a doubled cooldown). Meanwhile the breaker stays half-open.
#[derive(Debug)]
struct Prober {
    breakers: Arc<Breakers>,
    store: Store,
    key: BucketKey,
    shard: u16,
    /// The least time between two probes (a store that times out at once is not asked in a
    /// busy loop): the patience, which is also how long one probe is waited for.
    every: Duration,
}

impl Prober {
    /// Starts probing on a task of its own, unless a probe of the shard's is out already.
    fn start(self: Box<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut s = self.breakers.shard(self.shard);
            if s.probing || !s.breaker.half_open() {
                return;
            }
            s.probing = true;
        }
        runtime.spawn(self.probe());
    }

    async fn probe(self: Box<Self>) {
        let breakers = &self.breakers;
        loop {
            let started = breakers.clock.now_micros();
            {
                let mut s = breakers.shard(self.shard);
                if !s.breaker.half_open() {
                    s.probing = false;
                    return;
                }
                s.breaker.hold_half_open(started);
            }
            breakers.metrics.store_calls.inc();
            // A read of the key whose call was the probe: on its shard, and cheap.
            let result = self.store.held_leases(&self.key).await;
            let now = breakers.clock.now_micros();
            breakers
                .metrics
                .observe_store(StoreOp::Probe, now.saturating_sub(started) as f64 / 1e6);
            let mut s = breakers.shard(self.shard);
            if !s.breaker.half_open() {
                // Another call's answer decided meanwhile.
                s.probing = false;
                return;
            }
            match result {
                Err(e @ StoreError::Timeout { .. }) => {
                    s.failed(self.shard, now, &e);
                    drop(s);
                    breakers
                        .metrics
                        .count_failure(StoreOp::Probe, StoreFailure::Timeout);
                    let next = started + self.every.as_micros() as u64;
                    if now < next {
                        tokio::time::sleep(Duration::from_micros(next - now)).await;
                    }
                }
                Err(e) if e.is_transient() && !matches!(e, StoreError::Full(_)) => {
                    s.failed(self.shard, now, &e);
                    s.breaker.on_failure(now, breakers.jitter.lock().random());
                    s.probing = false;
                    drop(s);
                    breakers
                        .metrics
                        .count_failure(StoreOp::Probe, StoreFailure::Unavailable);
                    breakers.publish_state();
                    return;
                }
                _ => {
                    s.answered(self.shard, now);
                    s.breaker.on_success(now);
                    s.probing = false;
                    drop(s);
                    tracing::info!(shard = self.shard, "store circuit breaker closed");
                    breakers.publish_state();
                    return;
                }
            }
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

    /// Starts, waits for and ends one call (`future` is `key`'s shard's side of it).
    async fn call<T>(
        &self,
        op: StoreOp,
        key: &BucketKey,
        wait: Wait,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let mut call = self.begin(op, key)?;
        let future = std::pin::pin!(future);
        match self
            .wait(&mut call, future, |late| wait.stops_at(late))
            .await
        {
            Waited::Answered(result) => {
                self.end(call, &result);
                result
            }
            Waited::Stopped(error) => Err(error),
        }
    }

    /// [`LeaseStore::check`] through the breaker, waited for as `wait` says.
    pub async fn check(&self, req: &CheckRequest, wait: Wait) -> Result<CheckOutcome, StoreError> {
        let key = &req.items()[0].key;
        self.call(StoreOp::Check, key, wait, self.store.check(req))
            .await
    }

    /// [`LeaseStore::acquire_leases`] through the breaker. The call is waited for until it
    /// answers or the patience ends (a grant that comes late is still used); `on_late` is told
    /// when the store stalls and when it is down, so that the requests waiting on the grant
    /// can be decided meanwhile.
    pub async fn acquire_leases(
        &self,
        req: &LeaseRequest,
        mut on_late: impl FnMut(Late),
    ) -> Result<Vec<LeaseGrant>, StoreError> {
        let mut call = self.begin(StoreOp::LeaseAcquire, &req.asks()[0].key)?;
        let future = std::pin::pin!(self.store.acquire_leases(req));
        let mut late = false;
        let waited = self
            .wait(&mut call, future, |l| {
                late = true;
                on_late(l);
                false
            })
            .await;
        match waited {
            Waited::Answered(result) => {
                if late && result.is_ok() {
                    self.breakers.metrics.late_leases.inc();
                }
                self.end(call, &result);
                result
            }
            Waited::Stopped(error) => Err(error),
        }
    }

    /// [`LeaseStore::return_leases`] through the breaker.
    pub async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        let key = &req.items()[0].key;
        self.call(
            StoreOp::LeaseReturn,
            key,
            Wait::UntilStall,
            self.store.return_leases(req),
        )
        .await
    }

    /// [`LeaseStore::release_slots`] through the breaker.
    pub async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        let key = &req.items()[0].0;
        self.call(
            StoreOp::SlotRelease,
            key,
            Wait::UntilStall,
            self.store.release_slots(req),
        )
        .await
    }

    /// [`LeaseStore::renew_slots`] through the breaker.
    pub async fn renew_slots(&self, req: &SlotRenew) -> Result<Vec<bool>, StoreError> {
        let key = &req.items()[0].0;
        self.call(
            StoreOp::SlotRenew,
            key,
            Wait::UntilStall,
            self.store.renew_slots(req),
        )
        .await
    }

    /// [`LeaseStore::debit`] through the breaker (what was admitted while the store was late).
    pub async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        let key = &req.items()[0].key;
        self.call(StoreOp::Debit, key, Wait::UntilStall, self.store.debit(req))
            .await
    }

    /// [`LeaseStore::check`], begun through the breaker, for a caller that may stop waiting
    /// and hand the call off (it goes on, in a task of its own, to its end): the call and the
    /// store's side of it. Waited for with [`GuardedStore::wait`], ended with
    /// [`GuardedStore::end`].
    pub(crate) fn begin_check(
        &self,
        req: &CheckRequest,
    ) -> Result<(Call, StoreFuture<CheckOutcome>), StoreError> {
        let call = self.begin(StoreOp::Check, &req.items()[0].key)?;
        let (store, req) = (self.store.clone(), req.clone());
        Ok((call, Box::pin(async move { store.check(&req).await })))
    }

    /// [`LeaseStore::settle`] through the breaker. No request waits on a settle (it is made
    /// after the response): it waits for the store through a stall, up to the patience.
    pub async fn settle(&self, req: &SettleRequest) -> Result<Vec<Settlement>, StoreError> {
        let key = &req.items()[0].key;
        self.call(
            StoreOp::Settle,
            key,
            Wait::UntilDown,
            self.store.settle(req),
        )
        .await
    }

    /// [`LeaseStore::note_denials`] through the breaker: denials counted towards `key`'s
    /// penalty (none: its record read), waited for through a stall, up to the patience (no
    /// request waits on it).
    pub async fn note_denials(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
        denials: u64,
        epoch: Option<u64>,
    ) -> Result<PenaltyState, StoreError> {
        self.call(
            StoreOp::NoteDenials,
            key,
            Wait::UntilDown,
            self.store.note_denials(key, penalty, denials, epoch),
        )
        .await
    }

    /// [`LeaseStore::reset`] through the breaker (an operator's call, waited for through a
    /// stall).
    pub async fn reset(&self, key: &BucketKey) -> Result<bool, StoreError> {
        self.call(StoreOp::Reset, key, Wait::UntilDown, self.store.reset(key))
            .await
    }

    /// [`LeaseStore::lift_block`] through the breaker (an operator's call).
    pub async fn lift_block(&self, key: &BucketKey) -> Result<Lift, StoreError> {
        self.call(
            StoreOp::PenaltyLift,
            key,
            Wait::UntilDown,
            self.store.lift_block(key),
        )
        .await
    }

    /// [`LeaseStore::held_leases`] through the breaker (an operator's read).
    pub async fn held_leases(&self, key: &BucketKey) -> Result<HeldLeases, StoreError> {
        self.call(
            StoreOp::Read,
            key,
            Wait::UntilDown,
            self.store.held_leases(key),
        )
        .await
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

impl Breakers {
    fn shard(&self, shard: u16) -> dashmap::mapref::one::RefMut<'_, u16, Shard> {
        self.shards.entry(shard).or_insert_with(|| Shard {
            breaker: Breaker::new(self.config.clone()),
            in_flight: Arc::new(AtomicU64::new(0)),
            last_answer: 0,
            probing: false,
            health: Health::default(),
            probe_key: None,
            last_outcome: 0,
        })
    }

    fn publish_state(&self) {
        let (worst, open) = self.shards.iter().fold((0, 0), |(worst, open), s| {
            let code = s.breaker.state().code();
            (worst.max(code), open + i64::from(code > 0))
        });
        self.metrics.breaker_state.set(worst);
        self.metrics.breakers_open.set(open);
    }
}
