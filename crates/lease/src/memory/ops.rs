//! The in-memory store's operations: the same steps as the Redis scripts, each under the
//! shard lock of its identity.

use std::time::Duration;

use super::MemoryStore;
use super::allowance::{Allowed, allowance_keys, load_demand};
use super::bucket::{Bucket, Keys, Value};
use super::lease::{
    ALLOWANCE_CODE, ParsedLease, credit_bucket, credit_kept, grant_size, lease_validity,
    store_leases,
};
use crate::algorithm::penalty_box::{self, PenaltyParams};
use crate::algorithm::reservations::Record;
use crate::algorithm::window_start;
use crate::algorithm::{EXPIRY_MARGIN_MS, once_marks};
use crate::clock::Micros;
use crate::error::StoreError;
use crate::key::BucketKey;
use crate::lease_store::{LeaseStore, counter_keys, state_key};
use crate::limit::Kind;
use crate::ops::allowance::DemandRequest;
use crate::ops::check::{BucketStatus, CheckOutcome, CheckRequest, is_slot_bucket};
use crate::ops::counter::HeldLeases;
use crate::ops::debit::DebitRequest;
use crate::ops::lease::{LeaseGrant, LeaseId, LeaseRequest, ReturnRequest};
use crate::ops::penalty::{Lift, Penalty, PenaltyState};
use crate::ops::reservation::{SettleRequest, Settlement};
use crate::ops::slot::{SlotId, SlotRelease, SlotRenew};

fn us(d: u64) -> Duration {
    Duration::from_micros(d)
}

/// Microseconds left of a penalty block on `key`'s identity (0: none).
fn block_left(keys: &Keys, key: &BucketKey, now: Micros) -> u64 {
    match keys.get(&key.penalty_key(), now) {
        Some(Value::Penalty(record)) => penalty_box::blocked_for(Some(record), now),
        _ => 0,
    }
}

/// The lift epoch of `key`'s penalty records (0: none).
fn lift_epoch(keys: &Keys, key: &BucketKey, now: Micros) -> u64 {
    match keys.get(&key.penalty_epoch_key(), now) {
        Some(Value::Epoch(epoch)) => *epoch,
        _ => 0,
    }
}

/// Starts a new lift epoch of `key`'s penalty records (`next_epoch` in `lib.lua`).
fn next_epoch(keys: &mut Keys, key: &BucketKey, now: Micros) -> u64 {
    let epoch = penalty_box::next_epoch(lift_epoch(keys, key, now), now);
    let expires = now + penalty_box::EPOCH_TTL.as_micros() as u64;
    keys.put(&key.penalty_epoch_key(), Value::Epoch(epoch), expires);
    epoch
}

/// How a debt is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Debt {
    /// A debit's: a token bucket's debt floored at one full bucket (GCRA and the leaky bucket
    /// at two bursts).
    Floored,
    /// A settlement's excess over its estimate: owed whole, however deep.
    InFull,
}

/// Subtracts `units` consumed at `at` from a loaded bucket (as lib.lua's `debit_bucket`);
/// returns the units applied (0 when their window no longer counts).
pub(super) fn debit_bucket(
    b: &mut Bucket,
    limit: &crate::limit::Limit,
    units: u64,
    at: Micros,
    now: Micros,
    debt: Debt,
) -> u64 {
    if debt == Debt::InFull {
        match (&mut *b, limit.kind()) {
            (Bucket::TokenBucket(tb), _) => {
                tb.tokens -= units as f64;
                return units;
            }
            (
                Bucket::Gcra(g),
                Kind::Gcra {
                    rate_per_second, ..
                },
            ) => {
                g.ahead += units as f64 * crate::algorithm::gcra::interval_us(rate_per_second);
                return units;
            }
            (Bucket::LeakyBucket(lb), _) => {
                lb.level += units as f64;
                return units;
            }
            _ => {}
        }
    }
    match (b, limit.kind()) {
        (Bucket::TokenBucket(tb), _) => tb.debit(units, limit.capacity()),
        (
            Bucket::Gcra(g),
            Kind::Gcra {
                burst,
                rate_per_second,
            },
        ) => g.debit(units, burst, rate_per_second),
        (Bucket::LeakyBucket(lb), _) => lb.debit(units, limit.capacity()),
        (Bucket::FixedWindow(fw), Kind::FixedWindow { window_us, .. })
            if fw.counts_at(window_us, at) =>
        {
            fw.count += units;
            units
        }
        (Bucket::SlidingWindow(sw), Kind::SlidingWindow { limit, window_us }) => {
            sw.debit(limit, window_us, at, units)
        }
        (Bucket::Log(log), Kind::SlidingWindowLog { limit, window_us })
            if at > now.saturating_sub(window_us) =>
        {
            log.add_owed(at, units, limit, window_us);
            units
        }
        _ => 0,
    }
}

