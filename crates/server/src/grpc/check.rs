//! Tollgate's own decision API: `CheckRateLimit(domain, descriptors, cost)` →
//! `{decision, remaining, retryAfterMs, matchedRule}`, and `ReleaseSlots` for concurrency
//! rules. Descriptors are merged into one set of request attributes (a rule may match `plan`
//! from one descriptor and `route` from another). A store failure never becomes a gRPC error:
//! each rule's fail mode decides, and `rules[].failed_with` says so. SHADOW rules are never
//! answered (they are counted in metrics and logged); `reason` says why a request was denied.
//! `reserve_ttl_ms` makes the check a reservation of its cost, which `Settle` charges at the
//! actual cost once it is known (docs/reserve-settle.md).

use tollgate_proto::tollgate::ratelimit::v1::rate_limiter_server::RateLimiter;
use tollgate_proto::tollgate::ratelimit::v1::{
    CheckRateLimitRequest, CheckRateLimitResponse, Decision, DenyReason, Header,
    ReleaseSlotsRequest, ReleaseSlotsResponse, RenewSlotsRequest, RenewSlotsResponse,
    RuleSettlement, RuleStatus, SettleRequest, SettleResponse, SettleResult,
};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::grpc::{invalid, reserve_status, store_status};
use tollgate_node::metrics::{Api, ApiResult};
use tollgate_node::runtime::Outcome;
use tollgate_node::runtime::verdict::Denial;
use tollgate_node::runtime::{Descriptor, HeldSlot, Matching, Node};

/// The service.
#[derive(Debug, Clone)]
pub struct Check {
    node: Node,
}

impl Check {
    /// Serves `node`.
    pub fn new(node: Node) -> Self {
        Self { node }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    d.as_micros().div_ceil(1000) as u64
}

fn reason(denial: Option<Denial>) -> i32 {
    (match denial {
        None => DenyReason::Unspecified,
        Some(Denial::OverLimit) => DenyReason::OverLimit,
        Some(Denial::StoreUnavailable) => DenyReason::StoreUnavailable,
        Some(Denial::CostExceedsLimit) => DenyReason::CostExceedsLimit,
        Some(Denial::Blocked) => DenyReason::Blocked,
        Some(Denial::Penalized) => DenyReason::Penalized,
    }) as i32
}

fn decision(allowed: bool) -> i32 {
    (if allowed {
        Decision::Allow
    } else {
        Decision::Deny
    }) as i32
}

#[tonic::async_trait]
impl RateLimiter for Check {
    async fn check_rate_limit(
        &self,
        request: Request<CheckRateLimitRequest>,
    ) -> Result<Response<CheckRateLimitResponse>, Status> {
        let span = crate::telemetry::decision_span("check", request.metadata());
        self.decide(request).instrument(span).await
    }

    async fn release_slots(
        &self,
        request: Request<ReleaseSlotsRequest>,
    ) -> Result<Response<ReleaseSlotsResponse>, Status> {
        self.release(request).await
    }

    async fn renew_slots(
        &self,
        request: Request<RenewSlotsRequest>,
    ) -> Result<Response<RenewSlotsResponse>, Status> {
        let slots = slot_tokens(&request.into_inner().slots)?;
        let renewed = self.node.renew_slots(&slots).await.map_err(store_status)?;
        Ok(Response::new(RenewSlotsResponse {
            renewed: renewed as u32,
        }))
    }

    async fn settle(
        &self,
        request: Request<SettleRequest>,
    ) -> Result<Response<SettleResponse>, Status> {
        let req = request.into_inner();
        let request = node_request(req.domain, req.descriptors, 1);
        let settled = self
            .node
            .settle(&request, &req.reservation_id, req.actual)
            .await
            .map_err(reserve_status)?;
        if settled.is_empty() {
            // Nothing Tollgate limits: said, not an empty list a client would read as done.
            return Ok(Response::new(SettleResponse {
                rules: vec![RuleSettlement {
                    rule: String::new(),
                    result: SettleResult::Unmatched as i32,
                    refunded: 0,
                    charged: 0,
                }],
            }));
        }
        let rules = settled
            .into_iter()
            .map(|s| {
                use tollgate_lease::Settlement;
                let (result, refunded, charged) = match s.settlement {
                    Settlement::Settled { refunded, charged } => {
                        (SettleResult::Settled, refunded, charged)
                    }
                    Settlement::Expired { charged } => (SettleResult::Expired, 0, charged),
                    Settlement::AlreadySettled => (SettleResult::AlreadySettled, 0, 0),
                    Settlement::Unknown => (SettleResult::Unknown, 0, 0),
                };
                RuleSettlement {
                    rule: s.rule,
                    result: result as i32,
                    refunded,
                    charged,
                }
            })
            .collect();
        Ok(Response::new(SettleResponse { rules }))
    }
}

/// The runtime's request for a domain, descriptors merged into one set of attributes.
fn node_request(
    domain: String,
    descriptors: Vec<tollgate_proto::tollgate::ratelimit::v1::Descriptor>,
    cost: u64,
) -> tollgate_node::runtime::Request {
    tollgate_node::runtime::Request {
        domain,
        descriptors: descriptors
            .into_iter()
            .map(|d| Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                ..Descriptor::default()
            })
            .collect(),
        cost,
        matching: Matching::Merged,
    }
}

