//! A request resolved once (rules matched, buckets and actors found), so a caller that decides
//! the same request shape again and again (a gateway caching per API key and route) pays only
//! for the leases' atomic operations: no matching, no allocation, no lock, no mailbox hop, no
//! cross-thread hop while the leases last.

use std::sync::Arc;

use crate::runtime::keys::bucket::{Bucket, LocalTake};
use crate::runtime::node::Node;
use crate::runtime::request::{Request, RequestError};
use crate::runtime::verdict::Verdict;
/// A decision as a value: the lease store's own (the same two answers, one type).
pub use tollgate_lease::Decision;

#[derive(Debug)]
struct Part {
    bucket: Arc<Bucket>,
    cost: u64,
    /// The identity, for a bucket whose demand is reported to the peer region.
    synced: Option<Vec<u8>>,
}

/// A resolved request. Create it with [`Node::prepare`].
#[derive(Debug)]
pub struct Prepared {
    node: Node,
    request: Request,
    /// The rule set's generation the buckets were resolved against.
    version: u64,
    /// The leased buckets, when every matched rule is an ENFORCE rule decided by a lease;
    /// otherwise empty and every decision takes the full path.
    parts: Vec<Part>,
}

impl Node {
    /// Resolves `request` once, so deciding it again costs only the leases' atomic operations.
    pub async fn prepare(&self, request: Request) -> Result<Prepared, RequestError> {
        Prepared::new(self.clone(), request).await
    }
}

impl Prepared {
    async fn new(node: Node, request: Request) -> Result<Prepared, RequestError> {
        request.validate()?;
        let mut prepared = Prepared {
            node,
            request,
            version: 0,
            parts: vec![],
        };
        prepared.resolve().await;
        Ok(prepared)
    }

    async fn resolve(&mut self) {
        self.version = self.node.rules().generation();
        self.parts = self
            .node
            .leased_buckets(&self.request)
            .await
            .map(|parts| {
                parts
                    .into_iter()
                    .map(|(bucket, cost, synced)| Part {
                        bucket,
                        cost,
                        synced,
                    })
                    .collect()
            })
            .unwrap_or_default();
    }

    /// The request.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Decides from the leases alone, if they can: `Some` when every bucket's lease covered
    /// the cost (or the store recently refused it); `None` when the store is needed — then
    /// call [`Prepared::check`]. Never waits.
    pub fn try_check(&self) -> Option<Decision> {
        if self.parts.is_empty() || self.node.rules().generation() != self.version {
            return None;
        }
        let shared = self.node.shared();
        let now = shared.clock.now_micros();
        // Demand for ASYNC_SYNC buckets, admitted or not (the regional allowances), noted when
        // decided here (the full path notes its own).
        let asked = |parts: &[Part]| {
            if let Some(region) = shared.region.get() {
                for p in parts {
                    if let Some(identity) = &p.synced {
                        region.ask(&p.bucket.rule.key, identity, p.cost);
                    }
                }
            }
        };
        let undo = |parts: &[Part]| {
            for p in parts {
                p.bucket.give_back(p.cost);
                if let Some(pre) = &p.bucket.prelimit {
                    pre.refund(p.cost);
                }
            }
        };
        for (i, part) in self.parts.iter().enumerate() {
            let refill = |granted, left| shared.config.lease.should_refill(granted, left);
            let retry_after = match part.bucket.take_local(part.cost, now, refill) {
                LocalTake::Took => continue,
                LocalTake::Prelimited(wait) => {
                    // The retry must find room in the store too: when this node does not
                    // know when it will, the full path asks.
                    let Some(store) = part.bucket.denied_for(part.cost, now) else {
                        undo(&self.parts[..i]);
                        return None;
                    };
                    shared.metrics.prelimit_denied.inc();
                    wait.max(store)
                }
                // The store said it has no room for what the lease lacks: answered here.
                LocalTake::Denied(wait) => wait,
                LocalTake::Dry => {
                    if let Some(pre) = &part.bucket.prelimit {
                        pre.refund(part.cost);
                    }
                    undo(&self.parts[..i]);
                    return None;
                }
            };
            undo(&self.parts[..i]);
            asked(&self.parts);
            part.bucket.rule.counters.denied.inc();
            return Some(Decision::Limited { retry_after });
        }
        asked(&self.parts);
        for part in &self.parts {
            part.bucket.rule.counters.allowed.inc();
        }
        shared.metrics.lease_hits.inc_by(self.parts.len() as u64);
        Some(Decision::Allowed)
    }

    /// Decides on the full path (store, fail modes, statuses), then resolves the buckets again
    /// so later [`Prepared::try_check`] calls find the current ones.
    pub async fn check(&mut self) -> Verdict {
        let verdict = self.node.check(&self.request).await;
        self.resolve().await;
        // The request was validated when prepared.
        verdict.unwrap_or_else(|_| unreachable!("a prepared request is valid"))
    }

    /// [`Prepared::try_check`], else [`Prepared::check`].
    pub async fn decide(&mut self) -> Decision {
        if let Some(decision) = self.try_check() {
            return decision;
        }
        let verdict = self.check().await;
        if verdict.allowed {
            Decision::Allowed
        } else {
            Decision::Limited {
                retry_after: verdict.retry_after,
            }
        }
    }
}
