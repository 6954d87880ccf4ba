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
//! 3. shares the rate it could pay for max-min fair per Envoy host, then among a host's
//!    streams (streams that closed keep theirs, and are paid for, until their assignment's
//!    TTL has passed: the Envoy may still be enforcing it);
//! 4. pushes what changed, lower shares first, and renews TTLs before they run out;
//! 5. forgets what its Envoys forgot: a stream that has not reported the bucket for a while,
//!    or reported no request three times, is told to abandon it (or, if it does not read its
//!    stream, loses it when its assignment has run out).
//!
//! Every token an Envoy can admit was taken from the global bucket first, so the Envoys, the
//! RLS callers and the embedded nodes of every node draw from one limit. What an Envoy admits
//! before its first assignment (its no-assignment behaviour) is the one thing not paid for:
//! docs/rlqs.md states the bound. What the broker holds is bounded in bytes
//! ([`RlqsConfig::max_state_bytes`], a quarter of it per stream; `streams.rs`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate_node::runtime::{Descriptor, Matching, Node, Request};
use tollgate_proto::envoy::service::rate_limit_quota::v3::BucketId;

use crate::rlqs::plan::{BucketState, StreamShare};
use crate::rlqs::streams::{
    BUCKET_BYTES, Budget, Outbox, Place, Places, Refusal, SHARE_BYTES, StreamHandle,
};

/// How the broker shares quotas, and what it may hold.
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
    /// A stream that has not reported a bucket for this long no longer holds it (Envoy
    /// reports every bucket it holds every 5 s).
    pub stale_after: Duration,
    /// Memory the buckets and their shares may take, over all streams (a stream alone may
    /// take a quarter of it).
    pub max_state_bytes: usize,
    /// The largest usage report taken (a larger one ends its stream, RESOURCE_EXHAUSTED).
    pub max_report_bytes: usize,
    /// Streams open at once on the node.
    pub max_streams: usize,
    /// Streams open at once from one Envoy host (an Envoy opens one per domain).
    pub max_streams_per_host: usize,
    /// A stream must send its first report within this (Envoy sends it with the stream).
    pub first_report_within: Duration,
    /// A stream whose answers have gone unread this long is ended.
    pub unread_for: Duration,
}

impl Default for RlqsConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(250),
            assignment_ttl: Duration::from_secs(10),
            renew_after: Duration::from_secs(4),
            idle_reports: 3,
            stale_after: Duration::from_secs(20),
            max_state_bytes: 64 << 20,
            max_report_bytes: 4 << 20,
            max_streams: 4096,
            max_streams_per_host: 32,
            first_report_within: Duration::from_secs(10),
            unread_for: Duration::from_secs(10),
        }
    }
}

impl RlqsConfig {
    /// What one stream's shares may take.
    pub fn max_stream_bytes(&self) -> usize {
        self.max_state_bytes / 4
    }
}

/// A bucket's identity: its domain and its id's entries, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    domain: String,
    entries: Vec<(String, String)>,
}

/// Why a reported bucket id cannot be tracked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// A map with no entries.
    #[error("the bucket id has no entries")]
    NoEntries,
    /// A value that is not UTF-8 (a client's header bytes, copied by Envoy). Nothing can be
    /// answered for it: an assignment or an abandon names the bucket by its id, and Envoy
    /// 1.40 refuses a message whose strings are not UTF-8, ending its whole RLQS stream
    /// (status 13), every bucket's assignments with it.
    #[error("the bucket id's {key:?} is not UTF-8")]
    NotUtf8 {
        /// The entry's key.
        key: String,
    },
    /// Entries a descriptor cannot carry.
    #[error("the bucket id is not a descriptor Tollgate can match: {0}")]
    NotADescriptor(String),
}

impl Unusable {
    /// Its `reason` label in `tollgate_rlqs_buckets_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Unusable::NotUtf8 { .. } => "not_utf8",
            _ => "malformed",
        }
    }
}

impl BucketKey {
    /// The key of `id` in `domain`, or why it is not one.
    pub fn of(domain: &str, id: &BucketId) -> Result<Self, Unusable> {
        let mut entries = Vec::with_capacity(id.bucket.len());
        for (k, v) in &id.bucket {
            let v =
                String::from_utf8(v.clone()).map_err(|_| Unusable::NotUtf8 { key: k.clone() })?;
            entries.push((k.clone(), v));
        }
        entries.sort();
        let key = Self {
            domain: domain.to_owned(),
            entries,
        };
        if key.entries.is_empty() {
            return Err(Unusable::NoEntries);
        }
        key.request()
            .validate()
            .map_err(|e| Unusable::NotADescriptor(e.to_string()))?;
        Ok(key)
    }

