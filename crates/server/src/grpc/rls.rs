//! Envoy's rate limit service, v3: every descriptor gets a status (one per request descriptor,
//! in order), `overall_code` is never UNKNOWN, and the response carries the rate-limit headers
//! for Envoy to add. A store failure is never an RPC error: each rule's fail mode decides, and
//! a rule that fails closed answers OVER_LIMIT (with Retry-After and `tollgate-reason:
//! store-unavailable`), so it denies whatever Envoy's `failure_mode_deny` says. Only a request
//! Tollgate cannot read is an RPC error (INVALID_ARGUMENT). An answer made without the
//! store's says so in a response header ([`DECIDED_WITHOUT_STORE`]).

use std::time::Duration;

use smallvec::SmallVec;

use tollgate_proto::envoy::config::core::v3::HeaderValue;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use tollgate_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_proto::envoy::r#type::v3::RateLimitUnit;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::grpc::rls_reservations::{self, Marker};
use crate::grpc::{invalid, reserve_status};
use tollgate_lease::limit::MAX_UNITS;
use tollgate_node::headers::{
    Policy, REASON_HEADER, XRateLimitHeaders, status_policy, write_headers,
};
use tollgate_node::metrics::client_input::Adjustment;
use tollgate_node::metrics::{Api, ApiResult};
use tollgate_node::rules::RuleKind;
use tollgate_node::runtime::{
    Descriptor, LimitOverride, Matching, Node, Outcome, RuleStatus, Verdict,
};

/// The gRPC response header (metadata, which Envoy ignores) set on an answer the store's
/// answer was missing from: `failed-open`, `last-answer`, `local-fallback` or `failed-closed`
/// ([`Verdict::decided_without_store`]). A load generator counts it, so a load test cannot
/// pass off a limiter deciding by its fail modes as a fast one.
pub const DECIDED_WITHOUT_STORE: &str = "tollgate-decided-without-store";

/// The service.
#[derive(Debug, Clone)]
pub struct Rls {
    node: Node,
    x_ratelimit: XRateLimitHeaders,
    /// Paces the warning for a request refused (its shape is one Envoy's configuration sets).
    refusals: std::sync::Arc<tollgate_regionsync::throttle::Throttled>,
}

impl Rls {
    /// Serves `node`, its answers with every rate-limit header.
    pub fn new(node: Node) -> Self {
        Self {
            node,
            x_ratelimit: XRateLimitHeaders::Send,
            refusals: Default::default(),
        }
    }

    /// With or without the X-RateLimit trio in its answers.
    pub fn with_x_ratelimit_headers(mut self, x_ratelimit: XRateLimitHeaders) -> Self {
        self.x_ratelimit = x_ratelimit;
        self
    }
}

fn unit_duration(unit: i32) -> Option<Duration> {
    let secs = match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Second => 1,
        RateLimitUnit::Minute => 60,
        RateLimitUnit::Hour => 3600,
        RateLimitUnit::Day => 86_400,
        RateLimitUnit::Month => 2_592_000,
        RateLimitUnit::Year => 31_536_000,
        RateLimitUnit::Unknown => return None,
    };
    Some(Duration::from_secs(secs))
}

/// What [`to_request`] read on other terms than as sent (counted by the caller).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adjusted {
    /// Values that were not UTF-8.
    pub not_utf8: u64,
    /// Costs above [`MAX_UNITS`], counted as it.
    pub cost_above_max: u64,
}

impl Adjusted {
    /// Counts them in `node`'s metrics (and logs them now and then).
    pub fn note(self, node: &Node, domain: &str) {
        let input = &node.metrics().client_input;
        input.note(Adjustment::NotUtf8, self.not_utf8, domain);
        input.note(Adjustment::CostAboveMax, self.cost_above_max, domain);
    }
}

/// A descriptor value as text: Envoy copies it from a client's request without checking that
/// it is UTF-8, so bytes that are not are read as U+FFFD (never refused: a refusal is an RPC
/// error, an uncounted allow behind Envoy's default).
pub fn value_text(bytes: Vec<u8>, adjusted: &mut Adjusted) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| {
        adjusted.not_utf8 += 1;
        String::from_utf8_lossy(e.as_bytes()).into_owned()
    })
}

