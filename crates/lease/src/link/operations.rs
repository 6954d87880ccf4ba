//! Every store operation across the link: the call crosses it, runs on the in-memory store
//! underneath, and its answer crosses back.

use crate::error::StoreError;
use crate::key::BucketKey;
use crate::lease_store::LeaseStore;
use crate::ops::allowance::DemandRequest;
use crate::ops::check::{CheckOutcome, CheckRequest};
use crate::ops::counter::HeldLeases;
use crate::ops::debit::DebitRequest;
use crate::ops::lease::{LeaseGrant, LeaseRequest, ReturnRequest};
use crate::ops::penalty::{Lift, Penalty, PenaltyState};
use crate::ops::slot::{SlotRelease, SlotRenew};

use super::LinkedStore;

impl LeaseStore for LinkedStore {
    async fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, StoreError> {
        let req = req.clone();
        let link = self.link.clone();
        self.call(
            "check",
            |c| &c.check,
            move |s| async move {
                // Booked where the store answers, whether or not the caller still waits.
                let outcome = s.check(&req).await?;
                if outcome.allowed() {
                    for item in req.items() {
                        if item.limit.algorithm() != crate::limit::Algorithm::Concurrency {
                            link.book(item.key.as_str(), |l| l.handed += item.cost);
                        }
                    }
                }
                Ok(outcome)
            },
        )
        .await
    }

    async fn acquire_leases(&self, req: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        let req = req.clone();
        let link = self.link.clone();
        self.call(
            "acquire",
            |c| &c.acquire,
            move |s| async move {
                let grants = s.acquire_leases(&req).await?;
                for (ask, grant) in req.asks().iter().zip(&grants) {
                    link.book(ask.key.as_str(), |l| l.handed += grant.units);
                }
                Ok(grants)
            },
        )
        .await
    }

    async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        let req = req.clone();
        let link = self.link.clone();
        self.call(
            "return",
            |c| &c.returns,
            move |s| async move {
                let credited = s.return_leases(&req).await?;
                for (item, units) in req.items().iter().zip(&credited) {
                    link.book(item.key.as_str(), |l| l.credited += units);
                }
                Ok(credited)
            },
        )
        .await
    }

    async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        let req = req.clone();
        self.call(
            "release",
            |c| &c.release,
            move |s| async move { s.release_slots(&req).await },
        )
        .await
    }

    async fn renew_slots(&self, req: &SlotRenew) -> Result<Vec<bool>, StoreError> {
        let req = req.clone();
        self.call(
            "renew",
            |c| &c.release,
            move |s| async move { s.renew_slots(&req).await },
        )
        .await
    }

    async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        let req = req.clone();
        self.call(
            "debit",
            |c| &c.debit,
            move |s| async move { s.debit(&req).await },
        )
        .await
    }

    async fn settle(
        &self,
        req: &crate::ops::reservation::SettleRequest,
    ) -> Result<Vec<crate::ops::reservation::Settlement>, StoreError> {
        let req = req.clone();
        self.call(
            "settle",
            |c| &c.debit,
            move |s| async move { s.settle(&req).await },
        )
        .await
    }

    async fn report_demand(&self, req: &DemandRequest) -> Result<(), StoreError> {
        let req = req.clone();
        self.call(
            "demand",
            |c| &c.demand,
            move |s| async move { s.report_demand(&req).await },
        )
        .await
    }

    async fn held_leases(&self, key: &BucketKey) -> Result<HeldLeases, StoreError> {
        let key = key.clone();
        self.call(
            "counter",
            |c| &c.counter,
            move |s| async move { s.held_leases(&key).await },
        )
        .await
    }

    async fn reset(&self, key: &BucketKey) -> Result<bool, StoreError> {
        let key = key.clone();
        self.call(
            "counter",
            |c| &c.counter,
            move |s| async move { s.reset(&key).await },
        )
        .await
    }

    async fn note_denials(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
        denials: u64,
        epoch: Option<u64>,
    ) -> Result<PenaltyState, StoreError> {
        let (key, penalty) = (key.clone(), *penalty);
        self.call(
            "penalty",
            |c| &c.penalty,
            move |s| async move { s.note_denials(&key, &penalty, denials, epoch).await },
        )
        .await
    }

    async fn lift_block(&self, key: &BucketKey) -> Result<Lift, StoreError> {
        let key = key.clone();
        self.call(
            "penalty",
            |c| &c.penalty,
            move |s| async move { s.lift_block(&key).await },
        )
        .await
    }
}
