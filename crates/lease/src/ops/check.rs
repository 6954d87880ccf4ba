//! `check`: consume `cost` from every named bucket, or from none.

use std::time::Duration;

use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::{Algorithm, Limit};
use crate::ops::allowance::Allowance;
use crate::ops::slot::SlotId;
use crate::ops::{Repeats, check_allowance, check_units, validate_keys};

/// One bucket of a check.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckItem {
    /// Which bucket.
    pub key: BucketKey,
    /// Its limit.
    pub limit: Limit,
    /// Units to consume; 0 peeks without consuming.
    pub cost: u64,
    /// Its region's allowance, if its rule has one: the item must also fit this region's
    /// share of the limit (see [`crate::ops::allowance`]).
    pub allowance: Option<Allowance>,
    /// Whether its rule has a penalty: the item is denied while its identity is blocked (see
    /// [`crate::ops::penalty`]), and the request consumes nothing.
    pub penalized: bool,
}

impl CheckItem {
    /// `cost` of `key`'s bucket under `limit`, with no allowance and no penalty.
    pub fn new(key: BucketKey, limit: Limit, cost: u64) -> Self {
        Self {
            key,
            limit,
            cost,
            allowance: None,
            penalized: false,
        }
    }

    /// This item under its region's `allowance` (None: none).
    pub fn with_allowance(self, allowance: Option<Allowance>) -> Self {
        Self { allowance, ..self }
    }

    /// This item, denied while its identity is under a penalty block when `penalized`.
    pub fn with_penalty(self, penalized: bool) -> Self {
        Self { penalized, ..self }
    }
}

/// A validated check of one identity's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRequest {
    items: Vec<CheckItem>,
    peek: bool,
    reserve: Option<crate::ops::reservation::Reserve>,
}

impl CheckRequest {
    /// Validates the items: one identity, each bucket once, no cost above a bucket's capacity
    /// (such a request could never be admitted, so it is refused rather than denied), and each
    /// allowance fit for its bucket.
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
            check_allowance(&item.key, &item.limit, item.allowance.as_ref())?;
        }
        Ok(Self {
            items,
            peek: false,
            reserve: None,
        })
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
        Self::new(vec![CheckItem::new(key, limit, cost)])
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
