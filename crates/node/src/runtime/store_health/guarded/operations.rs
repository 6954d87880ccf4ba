//! Every operation the node makes on the store, each one call through the guard: started,
//! waited for as its callers need, and ended.

use super::*;

impl GuardedStore {
    /// Starts, waits for and ends one call (`future` is `key`'s shard's side of it).
    pub(super) async fn call<T>(
        &self,
        op: StoreOp,
        key: &BucketKey,
        wait: Wait,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let mut call = self.begin(op, key)?;
        let future = std::pin::pin!(future);
        match self
            .wait(&mut call, future, |late| wait.stops_at(late))
            .await
        {
            Waited::Answered(result) => {
                self.end(call, &result);
                result
            }
            Waited::Stopped(error) => Err(error),
        }
    }

    /// [`LeaseStore::check`] through the breaker, waited for as `wait` says.
    pub async fn check(&self, req: &CheckRequest, wait: Wait) -> Result<CheckOutcome, StoreError> {
        let key = &req.items()[0].key;
        self.call(StoreOp::Check, key, wait, self.store.check(req))
            .await
    }

    /// [`LeaseStore::acquire_leases`] through the breaker. The call is waited for until it
    /// answers or the patience ends (a grant that comes late is still used); `on_late` is told
    /// when the store stalls and when it is down, so that the requests waiting on the grant
    /// can be decided meanwhile.
    pub async fn acquire_leases(
        &self,
        req: &LeaseRequest,
        mut on_late: impl FnMut(Late),
    ) -> Result<Vec<LeaseGrant>, StoreError> {
        let mut call = self.begin(StoreOp::LeaseAcquire, &req.asks()[0].key)?;
        let future = std::pin::pin!(self.store.acquire_leases(req));
        let mut late = false;
        let waited = self
            .wait(&mut call, future, |l| {
                late = true;
                on_late(l);
                false
            })
            .await;
        match waited {
            Waited::Answered(result) => {
                if late && result.is_ok() {
                    self.breakers.metrics.late_leases.inc();
                }
                self.end(call, &result);
                result
            }
            Waited::Stopped(error) => Err(error),
        }
    }

    /// [`LeaseStore::return_leases`] through the breaker.
    pub async fn return_leases(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        let key = &req.items()[0].key;
        self.call(
            StoreOp::LeaseReturn,
            key,
            Wait::UntilStall,
            self.store.return_leases(req),
        )
        .await
    }

    /// [`LeaseStore::release_slots`] through the breaker.
    pub async fn release_slots(&self, req: &SlotRelease) -> Result<Vec<bool>, StoreError> {
        let key = &req.items()[0].0;
        self.call(
            StoreOp::SlotRelease,
            key,
            Wait::UntilStall,
            self.store.release_slots(req),
        )
        .await
    }

    /// [`LeaseStore::renew_slots`] through the breaker.
    pub async fn renew_slots(&self, req: &SlotRenew) -> Result<Vec<bool>, StoreError> {
        let key = &req.items()[0].0;
        self.call(
            StoreOp::SlotRenew,
            key,
            Wait::UntilStall,
            self.store.renew_slots(req),
        )
        .await
    }

    /// [`LeaseStore::debit`] through the breaker (what was admitted while the store was late).
    pub async fn debit(&self, req: &DebitRequest) -> Result<Vec<u64>, StoreError> {
        let key = &req.items()[0].key;
        self.call(StoreOp::Debit, key, Wait::UntilStall, self.store.debit(req))
            .await
    }

    /// [`LeaseStore::check`], begun through the breaker, for a caller that may stop waiting
    /// and hand the call off (it goes on, in a task of its own, to its end): the call and the
    /// store's side of it. Waited for with [`GuardedStore::wait`], ended with
    /// [`GuardedStore::end`].
    pub(crate) fn begin_check(
        &self,
        req: &CheckRequest,
    ) -> Result<(Call, StoreFuture<CheckOutcome>), StoreError> {
        let call = self.begin(StoreOp::Check, &req.items()[0].key)?;
        let (store, req) = (self.store.clone(), req.clone());
        Ok((call, Box::pin(async move { store.check(&req).await })))
    }

    /// [`LeaseStore::settle`] through the breaker. No request waits on a settle (it is made
    /// after the response): it waits for the store through a stall, up to the patience.
    pub async fn settle(&self, req: &SettleRequest) -> Result<Vec<Settlement>, StoreError> {
        let key = &req.items()[0].key;
        self.call(
            StoreOp::Settle,
            key,
            Wait::UntilDown,
            self.store.settle(req),
        )
        .await
    }

    /// [`LeaseStore::note_denials`] through the breaker: denials counted towards `key`'s
    /// penalty, waited for through a stall, up to the patience (no
    /// request waits on it).
    pub async fn note_denials(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
        denials: u64,
        epoch: Option<u64>,
    ) -> Result<PenaltyState, StoreError> {
        self.call(
            StoreOp::NoteDenials,
            key,
            Wait::UntilDown,
            self.store.note_denials(key, penalty, denials, epoch),
        )
        .await
    }

    /// [`LeaseStore::penalty_standing`] through the breaker (an operator's read, waited for
    /// through a stall; counted with the denials, whose script answers it).
    pub async fn penalty_standing(
        &self,
        key: &BucketKey,
        penalty: &Penalty,
    ) -> Result<PenaltyState, StoreError> {
        self.call(
            StoreOp::NoteDenials,
            key,
            Wait::UntilDown,
            self.store.penalty_standing(key, penalty),
        )
        .await
    }

    /// [`LeaseStore::reset`] through the breaker (an operator's call, waited for through a
    /// stall).
    pub async fn reset(&self, key: &BucketKey) -> Result<bool, StoreError> {
        self.call(StoreOp::Reset, key, Wait::UntilDown, self.store.reset(key))
            .await
    }

    /// [`LeaseStore::lift_block`] through the breaker (an operator's call).
    pub async fn lift_block(&self, key: &BucketKey) -> Result<Lift, StoreError> {
        self.call(
            StoreOp::PenaltyLift,
            key,
            Wait::UntilDown,
            self.store.lift_block(key),
        )
        .await
    }

    /// [`LeaseStore::held_leases`] through the breaker (an operator's read).
    pub async fn held_leases(&self, key: &BucketKey) -> Result<HeldLeases, StoreError> {
        self.call(
            StoreOp::Read,
            key,
            Wait::UntilDown,
            self.store.held_leases(key),
        )
        .await
    }
}
