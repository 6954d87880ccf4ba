//! Finding a hit's bucket: in the registry, or made on first use, with its identity's actor
//! spawned under the supervisor, within the key state budget. A key is given a bucket and an
//! actor only once its demand would lease more than one unit; until then (and when the budget
//! is short) its decisions are store checks.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use ractor::rpc::CallResult;
use tollgate_lease::{Limit, Micros};

use crate::rules::CompiledRule;
use crate::runtime::fallbacks::Fallbacks;
use crate::runtime::keys::bucket::{Bucket, KeyMsg};
use crate::runtime::keys::bucket_id::BucketId;
use crate::runtime::keys::registry::bucket_cost;
use crate::runtime::keys::supervisor::SupervisorMsg;
use crate::runtime::local::LocalBucket;
use crate::runtime::shared::Shared;

thread_local! {
    /// The registry key of the bucket being looked up: built here, so a lookup allocates nothing.
    static LOOKUP: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What a lookup needs of the node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) supervisor: &'a ActorRef<SupervisorMsg>,
    /// The LOCAL fallbacks of keys without a bucket (a new bucket takes over its key's count).
    pub(crate) fallbacks: &'a Fallbacks,
}

impl Keys<'_> {
    /// The bucket of `rule` applied to `identity`, made (with the identity's actor) on first
    /// use. None when the key has not earned one yet or the key state budget is short: the hit
    /// is then decided directly.
    pub(crate) async fn bucket(
        &self,
        rule: &Arc<CompiledRule>,
        identity: &[u8],
        limit: Limit,
        now: Micros,
    ) -> Option<Arc<Bucket>> {
        let shared = self.shared;
        let id = BucketId::new(rule, identity);
        if let Some(bucket) = LOOKUP.with_borrow_mut(|key| {
            id.write_local_key(key);
            shared.registry.bucket(key)
        }) {
            return Some(bucket);
        }
        let key = id.local_key();
        let store_key = id.store_key().ok()?;
        let actor = match shared.registry.actor(identity) {
            // The identity's actor serves this bucket too (and settles what an older
            // definition of the rule holds before it leases).
            Some(actor) => actor,
            None => {
                // A key is worth an actor when its demand would lease more than one unit:
                // leases cover half a lifetime of demand, so it must come back within a
                // quarter of one (two requests in that time). Until then its decision is a
                // store check, as its one-unit lease would be.
                let within = shared.config.lease.ttl.as_micros() as u64 / 4;
                if !shared.registry.seen_again(&key, now, within) {
                    return None;
                }
                if !shared.registry.reserve_actor(identity.len()) {
                    shared.metrics.key_actors_refused.inc();
                    press(shared, now);
                    return None;
                }
                let spawned = self
                    .supervisor
                    .call(
                        |reply| SupervisorMsg::Spawn {
                            identity: identity.to_vec(),
                            reply,
                        },
                        Some(Duration::from_secs(1)),
                    )
                    .await;
                let Ok(CallResult::Success(Some(actor))) = spawned else {
                    shared.registry.unreserve_actor(identity.len());
                    return None;
                };
                let kept = shared
                    .registry
                    .insert_actor(identity.to_vec(), actor.clone());
                if kept.get_id() != actor.get_id() {
                    // Another request spawned this identity's actor first.
                    actor.stop(None);
                    shared.registry.unreserve_actor(identity.len());
                }
                kept
            }
        };
        if !shared
            .registry
            .reserve(bucket_cost(identity.len(), store_key.as_str().len()))
        {
            shared.metrics.key_actors_refused.inc();
            press(shared, now);
            return None;
        }
        // The LOCAL fail mode's count the key had without a bucket carries over.
        let fallback = match self.fallbacks.take(&key) {
            Some(kept) => kept,
            None => Arc::new(LocalBucket::for_limit(
                &limit,
                1.0 / f64::from(shared.config.cluster_nodes.max(1)),
            )),
        };
        let bucket = Arc::new(Bucket::new(
            store_key,
            rule.clone(),
            limit,
            actor,
            shared.config.prelimit_factor,
            fallback,
            shared.config.cluster_nodes,
        ));
        Some(shared.registry.insert_bucket(key, bucket))
    }
}

/// The key state budget is short: a sample of actors is asked to stop if they have been idle
/// for [`EVICTABLE_AFTER`](crate::runtime::keys::registry::EVICTABLE_AFTER) (they return
/// what their leases hold first).
fn press(shared: &Shared, now: Micros) {
    shared.registry.press(now, 256, |actor| {
        let _ = actor.cast(KeyMsg::Evict);
    });
}