    /// The memory it takes.
    pub fn bytes(&self) -> usize {
        48 + self.domain.len()
            + self
                .entries
                .iter()
                .map(|(k, v)| 48 + k.len() + v.len())
                .sum::<usize>()
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
            bucket: self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
                .collect(),
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
    buckets: Mutex<HashMap<Arc<BucketKey>, Arc<SharedBucket>>>,
    /// What the buckets and their shares take.
    budget: Arc<Budget>,
    places: Arc<Places>,
    next_stream: AtomicU64,
    /// True once the node shuts down: streams end, bucket loops stop.
    stopping: tokio::sync::watch::Sender<bool>,
}

/// One bucket and the streams that share it.
#[derive(Debug)]
struct SharedBucket {
    key: Arc<BucketKey>,
    state: Mutex<BucketState>,
    wake: Notify,
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

/// The most requests a second one Envoy is taken to report for one bucket: a report of more
/// counts this much (the reported metrics and the demand a share follows are a client's word;
/// no Envoy serves a million requests a second for one bucket).
pub const MAX_REPORTED_PER_SECOND: u64 = 1_000_000;

/// One stream's side: its place, and the buckets it holds.
#[derive(Debug)]
pub struct StreamBuckets {
    handle: Arc<StreamHandle>,
    held: HashMap<Arc<BucketKey>, Arc<SharedBucket>>,
    _place: Place,
}

impl StreamBuckets {
    /// How long its answers have gone unread (None: they are read).
    pub fn unread_for(&self, now: Instant) -> Option<Duration> {
        self.handle.unread_for(now)
    }

    /// Buckets it holds.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

impl Broker {
    /// A broker for `node`'s rules and store.
    pub fn new(node: Node, config: RlqsConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                budget: Arc::new(Budget::new(node.metrics().rlqs.state_bytes.clone())),
                node,
                config,
                buckets: Mutex::new(HashMap::new()),
                places: Arc::default(),
                next_stream: AtomicU64::new(1),
                stopping: tokio::sync::watch::Sender::new(false),
            }),
        }
    }

