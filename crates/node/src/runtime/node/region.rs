//! The node's side of region sync: consumption recorded for the peer, HOME_REGION decisions
//! made for it, and the host handle region sync calls back into.

use std::sync::Arc;

use tollgate_lease::Limit;
use tollgate_regionsync::messages::{ForwardReply, ForwardRequest};
use tollgate_regionsync::{ForwardError, RegionSync};

use super::{Inner, Node};
use crate::runtime::decision::Route;
use crate::runtime::matching::Hit;
use crate::runtime::verdict::Verdict;

impl Node {
    /// The node's face to region sync: attaching it, following the regions' state, and the
    /// handle region sync calls back into.
    pub fn region(&self) -> Region<'_> {
        Region { node: self }
    }

    /// Decides one rule for one identity, as the home region of a HOME_REGION rule does for
    /// the peer. None when the rule is unknown here or is not a HOME_REGION rule homed here.
    async fn check_rule(&self, rule_key: &str, identity: &[u8], cost: u64) -> Option<Verdict> {
        let rule = self.inner.rules.load().rule(rule_key)?.clone();
        // Only a HOME_REGION rule homed here is the peer's to ask about: any other rule's
        // counter is this region's own (a SPLIT share, an ASYNC_SYNC budget), not the peer's.
        if rule.placement.role != tollgate_regionsync::Role::Home || rule.limit().is_none() {
            return None;
        }
        let hit = Hit {
            descriptor: 0,
            also: vec![],
            rule,
            identity: identity.to_vec(),
            cost,
        };
        let now = self.now();
        Some(
            self.inner
                .decider
                .decide(vec![hit], Route::Fastest, now)
                .await,
        )
    }
}

/// The node's face to region sync ([`Node::region`]).
#[derive(Debug, Clone, Copy)]
pub struct Region<'a> {
    node: &'a Node,
}

impl<'a> Region<'a> {
    /// Attaches region sync: consumption of ASYNC_SYNC rules is recorded for the peer and
    /// HOME_REGION decisions are forwarded. Once per node.
    pub fn attach(&self, sync: Arc<RegionSync>) -> Result<(), Arc<RegionSync>> {
        self.node.inner.decider.shared.region.set(sync)
    }

    /// Region sync, if attached.
    pub fn link(self) -> Option<&'a Arc<RegionSync>> {
        self.node.inner.decider.shared.region.get()
    }

    /// Keeps the rules compiled for the regions' state: the peer going down or coming back
    /// moves SPLIT shares. Runs until region sync ends; spawn it beside the node.
    pub async fn follow_view(self) {
        let Some(sync) = self.link().cloned() else {
            return;
        };
        let rules = self.node.rules().clone();
        let mut changes = sync.subscribe();
        while changes.changed().await.is_ok() {
            if let Err(e) = rules.set_region_view(Some(sync.view())) {
                tracing::error!(error = %e, "rules do not compile for the regions' state");
            }
        }
    }

    /// A handle region sync calls back into (holding the node weakly).
    pub fn host(&self) -> Arc<dyn tollgate_regionsync::RegionHost> {
        Arc::new(RegionHostOf {
            node: Arc::downgrade(&self.node.inner),
        })
    }
}

/// What region sync calls back into: the node's rules and decisions.
struct RegionHostOf {
    node: std::sync::Weak<Inner>,
}

impl tollgate_regionsync::RegionHost for RegionHostOf {
    fn synced_limit(&self, rule: &str) -> Option<Limit> {
        let inner = self.node.upgrade()?;
        let rules = inner.rules.load();
        let rule = rules.rule(rule)?;
        if rule.synced() { rule.limit() } else { None }
    }

    fn decide_forwarded(
        &self,
        request: ForwardRequest,
    ) -> futures::future::BoxFuture<'static, Result<ForwardReply, ForwardError>> {
        let node = self.node.upgrade().map(|inner| Node { inner });
        Box::pin(async move {
            let node = node.ok_or(ForwardError::Stopping)?;
            let verdict = node
                .check_rule(&request.rule, &request.identity, request.cost)
                .await
                .ok_or_else(|| ForwardError::NotHeld(request.rule.clone()))?;
            let status = verdict.statuses.first().ok_or(ForwardError::NoDecision)?;
            // The rule's own answer: a SHADOW rule that would deny says so (the asking
            // region's decision path then counts it without blocking).
            Ok(ForwardReply {
                allowed: status.allowed,
                remaining: status.remaining,
                retry_after_us: verdict.retry_after.as_micros() as u64,
                reset_after_us: status.reset_after.as_micros() as u64,
            })
        })
    }

    fn impose_block(
        &self,
        rule: String,
        identity: Vec<u8>,
        left: std::time::Duration,
    ) -> futures::future::BoxFuture<'static, bool> {
        let inner = self.node.upgrade();
        Box::pin(async move {
            let Some(inner) = inner else {
                return false;
            };
            let Some(compiled) = inner.rules.load().rule(&rule).cloned() else {
                return false;
            };
            crate::runtime::decision::penalties::impose(
                &inner.decider.shared,
                &compiled,
                &identity,
                left,
            )
            .await
        })
    }
}
