//! Concurrency slots: taken by a `check` on a `CONCURRENCY` bucket, renewed while their
//! request runs, released here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::{Algorithm, Limit};
use crate::ops::{Repeats, validate_keys};

/// An in-flight slot. Opaque; hand it back to [`SlotRelease`] when the request completes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SlotId(pub(crate) Arc<str>);

impl SlotId {
    /// The id as the store knows it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id that no store issued (for tests of forged releases).
    pub fn forged(text: &str) -> Self {
        Self(text.into())
    }
}

impl fmt::Debug for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlotId({})", self.0)
    }
}

/// Slots to release, all of one identity. Releasing is idempotent: a slot already released or
/// expired is simply not found.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotRelease {
    items: Vec<(BucketKey, SlotId)>,
}

impl SlotRelease {
    /// Validates that every bucket is a concurrency bucket of one identity.
    pub fn new(items: Vec<(BucketKey, Limit, SlotId)>) -> Result<Self, InvalidInput> {
        validate_keys(items.iter().map(|(k, _, _)| k), Repeats::Allowed)?;
        for (key, limit, _) in &items {
            if limit.algorithm() != Algorithm::Concurrency {
                return Err(InvalidInput::Unsupported {
                    operation: "slot release",
                    algorithm: limit.algorithm(),
                    key: key.to_string(),
                });
            }
        }
        Ok(Self {
            items: items.into_iter().map(|(k, _, s)| (k, s)).collect(),
        })
    }

    /// Slots named by their bucket key alone (their limit is not needed to release them).
    /// Every key must belong to the same identity.
    pub fn of_keys(items: Vec<(BucketKey, SlotId)>) -> Result<Self, InvalidInput> {
        validate_keys(items.iter().map(|(k, _)| k), Repeats::Allowed)?;
        Ok(Self { items })
    }

    /// The slots, in request order.
    pub fn items(&self) -> &[(BucketKey, SlotId)] {
        &self.items
    }
}

/// Slots to renew, all of one identity: each held slot lives its limit's slot TTL from now
/// on. A request that runs longer than the TTL renews its slots, so they are not given to
/// another request while it runs; a slot whose holder vanished still expires. A slot already
/// released or expired is not brought back.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotRenew {
    items: Vec<(BucketKey, SlotId)>,
    ttls: Vec<Duration>,
}

impl SlotRenew {
    /// Validates that every bucket is a concurrency bucket of one identity.
    pub fn new(items: Vec<(BucketKey, Limit, SlotId)>) -> Result<Self, InvalidInput> {
        validate_keys(items.iter().map(|(k, _, _)| k), Repeats::Allowed)?;
        let mut ttls = Vec::with_capacity(items.len());
        for (key, limit, _) in &items {
            let Some(ttl) = limit.slot_ttl() else {
                return Err(InvalidInput::Unsupported {
                    operation: "slot renew",
                    algorithm: limit.algorithm(),
                    key: key.to_string(),
                });
            };
            ttls.push(ttl);
        }
        Ok(Self {
            items: items.into_iter().map(|(k, _, s)| (k, s)).collect(),
            ttls,
        })
    }

    /// The slots, in request order.
    pub fn items(&self) -> &[(BucketKey, SlotId)] {
        &self.items
    }

    /// Each slot's TTL from now, in request order.
    pub fn ttls(&self) -> &[Duration] {
        &self.ttls
    }
}
