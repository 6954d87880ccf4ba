//! Every store operation on Redis: its keys and arguments laid out for its script, the
//! script run on the shard of its keys, and the reply read.

use std::time::Duration;

use crate::key::BucketKey;

use crate::error::StoreError;
use crate::lease_store::{LeaseStore, counter_keys, state_key};
use crate::limit::Limit;
use crate::ops::allowance::{Allowance, DemandRequest};
use crate::ops::check::{CheckOutcome, CheckRequest};
use crate::ops::counter::HeldLeases;
use crate::ops::debit::DebitRequest;
use crate::ops::lease::{LeaseGrant, LeaseRequest, ReturnRequest};
use crate::ops::nonce;
use crate::ops::penalty::{Lift, Penalty, PenaltyState};
use crate::ops::reservation::{SettleRequest, Settlement};
use crate::ops::slot::{SlotRelease, SlotRenew};

use super::*;

/// The four arguments that describe an item's allowance to the scripts (the KEYS index of its
/// allowance key, pushed with the demand key after it, or 0), see `lib.lua`.
fn allowance_args(
    key: &BucketKey,
    allowance: Option<&Allowance>,
    extra: &mut Vec<String>,
    args: &mut Vec<String>,
    first_extra: usize,
) {
    match allowance {
        None => args.extend([
            "0".to_owned(),
            String::new(),
            "0".to_owned(),
            "1".to_owned(),
        ]),
        Some(a) => {
            args.push((first_extra + extra.len() + 1).to_string());
            extra.push(key.allowance_key());
            extra.push(key.demand_key());
            args.push(a.region.to_string());
            args.push(a.interval_us.to_string());
            args.push(format!("{:?}", a.unknown_share));
        }
    }
}

/// The argument that names an item's penalty record to the scripts (the KEYS index of
/// `<key>:penalty`, pushed after the others, or 0 when its rule has no penalty).
fn penalty_arg(
    key: &BucketKey,
    penalized: bool,
    extra: &mut Vec<String>,
    args: &mut Vec<String>,
    first_extra: usize,
) {
    if penalized {
        args.push((first_extra + extra.len() + 1).to_string());
        extra.push(key.penalty_key());
    } else {
        args.push("0".to_owned());
    }
}

/// The three arguments that describe a bucket's limit to the scripts.
fn limit_args(limit: &Limit, args: &mut Vec<String>) {
    let (p1, p2) = limit.script_params();
    args.push(limit.algorithm().script_code().to_string());
    args.push(p1);
    args.push(p2);
}

