//! Store calls batched per shard, under load only (the design: `docs/store-call-batching.md`).
//!
//! Checks and lease asks for different keys on the same shard share one round trip and one
//! script invocation (`batch.lua`), each request still atomic within itself. Per shard:
//!
//! - a call that finds nothing in flight goes at once, alone, with its own script: at low load
//!   nothing changes;
//! - a call that finds a call in flight queues; when the calls in flight answer, everything
//!   queued meanwhile goes as one batch (at most `max_batch` requests), so a batch is about the
//!   arrival rate times one round trip, with no timer and no added wait;
//! - a queue that holds a full batch sends it at once, on another call in flight (at most
//!   `max_in_flight` per shard).
//!
//! Each request keeps its own budget, counted from when it was made: it stops waiting at its
//! end wherever it is, and a request that stopped waiting before its batch left is not sent.
//! A batch that fails for want of the store (a lost connection, a timeout) fails each of its
//! requests with that error, as separate calls would have failed; a batch Redis refuses as a
//! whole, and a request whose keys the node no longer serves, goes again alone.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value;
use tokio::sync::oneshot;

use super::connection::Connection;
use super::scripts::{BatchOp, SCRIPTS};
use crate::error::StoreError;

/// How calls are batched on one Redis or Redis Cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// The most requests in one batch; 1 sends every call alone (no batching).
    pub max_batch: usize,
    /// The most calls in flight per shard once calls queue (a full batch starts one more).
    pub max_in_flight: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_batch: 64,
            max_in_flight: 4,
        }
    }
}

/// How the batching went so far (counters since the store was opened).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// Batches of two requests or more sent.
    pub batches: u64,
    /// Requests those batches carried.
    pub batched_requests: u64,
    /// Checks and lease asks sent alone (nothing was in flight, or batching does not apply).
    pub alone: u64,
    /// Requests a batch could not run (their keys had moved to another node, or the batch was
    /// refused before it ran) that went again alone.
    pub sent_again: u64,
}

/// A request waiting for a batch.
struct Pending {
    op: BatchOp,
    keys: Vec<String>,
    args: Vec<String>,
    answer: oneshot::Sender<Answer>,
}

/// What a queued request is told.
pub(super) enum Answer {
    /// Its slot of the batch's reply: the reply its own script would give, or its error.
    Replied(Result<Value, StoreError>),
    /// It is to go again alone (the batch was refused as a whole, or its keys moved).
    Alone {
        keys: Vec<String>,
        args: Vec<String>,
    },
}

/// One shard's calls in flight and requests waiting.
#[derive(Default)]
struct Queue {
    in_flight: usize,
    waiting: VecDeque<Pending>,
}

impl Queue {
    /// A call in flight gives its slot back without taking the queue: when it was the last,
    /// nothing would ever send what waits, so the waiting requests are let go (their
    /// receivers see the batch dropped) rather than left until their budgets end.
    fn release(&mut self) {
        self.in_flight -= 1;
        if self.in_flight == 0 {
            self.waiting.clear();
        }
    }
}

/// A drain's call in flight: given back when the drain ends, however it ends (its task may be
/// dropped with the runtime, or panic).
struct DrainSlot<'a> {
    group: &'a Group,
    /// Still held (the drain gives it back itself, under the queue's lock, when the queue is
    /// empty).
    held: bool,
}

impl Drop for DrainSlot<'_> {
    fn drop(&mut self) {
        if self.held {
            self.group.queue.lock().release();
        }
    }
}

#[derive(Default)]
struct Group {
    queue: Mutex<Queue>,
}

/// The batching of one store (shared by its clones).
pub(super) struct Batcher {
    config: BatchConfig,
    conn: Connection,
    /// A cluster's batches check that each request's keys are on the node before running it
    /// (a slot may have moved since the shard map was read).
    cluster: bool,
    /// How long a batch is waited for (its requests stop waiting at their own budgets).
    patience: Duration,
    groups: Mutex<HashMap<u16, Arc<Group>>>,
    batches: AtomicU64,
    batched_requests: AtomicU64,
    alone: AtomicU64,
    sent_again: AtomicU64,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("config", &self.config)
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// How a request entered its shard's queue.
pub(super) enum Entered {
    /// Nothing was in flight: it goes now, alone, and holds the shard's call in flight until
    /// the guard drops.
    Alone(InFlight, Vec<String>, Vec<String>),
    /// It waits for a batch.
    Queued(oneshot::Receiver<Answer>),
}

/// A call in flight that went alone; dropping it hands the queue to a batch, if any waits.
pub(super) struct InFlight {
    batcher: Arc<Batcher>,
    group: Arc<Group>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.batcher.call_ended(&self.group);
    }
}