/// Slot tokens as a client sent them back.
fn slot_tokens(tokens: &[String]) -> Result<Vec<HeldSlot>, Status> {
    tokens
        .iter()
        .map(|t| {
            HeldSlot::from_token(t)
                .ok_or_else(|| Status::invalid_argument(format!("{t:?} is not a slot token")))
        })
        .collect()
}

impl Check {
    async fn decide(
        &self,
        request: Request<CheckRateLimitRequest>,
    ) -> Result<Response<CheckRateLimitResponse>, Status> {
        let started = tokio::time::Instant::now();
        let metrics = self.node.metrics().api(Api::Check);
        let req = request.into_inner();
        let with_headers = req.with_headers;
        let request = node_request(req.domain, req.descriptors, req.cost.max(1));
        let refused = |status: Status| {
            metrics.answered(ApiResult::Invalid, started.elapsed().as_secs_f64());
            status
        };
        let (verdict, reservation_id) = if req.reserve_ttl_ms == 0 {
            let verdict = self
                .node
                .check(&request)
                .await
                .map_err(|e| refused(invalid(e)))?;
            (verdict, None)
        } else {
            let ttl = std::time::Duration::from_millis(req.reserve_ttl_ms);
            self.node
                .check_and_reserve(&request, ttl)
                .await
                .map_err(|e| refused(reserve_status(e)))?
        };
        crate::telemetry::record_decision(&request.domain, request.descriptors.len(), &verdict);
        let decisive = verdict.decisive();
        let rules = verdict
            .statuses
            .iter()
            .filter(|s| s.shown())
            .map(|s| {
                let policy = with_headers
                    .then(|| tollgate_node::headers::status_policy(s))
                    .flatten();
                RuleStatus {
                    rule: s.rule.id.clone(),
                    decision: decision(s.allowed),
                    limit: s.limit.map_or(0, |l| l.capacity()),
                    remaining: if s.allowed { s.remaining } else { 0 },
                    retry_after_ms: millis(s.retry_after),
                    reset_after_ms: millis(s.reset_after),
                    mode: s.rule.mode.to_string(),
                    failed_with: match s.outcome {
                        Some(Outcome::FailedOpen) => "OPEN".into(),
                        Some(Outcome::FailedClosed) => "CLOSED".into(),
                        Some(Outcome::LocalFallback) => "LOCAL".into(),
                        _ => String::new(),
                    },
                    reason: reason(s.denial),
                    name: policy
                        .as_ref()
                        .map(|p| p.name.to_owned())
                        .unwrap_or_default(),
                    quota: policy.as_ref().map_or(0, |p| p.quota),
                    window_seconds: policy.as_ref().and_then(|p| p.window).unwrap_or(0),
                    refill_per_second: s.token_bucket().map_or(0.0, |(_, rate)| rate),
                }
            })
            .collect();
        let headers = if with_headers {
            tollgate_node::headers::headers(&verdict)
                .into_iter()
                .map(|(name, value)| Header {
                    name: name.to_owned(),
                    value,
                })
                .collect()
        } else {
            vec![]
        };
        let result = ApiResult::of(verdict.allowed);
        let response = CheckRateLimitResponse {
            decision: decision(verdict.allowed),
            remaining: decisive.map_or(0, |s| if s.allowed { s.remaining } else { 0 }),
            retry_after_ms: millis(verdict.retry_after),
            matched_rule: decisive.map(|s| s.rule.id.clone()).unwrap_or_default(),
            rules,
            slots: verdict.slots.iter().map(HeldSlot::token).collect(),
            reason: reason(verdict.denial()),
            headers,
            slot_ttl_ms: verdict.slot_ttl().map_or(0, millis),
            reservation_id: reservation_id.unwrap_or_default(),
        };
        metrics.answered(result, started.elapsed().as_secs_f64());
        Ok(Response::new(response))
    }

    async fn release(
        &self,
        request: Request<ReleaseSlotsRequest>,
    ) -> Result<Response<ReleaseSlotsResponse>, Status> {
        let slots = slot_tokens(&request.into_inner().slots)?;
        let released = self
            .node
            .release_slots(&slots)
            .await
            .map_err(store_status)?;
        Ok(Response::new(ReleaseSlotsResponse {
            released: released as u32,
        }))
    }
}
