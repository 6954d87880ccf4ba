//! `check`: consume `cost` from every named bucket, or from none.

use std::time::Duration;

use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::{Algorithm, Limit};
use crate::ops::allowance::Allowance;
use crate::ops::slot::SlotId;
use crate::ops::{Repeats, check_allowances, check_marks, check_units, validate_keys};

/// One bucket of a check.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckItem {
    /// Which bucket.
    pub key: BucketKey,
    /// Its limit.
    pub limit: Limit,
    /// Units to consume; 0 peeks without consuming.
    pub cost: u64,
}

/// A validated check of one identity's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRequest {
    items: Vec<CheckItem>,
    peek: bool,
    allowances: Vec<Option<Allowance>>,
    penalized: Vec<bool>,
    reserve: Option<crate::ops::reservation::Reserve>,
}

impl CheckRequest {
    /// Validates the items: one identity, each bucket once, and no cost above a bucket's
    /// capacity (such a request could never be admitted, so it is refused rather than denied).
    pub fn new(items: Vec<CheckItem>) -> Result<Self, InvalidInput> {
        validate_keys(items.iter().map(|i| &i.key), Repeats::Forbidden)?;
        for item in &items {
            check_units("cost", item.cost)?;
            if item.cost > item.limit.capacity() {
                return Err(InvalidInput::CostExceedsCapacity {
                    key: item.key.to_string(),
                    cost: item.cost,
                    capacity: item.limit.capacity(),
                });
            }
        }
        let allowances = vec![None; items.len()];
        let penalized = vec![false; items.len()];
        Ok(Self {
            items,
            peek: false,
            allowances,
            penalized,
            reserve: None,
        })
    }

    /// This request with a regional allowance per item (None: the item has none): an item
    /// with one must also fit its region's share of the limit (see [`crate::ops::allowance`]).
    pub fn with_allowances(
        mut self,
        allowances: Vec<Option<Allowance>>,
    ) -> Result<Self, InvalidInput> {
        check_allowances(self.items.iter().map(|i| (&i.key, &i.limit)), &allowances)?;
        self.allowances = allowances;
        Ok(self)
    }

    /// The allowance of each item.
    pub fn allowances(&self) -> &[Option<Allowance>] {
        &self.allowances
    }

    /// This request with the items whose rule has a penalty marked: such an item is denied
    /// while its identity is blocked (see [`crate::ops::penalty`]), and the request consumes
    /// nothing.
    pub fn with_penalized(mut self, penalized: Vec<bool>) -> Result<Self, InvalidInput> {
        check_marks(self.items.len(), penalized.len())?;
        self.penalized = penalized;
        Ok(self)
    }

    /// Per item, whether a penalty block denies it.
    pub fn penalized(&self) -> &[bool] {
        &self.penalized
    }

    /// This request as a peek: judged exactly as a check (allowed, remaining, and when denied
    /// the retry-after for the cost) but consuming nothing, so a node can learn when a cost
    /// will fit without spending it.
    pub fn peek(mut self) -> Self {
        self.peek = true;
        self.reserve = None;
        self
    }

    /// This check as a reservation: admitted, it consumes its costs (the estimate) and records
    /// a reservation under `nonce` in each bucket, which
    /// [`LeaseStore::settle`](crate::LeaseStore::settle) settles at the actual cost (see
    /// [`crate::ops::reservation`]). Not on a peek nor on CONCURRENCY buckets.
    pub fn reserve(mut self, nonce: &str, ttl: Duration) -> Result<Self, InvalidInput> {
        crate::ops::reservation::check_nonce(nonce)?;
        crate::ops::reservation::check_ttl(ttl)?;
        if self.items.iter().any(|i| is_slot_bucket(&i.limit)) {
            return Err(InvalidInput::BadReservation {
                field: "algorithm",
                reason: "a CONCURRENCY bucket takes no reservation".into(),
            });
        }
        if self.peek {
            return Err(InvalidInput::BadReservation {
                field: "peek",
                reason: "a peek reserves nothing".into(),
            });
        }
        self.reserve = Some(crate::ops::reservation::Reserve {
            nonce: nonce.to_owned(),
            ttl,
        });
        Ok(self)
    }

    /// The reservation this check makes, if it is one.
    pub fn reservation(&self) -> Option<&crate::ops::reservation::Reserve> {
        self.reserve.as_ref()
    }

    /// Whether it is a peek.
    pub fn is_peek(&self) -> bool {
        self.peek
    }

    /// A check of a single bucket.
    pub fn single(key: BucketKey, limit: Limit, cost: u64) -> Result<Self, InvalidInput> {
        Self::new(vec![CheckItem { key, limit, cost }])
    }

    /// The items, in request order.
    pub fn items(&self) -> &[CheckItem] {
        &self.items
    }
}

/// What one bucket said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketStatus {
    /// Whether this bucket alone had room for the cost.
    pub allowed: bool,
    /// Whole units left after this call (after consumption if the request was admitted).
    pub remaining: u64,
    /// When denied: the time until this bucket has room for the cost. Zero when allowed.
    pub retry_after: Duration,
    /// The time until the bucket is back to its full capacity (zero if it already is).
    pub reset_after: Duration,
    /// For a concurrency bucket of an admitted request: the slot to release when done.
    pub slot: Option<SlotId>,
    /// The time left of the penalty block that denied it (zero: none). `retry_after` is at
    /// least this.
    pub blocked_for: Duration,
}

/// A limit decision: a value, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Every bucket had room and the cost was consumed from each.
    Allowed,
    /// At least one bucket had no room; nothing was consumed.
    Limited {
        /// When the request could be admitted (the longest wait among the denying buckets).
        retry_after: Duration,
    },
}

/// The result of a check, one status per item in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOutcome {
    /// Per bucket, in request order.
    pub buckets: Vec<BucketStatus>,
}

impl CheckOutcome {
    /// Whether the request was admitted (every bucket allowed it).
    pub fn allowed(&self) -> bool {
        self.buckets.iter().all(|b| b.allowed)
    }

    /// The decision as a value.
    pub fn decision(&self) -> Decision {
        if self.allowed() {
            Decision::Allowed
        } else {
            let retry_after = self
                .buckets
                .iter()
                .filter(|b| !b.allowed)
                .map(|b| b.retry_after)
                .max()
                .unwrap_or_default();
            Decision::Limited { retry_after }
        }
    }

    /// The concurrency slots this admission holds, to release when the request completes.
    pub fn slots(&self) -> impl Iterator<Item = &SlotId> {
        self.buckets.iter().filter_map(|b| b.slot.as_ref())
    }
}

pub(crate) fn is_slot_bucket(limit: &Limit) -> bool {
    limit.algorithm() == Algorithm::Concurrency
}