    /// How it shares and what it may hold.
    pub fn config(&self) -> &RlqsConfig {
        &self.inner.config
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

    /// Counts a bucket report that could not be tracked: its id is not one.
    pub fn unusable(&self, why: &Unusable) {
        self.inner.node.metrics().rlqs.refused(why.reason());
    }

    /// Counts a stream the node ended (or would not open), by why.
    pub fn ended(&self, reason: &'static str) {
        self.inner.node.metrics().rlqs.ended(reason);
    }

    /// Memory the buckets and their shares take now.
    pub fn state_bytes(&self) -> usize {
        self.inner.budget.held()
    }

    /// An outbox for a stream's answers, paid from the node's budget.
    pub fn outbox(&self) -> Outbox {
        Outbox::new(self.inner.budget.clone())
    }

    /// A new stream of the Envoy at `host`, answering on `outbox`; refused when the node, or
    /// that host, holds every stream it may.
    pub fn open(&self, host: IpAddr, outbox: Outbox) -> Result<StreamBuckets, Refusal> {
        let config = &self.inner.config;
        let place =
            self.inner
                .places
                .take(host, config.max_streams, config.max_streams_per_host)?;
        self.inner.node.metrics().rlqs.streams.inc();
        let id = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        Ok(StreamBuckets {
            handle: Arc::new(StreamHandle::new(id, host, outbox)),
            held: HashMap::new(),
            _place: place,
        })
    }

    /// A stream ended: its shares live on, paid for, until their TTLs pass.
    pub fn close(&self, stream: StreamBuckets) {
        for bucket in stream.held.values() {
            if let Some(share) = bucket.state.lock().streams.get_mut(&stream.handle.id) {
                share.open = false;
            }
        }
        self.inner.node.metrics().rlqs.streams.dec();
    }

    /// Forgets the buckets `stream` holds that no longer hold it (told to abandon, or gone):
    /// its Envoy forgot them, or will at its next request.
    pub fn sweep(&self, stream: &mut StreamBuckets) {
        let id = stream.handle.id;
        stream.held.retain(|_, bucket| {
            let state = bucket.state.lock();
            !state.gone && state.streams.contains_key(&id)
        });
    }

    /// Counts one report of `stream`: a bucket it did not hold joins it (and its loop is woken
    /// to assign it a share at once). The counts are a client's word, taken up to what its
    /// Envoy could have done: allowed at most what its token bucket held and refilled, each
    /// at most [`MAX_REPORTED_PER_SECOND`].
    pub fn report(&self, stream: &mut StreamBuckets, usage: Usage) {
        let now = Instant::now();
        let metrics = &self.inner.node.metrics().rlqs;
        let id = stream.handle.id;
        if let Some(held) = stream.held.get(&usage.key) {
            let state = held.state.lock();
            if state.gone || !state.streams.contains_key(&id) {
                // Abandoned, or gone: the Envoy reports it because it holds it again (its
                // next request subscribed anew). It joins again, and gets a share at once.
                drop(state);
                stream.held.remove(&usage.key);
            }
        }
        let bucket = match stream.held.get(&usage.key) {
            Some(b) => b.clone(),
            None => {
                let key = Arc::new(usage.key);
                match self.join(stream, key.clone(), now) {
                    Ok(bucket) => {
                        stream.held.insert(bucket.key.clone(), bucket.clone());
                        bucket.wake.notify_one();
                        bucket
                    }
                    Err(full) => {
                        metrics.refused(full);
                        // The Envoy forgets it (it would hold and report it for good
                        // otherwise): its next request reports it anew, and it joins once
                        // there is room. Until then its requests meet the no-assignment
                        // behaviour. Should the node's budget have no room for the answer
                        // either, the bucket's next report is answered.
                        stream.handle.send_unpaid(
                            &key,
                            abandon(key.id()),
                            self.inner.config.max_state_bytes,
                        );
                        return;
                    }
                }
            }
        };
        let mut state = bucket.state.lock();
        let Some(share) = state.streams.get_mut(&id) else {
            // Dropped by its loop this very moment: joined again at the next report.
            drop(state);
            stream.held.remove(&bucket.key);
            return;
        };
        let elapsed = now
            .saturating_duration_since(share.last_report)
            .max(Duration::from_secs(1));
        let ceiling = (MAX_REPORTED_PER_SECOND as f64 * elapsed.as_secs_f64()) as u64;
        let allowed = usage
            .allowed
            .min(ceiling)
            .min(share.most_admitted(elapsed).unwrap_or(u64::MAX));
        let denied = usage.denied.min(ceiling);
        let requests = allowed.saturating_add(denied);
        share.demand.report(now, requests);
        share.last_report = now;
        share.idle_reports = if requests == 0 {
            share.idle_reports + 1
        } else {
            0
        };
        for (domain, rule) in &state.rules {
            for (result, n) in [("allowed", allowed), ("denied", denied)] {
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
    }

    /// Adds `stream` to the bucket of `key`, made if needed; why not (`node_full`,
    /// `stream_full`) when the node's budget, or the stream's quarter of it, has no room.
    fn join(
        &self,
        stream: &StreamBuckets,
        key: Arc<BucketKey>,
        now: Instant,
    ) -> Result<Arc<SharedBucket>, &'static str> {
        let config = &self.inner.config;
        // A stream is charged for the buckets it holds whole (their state, their tasks), as if
        // it alone held them: its quarter of the budget is what it can make the node hold.
        let share_bytes = SHARE_BYTES + BUCKET_BYTES + key.bytes();
        if !stream.handle.take(share_bytes, config.max_stream_bytes()) {
            return Err("stream_full");
        }
        if !self.inner.budget.take(SHARE_BYTES, config.max_state_bytes) {
            stream.handle.give_back(share_bytes);
            return Err("node_full");
        }
        let give_back = || {
            stream.handle.give_back(share_bytes);
            self.inner.budget.give_back(SHARE_BYTES);
        };
        loop {
            let bucket = {
                let mut buckets = self.inner.buckets.lock();
                match buckets.get(&key) {
                    Some(b) => b.clone(),
                    None => {
                        let bucket_bytes = BUCKET_BYTES + key.bytes();
                        if !self.inner.budget.take(bucket_bytes, config.max_state_bytes) {
                            give_back();
                            return Err("node_full");
                        }
                        let state = BucketState {
                            rules: rules_of(&self.inner.node, &key),
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
            if let Some(old) = state.streams.insert(
                stream.handle.id,
                StreamShare::new(stream.handle.clone(), share_bytes, now),
            ) {
                // Rejoined before its old share went: that one's budget goes back.
                stream.handle.give_back(old.bytes);
                self.inner.budget.give_back(SHARE_BYTES);
            }
            return Ok(bucket.clone());
        }
    }
}

mod bucket_loop;
use bucket_loop::{abandon, rules_of, run};

#[cfg(test)]
mod tests;
