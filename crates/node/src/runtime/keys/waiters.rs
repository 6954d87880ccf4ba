//! The requests waiting on a key actor for units its leases do not hold yet: served together
//! when a lease arrives (each all or nothing), denied when the store said when they fit, failed
//! together when the store fails, and, while a call out is late, kept only if they wait
//! through it (none waits behind another's timeout).

use std::collections::VecDeque;
use std::sync::Arc;

use ractor::RpcReplyPort;
use tollgate_lease::Micros;

use crate::runtime::fail_modes::{self, Cause};
use crate::runtime::keys::bucket::{AcquireOutcome, Bucket, Want};
use crate::runtime::store_health::lateness::Late;

#[derive(Debug)]
struct Waiter {
    wants: Vec<Want>,
    reply: RpcReplyPort<AcquireOutcome>,
}

/// One bucket's part in what the waiters need.
#[derive(Debug)]
pub(crate) struct Need {
    pub(crate) bucket: Arc<Bucket>,
    /// Units every waiter needs of it together.
    pub(crate) total: u64,
    /// Units the first waiter needs of it.
    pub(crate) first: u64,
}

/// The requests waiting, in arrival order.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    queue: VecDeque<Waiter>,
}

impl Waiters {
    /// Queues a request for `wants`.
    pub(crate) fn push(&mut self, wants: Vec<Want>, reply: RpcReplyPort<AcquireOutcome>) {
        self.queue.push_back(Waiter { wants, reply });
    }

    /// Whether none waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Serves every waiter that the leases (or a recorded denial) can answer at `now`.
    pub(crate) fn serve(&mut self, now: Micros) {
        let mut still = VecDeque::with_capacity(self.queue.len());
        while let Some(waiter) = self.queue.pop_front() {
            // The decision path stopped waiting (and decided without these units): taking
            // them now would strand them.
            if waiter.reply.is_closed() {
                continue;
            }
            if let Some((index, retry_after)) = waiter
                .wants
                .iter()
                .enumerate()
                .find_map(|(i, w)| w.bucket.denied_for(w.cost, now).map(|r| (i, r)))
            {
                let _ = waiter
                    .reply
                    .send(AcquireOutcome::Denied { index, retry_after });
            } else if take_all(&waiter.wants, now) {
                if waiter.reply.send(AcquireOutcome::Reserved).is_err() {
                    for want in &waiter.wants {
                        want.bucket.give_back(want.cost);
                    }
                }
            } else {
                still.push_back(waiter);
            }
        }
        self.queue = still;
    }

    /// What the waiters need, per bucket, in the order first needed.
    pub(crate) fn needs(&self) -> Vec<Need> {
        let mut needs: Vec<Need> = vec![];
        for want in self.queue.iter().flat_map(|w| &w.wants) {
            match needs
                .iter_mut()
                .find(|n| Arc::ptr_eq(&n.bucket, &want.bucket))
            {
                Some(need) => need.total += want.cost,
                None => needs.push(Need {
                    bucket: want.bucket.clone(),
                    total: want.cost,
                    first: want.cost,
                }),
            }
        }
        needs
    }

    /// The most units one waiter needs of `bucket`.
    pub(crate) fn largest_need_of(&self, bucket: &Arc<Bucket>) -> u64 {
        self.queue
            .iter()
            .flat_map(|w| &w.wants)
            .filter(|w| Arc::ptr_eq(&w.bucket, bucket))
            .map(|w| w.cost)
            .max()
            .unwrap_or(0)
    }

    /// Whether a waiter is on another definition of `bucket`'s rule (same key, other uid).
    pub(crate) fn on_older_definition_of(&self, bucket: &Bucket) -> bool {
        self.queue
            .iter()
            .flat_map(|w| &w.wants)
            .any(|w| w.bucket.key == bucket.key && w.bucket.rule.uid != bucket.rule.uid)
    }

    /// The call out is `late`: fails the waiters that do not wait through it.
    pub(crate) fn fail_those_not_waiting_through(&mut self, late: Late) {
        let (stay, decided): (VecDeque<_>, VecDeque<_>) = self
            .queue
            .drain(..)
            .partition(|w| waits_through(late, &w.wants));
        self.queue = stay;
        for waiter in decided {
            let _ = waiter.reply.send(AcquireOutcome::Failed(late.into()));
        }
    }

    /// Fails every waiter, for `cause`.
    pub(crate) fn fail_all(&mut self, cause: Cause) {
        for waiter in self.queue.drain(..) {
            let _ = waiter.reply.send(AcquireOutcome::Failed(cause));
        }
    }
}

/// Takes every want's units, or none.
fn take_all(wants: &[Want], now: Micros) -> bool {
    for (i, want) in wants.iter().enumerate() {
        if !want.bucket.try_take(want.cost, || now) {
            for taken in &wants[..i] {
                taken.bucket.give_back(taken.cost);
            }
            return false;
        }
    }
    true
}

/// Whether a request for `wants` waits through a late call: when any of its rules does
/// ([`fail_modes::waits_through`]).
pub(crate) fn waits_through(late: Late, wants: &[Want]) -> bool {
    wants
        .iter()
        .any(|w| fail_modes::waits_through(w.bucket.rule.fail_mode, late))
}
