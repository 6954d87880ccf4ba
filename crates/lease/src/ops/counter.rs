//! One bucket's counter, for the people who support its callers: what the nodes hold of it
//! (its live leases), and forgetting it (a reset).

/// The live leases on one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldLeases {
    /// Leases granted and neither returned nor expired (about one per node that holds units).
    pub leases: u64,
    /// The units they were granted: the most the nodes can still admit without the store
    /// (what they spent already is among these).
    pub units: u64,
}
