//! `debit`: subtract units consumed elsewhere (another region), even below zero.

use crate::clock::Micros;
use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::{Algorithm, Limit};
use crate::ops::{Repeats, check_units, validate_keys};

/// One bucket to debit.
#[derive(Debug, Clone, PartialEq)]
pub struct DebitItem {
    /// Which bucket.
    pub key: BucketKey,
    /// Its limit.
    pub limit: Limit,
    /// Units consumed elsewhere.
    pub units: u64,
    /// When they were consumed (Unix microseconds), for window algorithms: units consumed in a
    /// window that has ended are dropped, never carried into the current one. `None` means now.
    pub consumed_at: Option<Micros>,
}

/// A validated debit of one identity's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct DebitRequest {
    items: Vec<DebitItem>,
}

impl DebitRequest {
    /// Validates the items. Concurrency buckets cannot be debited (slots are not consumption).
    pub fn new(items: Vec<DebitItem>) -> Result<Self, InvalidInput> {
        validate_keys(items.iter().map(|i| &i.key), Repeats::Allowed)?;
        for item in &items {
            check_units("debit units", item.units)?;
            if item.limit.algorithm() == Algorithm::Concurrency {
                return Err(InvalidInput::Unsupported {
                    operation: "debit",
                    algorithm: Algorithm::Concurrency,
                    key: item.key.to_string(),
                });
            }
        }
        Ok(Self { items })
    }

    /// The items, in request order.
    pub fn items(&self) -> &[DebitItem] {
        &self.items
    }
}