mod leases;

impl LeaseStore for MemoryStore {
    /// A check, as `redis/scripts/check.lua` does it, step for step (load every bucket and its
    /// allowance, judge, refuse a blocked identity, write all or nothing): longer than most
    /// functions here so that the two read side by side (the conformance suite holds them to
    /// one behaviour).
    async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        let items = req.items();
        let slot_nonce = if items.iter().any(|i| is_slot_bucket(&i.limit)) {
            self.nonce()
        } else {
            String::new()
        };
        let state_keys: Vec<_> = items.iter().map(|i| state_key(&i.key, &i.limit)).collect();
        let mut extra = allowance_keys(items.iter().map(|i| (&i.key, i.allowance.as_ref())));
        if req.reservation().is_some() {
            extra.extend(items.iter().map(|i| i.key.reservations_key()));
        }
        let creates: Vec<&str> = state_keys
            .iter()
            .map(|k| k.as_ref())
            .chain(extra.iter().map(String::as_str))
            .collect();
        self.with_shard(&items[0].key, &creates, |keys, now| {
            let buckets: Vec<(std::borrow::Cow<str>, Bucket, Option<Allowed>)> = items
                .iter()
                .map(|i| {
                    let k = state_key(&i.key, &i.limit);
                    let b = Bucket::load(keys, &k, &i.limit, now);
                    let allowed = i
                        .allowance
                        .as_ref()
                        .map(|a| Allowed::load(keys, &i.key, &i.limit, a, now));
                    (k, b, allowed)
                })
                .collect();
            // Per item: whether the view admits, whether the allowance does.
            let admits: Vec<(bool, bool)> = items
                .iter()
                .zip(&buckets)
                .map(|(i, (_, b, a))| {
                    (
                        b.admits(&i.limit, now, i.cost),
                        a.as_ref()
                            .is_none_or(|a| a.bucket.admits(&a.limit, now, i.cost)),
                    )
                })
                .collect();
            let blocks: Vec<u64> = items
                .iter()
                .map(|i| {
                    if i.penalized {
                        block_left(keys, &i.key, now)
                    } else {
                        0
                    }
                })
                .collect();
            let all = admits.iter().all(|(v, a)| *v && *a) && blocks.iter().all(|b| *b == 0);
            let mut out = Vec::with_capacity(items.len());
            for (((item, (k, mut b, mut allowance)), (view_ok, allowance_ok)), block) in
                items.iter().zip(buckets).zip(admits).zip(blocks)
            {
                let consume = all && item.cost > 0 && !req.is_peek();
                let entry = if consume {
                    b.consume(&item.limit, now, item.cost, &slot_nonce)
                } else {
                    None
                };
                if let Some(r) = req.reservation().filter(|_| all) {
                    let log_entry = match (&b, &entry) {
                        (Bucket::Log(_), Some(member)) => {
                            member.split(':').next().unwrap_or_default().to_owned()
                        }
                        _ => String::new(),
                    };
                    let rkey = item.key.reservations_key();
                    let mut records = keys.take_reservations(&rkey, now);
                    records.record(
                        &r.nonce,
                        item.cost,
                        item.limit.algorithm().script_code(),
                        r.ttl.as_micros() as u64,
                        log_entry,
                        now,
                    );
                    keys.keep_reservations(&rkey, records, now);
                }
                let mut status = BucketStatus {
                    allowed: view_ok,
                    remaining: b.available(&item.limit, now),
                    retry_after: us(if view_ok {
                        0
                    } else {
                        b.retry_after(&item.limit, now, item.cost)
                    }),
                    reset_after: us(b.reset_after(&item.limit, now)),
                    slot: entry
                        .filter(|_| is_slot_bucket(&item.limit))
                        .map(|s| SlotId(s.into())),
                    blocked_for: Duration::ZERO,
                };
                if let Some(a) = allowance.as_mut() {
                    if consume {
                        a.bucket.consume(&a.limit, now, item.cost, "");
                    }
                    status.allowed &= allowance_ok;
                    status.remaining = status.remaining.min(a.bucket.available(&a.limit, now));
                    if !allowance_ok {
                        status.retry_after = status
                            .retry_after
                            .max(us(a.bucket.retry_after(&a.limit, now, item.cost)));
                    }
                    status.reset_after = status
                        .reset_after
                        .max(us(a.bucket.reset_after(&a.limit, now)));
                }
                if block > 0 {
                    status.allowed = false;
                    status.blocked_for = us(block);
                    status.retry_after = status.retry_after.max(us(block));
                }
                out.push(status);
                if consume {
                    b.store(keys, &k, &item.limit, now);
                } else {
                    b.restore(keys, &k);
                }
                if let Some(a) = allowance {
                    a.store(keys, consume, now);
                }
            }
            CheckOutcome { buckets: out }
        })
    }

    async fn acquire_leases(&self, req: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        self.acquire_leases_now(req)
    }

    async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        self.return_leases_now(req)
    }

    async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        let items = req.items();
        self.with_shard(&items[0].0, &[], |keys, now| {
            items
                .iter()
                .map(|(key, slot)| {
                    let k = format!("{key}:slots");
                    let mut slots = keys.take_sorted(&k, now);
                    slots.remove_up_to(now);
                    let released = slots.remove(slot.as_str());
                    keys.restore_sorted(&k, slots);
                    released
                })
                .collect()
        })
    }

    async fn renew_slots(&self, req: &SlotRenew) -> Result<Vec<bool>, StoreError> {
        let items = req.items();
        self.with_shard(&items[0].0, &[], |keys, now| {
            items
                .iter()
                .zip(req.ttls())
                .map(|((key, slot), ttl)| {
                    let k = format!("{key}:slots");
                    let mut slots = keys.take_sorted(&k, now);
                    slots.remove_up_to(now);
                    let held = slots.score(slot.as_str()).is_some();
                    if held {
                        slots.add(now + ttl.as_micros() as u64, slot.as_str().to_owned());
                    }
                    store_leases(keys, &k, slots, now);
                    held
                })
                .collect()
        })
    }

    async fn report_demand(&self, req: &DemandRequest) -> Result<(), StoreError> {
        let reports = req.reports();
        let names: Vec<String> = reports.iter().map(|r| r.key.demand_key()).collect();
        let creates: Vec<&str> = names.iter().map(String::as_str).collect();
        self.with_shard(&reports[0].key, &creates, |keys, now| {
            for (r, key) in reports.iter().zip(&names) {
                let mut demand = load_demand(keys, key, now);
                demand.report(r, now);
                let expires_at = demand.expires_at(0, now);
                keys.put(key, Value::Demand(demand), expires_at);
            }
        })
    }

    async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        let state_keys: Vec<_> = items.iter().map(|i| state_key(&i.key, &i.limit)).collect();
        let remote_keys: Vec<String> = items
            .iter()
            .filter(|i| i.once.is_some())
            .map(|i| i.key.remote_key())
            .collect();
        let creates: Vec<&str> = state_keys
            .iter()
            .map(|k| k.as_ref())
            .chain(remote_keys.iter().map(String::as_str))
            .collect();
        self.with_shard(&items[0].key, &creates, |keys, now| {
            items
                .iter()
                .map(|item| {
                    let units = match &item.once {
                        None => item.units,
                        Some(once) => {
                            let remote = item.key.remote_key();
                            let mut marks = match keys.get(&remote, now) {
                                Some(Value::Marks(m)) => m.clone(),
                                _ => Default::default(),
                            };
                            let excess = once_marks::apply(
                                &mut marks,
                                &once.origin,
                                once.until,
                                item.units,
                                now,
                            );
                            if excess > 0 {
                                let expires_at = once_marks::last_until(&marks)
                                    .saturating_add(EXPIRY_MARGIN_MS * 1000);
                                keys.put(&remote, Value::Marks(marks), expires_at);
                            }
                            excess
                        }
                    };
                    if units == 0 {
                        return 0;
                    }
                    let at = item.consumed_at.unwrap_or(now).min(now);
                    let k = state_key(&item.key, &item.limit);
                    let mut b = Bucket::load(keys, &k, &item.limit, now);
                    let applied = debit_bucket(&mut b, &item.limit, units, at, now, Debt::Floored);
                    if applied > 0 {
                        b.store(keys, &k, &item.limit, now);
                    } else {
                        b.restore(keys, &k);
                    }
                    applied
                })
                .collect()
        })
    }

    async fn held_leases(&self, key: &BucketKey) -> Result<HeldLeases, StoreError> {
        let lease_key = key.lease_key();
        self.with_shard(key, &[], |keys, now| {
            let mut held = HeldLeases::default();
            if let Some(Value::Sorted(leases)) = keys.get(&lease_key, now) {
                for (expires_at, lease) in leases.iter() {
                    if expires_at > now {
                        held.leases += 1;
                        held.units += ParsedLease::parse(lease).map_or(0, |l| l.units);
                    }
                }
            }
            held
        })
    }

    async fn reset(&self, key: &BucketKey) -> Result<bool, StoreError> {
        let epoch = key.penalty_epoch_key();
        self.with_shard(key, &[epoch.as_str()], |keys, now| {
            let mut forgot = false;
            for name in counter_keys(key) {
                forgot |= keys.get(&name, now).is_some();
                keys.remove(&name);
            }
            next_epoch(keys, key, now);
            forgot
        })
    }

    async fn settle(&self, req: &SettleRequest) -> Result<Vec<Settlement>, StoreError> {
        let items = req.items();
        let names: Vec<String> = items
            .iter()
            .flat_map(|i| {
                [
                    state_key(&i.key, &i.limit).into_owned(),
                    i.key.reservations_key(),
                ]
            })
            .collect();
        let creates: Vec<&str> = names.iter().map(String::as_str).collect();
        self.with_shard(&items[0].key, &creates, |keys, now| {
            items
                .iter()
                .map(|item| {
                    let rkey = item.key.reservations_key();
                    let mut records = keys.take_reservations(&rkey, now);
                    records.prune(now);
                    let outcome = match records.get(&item.nonce).cloned() {
                        None => Settlement::Unknown,
                        Some(Record::Settled) => Settlement::AlreadySettled,
                        Some(Record::Open {
                            units,
                            at,
                            alg,
                            expires,
                            entry,
                        }) => {
                            let live = now < expires;
                            let (mut refunded, mut charged) = (0, 0);
                            if alg == item.limit.algorithm().script_code() {
                                let k = state_key(&item.key, &item.limit);
                                let mut b = Bucket::load(keys, &k, &item.limit, now);
                                if item.actual < units && live {
                                    let back = units - item.actual;
                                    refunded = match &mut b {
                                        Bucket::Log(log) => {
                                            let member = format!("{entry}:{units}");
                                            match log.remove(&member) {
                                                Some((score, _)) => {
                                                    if units > back {
                                                        log.entries.add(
                                                            score,
                                                            format!("{entry}:{}", units - back),
                                                        );
                                                        log.used += units - back;
                                                    }
                                                    back
                                                }
                                                None => 0,
                                            }
                                        }
                                        _ => {
                                            let ws = item.limit.window().map_or(0, |w| {
                                                window_start(at, w.as_micros() as u64)
                                            });
                                            credit_kept(&mut b, &item.limit, back, ws)
                                        }
                                    };
                                } else if item.actual > units {
                                    charged = debit_bucket(
                                        &mut b,
                                        &item.limit,
                                        item.actual - units,
                                        at.min(now),
                                        now,
                                        Debt::InFull,
                                    );
                                }
                                if refunded > 0 || charged > 0 {
                                    b.store(keys, &k, &item.limit, now);
                                } else {
                                    b.restore(keys, &k);
                                }
                            }
                            records.settle(&item.nonce);
                            if live {
                                Settlement::Settled { refunded, charged }
                            } else {
                                Settlement::Expired { charged }
                            }
                        }
                    };
                    keys.keep_reservations(&rkey, records, now);
                    outcome
                })
                .collect()
        })
    }

    async fn note_denials(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
        denials: u64,
        under: Option<u64>,
    ) -> Result<PenaltyState, StoreError> {
        let name = key.penalty_key_of(penalty);
        let params = PenaltyParams {
            after: penalty.after(),
            within_us: penalty.within().as_micros() as u64,
            block_us: penalty.block().as_micros() as u64,
        };
        self.with_shard(key, &[name.as_str()], |keys, now| {
            let record = match keys.get(&name, now) {
                Some(Value::Penalty(r)) => Some(*r),
                _ => None,
            };
            let adding = penalty_box::Adding {
                denials,
                under,
                epoch: lift_epoch(keys, key, now),
            };
            let (state, write) = penalty_box::note(record, adding, params, now);
            if let Some((record, ttl_ms)) = write {
                keys.put(&name, Value::Penalty(record), now + ttl_ms * 1000);
            }
            state
        })
    }

    async fn lift_block(&self, key: &BucketKey) -> Result<Lift, StoreError> {
        let (name, shadow) = (key.penalty_key(), key.shadow_penalty_key());
        let epoch = key.penalty_epoch_key();
        self.with_shard(key, &[epoch.as_str()], |keys, now| {
            let was_blocked = block_left(keys, key, now) > 0;
            keys.remove(&name);
            keys.remove(&shadow);
            Lift {
                was_blocked,
                epoch: next_epoch(keys, key, now),
            }
        })
    }
}
