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
    /// Makes the debit idempotent (see [`DebitOnce`]); `None`: `units` are simply subtracted.
    pub once: Option<DebitOnce>,
}

/// Makes a debit idempotent, for consumption delivered at least once (region sync).
///
/// `units` is then the origin's running total for one epoch: the store keeps, per bucket, the
/// largest total applied for each `(origin, until)` and debits only what exceeds it. Applying
/// the same totals again, in any order, changes nothing. From `until` on, nothing more is
/// applied for that epoch (and its record may be forgotten).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebitOnce {
    /// Who consumed: 1 to 64 characters of `[A-Za-z0-9._:/-]`.
    pub origin: String,
    /// The end of the epoch the total belongs to (Unix microseconds).
    pub until: Micros,
}

/// The longest origin name.
pub const MAX_ORIGIN_BYTES: usize = 64;

/// Whether `origin` can name a sender in the store's records: 1 to [`MAX_ORIGIN_BYTES`] of
/// `[A-Za-z0-9._:/-]` (never the `|` the records separate fields with).
pub(crate) fn is_origin_name(origin: &str) -> bool {
    !origin.is_empty()
        && origin.len() <= MAX_ORIGIN_BYTES
        && origin
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
}

/// Epoch ends must be below this (2^53 µs, about year 2255): exact in Lua's doubles.
pub const MAX_UNTIL: Micros = 1 << 53;

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
            if let Some(once) = &item.once {
                if !is_origin_name(&once.origin) {
                    return Err(InvalidInput::BadOrigin {
                        origin: once.origin.chars().take(80).collect(),
                    });
                }
                // Times stay exact as Lua numbers (doubles).
                if once.until >= MAX_UNTIL {
                    return Err(InvalidInput::TooLarge {
                        what: "debit-once until",
                        value: once.until,
                        max: MAX_UNTIL - 1,
                    });
                }
            }
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
