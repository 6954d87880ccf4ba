//! The store trait every decision goes through, and where a bucket's state lives in a store.

use std::borrow::Cow;
use std::future::Future;

use crate::error::StoreError;
use crate::key::BucketKey;
use crate::limit::{Algorithm, Limit};
use crate::ops::allowance::DemandRequest;
use crate::ops::check::{CheckOutcome, CheckRequest};
use crate::ops::counter::HeldLeases;
use crate::ops::debit::DebitRequest;
use crate::ops::lease::{LeaseGrant, LeaseRequest, ReturnRequest};
use crate::ops::penalty::{Lift, Penalty, PenaltyState};
use crate::ops::reservation::{SettleRequest, Settlement};
use crate::ops::slot::{SlotRelease, SlotRenew};

/// A store of global rate-limit state. Each operation is atomic for the one identity its
/// request serves. The operations are grouped by purpose: deciding, leases, slots, regions
/// and penalties, the operator's. Implemented by [`MemoryStore`](crate::memory::MemoryStore) and
/// [`RedisStore`](crate::redis::RedisStore), which pass the same conformance suite.
pub trait LeaseStore: Send + Sync {
    // ---- Deciding: a check of one identity's buckets, its reservation settled.

    /// Consumes each item's cost from its bucket if every bucket has room, else nothing.
    fn check(
        &self,
        req: &CheckRequest,
    ) -> impl Future<Output = Result<CheckOutcome, StoreError>> + Send;

    /// Settles a reservation made by a reserving check, one bucket per item, exactly once per
    /// bucket and nonce (see [`crate::ops::reservation`]).
    fn settle(
        &self,
        req: &SettleRequest,
    ) -> impl Future<Output = Result<Vec<Settlement>, StoreError>> + Send;

    // ---- Leases: units taken in a batch, spent on a node, and what was not spent given back.

    /// Grants each ask independently: up to `want` units, at least `min`, or none.
    fn acquire_leases(
        &self,
        req: &LeaseRequest,
    ) -> impl Future<Output = Result<Vec<LeaseGrant>, StoreError>> + Send;

    /// Gives back unspent units of live leases; returns the units credited per item (0 for an
    /// expired, unknown, repeated or stale-window lease).
    fn return_leases(
        &self,
        req: &ReturnRequest,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    // ---- Concurrency slots held by requests still running.

    /// Releases concurrency slots; returns per item whether the slot was still held.
    fn release_slots(
        &self,
        req: &SlotRelease,
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    /// Renews concurrency slots for their limit's TTL from now; returns per item whether the
    /// slot was still held (and is now renewed).
    fn renew_slots(
        &self,
        req: &SlotRenew,
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;

    // ---- Regions and penalties: what was consumed elsewhere, what nodes asked for, denials counted.

    /// Subtracts units consumed elsewhere; returns the units applied per item (0 when they
    /// belong to a window that has ended).
    fn debit(
        &self,
        req: &DebitRequest,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// Records what nodes (of this region or the peer's) asked of buckets in their last
    /// interval: the inputs of the regional allowances' shares.
    fn report_demand(
        &self,
        req: &DemandRequest,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds `denials` to the count of `key`'s identity under `penalty` (0: reads its standing,
    /// as [`Self::penalty_standing`] does),
    /// starting a block when the count reaches the penalty's `after` (see
    /// [`crate::ops::penalty`]). `epoch` is the lift epoch the denials were handed out under:
    /// under another than the store's they count nothing (None: counted whatever it is). The
    /// answer carries the store's epoch.
    fn note_denials(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
        denials: u64,
        epoch: Option<u64>,
    ) -> impl Future<Output = Result<PenaltyState, StoreError>> + Send;

    // ---- The operator's: a bucket's live leases and penalty standing read, a bucket reset, a block lifted.

    /// The live leases on `key`'s bucket (whatever its algorithm): how many, and the units
    /// they were granted.
    fn held_leases(
        &self,
        key: &BucketKey,
    ) -> impl Future<Output = Result<HeldLeases, StoreError>> + Send;

    /// The standing of `key`'s identity under `penalty`: the block's time left, or the denials
    /// counted in the current window; writes nothing. (A [`Self::note_denials`] of none, which
    /// every store answers without a write: one read, not a second script to keep in step.)
    fn penalty_standing(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
    ) -> impl Future<Output = Result<PenaltyState, StoreError>> + Send {
        self.note_denials(key, penalty, 0, None)
    }

    /// Forgets `key`'s bucket: its state under every algorithm, its live leases (a return of
    /// one credits nothing after this) and its regional allowance. The next call finds the
    /// bucket full. Returns whether there was anything to forget.
    fn reset(&self, key: &BucketKey) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Lifts `key`'s identity's penalty block and forgets its denial counts (a SHADOW rule's
    /// too), starting a new lift epoch; the bucket is untouched.
    fn lift_block(&self, key: &BucketKey) -> impl Future<Output = Result<Lift, StoreError>> + Send;
}

/// Every key [`LeaseStore::reset`] forgets for `key`'s bucket.
pub(crate) fn counter_keys(key: &BucketKey) -> [String; 9] {
    [
        key.as_str().to_owned(),
        format!("{key}:log"),
        format!("{key}:slots"),
        key.lease_key(),
        key.allowance_key(),
        key.penalty_key(),
        key.shadow_penalty_key(),
        key.reservations_key(),
        key.reservation_ends_key(),
    ]
}

/// Where a bucket's state lives: counters in a hash at the bucket key itself, the log and the
/// slots in sorted sets beside it (so changing a rule's algorithm never reads one type as
/// another).
pub(crate) fn state_key<'a>(key: &'a BucketKey, limit: &Limit) -> Cow<'a, str> {
    match limit.algorithm() {
        Algorithm::SlidingWindowLog => Cow::Owned(format!("{key}:log")),
        Algorithm::Concurrency => Cow::Owned(format!("{key}:slots")),
        _ => Cow::Borrowed(key.as_str()),
    }
}
