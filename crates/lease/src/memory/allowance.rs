//! A bucket's regional allowance in the in-memory store: the keys it may create, its demand
//! record, and its share loaded for one call.

use super::bucket::{Bucket, Keys, Value};
use crate::clock::Micros;
use crate::key::BucketKey;
use crate::limit::Limit;
use crate::ops::allowance::{Allowance, Demand, share_of};

/// The allowance and demand keys a request may create.
pub(super) fn allowance_keys<'a>(
    items: impl Iterator<Item = (&'a BucketKey, Option<&'a Allowance>)>,
) -> Vec<String> {
    items
        .filter(|(_, a)| a.is_some())
        .flat_map(|(k, _)| [k.allowance_key(), k.demand_key()])
        .collect()
}

/// The demand record at `key` (empty if none).
pub(super) fn load_demand(keys: &Keys, key: &str, now: Micros) -> Demand {
    match keys.get(key, now) {
        Some(Value::Demand(d)) => d.clone(),
        _ => Demand::default(),
    }
}

/// A bucket's allowance as loaded for one call (the demand record is written as it loads:
/// asking is demand, whatever the answer).
pub(super) struct Allowed {
    key: String,
    pub(super) limit: Limit,
    pub(super) bucket: Bucket,
}

impl Allowed {
    pub(super) fn load(
        keys: &mut Keys,
        key: &BucketKey,
        limit: &Limit,
        a: &Allowance,
        now: Micros,
    ) -> Self {
        let demand_key = key.demand_key();
        let mut demand = load_demand(keys, &demand_key, now);
        let share = demand.share(a, now);
        let expires_at = demand.expires_at(a.horizon_us(), now);
        keys.put(&demand_key, Value::Demand(demand), expires_at);
        let limit = share_of(limit, share);
        let key = key.allowance_key();
        let mut bucket = Bucket::load(keys, &key, &limit, now);
        if let Bucket::TokenBucket(tb) = &mut bucket {
            tb.cap = limit.capacity();
        }
        Self { key, limit, bucket }
    }

    pub(super) fn store(self, keys: &mut Keys, changed: bool, now: Micros) {
        // A token bucket whose capacity moved is written even when nothing was taken, so the
        // next call measures the move from here.
        if changed || matches!(self.bucket, Bucket::TokenBucket(_)) {
            self.bucket.store(keys, &self.key, &self.limit, now);
        } else {
            self.bucket.restore(keys, &self.key);
        }
    }
}
