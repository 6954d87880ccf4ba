//! One request's attempt at its buckets: the status of every matched rule decided so far, and
//! a log of what was taken for it (lease units, pre-limit tokens, LOCAL fallback tokens, units
//! owed to a bucket's next grant, concurrency slots) so that a denied request, or a SHADOW rule
//! that would have denied, gives back exactly what it took: all or nothing.
//!
//! It knows nothing of the node: the decision path records into it, and rolls it back to a
//! mark; what rolling back cannot do by itself (release slots in the store) it hands back.

use std::sync::Arc;

use crate::runtime::keys::bucket::Bucket;
use crate::runtime::local::LocalBucket;
use crate::runtime::verdict::{HeldSlot, RuleStatus};

/// Something taken for the request, to give back if it is denied.
#[derive(Debug)]
pub(crate) enum Taken {
    /// Units spent from a bucket's lease.
    Lease(Arc<Bucket>, u64),
    /// Tokens of a bucket's pre-limit.
    Prelimit(Arc<Bucket>, u64),
    /// Tokens of a LOCAL fail mode's bucket.
    Fallback(Arc<LocalBucket>, u64),
    /// Units admitted without the store, owed by the bucket's next grant.
    Owed(Arc<Bucket>, u64),
    /// A concurrency slot held in the store.
    Slot(HeldSlot),
}

impl Taken {
    /// Gives this back; a slot cannot be given back here and is returned.
    fn give_back(self) -> Option<HeldSlot> {
        match self {
            Taken::Lease(bucket, cost) => bucket.give_back(cost),
            Taken::Prelimit(bucket, cost) => {
                if let Some(pre) = &bucket.prelimit {
                    pre.refund(cost);
                }
            }
            Taken::Fallback(local, cost) => local.refund(cost),
            Taken::Owed(bucket, cost) => bucket.last.refund_owed(cost),
            Taken::Slot(slot) => return Some(slot),
        }
        None
    }
}

/// Where an attempt stood: rolling back to it gives back what was taken since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark(usize);

/// One request's attempt (see the module docs).
#[derive(Debug)]
pub(crate) struct Attempt {
    statuses: Vec<Option<RuleStatus>>,
    taken: Vec<Taken>,
}

impl Attempt {
    /// An attempt at `hits` matched rules, none decided yet.
    pub(crate) fn new(hits: usize) -> Self {
        Self {
            statuses: vec![None; hits],
            taken: vec![],
        }
    }

    /// Records hit `index`'s status; whether it admits.
    pub(crate) fn record(&mut self, index: usize, status: RuleStatus) -> bool {
        let allowed = status.allowed;
        self.statuses[index] = Some(status);
        allowed
    }

    /// Hit `index`'s status, if decided.
    pub(crate) fn status_mut(&mut self, index: usize) -> Option<&mut RuleStatus> {
        self.statuses[index].as_mut()
    }

    /// Logs something taken for the request.
    pub(crate) fn took(&mut self, taken: Taken) {
        self.taken.push(taken);
    }

    /// Records hit `index`'s status and what was taken for it; whether it was allowed.
    pub(crate) fn record_taken(
        &mut self,
        index: usize,
        (status, taken): (RuleStatus, Vec<Taken>),
    ) -> bool {
        self.taken.extend(taken);
        self.record(index, status)
    }

    /// Where the attempt stands now.
    pub(crate) fn mark(&self) -> Mark {
        Mark(self.taken.len())
    }

    /// Gives back, newest first, everything taken since `mark`; returns the slots among it
    /// (to be released in the store).
    pub(crate) fn roll_back_to(&mut self, mark: Mark) -> Vec<HeldSlot> {
        let mut slots = vec![];
        while self.taken.len() > mark.0 {
            if let Some(slot) = self.taken.pop().and_then(Taken::give_back) {
                slots.push(slot);
            }
        }
        slots
    }

    /// The statuses (None where a hit was never reached) and the slots the request holds.
    pub(crate) fn finish(self) -> (Vec<Option<RuleStatus>>, Vec<HeldSlot>) {
        let slots = self
            .taken
            .into_iter()
            .filter_map(|t| match t {
                Taken::Slot(slot) => Some(slot),
                _ => None,
            })
            .collect();
        (self.statuses, slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_lease::{BucketKey, Limit};

    fn slot(n: u64) -> HeldSlot {
        HeldSlot {
            key: BucketKey::new(b"k", "r").expect("key"),
            slot: tollgate_lease::SlotId::forged(&format!("s{n}")),
        }
    }

    #[test]
    fn rolling_back_gives_back_what_was_taken_since_the_mark_only() {
        let limit = Limit::token_bucket(10, 1.0).expect("limit");
        let kept = Arc::new(LocalBucket::for_limit(&limit, 1.0));
        let undone = Arc::new(LocalBucket::for_limit(&limit, 1.0));
        let mut attempt = Attempt::new(2);
        kept.take(4, 0).expect("room");
        attempt.took(Taken::Fallback(kept.clone(), 4));
        let mark = attempt.mark();
        undone.take(6, 0).expect("room");
        attempt.took(Taken::Fallback(undone.clone(), 6));
        attempt.took(Taken::Slot(slot(1)));
        let slots = attempt.roll_back_to(mark);
        assert_eq!(slots.len(), 1, "a slot is handed back to be released");
        assert!(
            undone.take(10, 0).is_ok(),
            "the rolled-back tokens are back"
        );
        assert!(
            kept.take(7, 0).is_err(),
            "what was taken before the mark stays taken"
        );
        assert_eq!(attempt.roll_back_to(mark), vec![], "nothing twice");
    }

    #[test]
    fn an_admitted_attempt_keeps_its_slots_and_statuses() {
        let mut attempt = Attempt::new(3);
        attempt.took(Taken::Slot(slot(1)));
        attempt.took(Taken::Slot(slot(2)));
        let (statuses, slots) = attempt.finish();
        assert_eq!(statuses.len(), 3);
        assert!(statuses.iter().all(Option::is_none), "none decided");
        assert_eq!(slots.len(), 2);
    }
}