impl LeaseStore for RedisStore {
    async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        let items = req.items();
        let mut keys: Vec<String> = items
            .iter()
            .map(|i| state_key(&i.key, &i.limit).into_owned())
            .collect();
        let mut args = Vec::with_capacity(2 + 9 * items.len());
        let mut extra = vec![];
        match req.reservation() {
            None => {
                args.push(nonce());
                args.push(if req.is_peek() { "1" } else { "0" }.to_owned());
            }
            Some(r) => {
                // The records' keys follow every other key (allowances and penalties are
                // placed by index as they come).
                args.push(r.nonce.clone());
                args.push(String::new());
            }
        }
        for item in items {
            limit_args(&item.limit, &mut args);
            args.push(item.cost.to_string());
            let a = item.allowance.as_ref();
            allowance_args(&item.key, a, &mut extra, &mut args, items.len());
            penalty_arg(
                &item.key,
                item.penalized,
                &mut extra,
                &mut args,
                items.len(),
            );
        }
        keys.extend(extra);
        if let Some(r) = req.reservation() {
            args[1] = format!("R|{}|{}", r.ttl.as_micros(), keys.len() + 1);
            for item in items {
                keys.push(item.key.reservations_key());
                keys.push(item.key.reservation_ends_key());
            }
        }
        let reply = self.run(BatchOp::Check, keys, args).await?;
        reply::check(reply, items.len())
    }

    async fn acquire_leases(&self, req: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        let asks = req.asks();
        let mut keys = Vec::with_capacity(2 * asks.len());
        let mut args = Vec::with_capacity(2 + 11 * asks.len());
        let mut extra = vec![];
        args.push(nonce());
        args.push((req.ttl().as_micros() as u64).to_string());
        for ask in asks {
            keys.push(state_key(&ask.key, &ask.limit).into_owned());
            keys.push(ask.key.lease_key());
            limit_args(&ask.limit, &mut args);
            args.push(ask.want.to_string());
            args.push(ask.min.to_string());
            args.push(format!("{:?}", ask.max_share));
            let a = ask.allowance.as_ref();
            allowance_args(&ask.key, a, &mut extra, &mut args, 2 * asks.len());
            penalty_arg(
                &ask.key,
                ask.penalized,
                &mut extra,
                &mut args,
                2 * asks.len(),
            );
        }
        keys.extend(extra);
        let reply = self.run(BatchOp::LeaseAcquire, keys, args).await?;
        reply::grants(reply, asks.len())
    }

    async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        let mut keys = Vec::with_capacity(2 * items.len());
        let mut args = Vec::with_capacity(9 * items.len());
        let mut extra = vec![];
        for item in items {
            let a = &item.allowance;
            keys.push(state_key(&item.key, &item.limit).into_owned());
            keys.push(item.key.lease_key());
            limit_args(&item.limit, &mut args);
            args.push(item.lease.as_str().to_owned());
            args.push(item.unspent.to_string());
            allowance_args(
                &item.key,
                a.as_ref(),
                &mut extra,
                &mut args,
                2 * items.len(),
            );
        }
        keys.extend(extra);
        let reply = eval(&self.conn, &SCRIPTS.lease_return, &keys, &args, self.budget).await?;
        reply::counts(reply, items.len(), "lease return reply")
    }

    async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        let items = req.items();
        let keys: Vec<String> = items.iter().map(|(k, _)| format!("{k}:slots")).collect();
        let args: Vec<String> = items.iter().map(|(_, s)| s.as_str().to_owned()).collect();
        let reply = eval(&self.conn, &SCRIPTS.slot_release, &keys, &args, self.budget).await?;
        Ok(reply::counts(reply, items.len(), "slot release reply")?
            .into_iter()
            .map(|n| n == 1)
            .collect())
    }

    async fn renew_slots(&self, req: &SlotRenew) -> Result<Vec<bool>, StoreError> {
        let items = req.items();
        let keys: Vec<String> = items.iter().map(|(k, _)| format!("{k}:slots")).collect();
        let args: Vec<String> = items
            .iter()
            .zip(req.ttls())
            .flat_map(|((_, s), ttl)| [s.as_str().to_owned(), ttl.as_micros().to_string()])
            .collect();
        let reply = eval(&self.conn, &SCRIPTS.slot_renew, &keys, &args, self.budget).await?;
        Ok(reply::counts(reply, items.len(), "slot renew reply")?
            .into_iter()
            .map(|n| n == 1)
            .collect())
    }

    async fn report_demand(&self, req: &DemandRequest) -> Result<(), StoreError> {
        let reports = req.reports();
        let keys: Vec<String> = reports.iter().map(|r| r.key.demand_key()).collect();
        let mut args = Vec::with_capacity(4 * reports.len());
        for r in reports {
            args.push(r.origin.clone());
            args.push(r.region.clone());
            args.push(r.units.to_string());
            args.push(r.interval_us.to_string());
        }
        eval(
            &self.conn,
            &SCRIPTS.demand_report,
            &keys,
            &args,
            self.budget,
        )
        .await?;
        Ok(())
    }

    async fn held_leases(&self, key: &BucketKey) -> Result<HeldLeases, StoreError> {
        let keys = [key.lease_key()];
        let reply = eval(&self.conn, &SCRIPTS.held_leases, &keys, &[], self.budget).await?;
        let counts = reply::counts(reply, 2, "held leases reply")?;
        Ok(HeldLeases {
            leases: counts[0],
            units: counts[1],
        })
    }

    async fn reset(&self, key: &BucketKey) -> Result<bool, StoreError> {
        let mut keys = counter_keys(key).to_vec();
        keys.push(key.penalty_epoch_key());
        let reply = eval(&self.conn, &SCRIPTS.reset, &keys, &[], self.budget).await?;
        Ok(reply::counts(reply, 1, "reset reply")?[0] > 0)
    }

    async fn settle(&self, req: &SettleRequest) -> Result<Vec<Settlement>, StoreError> {
        let items = req.items();
        let mut keys = Vec::with_capacity(3 * items.len());
        let mut args = Vec::with_capacity(5 * items.len());
        for item in items {
            keys.push(state_key(&item.key, &item.limit).into_owned());
            keys.push(item.key.reservations_key());
            keys.push(item.key.reservation_ends_key());
            limit_args(&item.limit, &mut args);
            args.push(item.nonce.clone());
            args.push(item.actual.to_string());
        }
        let reply = eval(&self.conn, &SCRIPTS.settle, &keys, &args, self.budget).await?;
        reply::settlements(reply, items.len())
    }

    async fn note_denials(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
        denials: u64,
        epoch: Option<u64>,
    ) -> Result<PenaltyState, StoreError> {
        let keys = [key.penalty_key_of(penalty), key.penalty_epoch_key()];
        let args = [
            denials.to_string(),
            penalty.after().to_string(),
            penalty.within().as_micros().to_string(),
            penalty.block().as_micros().to_string(),
            epoch.map(|e| e.to_string()).unwrap_or_default(),
        ];
        let reply = eval(&self.conn, &SCRIPTS.note_denials, &keys, &args, self.budget).await?;
        let counts = reply::counts(reply, 4, "note denials reply")?;
        Ok(PenaltyState {
            blocked_for: Duration::from_micros(counts[0]),
            denials: counts[1],
            started: counts[2] == 1,
            epoch: counts[3],
        })
    }

    async fn lift_block(&self, key: &BucketKey) -> Result<Lift, StoreError> {
        let keys = [
            key.penalty_key(),
            key.shadow_penalty_key(),
            key.penalty_epoch_key(),
        ];
        let reply = eval(&self.conn, &SCRIPTS.penalty_lift, &keys, &[], self.budget).await?;
        let counts = reply::counts(reply, 2, "penalty lift reply")?;
        Ok(Lift {
            was_blocked: counts[0] == 1,
            epoch: counts[1],
        })
    }

    async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        let keys: Vec<String> = items
            .iter()
            .flat_map(|i| [state_key(&i.key, &i.limit).into_owned(), i.key.remote_key()])
            .collect();
        let mut args = Vec::with_capacity(7 * items.len());
        for item in items {
            limit_args(&item.limit, &mut args);
            args.push(item.units.to_string());
            args.push(item.consumed_at.map(|t| t.to_string()).unwrap_or_default());
            match &item.once {
                Some(once) => {
                    args.push(once.origin.clone());
                    args.push(once.until.to_string());
                }
                None => args.extend([String::new(), String::new()]),
            }
        }
        let reply = eval(&self.conn, &SCRIPTS.debit, &keys, &args, self.budget).await?;
        reply::counts(reply, items.len(), "debit reply")
    }
}
