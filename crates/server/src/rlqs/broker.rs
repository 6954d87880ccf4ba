//! The quota broker: every RLQS bucket this node serves, the Envoy streams that share it, and
//! the loop that pays for their shares out of the rule's global limit.
//!
//! A bucket (a domain and a `BucketId`) is matched against the active rules like an RLS
//! descriptor. For a limited bucket, every tick (250 ms) its loop:
//!
//! 1. sets each open stream's target rate: its demand (allowed + denied per second on the
//!    server's clock, from its reports), or the rule's whole rate until a report shows one;
//! 2. draws from the rule's bucket, through the node's decision path (lease, store, fail
//!    modes), what the shares will let the Envoys admit until the next tick, plus the first
//!    fill of every new Envoy bucket (a new token bucket starts full);
//! 3. shares the rate it could pay for max-min fair on the targets (streams that closed keep
//!    theirs, and are paid for, until their assignment's TTL has passed: the Envoy may still
//!    be enforcing it);
//! 4. pushes what changed, lower shares first, and renews TTLs before they run out.
//!
//! Every token an Envoy can admit was taken from the global bucket first, so the Envoys, the
//! RLS callers and the embedded nodes of every node draw from one limit. What an Envoy admits
//! before its first assignment (its no-assignment behaviour) is the one thing not paid for:
//! docs/rlqs.md states the bound.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tollgate_lease::Algorithm;
use tollgate_node::rules::{Mode, RuleKind};
use tollgate_node::runtime::{Charge, Descriptor, Matching, Node, Request};
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, QuotaAssignmentAction,
};
use tollgate_proto::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse};
use tollgate_proto::envoy::r#type::v3::RateLimitStrategy;
use tollgate_proto::envoy::r#type::v3::TokenBucket;
use tollgate_proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as Wire};
use tonic::Status;

use crate::rlqs::shares::{Strategy, water_fill};

/// How the broker shares quotas.
#[derive(Debug, Clone)]
pub struct RlqsConfig {
    /// How often each bucket pays for its shares and rebalances them.
    pub tick: Duration,
    /// How long an assignment lives in the Envoy (whole seconds: Envoy 1.40 reads no more).
    pub assignment_ttl: Duration,
    /// An unchanged assignment is sent again this long after the last push, to renew its TTL.
    pub renew_after: Duration,
    /// Reports in a row with no request after which a stream is told to abandon a bucket.
    pub idle_reports: u32,
    /// A stream that has not reported a bucket for this long no longer holds it.
    pub stale_after: Duration,
    /// Buckets this node tracks at most, over all streams.
    pub max_buckets: usize,
    /// Buckets one stream may hold at most.
    pub max_buckets_per_stream: usize,
}

impl Default for RlqsConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(250),
            assignment_ttl: Duration::from_secs(10),
            renew_after: Duration::from_secs(4),
            idle_reports: 3,
            stale_after: Duration::from_secs(20),
            max_buckets: 10_000,
            max_buckets_per_stream: 10_000,
        }
    }
}

/// Where a stream's answers go.
pub type Outbox = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// A bucket's identity: its domain and its id's entries, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    domain: String,
    entries: Vec<(String, String)>,
}

impl BucketKey {
    /// The key of `id` in `domain`, or why it is not one (a map with no entries, or entries a
    /// descriptor could not carry).
    pub fn of(domain: &str, id: &BucketId) -> Result<Self, String> {
        let mut entries: Vec<(String, String)> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.sort();
        let key = Self {
            domain: domain.to_owned(),
            entries,
        };
        if key.entries.is_empty() {
            return Err("the bucket id has no entries".into());
        }
        key.request()
            .validate()
            .map_err(|e| format!("the bucket id is not a descriptor Tollgate can match: {e}"))?;
        Ok(key)
    }

    /// The bucket as an RLS request of one descriptor (entries in key order), one unit.
    fn request(&self) -> Request {
        Request {
            domain: self.domain.clone(),
            descriptors: vec![Descriptor {
                entries: self.entries.clone(),
                cost: None,
                limit: None,
            }],
            cost: 1,
            matching: Matching::PerDescriptor,
        }
    }

