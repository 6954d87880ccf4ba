//! The store's operations: their requests, validated on construction, and their outcomes.
//!
//! Every request serves one identity (all its buckets share a hash tag, hence one cluster slot
//! and one atomic script call) and names each bucket at most once.
//!
//! # Layout
//! - [`check`]: consume `cost` from every bucket or from none.
//! - [`lease`]: take a batch of units to spend locally; give back what is left.
//! - [`slot`]: release a concurrency slot.
//! - [`debit`]: subtract units consumed elsewhere.
//! - [`allowance`]: a region's demand-based share of a bucket that syncs with a peer region.
//! - [`counter`]: read what the nodes hold of one bucket, or forget the bucket (a reset).
//! - [`penalty`]: count an identity's denials and block it when a rule's penalty says so.
//! - [`reservation`]: a check that reserves an estimate, settled later at the actual cost.

pub mod allowance;
pub mod check;
pub mod counter;
pub mod debit;
pub mod lease;
pub mod penalty;
pub mod reservation;
pub mod slot;

use std::collections::HashSet;

use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::MAX_UNITS;

/// The most buckets one call may name.
pub const MAX_BUCKETS_PER_CALL: usize = 64;

/// Whether a request may name the same bucket more than once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeats {
    /// Items are applied one after another (returns, releases, debits, lease asks).
    Allowed,
    /// Items are judged together before any is applied (check): each bucket once.
    Forbidden,
}

/// Checks the rules every request shares: at least one bucket, not too many, one identity, and
/// (for checks) no bucket twice.
pub(crate) fn validate_keys<'a>(
    keys: impl ExactSizeIterator<Item = &'a BucketKey>,
    repeats: Repeats,
) -> Result<(), InvalidInput> {
    let count = keys.len();
    if count == 0 {
        return Err(InvalidInput::NoBuckets);
    }
    if count > MAX_BUCKETS_PER_CALL {
        return Err(InvalidInput::TooManyBuckets {
            count,
            max: MAX_BUCKETS_PER_CALL,
        });
    }
    let mut seen = HashSet::with_capacity(count);
    let mut first: Option<&BucketKey> = None;
    for key in keys {
        match first {
            None => first = Some(key),
            Some(first) if first.identity_prefix() != key.identity_prefix() => {
                return Err(InvalidInput::MixedIdentities {
                    first: first.to_string(),
                    other: key.to_string(),
                });
            }
            Some(_) => {}
        }
        if repeats == Repeats::Forbidden && !seen.insert(key.as_str()) {
            return Err(InvalidInput::DuplicateBucket {
                key: key.to_string(),
            });
        }
    }
    Ok(())
}

/// Whether `allowance` fits `key`'s bucket under `limit` (window logs and concurrency slots
/// take none).
pub(crate) fn check_allowance(
    key: &BucketKey,
    limit: &crate::limit::Limit,
    allowance: Option<&allowance::Allowance>,
) -> Result<(), InvalidInput> {
    let Some(a) = allowance else {
        return Ok(());
    };
    a.validate(key)?;
    if matches!(
        limit.algorithm(),
        crate::limit::Algorithm::SlidingWindowLog | crate::limit::Algorithm::Concurrency
    ) {
        return Err(InvalidInput::BadAllowance {
            key: key.to_string(),
            reason: format!("{:?} buckets take no allowance", limit.algorithm()),
        });
    }
    Ok(())
}

pub(crate) fn check_units(what: &'static str, value: u64) -> Result<(), InvalidInput> {
    if value > MAX_UNITS {
        return Err(InvalidInput::TooLarge {
            what,
            value,
            max: MAX_UNITS,
        });
    }
    Ok(())
}

/// A random token that makes lease and slot ids unguessable, so a forged return or release
/// names nothing.
pub(crate) fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}
