//! What the regions say to each other. Encoded by [`crate::codec`] only.

use serde::{Deserialize, Serialize};
use tollgate_lease::Micros;

/// Who sent a message: a region and the sending node's incarnation (a random number chosen
/// when the node started, so a restarted node never reuses its old totals' records).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Origin {
    /// The sender's region.
    pub region: String,
    /// The sending node's incarnation.
    pub incarnation: u64,
}

impl Origin {
    /// The origin's name in the store's debit-once records: `<region>/<incarnation, hex>`.
    pub fn name(&self) -> String {
        format!("{}/{:016x}", self.region, self.incarnation)
    }
}

/// Consumption totals, shipped every sync interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// The sender.
    pub origin: Origin,
    /// The sender's batch number (for tracing and lag; delivery does not depend on it).
    pub seq: u64,
    /// When it was sent (sender's clock, Unix microseconds).
    pub sent_at: Micros,
    /// The totals.
    pub entries: Vec<Entry>,
}

/// One bucket's consumption in one epoch, as a running total since the epoch began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The rule id.
    pub rule: String,
    /// The identity its counter is keyed by.
    pub identity: Vec<u8>,
    /// The epoch's end (Unix microseconds): nothing of it is applied after that.
    pub until: Micros,
    /// Units the sender admitted in the epoch so far.
    pub total: u64,
    /// When the last of them was admitted (sender's clock): the window they land in.
    pub at: Micros,
}

/// The receiver's answer to a batch, once every entry is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchAck {
    /// Units debited (the excess of the totals over what was already applied).
    pub applied_units: u64,
    /// Entries of rules that do not sync in the receiving region (ignored).
    pub skipped: u32,
}

/// What a node's requests asked of synced buckets in its last interval (link version 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemandBatch {
    /// The sender.
    pub origin: Origin,
    /// The sender's interval (its reports count for two of them and a second).
    pub interval_us: u64,
    /// Per bucket, units asked.
    pub items: Vec<DemandItem>,
}

/// One bucket's demand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemandItem {
    /// The rule id.
    pub rule: String,
    /// The identity its counter is keyed by.
    pub identity: Vec<u8>,
    /// Units asked in the interval, admitted or not.
    pub units: u64,
}

/// The receiver's answer to a [`DemandBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemandAck {
    /// Reports recorded (items of rules that sync here).
    pub recorded: u32,
}

/// Penalty blocks started in the sender's region (link version 3): the receiver holds each in
/// its own store for the time left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PenaltyBatch {
    /// The sender.
    pub origin: Origin,
    /// The blocks.
    pub blocks: Vec<PenaltyBlock>,
}

/// One identity blocked by one rule's penalty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PenaltyBlock {
    /// The rule (its counters' key).
    pub rule: String,
    /// The identity its counter is keyed by.
    pub identity: Vec<u8>,
    /// Microseconds left of the block when it was sent.
    pub left_us: u64,
}

/// The receiver's answer to a [`PenaltyBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PenaltyAck {
    /// Blocks now held in the receiver's store (rules with an enforced penalty there).
    pub imposed: u32,
}

/// A liveness probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ping {
    /// The sender.
    pub origin: Origin,
    /// When it was sent.
    pub sent_at: Micros,
}

/// The answer to a [`Ping`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    /// The responder.
    pub origin: Origin,
}

/// A HOME_REGION decision asked of the key's home region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardRequest {
    /// The rule id.
    pub rule: String,
    /// The identity its counter is keyed by.
    pub identity: Vec<u8>,
    /// Units the request costs.
    pub cost: u64,
}

/// The home region's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardReply {
    /// Admitted.
    pub allowed: bool,
    /// Units left after it.
    pub remaining: u64,
    /// When denied: microseconds until the request would fit.
    pub retry_after_us: u64,
    /// Microseconds until the bucket is full again.
    pub reset_after_us: u64,
}
