//! The key actor's store calls, each in a task of its own so the actor never awaits the
//! store: one lease call for its asks (after the returns that must reach the store before it,
//! in the same task), whose result comes back as a message, and returns of unspent units.

use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tollgate_lease::{LeaseAsk, LeaseRequest, LeaseReturn, ReturnRequest, StoreError};

use crate::runtime::keys::book::Return;
use crate::runtime::keys::bucket::{Ask, Bucket, KeyMsg};
use crate::runtime::shared::Shared;

/// Starts one lease call for `asks` after `returns`; the actor (`myself`) is told when the
/// call is late ([`KeyMsg::Late`]) and when it ends ([`KeyMsg::Granted`]).
pub(crate) fn lease(
    shared: &Arc<Shared>,
    myself: &ActorRef<KeyMsg>,
    identity: &[u8],
    asks: Vec<Ask>,
    returns: Vec<Return>,
) {
    let policy = &shared.config.lease;
    let lease_asks = asks
        .iter()
        .map(|a| LeaseAsk {
            key: a.bucket.key.clone(),
            limit: a.bucket.limit,
            want: a.want,
            min: a.min,
            max_share: policy.max_share,
            allowance: shared.allowance_of(&a.bucket.rule, &a.bucket.limit),
            penalized: a.bucket.rule.enforces_penalty(),
        })
        .collect();
    let request = LeaseRequest::new(lease_asks, policy.ttl);
    let shared = shared.clone();
    let myself = myself.clone();
    let identity = identity.to_vec();
    tokio::spawn(async move {
        // Returns that must precede this call go first.
        return_units(&shared, &identity, returns).await;
        let result = match request {
            Ok(req) => {
                let buckets: Vec<Arc<Bucket>> = asks.iter().map(|a| a.bucket.clone()).collect();
                let told = myself.clone();
                shared
                    .store
                    .acquire_leases(&req, move |late| {
                        for bucket in &buckets {
                            bucket.set_late(late);
                        }
                        let _ = told.cast(KeyMsg::Late {
                            late,
                            buckets: buckets.clone(),
                        });
                    })
                    .await
            }
            Err(e) => Err(StoreError::Invalid(e)),
        };
        let _ = myself.cast(KeyMsg::Granted { asks, result });
    });
}

/// Gives `returns` back to the store in a task of their own; `done` is answered after.
pub(crate) fn give_back(
    shared: &Arc<Shared>,
    identity: &[u8],
    returns: Vec<Return>,
    done: Option<RpcReplyPort<()>>,
) {
    if returns.is_empty() {
        if let Some(done) = done {
            let _ = done.send(());
        }
        return;
    }
    let shared = shared.clone();
    let identity = identity.to_vec();
    tokio::spawn(async move {
        return_units(&shared, &identity, returns).await;
        if let Some(done) = done {
            let _ = done.send(());
        }
    });
}

/// Gives `returns` back to the store, and takes what it credits back from the peer region's
/// count.
async fn return_units(shared: &Shared, identity: &[u8], returns: Vec<Return>) {
    if returns.is_empty() {
        return;
    }
    let items = returns
        .iter()
        .map(|r| LeaseReturn {
            key: r.bucket.key.clone(),
            limit: r.bucket.limit,
            lease: r.lease.clone(),
            unspent: r.units,
            allowance: shared.allowance_of(&r.bucket.rule, &r.bucket.limit),
        })
        .collect();
    let Ok(req) = ReturnRequest::new(items) else {
        return;
    };
    match shared.store.return_leases(&req).await {
        Ok(credited) => {
            let metrics = &shared.metrics;
            for (r, units) in returns.iter().zip(credited) {
                if units == 0 {
                    continue;
                }
                metrics.leases_returned.inc();
                metrics.lease_units_returned.inc_by(units);
                // Back in this region's store: not the peer's to count any more.
                if r.recorded
                    && r.bucket.rule.synced()
                    && let Some(region) = shared.region.get()
                {
                    region.unrecord(
                        &r.bucket.rule.key,
                        identity,
                        &r.bucket.limit,
                        units,
                        r.granted_at,
                    );
                }
            }
        }
        // Unreturned units stay consumed until the lease expires: under-admission only.
        Err(e) => tracing::debug!(error = %e, "lease return failed"),
    }
}