    fn id(&self) -> BucketId {
        BucketId {
            bucket: self.entries.iter().cloned().collect(),
        }
    }
}

/// The node's RLQS buckets. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node: Node,
    config: RlqsConfig,
    buckets: Mutex<HashMap<BucketKey, Arc<SharedBucket>>>,
    next_stream: AtomicU64,
    /// True once the node shuts down: streams end, bucket loops stop.
    stopping: tokio::sync::watch::Sender<bool>,
}

/// One bucket and the streams that share it.
#[derive(Debug)]
struct SharedBucket {
    key: BucketKey,
    state: Mutex<BucketState>,
    wake: Notify,
}

#[derive(Debug, Default)]
struct BucketState {
    streams: HashMap<u64, StreamShare>,
    /// Units drawn from each limited rule's bucket (by rule key) and not yet given to a share:
    /// negative when a new Envoy bucket's first token was given on credit.
    credit: HashMap<String, f64>,
    /// The summed rate of the shares, paid until `paid_until`.
    paid_rate: u64,
    paid_until: Option<Instant>,
    /// The rules the bucket matched at its last tick (domain, id), for the report counters.
    rules: Vec<(String, String)>,
    /// Removed from the broker: a stream that finds it so joins a new one.
    gone: bool,
}

/// One stream's share of a bucket.
#[derive(Debug)]
struct StreamShare {
    /// None once the stream closed (its share lives on until `expires_at`).
    outbox: Option<Outbox>,
    /// What the Envoy was last told, and when.
    strategy: Option<Strategy>,
    pushed_at: Instant,
    /// When the Envoy's assignment runs out (None: it has none).
    expires_at: Option<Instant>,
    demand: Demand,
    idle_reports: u32,
    last_report: Instant,
}

/// A stream's demand for a bucket: requests reported (allowed and denied) per second of the
/// server's clock (Envoy's `time_elapsed` is in whole seconds).
#[derive(Debug)]
struct Demand {
    since: Instant,
    requests: u64,
    per_second: Option<f64>,
}

impl Demand {
    fn new(now: Instant) -> Self {
        Self {
            since: now,
            requests: 0,
            per_second: None,
        }
    }

    /// Counts a report; the rate is measured over at least a second.
    fn report(&mut self, now: Instant, requests: u64) {
        self.requests = self.requests.saturating_add(requests);
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= Duration::from_secs(1) {
            self.per_second = Some(self.requests as f64 / elapsed.as_secs_f64());
            self.requests = 0;
            self.since = now;
        }
    }
}

/// What a bucket's matched rules make of it.
enum Plan {
    /// No enforced rule limits it.
    AllowAll,
    /// An enforced rule blocks it.
    DenyAll,
    /// Shares of the tightest limited rule's rate, paid from every limited rule's bucket.
    Shares {
        charges: Vec<Charge>,
        /// Units per second and bucket size of the tightest rule.
        rate: f64,
        capacity: u64,
    },
}

impl Plan {
    fn of(charges: Vec<Charge>) -> Plan {
        let enforced: Vec<Charge> = charges
            .into_iter()
            .filter(|c| c.rule.mode == Mode::Enforce)
            .collect();
        if enforced
            .iter()
            .any(|c| matches!(c.rule.kind, RuleKind::Block(_)))
        {
            return Plan::DenyAll;
        }
        // A concurrency limit counts requests in flight, which an Envoy's reports do not
        // carry: RLQS enforces the bucket's other rules (docs/rlqs.md).
        let limited: Vec<Charge> = enforced
            .into_iter()
            .filter(|c| {
                c.rule
                    .limit()
                    .is_some_and(|l| l.algorithm() != Algorithm::Concurrency)
            })
            .collect();
        let mut rate = f64::INFINITY;
        let mut capacity = u64::MAX;
        for limit in limited.iter().filter_map(|c| c.rule.limit()) {
            rate = rate.min(limit.average_per_second().unwrap_or(f64::INFINITY));
            capacity = capacity.min(limit.capacity());
        }
        if limited.is_empty() {
            Plan::AllowAll
        } else {
            Plan::Shares {
                charges: limited,
                rate,
                capacity,
            }
        }
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// The wire form of `strategy` for bucket `id`, to live `ttl`.
fn assignment(id: BucketId, strategy: Strategy, ttl: Duration) -> BucketAction {
    let wire = match strategy {
        Strategy::AllowAll => Wire::BlanketRule(BlanketRule::AllowAll as i32),
        Strategy::DenyAll => Wire::BlanketRule(BlanketRule::DenyAll as i32),
        Strategy::TokenBucket {
            max_tokens,
            per_second,
        } => Wire::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(per_second),
            // Whole seconds: Envoy 1.40 divides by the seconds, and compares only the nanos.
            fill_interval: Some(duration(Duration::from_secs(1))),
            name: String::new(),
        }),
    };
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(
            tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction::QuotaAssignmentAction(
                QuotaAssignmentAction {
                    // Whole seconds, at least one: an unset or sub-second TTL expires at once.
                    assignment_time_to_live: Some(duration(Duration::from_secs(
                        ttl.as_secs().max(1),
                    ))),
                    rate_limit_strategy: Some(RateLimitStrategy {
                        strategy: Some(wire),
                    }),
                },
            ),
        ),
    }
}

