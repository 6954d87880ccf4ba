//! Script replies parsed into typed outcomes, in one place.

use std::time::Duration;

use redis::Value;

use crate::error::StoreError;
use crate::ops::check::{BucketStatus, CheckOutcome};
use crate::ops::lease::{LeaseGrant, LeaseId};
use crate::ops::reservation::Settlement;
use crate::ops::slot::SlotId;

fn bad(what: impl Into<String>) -> StoreError {
    StoreError::BadReply(what.into())
}

fn array(v: Value, len: usize, what: &str) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) if items.len() == len => Ok(items),
        other => Err(bad(format!(
            "{what}: expected an array of {len}, got {other:?}"
        ))),
    }
}

fn int(v: &Value, what: &str) -> Result<u64, StoreError> {
    match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(bad(format!(
            "{what}: expected a non-negative integer, got {other:?}"
        ))),
    }
}

fn text(v: &Value, what: &str) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => {
            String::from_utf8(b.clone()).map_err(|_| bad(format!("{what}: not UTF-8")))
        }
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(bad(format!("{what}: expected a string, got {other:?}"))),
    }
}

fn micros(v: &Value, what: &str) -> Result<Duration, StoreError> {
    int(v, what).map(Duration::from_micros)
}

/// `check`: per bucket `{allowed, remaining, retry_after_us, reset_after_us, slot,
/// blocked_for_us}`.
pub(crate) fn check(v: Value, buckets: usize) -> Result<CheckOutcome, StoreError> {
    let rows = array(v, buckets, "check reply")?;
    let buckets = rows
        .into_iter()
        .map(|row| {
            let f = array(row, 6, "check row")?;
            let slot = text(&f[4], "slot")?;
            Ok(BucketStatus {
                allowed: int(&f[0], "allowed")? == 1,
                remaining: int(&f[1], "remaining")?,
                retry_after: micros(&f[2], "retry_after")?,
                reset_after: micros(&f[3], "reset_after")?,
                slot: (!slot.is_empty()).then(|| SlotId(slot.into())),
                blocked_for: micros(&f[5], "blocked_for")?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(CheckOutcome { buckets })
}

/// `lease_acquire`: per ask `{units, lease, valid_for_us, remaining, retry_after_us,
/// reset_after_us, live_leases, blocked_for_us}`.
pub(crate) fn grants(v: Value, asks: usize) -> Result<Vec<LeaseGrant>, StoreError> {
    array(v, asks, "lease reply")?
        .into_iter()
        .map(|row| {
            let f = array(row, 8, "lease row")?;
            let lease = text(&f[1], "lease id")?;
            Ok(LeaseGrant {
                units: int(&f[0], "units")?,
                lease: (!lease.is_empty()).then(|| LeaseId(lease.into())),
                valid_for: micros(&f[2], "valid_for")?,
                remaining: int(&f[3], "remaining")?,
                retry_after: micros(&f[4], "retry_after")?,
                reset_after: micros(&f[5], "reset_after")?,
                live_leases: int(&f[6], "live_leases")?,
                blocked_for: micros(&f[7], "blocked_for")?,
            })
        })
        .collect()
}

/// A flat array of counts (returns, releases, debits).
/// `settle`: per bucket `{code, refunded, charged}`.
pub(crate) fn settlements(v: Value, items: usize) -> Result<Vec<Settlement>, StoreError> {
    array(v, items, "settle reply")?
        .into_iter()
        .map(|row| {
            let f = array(row, 3, "settle row")?;
            let (refunded, charged) = (int(&f[1], "refunded")?, int(&f[2], "charged")?);
            Ok(match int(&f[0], "code")? {
                1 => Settlement::Settled { refunded, charged },
                2 => Settlement::Expired { charged },
                3 => Settlement::AlreadySettled,
                4 => Settlement::Unknown,
                other => {
                    return Err(StoreError::BadReply(format!(
                        "settle code {other} is none of 1-4"
                    )));
                }
            })
        })
        .collect()
}

pub(crate) fn counts(v: Value, items: usize, what: &str) -> Result<Vec<u64>, StoreError> {
    array(v, items, what)?
        .iter()
        .map(|x| int(x, what))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        assert!(matches!(check(Value::Nil, 1), Err(StoreError::BadReply(_))));
        assert!(matches!(
            check(Value::Array(vec![Value::Int(1)]), 1),
            Err(StoreError::BadReply(_))
        ));
        let neg = Value::Array(vec![Value::Array(vec![
            Value::Int(1),
            Value::Int(-3),
            Value::Int(0),
            Value::Int(0),
            Value::BulkString(vec![]),
        ])]);
        assert!(matches!(check(neg, 1), Err(StoreError::BadReply(_))));
        assert!(matches!(
            counts(Value::Array(vec![]), 2, "x"),
            Err(StoreError::BadReply(_))
        ));
    }

    #[test]
    fn a_well_formed_check_row_parses() {
        let row = Value::Array(vec![Value::Array(vec![
            Value::Int(1),
            Value::Int(9),
            Value::Int(0),
            Value::Int(200_000),
            Value::BulkString(b"17:1:ab".to_vec()),
            Value::Int(0),
        ])]);
        let out = check(row, 1).expect("parses");
        assert!(out.allowed() && out.buckets[0].blocked_for.is_zero());
        assert_eq!(out.buckets[0].remaining, 9);
        assert_eq!(out.buckets[0].reset_after, Duration::from_millis(200));
        assert_eq!(
            out.buckets[0].slot.as_ref().map(SlotId::as_str),
            Some("17:1:ab")
        );
    }
}
