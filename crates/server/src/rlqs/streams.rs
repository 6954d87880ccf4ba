//! The Envoy streams a node holds, and what each may hold: streams per node and per Envoy host
//! are bounded, every bucket a stream shares is counted in bytes against the node's budget and
//! a quarter of it for the stream alone, a stream whose answers go unread is found out, and a
//! stream can be ended with a status Envoy sees (not the OK a closed channel would send).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tollgate_proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use tonic::Status;

use crate::rlqs::broker::BucketKey;

/// What a waiting answer costs beside its bucket id's bytes, when it is charged to the budget
/// (an abandon for a bucket the stream was refused: no share pays for it).
pub const WAITING_BYTES: usize = 256;

/// Actions one answer carries at most: a stream that reported thousands of buckets at once
/// gets their answers in a few messages, none of them large.
const ACTIONS_PER_ANSWER: usize = 1_000;

/// Bucket id bytes one answer carries at most (its actions' keys and values).
const BYTES_PER_ANSWER: usize = 256 * 1024;

/// What a stream has to say to its Envoy and has not yet sent: at most one action for each
/// bucket (an abandon replaces an assignment not yet sent; a newer assignment waits for the
/// bucket's next tick), in the order they first waited. Nothing is dropped for want of room:
/// a stream holds at most one waiting action a bucket it holds, and abandons for buckets it
/// was refused are paid for in the node's budget. Cheap to clone; the stream's [`Answers`]
/// take from it.
#[derive(Debug, Clone)]
pub struct Outbox {
    shared: Arc<OutboxShared>,
}

#[derive(Debug)]
struct OutboxShared {
    waiting: Mutex<Waiting>,
    /// The stream's answers, woken when something waits.
    reader: AtomicWaker,
    /// Set once the answers are dropped: tonic stopped sending them.
    closed: AtomicBool,
    closing: Notify,
    budget: Arc<Budget>,
}

#[derive(Debug, Default)]
struct Waiting {
    actions: HashMap<Arc<BucketKey>, (BucketAction, usize)>,
    order: VecDeque<Arc<BucketKey>>,
    /// Since when something has waited unsent (None: nothing waits).
    since: Option<Instant>,
}

impl Outbox {
    /// An empty outbox; charged answers are paid from `budget`.
    pub fn new(budget: Arc<Budget>) -> Self {
        Self {
            shared: Arc::new(OutboxShared {
                waiting: Mutex::new(Waiting::default()),
                reader: AtomicWaker::new(),
                closed: AtomicBool::new(false),
                closing: Notify::new(),
                budget,
            }),
        }
    }

    /// Puts `action` for `key` out. An abandon replaces whatever waits for the bucket; an
    /// assignment does not replace one still waiting (each assignment's tokens were paid for:
    /// one replaced unsent would strand them), and is not put (false: its bucket tries again
    /// at its next tick, once the first has gone). `charged` bytes were taken from the budget
    /// for it (given back once it is sent, replaced, or not put). False too when the stream's
    /// answers are gone.
    fn put(&self, key: &Arc<BucketKey>, action: BucketAction, charged: usize) -> bool {
        let abandon = matches!(action.bucket_action, Some(Kind::AbandonAction(_)));
        {
            let mut waiting = self.shared.waiting.lock();
            // Checked under the lock `close` takes: nothing is put after it emptied the outbox.
            if self.is_closed() || (!abandon && waiting.actions.contains_key(key)) {
                drop(waiting);
                self.shared.budget.give_back(charged);
                return false;
            }
            match waiting.actions.get_mut(key) {
                Some(entry) => {
                    let (_, was) = std::mem::replace(entry, (action, charged));
                    self.shared.budget.give_back(was);
                }
                None => {
                    waiting.actions.insert(key.clone(), (action, charged));
                    waiting.order.push_back(key.clone());
                }
            }
            waiting.since.get_or_insert_with(Instant::now);
        }
        self.shared.reader.wake();
        true
    }

    /// Whether the stream's answers are gone.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Resolves once the stream's answers are gone.
    pub async fn closed(&self) {
        loop {
            let closing = self.shared.closing.notified();
            if self.is_closed() {
                return;
            }
            closing.await;
        }
    }