fn abandon(id: BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(
            tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction::AbandonAction(
                AbandonAction {},
            ),
        ),
    }
}

/// Sends `actions` on `outbox` without waiting: an Envoy that does not read its stream
/// misses them (they are pushed again while they differ from what it was last told).
fn send(outbox: &Outbox, actions: Vec<BucketAction>) -> bool {
    outbox
        .try_send(Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        }))
        .is_ok()
}

/// What one stream reported of one bucket.
#[derive(Debug)]
pub struct Usage {
    /// The bucket.
    pub key: BucketKey,
    /// Requests its Envoy admitted since its last report.
    pub allowed: u64,
    /// Requests its Envoy denied since its last report.
    pub denied: u64,
}

/// One stream's side: the buckets it holds.
#[derive(Debug)]
pub struct StreamBuckets {
    id: u64,
    outbox: Outbox,
    held: HashMap<BucketKey, Arc<SharedBucket>>,
}

impl Broker {
    /// A broker for `node`'s rules and store.
    pub fn new(node: Node, config: RlqsConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                node,
                config,
                buckets: Mutex::new(HashMap::new()),
                next_stream: AtomicU64::new(1),
                stopping: tokio::sync::watch::Sender::new(false),
            }),
        }
    }

    /// Ends every stream and bucket loop: Envoys keep their streams open for as long as they
    /// run, so a node shutting down closes them (their assignments live on until their TTLs,
    /// and the Envoys reconnect to another node).
    pub fn shut_down(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// Resolves once the node shuts down.
    pub async fn stopping(&self) {
        let mut stopping = self.inner.stopping.subscribe();
        let _ = stopping.wait_for(|s| *s).await;
    }

    /// Counts a bucket report that could not be tracked.
    pub fn refused(&self) {
        self.inner.node.metrics().rlqs.buckets_refused.inc();
    }

    /// A new stream answering on `outbox`.
    pub fn open(&self, outbox: Outbox) -> StreamBuckets {
        self.inner.node.metrics().rlqs.streams.inc();
        StreamBuckets {
            id: self.inner.next_stream.fetch_add(1, Ordering::Relaxed),
            outbox,
            held: HashMap::new(),
        }
    }

    /// A stream ended: its shares live on, paid for, until their TTLs pass.
    pub fn close(&self, stream: StreamBuckets) {
        for bucket in stream.held.values() {
            if let Some(share) = bucket.state.lock().streams.get_mut(&stream.id) {
                share.outbox = None;
            }
        }
        self.inner.node.metrics().rlqs.streams.dec();
    }

    /// Counts one report of `stream`: a bucket it did not hold joins it (and its loop is woken
    /// to assign it a share at once).
    pub fn report(&self, stream: &mut StreamBuckets, usage: Usage) {
        let now = Instant::now();
        let metrics = &self.inner.node.metrics().rlqs;
        let bucket = match stream.held.get(&usage.key) {
            Some(b) => b.clone(),
            None => {
                if stream.held.len() >= self.inner.config.max_buckets_per_stream {
                    metrics.buckets_refused.inc();
                    return;
                }
                let Some(bucket) = self.join(stream, &usage.key, now) else {
                    metrics.buckets_refused.inc();
                    return;
                };
                stream.held.insert(usage.key.clone(), bucket.clone());
                bucket.wake.notify_one();
                bucket
            }
        };
        let requests = usage.allowed.saturating_add(usage.denied);
        let mut state = bucket.state.lock();
        for (domain, rule) in &state.rules {
            for (result, n) in [("allowed", usage.allowed), ("denied", usage.denied)] {
                if n > 0 {
                    metrics
                        .reported
                        .get_or_create(&tollgate_node::metrics::rlqs::ReportedLabels {
                            domain: domain.clone(),
                            rule: rule.clone(),
                            result,
                        })
                        .inc_by(n);
                }
            }
        }
        let Some(share) = state.streams.get_mut(&stream.id) else {
            // Abandoned meanwhile: the Envoy's next request subscribes again.
            drop(state);
            stream.held.remove(&usage.key);
            return;
        };
        share.demand.report(now, requests);
        share.last_report = now;
        share.idle_reports = if requests == 0 {
            share.idle_reports + 1
        } else {
            0
        };
    }

    /// Adds `stream` to the bucket of `key`, made if needed (None: the node's bucket budget is
    /// full).
    fn join(
        &self,
        stream: &StreamBuckets,
        key: &BucketKey,
        now: Instant,
    ) -> Option<Arc<SharedBucket>> {
        loop {
            let bucket = {
                let mut buckets = self.inner.buckets.lock();
                match buckets.get(key) {
                    Some(b) => b.clone(),
                    None => {
                        if buckets.len() >= self.inner.config.max_buckets {
                            return None;
                        }
                        let state = BucketState {
                            rules: rules_of(&self.inner.node, key),
                            ..BucketState::default()
                        };
                        let bucket = Arc::new(SharedBucket {
                            key: key.clone(),
                            state: Mutex::new(state),
                            wake: Notify::new(),
                        });
                        buckets.insert(key.clone(), bucket.clone());
                        self.inner
                            .node
                            .metrics()
                            .rlqs
                            .buckets
                            .set(buckets.len() as i64);
                        tokio::spawn(run(self.inner.clone(), bucket.clone()));
                        bucket
                    }
                }
            };
            let mut state = bucket.state.lock();
            if state.gone {
                continue;
            }
            state.streams.insert(
                stream.id,
                StreamShare {
                    outbox: Some(stream.outbox.clone()),
                    strategy: None,
                    pushed_at: now,
                    expires_at: None,
                    demand: Demand::new(now),
                    idle_reports: 0,
                    last_report: now,
                },
            );
            return Some(bucket.clone());
        }
    }
}