impl Batcher {
    pub(super) fn new(config: BatchConfig, conn: Connection, patience: Duration) -> Self {
        let config = BatchConfig {
            max_batch: config.max_batch.max(1),
            max_in_flight: config.max_in_flight.max(1),
        };
        Self {
            config,
            cluster: matches!(conn, Connection::Cluster(_)),
            conn,
            patience,
            groups: Mutex::new(HashMap::new()),
            batches: AtomicU64::new(0),
            batched_requests: AtomicU64::new(0),
            alone: AtomicU64::new(0),
            sent_again: AtomicU64::new(0),
        }
    }

    pub(super) fn counts(&self) -> BatchCounts {
        BatchCounts {
            batches: self.batches.load(Ordering::Relaxed),
            batched_requests: self.batched_requests.load(Ordering::Relaxed),
            alone: self.alone.load(Ordering::Relaxed),
            sent_again: self.sent_again.load(Ordering::Relaxed),
        }
    }

    /// Counts a call sent alone without entering a queue (batching did not apply).
    pub(super) fn count_alone(&self) {
        self.alone.fetch_add(1, Ordering::Relaxed);
    }

    fn group(&self, shard: u16) -> Arc<Group> {
        self.groups.lock().entry(shard).or_default().clone()
    }

    /// Enters a request for `shard`: it goes alone at once, or waits for a batch.
    pub(super) fn enter(
        self: &Arc<Self>,
        shard: u16,
        op: BatchOp,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Entered {
        let group = self.group(shard);
        let mut queue = group.queue.lock();
        if queue.in_flight < self.config.max_in_flight && queue.waiting.is_empty() {
            queue.in_flight += 1;
            drop(queue);
            self.count_alone();
            let guard = InFlight {
                batcher: self.clone(),
                group,
            };
            return Entered::Alone(guard, keys, args);
        }
        let (answer, receiver) = oneshot::channel();
        queue.waiting.push_back(Pending {
            op,
            keys,
            args,
            answer,
        });
        let another = queue.waiting.len() >= self.config.max_batch
            && queue.in_flight < self.config.max_in_flight;
        if another {
            queue.in_flight += 1;
        }
        drop(queue);
        if another {
            self.spawn_drain(group);
        }
        Entered::Queued(receiver)
    }

    /// A call in flight ended: the queue, if anything waits in it, goes out as a batch on the
    /// same call in flight.
    fn call_ended(self: &Arc<Self>, group: &Arc<Group>) {
        let mut queue = group.queue.lock();
        if queue.waiting.is_empty() || tokio::runtime::Handle::try_current().is_err() {
            queue.release();
            return;
        }
        drop(queue);
        self.spawn_drain(group.clone());
    }

    fn spawn_drain(self: &Arc<Self>, group: Arc<Group>) {
        let batcher = self.clone();
        tokio::spawn(async move { batcher.drain(group).await });
    }

    /// Sends what waits in `group`'s queue, a batch at a time, until nothing does.
    async fn drain(&self, group: Arc<Group>) {
        let mut slot = DrainSlot {
            group: &group,
            held: true,
        };
        loop {
            let batch = {
                let mut queue = group.queue.lock();
                let mut batch = Vec::with_capacity(queue.waiting.len().min(self.config.max_batch));
                while let Some(pending) = queue.waiting.pop_front() {
                    // A request that stopped waiting is not sent.
                    if pending.answer.is_closed() {
                        continue;
                    }
                    batch.push(pending);
                    if batch.len() == self.config.max_batch {
                        break;
                    }
                }
                if batch.is_empty() {
                    // Under the lock: a request that queues after this sees the slot free.
                    queue.in_flight -= 1;
                    slot.held = false;
                    return;
                }
                batch
            };
            self.send(batch).await;
        }
    }

    /// Sends one batch and answers each of its requests.
    async fn send(&self, mut batch: Vec<Pending>) {
        if batch.len() == 1 {
            let pending = batch.remove(0);
            self.count_alone();
            let result = super::eval(
                &self.conn,
                pending.op.script(),
                &pending.keys,
                &pending.args,
                self.patience,
            )
            .await;
            let _ = pending.answer.send(Answer::Replied(result));
            return;
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_requests
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        // The first request's first key is the one declared: it routes the call.
        let fill = |cmd: &mut redis::Cmd| {
            cmd.arg(1)
                .arg(&batch[0].keys[0])
                .arg(batch.len())
                .arg(u8::from(self.cluster));
            for pending in &batch {
                cmd.arg(pending.op as u8)
                    .arg(pending.keys.len())
                    .arg(pending.args.len())
                    .arg(&pending.keys)
                    .arg(&pending.args);
            }
        };
        let reply = super::eval_with(&self.conn, &SCRIPTS.batch, self.patience, fill).await;
        match reply {
            Ok(Value::Array(slots)) if slots.len() == batch.len() => {
                for (pending, slot) in batch.into_iter().zip(slots) {
                    let answer = match slot_answer(slot) {
                        SlotAnswer::Replied(result) => Answer::Replied(result),
                        SlotAnswer::Alone => {
                            self.sent_again.fetch_add(1, Ordering::Relaxed);
                            Answer::Alone {
                                keys: pending.keys,
                                args: pending.args,
                            }
                        }
                    };
                    let _ = pending.answer.send(answer);
                }
            }
            Ok(other) => {
                let error = StoreError::BadReply(format!(
                    "batch reply: expected an array of {}, got {other:?}",
                    batch.len()
                ));
                for pending in batch {
                    let _ = pending.answer.send(Answer::Replied(Err(error.clone())));
                }
            }
            Err(error) if never_ran(&error) => {
                tracing::debug!(%error, "a batch was refused before it ran; its requests go alone");
                self.sent_again
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                for pending in batch {
                    let _ = pending.answer.send(Answer::Alone {
                        keys: pending.keys,
                        args: pending.args,
                    });
                }
            }
            // Anything else may have come after the batch ran (a reply that did not parse, a
            // timeout): its requests are not sent again, each fails with the batch's error.
            Err(error) => {
                for pending in batch {
                    let _ = pending.answer.send(Answer::Replied(Err(error.clone())));
                }
            }
        }
    }
}

/// Whether a batch's error proves that its script did not run, so that each of its requests
/// may go again alone: Redis refused the call's keys (`CROSSSLOT`) or could not compile the
/// script. (Redirections, `MOVED` and `ASK`, the connection follows by itself.)
fn never_ran(error: &StoreError) -> bool {
    let StoreError::Rejected(message) = error else {
        return false;
    };
    ["CROSSSLOT", "Error compiling script"]
        .iter()
        .any(|m| message.contains(m))
}

enum SlotAnswer {
    Replied(Result<Value, StoreError>),
    Alone,
}

/// One request's slot of a batch reply: `{1, reply}` or `{0, error}`.
fn slot_answer(slot: Value) -> SlotAnswer {
    let bad = |what: String| SlotAnswer::Replied(Err(StoreError::BadReply(what)));
    let Value::Array(mut fields) = slot else {
        return bad(format!("batch slot: expected an array, got {slot:?}"));
    };
    if fields.len() != 2 {
        return bad(format!(
            "batch slot: expected 2 fields, got {}",
            fields.len()
        ));
    }
    let reply = fields.pop().expect("two fields");
    match (fields.pop().expect("two fields"), reply) {
        (Value::Int(1), reply) => SlotAnswer::Replied(Ok(reply)),
        (Value::Int(0), Value::BulkString(message)) => {
            let message = String::from_utf8_lossy(&message).into_owned();
            slot_error(message)
        }
        (flag, reply) => bad(format!("batch slot: unexpected {flag:?}, {reply:?}")),
    }
}

/// What an error one request raised in a batch means for it: the error its own script would
/// have given, or (its keys are not on this node any more) another try alone, which follows
/// the cluster's redirection.
fn slot_error(message: String) -> SlotAnswer {
    const MOVED: [&str; 5] = ["non local key", "MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"];
    if MOVED.iter().any(|m| message.contains(m)) {
        return SlotAnswer::Alone;
    }
    if message.starts_with("OOM") {
        return SlotAnswer::Replied(Err(StoreError::Full(message)));
    }
    SlotAnswer::Replied(Err(StoreError::Rejected(message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(flag: i64, reply: Value) -> Value {
        Value::Array(vec![Value::Int(flag), reply])
    }

    #[test]
    fn a_slot_is_a_reply_or_an_error() {
        let ok = slot_answer(slot(1, Value::Array(vec![Value::Int(7)])));
        assert!(matches!(ok, SlotAnswer::Replied(Ok(Value::Array(v))) if v == [Value::Int(7)]));
        let wrong = slot_answer(slot(
            0,
            Value::BulkString(b"WRONGTYPE Operation against a key".to_vec()),
        ));
        assert!(
            matches!(wrong, SlotAnswer::Replied(Err(StoreError::Rejected(m))) if m.starts_with("WRONGTYPE"))
        );
        let moved = slot_answer(slot(
            0,
            Value::BulkString(b"ERR Script attempted to access a non local key".to_vec()),
        ));
        assert!(matches!(moved, SlotAnswer::Alone));
        let garbage = slot_answer(Value::Int(3));
        assert!(matches!(
            garbage,
            SlotAnswer::Replied(Err(StoreError::BadReply(_)))
        ));
    }

    #[test]
    fn only_a_batch_that_never_ran_goes_again() {
        let rejected = |m: &str| StoreError::Rejected(m.into());
        assert!(never_ran(&rejected(
            "CROSSSLOT Keys in request don't hash to the same slot"
        )));
        assert!(!never_ran(&rejected("ERR something the script raised")));
        assert!(!never_ran(&StoreError::BadReply(
            "a reply that did not parse".into()
        )));
        assert!(!never_ran(&StoreError::Timeout {
            budget: Duration::from_millis(5)
        }));
    }
}