    /// Actions waiting.
    pub fn waiting(&self) -> usize {
        self.shared.waiting.lock().actions.len()
    }

    /// How long what waits has waited unsent, since the last answer went out (None: nothing
    /// waits).
    fn unsent_for(&self, now: Instant) -> Option<Duration> {
        self.shared
            .waiting
            .lock()
            .since
            .map(|since| now.saturating_duration_since(since))
    }

    /// The next answer: up to [`ACTIONS_PER_ANSWER`] of what waits, oldest first.
    fn take_answer(&self) -> Option<RateLimitQuotaResponse> {
        let mut waiting = self.shared.waiting.lock();
        let mut actions = vec![];
        let mut bytes = 0;
        while actions.len() < ACTIONS_PER_ANSWER && bytes < BYTES_PER_ANSWER {
            let Some(key) = waiting.order.pop_front() else {
                break;
            };
            let Some((action, charged)) = waiting.actions.remove(&key) else {
                continue;
            };
            self.shared.budget.give_back(charged);
            bytes += key.bytes();
            actions.push(action);
        }
        // An answer goes out: the stream reads. What still waits waits from now.
        waiting.since = (!waiting.order.is_empty()).then(Instant::now);
        (!actions.is_empty()).then_some(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// The stream is over: nothing more goes out (but the status it ends with), and what
    /// waited is paid back.
    pub fn close(&self) {
        let mut waiting = self.shared.waiting.lock();
        self.shared.closed.store(true, Ordering::Release);
        for (_, (_, charged)) in waiting.actions.drain() {
            self.shared.budget.give_back(charged);
        }
        waiting.order.clear();
        waiting.since = None;
        drop(waiting);
        self.shared.closing.notify_waiters();
    }
}

/// What a bucket costs the node's budget beside its id's bytes: the shared state, its task
/// and that task's timer, as the allocator hands them out. Measured: 40,000 buckets of one
/// stream each, with 47-byte keys, took 2,630 bytes of resident memory a bucket (debug build;
/// `rlqs_budget.rs` in crates/server/tests holds the count within 20 % of it).
pub const BUCKET_BYTES: usize = 2048;

/// What one stream's share of a bucket costs: its place in the bucket, the bucket in the
/// stream's own map, and the one answer for it that may wait in the stream's outbox.
pub const SHARE_BYTES: usize = 768;

/// One stream as the buckets it shares see it: where its answers go, which Envoy host it is,
/// and what of the budget it holds.
#[derive(Debug)]
pub struct StreamHandle {
    /// Unique on this node.
    pub id: u64,
    /// The Envoy's host (the connection's address): shares are fair per host first, so one
    /// host's many streams are one host's share.
    pub host: IpAddr,
    outbox: Outbox,
    /// Bytes of the budget this stream's shares take ([`SHARE_BYTES`] and the bucket id's).
    bytes: AtomicUsize,
}

impl StreamHandle {
    pub(crate) fn new(id: u64, host: IpAddr, outbox: Outbox) -> Self {
        Self {
            id,
            host,
            outbox,
            bytes: AtomicUsize::new(0),
        }
    }

    /// Sends `action` for the bucket of `key`, which a share of this stream pays for, without
    /// waiting (see [`Outbox`]: an assignment while another waits for the bucket is not sent,
    /// false). False too when the stream's answers are gone.
    pub fn send(&self, key: &Arc<BucketKey>, action: BucketAction) -> bool {
        self.outbox.put(key, action, 0)
    }

    /// Sends `action` for a bucket no share of this stream pays for (an abandon for one it was
    /// refused), paid from the node's budget, up to `most`, while it waits: false when the
    /// budget has no room (the Envoy reports the bucket again, and is answered then) or the
    /// stream is gone.
    pub fn send_unpaid(&self, key: &Arc<BucketKey>, action: BucketAction, most: usize) -> bool {
        let bytes = WAITING_BYTES + key.bytes();
        if !self.outbox.shared.budget.take(bytes, most) {
            return false;
        }
        self.outbox.put(key, action, bytes)
    }

    /// How long its answers have waited unsent although it has something to say (None:
    /// nothing waits): an Envoy that reads takes them within moments.
    pub fn unread_for(&self, now: Instant) -> Option<Duration> {
        self.outbox.unsent_for(now)
    }

    /// The budget its shares take.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of the stream's budget, unless that passes `most`.
    pub(crate) fn take(&self, bytes: usize, most: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |held| {
                (held + bytes <= most).then_some(held + bytes)
            })
            .is_ok()
    }

    /// Gives `bytes` back.
    pub(crate) fn give_back(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// The node's RLQS budget in bytes: buckets and their shares, over every stream (shown in
/// `tollgate_rlqs_state_bytes`).
#[derive(Debug)]
pub struct Budget {
    held: AtomicUsize,
    shown: prometheus_client::metrics::gauge::Gauge,
}

impl Budget {
    /// An empty budget, shown in `gauge`.
    pub fn new(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        Self {
            held: AtomicUsize::new(0),
            shown: gauge,
        }
    }

    /// Takes `bytes`, unless that passes `most`.
    pub fn take(&self, bytes: usize, most: usize) -> bool {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |held| {
                (held + bytes <= most).then_some(held + bytes)
            })
            .is_ok();
        if taken {
            self.shown.inc_by(bytes as i64);
        }
        taken
    }

    /// Gives `bytes` back.
    pub fn give_back(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        self.shown.dec_by(bytes as i64);
    }

    /// What is held.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// Why a stream was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The node holds every stream it may.
    Full,
    /// The Envoy host holds every stream one host may.
    HostFull,
}

/// The streams open, over the node and per host.
#[derive(Debug, Default)]
pub struct Places {
    by_host: Mutex<HashMap<IpAddr, usize>>,
    open: AtomicUsize,
}

/// A stream's place, given back when dropped.
#[derive(Debug)]
pub struct Place {
    places: Arc<Places>,
    host: IpAddr,
}

impl Places {
    /// A place for a stream of `host`, within `most` streams and `per_host` per host.
    pub fn take(
        self: &Arc<Self>,
        host: IpAddr,
        most: usize,
        per_host: usize,
    ) -> Result<Place, Refusal> {
        let mut by_host = self.by_host.lock();
        if self.open.load(Ordering::Relaxed) >= most {
            return Err(Refusal::Full);
        }
        let held = by_host.entry(host).or_insert(0);
        if *held >= per_host {
            return Err(Refusal::HostFull);
        }
        *held += 1;
        self.open.fetch_add(1, Ordering::Relaxed);
        Ok(Place {
            places: self.clone(),
            host,
        })
    }

    /// Streams open.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut by_host = self.places.by_host.lock();
        if let Some(held) = by_host.get_mut(&self.host) {
            *held -= 1;
            if *held == 0 {
                by_host.remove(&self.host);
            }
        }
        self.places.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream's answers as tonic sends them: what waits in its outbox, until the stream is
/// ended, with a status of the node's choosing (Envoy then sees why, not an OK), which goes out
/// before any answer still waiting, or without one (OK) when the way to end it is dropped.
/// Dropped (tonic stops sending: the stream is over), it closes the outbox.
#[derive(Debug)]
pub struct Answers {
    outbox: Outbox,
    end: Option<oneshot::Receiver<Status>>,
    ended: bool,
}

impl Answers {
    /// The answers of `outbox`, and the way to end them.
    pub fn new(outbox: Outbox) -> (Self, oneshot::Sender<Status>) {
        let (end, ending) = oneshot::channel();
        (
            Self {
                outbox,
                end: Some(ending),
                ended: false,
            },
            end,
        )
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.outbox.close();
    }
}

impl Stream for Answers {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(end) = self.end.as_mut()
            && let Poll::Ready(result) = Pin::new(end).poll(cx)
        {
            // Ended with a status, or its reader went away (the stream is over: whatever
            // buckets still hold a way to push to it, nothing more goes out).
            self.end = None;
            self.ended = true;
            self.outbox.close();
            return Poll::Ready(result.ok().map(Err));
        }
        // Registered before looking: a put after the look wakes this task.
        self.outbox.shared.reader.register(cx.waker());
        match self.outbox.take_answer() {
            Some(answer) => Poll::Ready(Some(Ok(answer))),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests;
