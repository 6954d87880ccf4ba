//! Errors of the lease store. A limit decision is never an error: a denied check is an `Ok`
//! value. Errors are failures, and each says whether retrying later can help.

use std::time::Duration;

use crate::key::KeyError;
use crate::limit::{Algorithm, LimitError};

/// A request the store refuses to run, whatever its state.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidInput {
    /// A request with no bucket in it.
    #[error("the request names no bucket")]
    NoBuckets,
    /// More buckets than one call may carry.
    #[error("the request names {count} buckets; at most {max} fit in one call")]
    TooManyBuckets {
        /// Buckets named.
        count: usize,
        /// The maximum.
        max: usize,
    },
    /// Buckets of different identities (they may live in different cluster slots).
    #[error(
        "buckets {first} and {other} belong to different identities; one call serves one identity"
    )]
    MixedIdentities {
        /// The first bucket's key.
        first: String,
        /// The first bucket with another identity.
        other: String,
    },
    /// The same bucket twice in one call.
    #[error("bucket {key} appears twice in one request")]
    DuplicateBucket {
        /// The repeated key.
        key: String,
    },
    /// A cost larger than the bucket can ever hold: no amount of waiting admits it.
    #[error("cost {cost} exceeds the capacity {capacity} of {key}; it can never be admitted")]
    CostExceedsCapacity {
        /// The bucket.
        key: String,
        /// The requested cost.
        cost: u64,
        /// The bucket's capacity.
        capacity: u64,
    },
    /// A lease larger than the bucket.
    #[error("lease size {want} exceeds the capacity {capacity} of {key}")]
    LeaseExceedsCapacity {
        /// The bucket.
        key: String,
        /// The requested lease size.
        want: u64,
        /// The bucket's capacity.
        capacity: u64,
    },
    /// A regional allowance or demand report whose parameters make no sense.
    #[error("invalid regional allowance for {key}: {reason}")]
    BadAllowance {
        /// The bucket.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A reservation (or its settlement) whose parameters make no sense.
    #[error("reservation field `{field}`: {reason}")]
    BadReservation {
        /// The field (`nonce`, `ttl`, `algorithm`).
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A penalty whose parameters make no sense.
    #[error("penalty field `{field}`: {reason}")]
    BadPenalty {
        /// The field (`after`, `within`, `block`).
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A lease request whose parameters make no sense.
    #[error("invalid lease request for {key}: {reason}")]
    BadLease {
        /// The bucket.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A debit-once origin that is empty, too long or has characters outside `[A-Za-z0-9._:/-]`.
    #[error("debit origin {origin:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ : / -")]
    BadOrigin {
        /// The origin given (cut at 80 characters).
        origin: String,
    },
    /// An operation that the bucket's algorithm does not support.
    #[error("{operation} is not supported by {algorithm} ({key})")]
    Unsupported {
        /// The operation (`lease acquire`, `debit`, `slot release`).
        operation: &'static str,
        /// The bucket's algorithm.
        algorithm: Algorithm,
        /// The bucket.
        key: String,
    },
    /// A unit count too large to be exact.
    #[error("{what} {value} is larger than the maximum {max}")]
    TooLarge {
        /// Which number.
        what: &'static str,
        /// Its value.
        value: u64,
        /// The maximum.
        max: u64,
    },
    /// A bucket key that cannot be built.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A limit whose parameters are out of range.
    #[error(transparent)]
    Limit(#[from] LimitError),
}

/// A store operation that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The request is invalid; retrying cannot help.
    #[error("invalid request: {0}")]
    Invalid(#[from] InvalidInput),
    /// The call did not finish within its budget.
    #[error("store call timed out after {budget:?}")]
    Timeout {
        /// The budget that ran out.
        budget: Duration,
    },
    /// The store cannot be reached, is failing over, or is loading.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Nothing accepts connections at the store's address (the connection was refused): the
    /// store is down, not slow, and a circuit breaker need not count to be sure of it.
    #[error("store refused the connection: {0}")]
    Refused(String),
    /// The store has no room for new state: the in-memory store holds its maximum number of
    /// keys and none has expired, or Redis is at its `maxmemory` and refuses writes (OOM).
    /// The store itself is up and answering.
    #[error("store is full: {0}")]
    Full(String),
    /// The store answered something this client does not understand.
    #[error("unexpected reply from the store: {0}")]
    BadReply(String),
    /// The store refused the command (a script error, CROSSSLOT, a permission problem).
    #[error("store rejected the command: {0}")]
    Rejected(String),
}

impl StoreError {
    /// Whether the same call may succeed later: timeouts, lost or refused connections,
    /// failovers and a full in-memory store are transient; invalid input, bad replies and rejected commands
    /// are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout { .. }
                | StoreError::Unavailable(_)
                | StoreError::Refused(_)
                | StoreError::Full(_)
        )
    }
}
