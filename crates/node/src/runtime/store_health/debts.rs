//! What a node owes the store: units it admitted while the store had stalled (a fail mode, or
//! its share of the store's last answer), debited in the store's own bucket as soon as the
//! store answers again, so that every node's next grant pays for them, not only this node's
//! (whose next grant may never come: the other nodes may take every refill).
//!
//! Each debt is a debit-once under this node's own name and an epoch end of its own: sent
//! again after a timeout (which may have applied it), it is applied once. A debt that cannot
//! reach the store before its epoch ends is forgiven: the store was down, not late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tollgate_lease::{BucketKey, DebitItem, DebitOnce, DebitRequest, Limit, Micros};

/// How long a debt is tried for (and its record kept in the store).
const KEEP: Duration = Duration::from_secs(30);
/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(100);
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(2);

/// This node's name in the store's debit records, and the epochs it has used.
#[derive(Debug)]
pub struct Debts {
    origin: String,
    /// The last epoch end handed out (node clock, µs): each debt gets its own.
    last_until: AtomicU64,
}

/// One debt: units of one bucket.
#[derive(Debug, Clone)]
pub(crate) struct Debt {
    /// The bucket.
    pub(crate) key: BucketKey,
    /// Its limit.
    pub(crate) limit: Limit,
    /// Units owed.
    pub(crate) units: u64,
    /// When the latest of them was admitted (node clock, µs): a window's debt lands in the
    /// window they were admitted in, or nowhere once it has ended.
    pub(crate) admitted_at: Micros,
}

impl Debts {
    /// A name for this node's debts: random, or drawn from `seed` (a simulation repeats).
    pub fn new(seed: Option<u64>) -> Self {
        let mut rng = match seed {
            Some(seed) => rand::rngs::StdRng::seed_from_u64(seed ^ 0x6465_6274),
            None => rand::rngs::StdRng::from_os_rng(),
        };
        Self {
            origin: format!("owed.{:016x}", rng.random::<u64>()),
            last_until: AtomicU64::new(0),
        }
    }

    /// An epoch end no other debt of this node has: at least `now + KEEP`.
    fn next_until(&self, now: Micros) -> Micros {
        let wanted = now + KEEP.as_micros() as u64;
        let mut last = self.last_until.load(Ordering::Acquire);
        loop {
            let until = wanted.max(last + 1);
            match self.last_until.compare_exchange_weak(
                last,
                until,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return until,
                Err(actual) => last = actual,
            }
        }
    }
}

/// The debit that pays one identity's debts: a debit-once under this node's name, with an
/// epoch end of its own.
#[derive(Debug)]
pub(crate) struct Owed {
    /// The store call (or why the debts cannot be debited).
    pub(crate) request: Result<DebitRequest, tollgate_lease::InvalidInput>,
    /// Units owed in all.
    pub(crate) units: u64,
    /// Until when it is worth trying (node clock, µs): the debit's epoch end.
    pub(crate) until: Micros,
}

impl Debts {
    /// What paying `debts` (one identity's buckets) takes, made at `now`.
    pub(crate) fn owe(&self, debts: Vec<Debt>, now: Micros) -> Owed {
        let units = debts.iter().map(|d| d.units).sum();
        let once = DebitOnce {
            origin: self.origin.clone(),
            until: self.next_until(now),
        };
        let until = once.until;
        let items = debts
            .into_iter()
            .map(|d| DebitItem {
                key: d.key,
                limit: d.limit,
                units: d.units,
                consumed_at: Some(d.admitted_at),
                once: Some(once.clone()),
            })
            .collect();
        Owed {
            request: DebitRequest::new(items),
            units,
            until,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_debt_gets_an_epoch_of_its_own() {
        let debts = Debts::new(Some(7));
        let now = 1_700_000_000_000_000;
        let a = debts.next_until(now);
        let b = debts.next_until(now);
        let c = debts.next_until(now + 1);
        assert_eq!(a, now + KEEP.as_micros() as u64);
        assert!(a < b && b < c, "{a} {b} {c}");
        assert!(Debts::new(Some(7)).origin == debts.origin);
        assert!(Debts::new(Some(8)).origin != debts.origin);
        assert!(debts.origin.len() <= tollgate_lease::MAX_ORIGIN_BYTES);
    }

    #[test]
    fn one_identitys_debts_are_one_debit_once_with_an_epoch_of_their_own() {
        let debts = Debts::new(Some(7));
        let now = 1_700_000_000_000_000;
        let limit = Limit::token_bucket(10, 1.0).expect("limit");
        let debt = |units| Debt {
            key: BucketKey::new(b"id", "rule").expect("key"),
            limit,
            units,
            admitted_at: now - 5,
        };
        let first = debts.owe(vec![debt(3), debt(4)], now);
        let second = debts.owe(vec![debt(1)], now);
        assert_eq!(first.units, 7);
        assert!(first.until < second.until);
        let request = first.request.expect("a valid debit");
        assert_eq!(request.items().len(), 2);
        for item in request.items() {
            let once = item.once.as_ref().expect("debited once");
            assert_eq!(
                (once.origin.as_str(), once.until),
                (debts.origin.as_str(), first.until)
            );
            assert_eq!(item.consumed_at, Some(now - 5));
        }
    }
}