/// The request in the runtime's terms, and what was read on other terms than as sent. Only a
/// request's shape, which Envoy's configuration sets, is refused; what a client's request
/// puts in it (a value's bytes, a cost from a header) is always read.
pub fn to_request(
    req: RateLimitRequest,
) -> Result<(tollgate_node::runtime::Request, Adjusted), Status> {
    let mut adjusted = Adjusted::default();
    let mut descriptors = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.into_iter().enumerate() {
        if d.is_negative_hits {
            return Err(Status::invalid_argument(format!(
                "descriptors[{i}].is_negative_hits is not supported"
            )));
        }
        let limit = match d.limit {
            None => None,
            Some(o) => Some(LimitOverride {
                requests: o.requests_per_unit,
                unit: unit_duration(o.unit).ok_or_else(|| {
                    Status::invalid_argument(format!("descriptors[{i}].limit.unit is unknown"))
                })?,
            }),
        };
        // A descriptor's cost may come from a header (a `hits_addend` format): above the most
        // a count holds, it is counted as that most, which no limit below it admits.
        let cost = d.hits_addend.map(|c| {
            if c > MAX_UNITS {
                adjusted.cost_above_max += 1;
            }
            c.min(MAX_UNITS)
        });
        descriptors.push(Descriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| (e.key, value_text(e.value, &mut adjusted)))
                .collect(),
            cost,
            limit,
        });
    }
    let request = tollgate_node::runtime::Request {
        domain: req.domain,
        descriptors,
        cost: u64::from(req.hits_addend.max(1)),
        matching: Matching::PerDescriptor,
    };
    Ok((request, adjusted))
}

/// The `tollgate-reason` of an answer no rule limited.
pub const NO_RULE: &str = "no-rule";

/// A descriptor's status when no limit speaks for it.
fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

