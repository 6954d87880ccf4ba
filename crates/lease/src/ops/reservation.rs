//! Reserve, then settle: a cost known only after the response.
//!
//! A check made with [`CheckRequest::reserve`](crate::CheckRequest::reserve) consumes its
//! costs (the estimate) as any check does and, when admitted, also records a reservation under
//! its nonce in each bucket. [`LeaseStore::settle`](crate::LeaseStore::settle) then charges the
//! actual amount, exactly once per bucket and nonce:
//! - less than the estimate gives the rest back (never above capacity, and for windows only
//!   into the window the reservation was taken in), while the reservation lives;
//! - more charges the excess as a debit, live or expired (a bucket may go into debt, so the
//!   next requests wait: underestimating buys nothing);
//! - a reservation never settled stays charged at its estimate;
//! - a second settle of the same nonce changes nothing and says so, for [`SETTLED_KEPT`] after
//!   the reservation's TTL; past that a nonce is unknown and charges nothing.
//!
//! In Redis the records are a hash `<key>:reservations` (nonce → record) and a sorted set
//! `<key>:reservations:ends` (nonce → when its record may go), in the bucket's slot.

use std::time::Duration;

use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::Limit;
use crate::ops::{Repeats, check_units, validate_keys};

/// How long a reservation's record is kept after its TTL: a settle within it still charges
/// any excess (and a repeated settle is still known as one).
pub const SETTLED_KEPT: Duration = Duration::from_secs(600);

/// The longest a reservation may live unsettled.
pub const MAX_RESERVATION_TTL: Duration = Duration::from_secs(3600);

/// The longest nonce (`[A-Za-z0-9_-]`).
pub const MAX_NONCE_BYTES: usize = 64;

/// Checks a reservation nonce: 1 to [`MAX_NONCE_BYTES`] of `[A-Za-z0-9_-]`.
pub(crate) fn check_nonce(nonce: &str) -> Result<(), InvalidInput> {
    let ok = !nonce.is_empty()
        && nonce.len() <= MAX_NONCE_BYTES
        && nonce
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(InvalidInput::BadReservation {
            field: "nonce",
            reason: format!("1 to {MAX_NONCE_BYTES} characters of A-Z a-z 0-9 _ -"),
        })
    }
}

/// Checks a reservation's TTL: 1 ms to [`MAX_RESERVATION_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), InvalidInput> {
    if ttl < Duration::from_millis(1) || ttl > MAX_RESERVATION_TTL {
        return Err(InvalidInput::BadReservation {
            field: "ttl",
            reason: format!("1 ms to {} s, got {ttl:?}", MAX_RESERVATION_TTL.as_secs()),
        });
    }
    Ok(())
}

/// A reservation asked of a check: its nonce (unique per reservation; the caller's) and how
/// long it lives unsettled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    /// The nonce the settle names.
    pub nonce: String,
    /// How long the reservation lives unsettled.
    pub ttl: Duration,
}

/// One bucket's settlement.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleItem {
    /// The bucket the reservation was made in.
    pub key: BucketKey,
    /// Its limit now.
    pub limit: Limit,
    /// The reservation's nonce.
    pub nonce: String,
    /// What the request really cost.
    pub actual: u64,
}

/// A validated settlement of one identity's buckets (one reservation's).
#[derive(Debug, Clone, PartialEq)]
pub struct SettleRequest {
    items: Vec<SettleItem>,
}

impl SettleRequest {
    /// Validates the items: one identity, each bucket once, nonces well formed, amounts in
    /// range.
    pub fn new(items: Vec<SettleItem>) -> Result<Self, InvalidInput> {
        validate_keys(items.iter().map(|i| &i.key), Repeats::Forbidden)?;
        for item in &items {
            check_units("actual", item.actual)?;
            check_nonce(&item.nonce)?;
            if crate::ops::check::is_slot_bucket(&item.limit) {
                return Err(InvalidInput::BadReservation {
                    field: "algorithm",
                    reason: "a CONCURRENCY bucket takes no reservation".into(),
                });
            }
        }
        Ok(Self { items })
    }

    /// The items, in request order.
    pub fn items(&self) -> &[SettleItem] {
        &self.items
    }
}

/// What a settle did to one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Settled while the reservation lived: `refunded` units given back (what the estimate
    /// exceeded the actual by, as a lease return credits: a window's only while it counts;
    /// a bucket already full keeps none of them), or `charged` units of excess debited (a
    /// debt is floored at one full bucket, as every debit's).
    Settled {
        /// Units given back.
        refunded: u64,
        /// Units of excess charged.
        charged: u64,
    },
    /// Settled after the reservation's TTL: the estimate stood, any excess was charged.
    Expired {
        /// Units of excess charged.
        charged: u64,
    },
    /// Already settled: nothing changed.
    AlreadySettled,
    /// No such reservation (never made here, forgotten past [`SETTLED_KEPT`], or its bucket
    /// reset): nothing changed.
    Unknown,
}

impl Settlement {
    /// The name metrics and APIs use.
    pub fn as_str(&self) -> &'static str {
        match self {
            Settlement::Settled { .. } => "settled",
            Settlement::Expired { .. } => "expired",
            Settlement::AlreadySettled => "already-settled",
            Settlement::Unknown => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_and_ttls_are_checked() {
        assert!(check_nonce("req-42_a").is_ok());
        assert!(check_nonce("").is_err());
        assert!(check_nonce("a|b").is_err());
        assert!(check_nonce(&"x".repeat(65)).is_err());
        assert!(check_ttl(Duration::from_secs(30)).is_ok());
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(Duration::from_secs(3601)).is_err());
    }
}
