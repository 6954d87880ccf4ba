//! Leases: a batch of units taken from the global state in one step, spent locally, and given
//! back if unspent.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::{Algorithm, Limit};
use crate::ops::allowance::Allowance;
use crate::ops::{Repeats, check_allowance, check_units, validate_keys};

/// The longest a lease may live.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);

/// One bucket to lease from.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseAsk {
    /// Which bucket.
    pub key: BucketKey,
    /// Its limit.
    pub limit: Limit,
    /// Units wanted.
    pub want: u64,
    /// Fewest units worth taking (the cost of the request waiting on this lease); if fewer are
    /// available, nothing is granted.
    pub min: u64,
    /// The largest share of what remains one grant may take, in (0, 1], so that one node
    /// cannot starve the others. At least `min` is granted whenever `min` units are available.
    pub max_share: f64,
    /// Its region's allowance, if its rule has one: a grant then also fits this region's
    /// share of the limit, and is taken from both.
    pub allowance: Option<Allowance>,
    /// Whether its rule has a penalty: nothing is granted while its identity is blocked (see
    /// [`crate::ops::penalty`]).
    pub penalized: bool,
}

/// A validated lease request for one identity's buckets. Each bucket is granted independently.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRequest {
    asks: Vec<LeaseAsk>,
    ttl: Duration,
}

impl LeaseRequest {
    /// Validates the asks. `ttl` is how long the leases live at most (window algorithms cap it
    /// at the end of the current window).
    pub fn new(asks: Vec<LeaseAsk>, ttl: Duration) -> Result<Self, InvalidInput> {
        validate_keys(asks.iter().map(|a| &a.key), Repeats::Allowed)?;
        for ask in &asks {
            let key = || ask.key.to_string();
            let bad = |reason: String| InvalidInput::BadLease { key: key(), reason };
            if ask.limit.algorithm() == Algorithm::Concurrency {
                return Err(InvalidInput::Unsupported {
                    operation: "lease acquire",
                    algorithm: Algorithm::Concurrency,
                    key: key(),
                });
            }
            check_units("lease size", ask.want)?;
            if ask.want == 0 {
                return Err(bad("lease size must be at least 1".into()));
            }
            if ask.want > ask.limit.capacity() {
                return Err(InvalidInput::LeaseExceedsCapacity {
                    key: key(),
                    want: ask.want,
                    capacity: ask.limit.capacity(),
                });
            }
            if ask.min == 0 || ask.min > ask.want {
                return Err(bad(format!(
                    "min must be in 1..={}, got {}",
                    ask.want, ask.min
                )));
            }
            if !(ask.max_share > 0.0 && ask.max_share <= 1.0) {
                return Err(bad(format!(
                    "max_share must be in (0, 1], got {}",
                    ask.max_share
                )));
            }
            check_allowance(&ask.key, &ask.limit, ask.allowance.as_ref())?;
        }
        if ttl < Duration::from_millis(1) || ttl > MAX_LEASE_TTL {
            return Err(InvalidInput::BadLease {
                key: asks[0].key.to_string(),
                reason: format!("ttl must be between 1 ms and {MAX_LEASE_TTL:?}, got {ttl:?}"),
            });
        }
        Ok(Self { asks, ttl })
    }

    /// The asks, in request order.
    pub fn asks(&self) -> &[LeaseAsk] {
        &self.asks
    }

    /// The longest the leases live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// A lease's name. Opaque and unguessable; only the store that issued it accepts it back.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(pub(crate) Arc<str>);

impl LeaseId {
    /// The id as the store knows it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id that was never issued (for tests of forged returns).
    pub fn forged(text: &str) -> Self {
        Self(text.into())
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({})", self.0)
    }
}

/// What one bucket granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Units granted: between `min` and `want`, or 0.
    pub units: u64,
    /// The lease's id when units were granted.
    pub lease: Option<LeaseId>,
    /// How long the lease is valid: spend its units before then, and return the rest.
    pub valid_for: Duration,
    /// Whole units left in the bucket after the grant.
    pub remaining: u64,
    /// When nothing was granted: the time until `min` units are available.
    pub retry_after: Duration,
    /// The time until the bucket is back to its full capacity.
    pub reset_after: Duration,
    /// Leases on the bucket still live after this call (this grant's included): at least one
    /// per node that holds units of it, more where a node holds several. A node that must
    /// decide on this answer while the store is slow divides what remains by the other nodes
    /// holding leases (`live_leases` less its own), so that they do not each spend all of it.
    pub live_leases: u64,
    /// The time left of the penalty block that refused it (zero: none). `retry_after` is at
    /// least this.
    pub blocked_for: Duration,
}

/// Unspent units to give back.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseReturn {
    /// Which bucket.
    pub key: BucketKey,
    /// Its limit.
    pub limit: Limit,
    /// The lease being returned.
    pub lease: LeaseId,
    /// Units not spent. The store credits at most what the lease granted.
    pub unspent: u64,
    /// The allowance the lease was taken under (None: none, or the region's allowance is no
    /// longer in force): the unspent units go back to it too.
    pub allowance: Option<Allowance>,
}

/// Validated returns for one identity's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct ReturnRequest {
    items: Vec<LeaseReturn>,
}

impl ReturnRequest {
    /// Validates the returns.
    pub fn new(items: Vec<LeaseReturn>) -> Result<Self, InvalidInput> {
        validate_keys(items.iter().map(|i| &i.key), Repeats::Allowed)?;
        for item in &items {
            check_units("unspent units", item.unspent)?;
            if item.limit.algorithm() == Algorithm::Concurrency {
                return Err(InvalidInput::Unsupported {
                    operation: "lease return",
                    algorithm: Algorithm::Concurrency,
                    key: item.key.to_string(),
                });
            }
            check_allowance(&item.key, &item.limit, item.allowance.as_ref())?;
        }
        Ok(Self { items })
    }

    /// The returns, in request order.
    pub fn items(&self) -> &[LeaseReturn] {
        &self.items
    }
}