/// How a limit reads in Envoy's terms: requests per unit.
fn current_limit(p: &Policy<'_>) -> RateLimit {
    let (requests, unit) = match p.window {
        None => (p.quota, Unit::Unknown),
        Some(1) => (p.quota, Unit::Second),
        Some(60) => (p.quota, Unit::Minute),
        Some(3600) => (p.quota, Unit::Hour),
        Some(86_400) => (p.quota, Unit::Day),
        Some(604_800) => (p.quota, Unit::Week),
        Some(2_592_000) => (p.quota, Unit::Month),
        Some(31_536_000) => (p.quota, Unit::Year),
        // Other windows: the same rate, per second, rounded up.
        Some(w) => (p.quota.div_ceil(w), Unit::Second),
    };
    RateLimit {
        name: p.name.to_owned(),
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit: unit as i32,
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// The response for a decision over `descriptors` request descriptors.
pub fn to_response(
    verdict: &Verdict,
    descriptors: usize,
    x_ratelimit: XRateLimitHeaders,
) -> RateLimitResponse {
    // SHADOW rules never show: they are counted in metrics and logged, nothing else.
    let shown: SmallVec<[(&RuleStatus, Option<Policy<'_>>); 4]> = verdict
        .statuses
        .iter()
        .filter(|s| s.shown())
        .map(|s| (s, status_policy(s)))
        .collect();
    let mut statuses = Vec::with_capacity(descriptors);
    for i in 0..descriptors {
        let mine = || shown.iter().filter(|(s, _)| s.covers(i));
        let over = mine().any(|(s, _)| s.denies());
        let code = if over { Code::OverLimit } else { Code::Ok } as i32;
        let decisive = if over {
            mine()
                .filter(|(s, _)| s.denies())
                .max_by_key(|(s, _)| s.retry_after)
        } else {
            // A rule that admitted without the store knows nothing of what is left: it states
            // no limit and no remaining (Envoy builds X-RateLimit headers only from a status
            // with a current limit).
            mine()
                .filter(|(s, p)| p.is_some() && s.outcome != Some(Outcome::FailedOpen))
                .min_by_key(|(s, _)| s.remaining)
        };
        let status = match decisive {
            Some((s, policy)) => DescriptorStatus {
                code,
                current_limit: policy.as_ref().map(current_limit),
                limit_remaining: if s.allowed {
                    u32::try_from(s.remaining).unwrap_or(u32::MAX)
                } else {
                    0
                },
                duration_until_reset: Some(duration(
                    if s.allowed || !s.denial.is_some_and(|d| d.retryable()) {
                        s.reset_after
                    } else {
                        s.retry_after
                    },
                )),
                quota: None,
            },
            None => DescriptorStatus {
                code,
                current_limit: None,
                limit_remaining: if mine().any(|(s, _)| matches!(s.rule.kind, RuleKind::Unlimited))
                {
                    u32::MAX
                } else {
                    0
                },
                duration_until_reset: None,
                quota: None,
            },
        };
        statuses.push(status);
    }
    let mut response_headers_to_add = Vec::with_capacity(7);
    write_headers(verdict, x_ratelimit, |key, value| {
        response_headers_to_add.push(HeaderValue {
            key: key.into(),
            value,
            raw_value: vec![],
        })
    });
    RateLimitResponse {
        overall_code: (if verdict.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        }) as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let span = crate::telemetry::decision_span("rls", request.metadata());
        self.decide(request).instrument(span).await
    }
}

impl Rls {
    /// Decides one request as Envoy asks it (`ShouldRateLimit` and the HTTP port's `POST
    /// /json` both answer through here): Envoy's answer, and how it was decided without the
    /// store if it was ([`Verdict::decided_without_store`]).
    pub async fn answer(
        &self,
        request: RateLimitRequest,
    ) -> Result<(RateLimitResponse, Option<&'static str>), Status> {
        let started = tokio::time::Instant::now();
        let metrics = self.node.metrics().api(Api::Rls);
        let refused = |status: Status| {
            metrics.answered(ApiResult::Invalid, started.elapsed().as_secs_f64());
            // Only a request's shape is refused, and Envoy's configuration sets it: an operator
            // must hear of it, because Envoy lets such a request through uncounted unless its
            // failure_mode_deny is set.
            if let Some(held_back) = self.refusals.ready() {
                tracing::warn!(
                    status = %status.message(),
                    held_back,
                    "an RLS request was refused as malformed (Envoy's configuration sends \
                     descriptors Tollgate cannot read; with failure_mode_deny: false Envoy \
                     lets such requests through)"
                );
            }
            status
        };
        let mut request = request;
        let marker = rls_reservations::take_marker(&mut request, rls_reservations::DEFAULT_TTL)
            .map_err(refused)?;
        let reserve = match marker {
            Some((_, Marker::Settle { id })) => {
                return self.settle(request, &id).await.map(|r| (r, None));
            }
            Some((at, Marker::Reserve { id, ttl })) => Some((at, id, ttl)),
            None => None,
        };
        let (request, adjusted) = to_request(request).map_err(refused)?;
        adjusted.note(&self.node, &request.domain);
        let descriptors = request.descriptors.len();
        let verdict = match &reserve {
            None => self
                .node
                .check(&request)
                .await
                .map_err(|e| refused(invalid(e)))?,
            Some((_, id, ttl)) => {
                self.node
                    .check_and_reserve_as(&request, *ttl, id.clone())
                    .await
                    .map_err(|e| refused(reserve_status(e)))?
                    .0
            }
        };
        let mut response = to_response(&verdict, descriptors, self.x_ratelimit);
        if verdict.statuses.is_empty() {
            // No rule matched: say so, to the client, in the metrics and (for a domain no
            // rule serves) in the log.
            let served = self.node.rules().load().has_domain(&request.domain);
            self.node.metrics().unmatched.note(&request.domain, served);
            response.response_headers_to_add.push(HeaderValue {
                key: REASON_HEADER.into(),
                value: NO_RULE.into(),
                raw_value: vec![],
            });
        }
        if let Some((at, _, _)) = reserve {
            // The reserve descriptor's own status, where Envoy sent it.
            response.statuses.insert(at, ok_status());
        }
        crate::telemetry::record_decision(&request.domain, descriptors, &verdict);
        let result = ApiResult::of(verdict.allowed);
        metrics.answered(result, started.elapsed().as_secs_f64());
        Ok((response, verdict.decided_without_store()))
    }

    /// Settles reservation `id` at each descriptor's own cost (its `hits_addend`, else the
    /// request's, as Envoy counts hits): the end of a stream, whose answer Envoy ignores. It
    /// is not a decision: it shows in the settlement metrics, not the API's.
    async fn settle(
        &self,
        request: RateLimitRequest,
        id: &str,
    ) -> Result<RateLimitResponse, Status> {
        let sent = request.descriptors.len() + 1;
        let (request, adjusted) = to_request(request)?;
        adjusted.note(&self.node, &request.domain);
        for d in &request.descriptors {
            let one = tollgate_node::runtime::Request {
                domain: request.domain.clone(),
                descriptors: vec![d.clone()],
                cost: request.cost,
                matching: request.matching,
            };
            let actual = d.cost.unwrap_or(request.cost);
            self.node
                .settle(&one, id, actual)
                .await
                .map_err(reserve_status)?;
        }
        Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![ok_status(); sent],
            ..RateLimitResponse::default()
        })
    }

    async fn decide(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (answer, without_store) = self.answer(request.into_inner()).await?;
        let mut response = Response::new(answer);
        if let Some(how) = without_store {
            response.metadata_mut().insert(
                DECIDED_WITHOUT_STORE,
                tonic::metadata::MetadataValue::from_static(how),
            );
        }
        Ok(response)
    }
}