fn rules_of(node: &Node, key: &BucketKey) -> Vec<(String, String)> {
    node.charges(&key.request())
        .map(|charges| {
            charges
                .iter()
                .map(|c| (c.rule.domain.clone(), c.rule.id.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A bucket's loop: a tick every `config.tick`, or at once when a stream joins.
async fn run(inner: Arc<Inner>, bucket: Arc<SharedBucket>) {
    let mut interval = tokio::time::interval(inner.config.tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = inner.stopping.subscribe();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = bucket.wake.notified() => {}
            _ = stopping.wait_for(|s| *s) => return,
        }
        if !tick(&inner, &bucket).await {
            return;
        }
    }
}

/// One tick of a bucket; false when the bucket has no stream left and is gone.
async fn tick(inner: &Inner, bucket: &SharedBucket) -> bool {
    let config = &inner.config;
    let now = Instant::now();
    let metrics = &inner.node.metrics().rlqs;
    let charges = inner
        .node
        .charges(&bucket.key.request())
        .unwrap_or_default();
    let rules: Vec<(String, String)> = charges
        .iter()
        .map(|c| (c.rule.domain.clone(), c.rule.id.clone()))
        .collect();
    let plan = Plan::of(charges);
    // What the streams want, and what to draw for it.
    let draws = {
        let mut state = bucket.state.lock();
        state.rules = rules;
        let mut abandoned = vec![];
        state.streams.retain(|id, share| {
            if let Some(outbox) = &share.outbox {
                let stale = now.saturating_duration_since(share.last_report) >= config.stale_after;
                if share.idle_reports >= config.idle_reports || stale {
                    // The Envoy forgets the bucket at once: nothing more to pay.
                    if send(outbox, vec![abandon(bucket.key.id())]) {
                        abandoned.push(*id);
                        return false;
                    }
                }
                true
            } else {
                share.expires_at.is_some_and(|at| at > now)
            }
        });
        metrics.abandons.inc_by(abandoned.len() as u64);
        if state.streams.is_empty() {
            state.gone = true;
            drop(state);
            let mut buckets = inner.buckets.lock();
            buckets.remove(&bucket.key);
            metrics.buckets.set(buckets.len() as i64);
            return false;
        }
        match &plan {
            Plan::AllowAll | Plan::DenyAll => None,
            Plan::Shares {
                charges,
                rate,
                capacity,
            } => {
                let ahead = paid_ahead(&state, now);
                let target = targets(&state, *rate).iter().map(|(_, t)| *t).sum::<f64>()
                    + closed_rate(&state) as f64;
                let target = target.min(*rate);
                let fresh = fresh_streams(&state);
                let bursts = (fresh as f64) * burst_each(*capacity, open_streams(&state));
                Some(
                    charges
                        .iter()
                        .map(|c| {
                            let credit = state.credit.get(&c.rule.key).copied().unwrap_or(0.0);
                            let need = target * config.tick.as_secs_f64() + bursts - ahead - credit;
                            let want = if need >= 1.0 { need.ceil() as u64 } else { 0 };
                            (c.clone(), want.min(*capacity))
                        })
                        .collect::<Vec<_>>(),
                )
            }
        }
    };
    // Draw, outside the lock: each rule's bucket gives what it has, up to what is wanted.
    let mut drawn = vec![];
    if let Some(draws) = draws {
        for (charge, want) in draws {
            if want > 0 {
                let got = draw(&inner.node, &charge, want).await;
                drawn.push((charge.rule.key.clone(), got));
            }
        }
    }
    let mut state = bucket.state.lock();
    for (rule, got) in drawn {
        *state.credit.entry(rule).or_insert(0.0) += got as f64;
    }
    match plan {
        Plan::AllowAll | Plan::DenyAll => {
            let strategy = if matches!(plan, Plan::AllowAll) {
                Strategy::AllowAll
            } else {
                Strategy::DenyAll
            };
            let decided = uniform(&state, strategy);
            push(&mut state, &bucket.key, decided, now, config, metrics);
        }
        Plan::Shares {
            charges,
            rate,
            capacity,
        } => {
            let decided = share_out(&state, &charges, rate, capacity, now, config.tick);
            let fills = push(&mut state, &bucket.key, decided, now, config, metrics);
            pay(&mut state, &charges, fills, now, config.tick);
        }
    }
    true
}

/// Takes up to `want` units from `charge`'s bucket: all of them if it has them, else what it
/// says remains (two store checks, each all or nothing). Returns what was taken.
async fn draw(node: &Node, charge: &Charge, want: u64) -> u64 {
    let verdict = node.draw(charge, want).await;
    if verdict.allowed {
        return want;
    }
    let left = verdict.statuses.first().map_or(0, |s| s.remaining);
    let remaining = left.min(want - 1);
    if remaining > 0 && node.draw(charge, remaining).await.allowed {
        remaining
    } else {
        0
    }
}

/// The value of the shares already paid beyond `now` (negative: a gap since the last tick
/// that the shares admitted through and is still owed).
fn paid_ahead(state: &BucketState, now: Instant) -> f64 {
    let Some(until) = state.paid_until else {
        return 0.0;
    };
    let seconds = if until >= now {
        (until - now).as_secs_f64()
    } else {
        -(now - until).as_secs_f64()
    };
    state.paid_rate as f64 * seconds
}

/// How far above its measured demand a stream's target is: arrivals come in bursts around
/// their average, and a share of exactly the average denies every burst while the tokens it
/// did not use sit idle in the Envoy's bucket.
const HEADROOM: f64 = 1.25;

/// Open streams' target rates: their demand with headroom, or the whole rate until they
/// report one.
fn targets(state: &BucketState, rate: f64) -> Vec<(u64, f64)> {
    let mut out: Vec<(u64, f64)> = state
        .streams
        .iter()
        .filter(|(_, s)| s.outbox.is_some())
        // At least one a second: a stream that saw no request yet can admit its first.
        .map(|(id, s)| {
            let target = s.demand.per_second.map_or(rate, |d| d * HEADROOM + 1.0);
            (*id, target.max(1.0))
        })
        .collect();
    out.sort_by_key(|(id, _)| *id);
    out
}

/// The summed rate of closed streams' shares (paid until their TTLs pass).
fn closed_rate(state: &BucketState) -> u64 {
    state
        .streams
        .values()
        .filter(|s| s.outbox.is_none())
        .filter_map(|s| s.strategy.and_then(|st| st.per_second()))
        .sum()
}

fn open_streams(state: &BucketState) -> usize {
    state
        .streams
        .values()
        .filter(|s| s.outbox.is_some())
        .count()
}

/// Open streams whose Envoy holds no token bucket of ours: the next one it gets starts full.
fn fresh_streams(state: &BucketState) -> usize {
    state
        .streams
        .values()
        .filter(|s| s.outbox.is_some() && s.strategy.is_none_or(|st| st.per_second().is_none()))
        .count()
}

/// The first fill a new Envoy bucket is given: an even share of the rule's burst.
fn burst_each(capacity: u64, open: usize) -> f64 {
    (capacity as f64 / open.max(1) as f64).floor().max(1.0)
}

fn uniform(state: &BucketState, strategy: Strategy) -> Vec<Decided> {
    state
        .streams
        .iter()
        .filter(|(_, s)| s.outbox.is_some())
        .map(|(id, _)| Decided {
            stream: *id,
            strategy,
            fill: 0.0,
        })
        .collect()
}

/// What one open stream is to be told: its strategy, and what its first fill costs when the
/// Envoy gets a new token bucket (it starts full).
struct Decided {
    stream: u64,
    strategy: Strategy,
    fill: f64,
}

/// Shares the rate the bucket can pay for among its open streams.
fn share_out(
    state: &BucketState,
    charges: &[Charge],
    rate: f64,
    capacity: u64,
    now: Instant,
    tick: Duration,
) -> Vec<Decided> {
    let tick_s = tick.as_secs_f64();
    let credit = min_credit(state, charges);
    let fresh = fresh_streams(state) as f64;
    // What the paid-for units afford until the next tick, a token set aside for each new
    // Envoy bucket (it starts full), never above the rule's rate. One tick of the rule's rate
    // and a unit may be owed (drawn at the next tick, before anything new is given): a store
    // that refilled a hair less than a tick's worth since the last draw does not make every
    // share shrink and grow back, each time pushed to every Envoy.
    let slack = rate * tick_s + 1.0;
    let affordable = ((credit + paid_ahead(state, now) - fresh + slack) / tick_s).max(0.0);
    let targets = targets(state, rate);
    // An Envoy bucket of ours is kept (at one unit a second) rather than replaced by DENY_ALL
    // while the credit is short: a new one would start full, and its first fill would deepen
    // the debt that cut it (the unit is paid for at the next draws).
    // Only while the debt is under one bucket: a store kept empty by other callers must not
    // let the floor run up a debt without end (repaid later by starving them).
    let held = if credit > -(capacity as f64) {
        targets
            .iter()
            .filter(|(id, _)| {
                state.streams[id]
                    .strategy
                    .is_some_and(|s| s.per_second().is_some())
            })
            .count() as u64
    } else {
        0
    };
    let budget = (affordable.floor() as u64)
        .max(held)
        .min(rate.floor() as u64);
    let open_budget = budget.saturating_sub(closed_rate(state));
    let demands: Vec<f64> = targets.iter().map(|(_, t)| *t).collect();
    let rates = water_fill(open_budget, &demands);
    // First fills of new Envoy buckets: an even share of the burst, out of what is left.
    let burst = burst_each(capacity, targets.len());
    let mut pool = (credit - fresh).max(0.0);
    let mut out = Vec::with_capacity(targets.len());
    for ((stream, _), per_second) in targets.iter().zip(rates) {
        // An Envoy bucket holds at least one second of its rate (Envoy adds a fill interval's
        // tokens at once, and a smaller bucket would drop them); raising it may add tokens at
        // once, up to the difference, which is paid for.
        let decided = match state.streams[stream].strategy {
            Some(Strategy::TokenBucket { max_tokens, .. }) if per_second > 0 => {
                let max_tokens = u64::from(max_tokens);
                Decided {
                    stream: *stream,
                    strategy: Strategy::share(per_second, max_tokens.max(per_second)),
                    fill: per_second.saturating_sub(max_tokens) as f64,
                }
            }
            _ if per_second == 0 => Decided {
                stream: *stream,
                strategy: Strategy::DenyAll,
                fill: 0.0,
            },
            _ => {
                let extra = (burst - 1.0).min(pool.floor()).max(0.0);
                pool -= extra;
                let fill = (1.0 + extra).max(per_second as f64);
                Decided {
                    stream: *stream,
                    strategy: Strategy::share(per_second, fill as u64),
                    fill,
                }
            }
        };
        out.push(decided);
    }
    out
}

/// The least credit over the bucket's limited rules.
fn min_credit(state: &BucketState, charges: &[Charge]) -> f64 {
    charges
        .iter()
        .map(|c| state.credit.get(&c.rule.key).copied().unwrap_or(0.0))
        .fold(f64::INFINITY, f64::min)
}

/// Pays, out of each rule's credit, the first fills given this tick and the shares the
/// Envoys now hold until the next tick (what was paid beyond now counts toward them).
fn pay(state: &mut BucketState, charges: &[Charge], fills: f64, now: Instant, tick: Duration) {
    let held: u64 = state
        .streams
        .values()
        .filter_map(|s| s.strategy.and_then(|st| st.per_second()))
        .sum();
    let cost = held as f64 * tick.as_secs_f64() + fills - paid_ahead(state, now);
    for c in charges {
        *state.credit.entry(c.rule.key.clone()).or_insert(0.0) -= cost;
    }
    state.paid_rate = held;
    state.paid_until = Some(now + tick);
}

/// Sends each open stream its strategy when it changed or its TTL is due for renewal: lower
/// shares first, so the sum stays within the limit while shares move. A higher share is sent
/// at most once a second (it can wait; a lower one cannot). Returns the first fills sent.
fn push(
    state: &mut BucketState,
    key: &BucketKey,
    decided: Vec<Decided>,
    now: Instant,
    config: &RlqsConfig,
    metrics: &tollgate_node::metrics::rlqs::RlqsMetrics,
) -> f64 {
    let mut due: Vec<(Decided, bool)> = decided
        .into_iter()
        .filter_map(|d| {
            let share = state.streams.get(&d.stream)?;
            let since = now.saturating_duration_since(share.pushed_at);
            let old = share.strategy.and_then(|s| s.per_second());
            let new = d.strategy.per_second();
            let lower = old.is_some_and(|old| new.unwrap_or(0) < old);
            let higher = matches!((old, new), (Some(old), Some(new)) if new > old);
            let changed = share.strategy != Some(d.strategy);
            let send = (changed && (!higher || since >= Duration::from_secs(1)))
                || since >= config.renew_after;
            send.then_some((d, lower))
        })
        .collect();
    due.sort_by_key(|(_, lower)| !lower);
    let mut fills = 0.0;
    for (d, _) in due {
        let Some(share) = state.streams.get_mut(&d.stream) else {
            continue;
        };
        let Some(outbox) = &share.outbox else {
            continue;
        };
        // An unchanged higher share not yet due keeps the old one, renewed.
        let strategy = d.strategy;
        tracing::debug!(stream = d.stream, bucket = ?key.entries, ?strategy, "RLQS assignment");
        if send(
            outbox,
            vec![assignment(key.id(), strategy, config.assignment_ttl)],
        ) {
            share.strategy = Some(strategy);
            share.pushed_at = now;
            share.expires_at = Some(now + config.assignment_ttl);
            fills += d.fill;
            metrics.assignments.inc();
        }
    }
    fills
}
