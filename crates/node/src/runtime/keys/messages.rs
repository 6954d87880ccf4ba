//! What the decision path and a key actor say to each other.

use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use tollgate_lease::{LeaseGrant, Micros, StoreError};

use crate::runtime::keys::bucket::Bucket;
use crate::runtime::lateness::Late;

/// Units of one bucket a request needs.
#[derive(Debug, Clone)]
pub struct Want {
    /// The bucket.
    pub bucket: Arc<Bucket>,
    /// Units.
    pub cost: u64,
}

/// One bucket's part in a lease call.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The bucket.
    pub bucket: Arc<Bucket>,
    /// Fewest units worth taking (what the first waiting request lacks; after
    /// the actor's `consolidate`, that plus the units given back).
    pub min: u64,
    /// Units wanted (sized by demand).
    pub want: u64,
    /// Units this node held and gave back before asking (see the actor's `consolidate`).
    pub returned: u64,
    /// When the ask was made (node clock, µs): how long refills take is part of a lease's
    /// size.
    pub asked_at: Micros,
}

/// What the actor did for a request.
#[derive(Debug)]
pub enum AcquireOutcome {
    /// The units were taken from the leases, for this request.
    Reserved,
    /// The store has no room in `wants[index]` for now.
    Denied {
        /// Which want.
        index: usize,
        /// When it will, as the store says.
        retry_after: Duration,
    },
    /// The store could not answer.
    Failed(StoreError),
}

/// Messages of the key actor.
#[derive(Debug)]
pub enum KeyMsg {
    /// Reserve every want's units for one request, or none.
    Acquire {
        /// The units needed.
        wants: Vec<Want>,
        /// Where the outcome goes.
        reply: RpcReplyPort<AcquireOutcome>,
    },
    /// The decision path saw a lease running low, or requests wait on it: refill it with at
    /// least `min` units (what a waiting request lacks; 1 to refill ahead).
    Refill {
        /// The bucket.
        bucket: Arc<Bucket>,
        /// Fewest units worth taking.
        min: u64,
        /// When the decision path asked (node clock, µs): a refill's time includes its wait
        /// in this mailbox.
        asked_at: Micros,
    },
    /// A lease call is late: the store stalled, or is down. The requests waiting on it that do
    /// not wait through it are decided by their fail modes now; the call goes on, its grant is
    /// used when it comes, and what they admitted is debited in the store then.
    Late {
        /// How.
        late: Late,
        /// The call's buckets.
        buckets: Vec<Arc<Bucket>>,
    },
    /// A store call finished.
    Granted {
        /// What was asked.
        asks: Vec<Ask>,
        /// The store's answer, one grant per ask.
        result: Result<Vec<LeaseGrant>, StoreError>,
    },
    /// Time to look at lease expiries and idleness.
    Tick,
    /// The key state budget is short: stop (returning what the leases hold) if idle for
    /// [`crate::runtime::keys::registry::EVICTABLE_AFTER`].
    Evict,
    /// Return everything and stop.
    Shutdown(RpcReplyPort<()>),
}
