//! Who decides: an embedded [`Node`] in this process, or a remote node over gRPC
//! ([`Remote`], Tollgate's `CheckRateLimit` API). Both answer the same [`Decision`].

use std::future::Future;
use std::time::Duration;

use tollgate_node::Node;
use tollgate_node::runtime::{HeldSlot, Request, Verdict};
use tollgate_proto::tollgate::ratelimit::v1 as api;
use tonic::transport::Channel;

/// The rule that decided a request, as a client is told about it.
#[derive(Debug, Clone, PartialEq)]
pub struct DecidingRule {
    /// The rule's id (what per-rule settings of the layer are keyed by).
    pub id: String,
    /// Its name as the headers state it (`"gold-orders"`).
    pub name: String,
    /// Units per window.
    pub quota: u64,
    /// The window, seconds (None: a concurrency limit).
    pub window: Option<u64>,
    /// A token bucket's burst and refill rate per second (None: another kind of limit): what
    /// a denied client hit (the quota is stated as the sustained rate).
    pub token_bucket: Option<(u64, f64)>,
}

/// Why a request was denied (the node's own reasons).
pub use tollgate_node::runtime::verdict::Denial;

/// Concurrency slots an admission holds, to give back when the response is done.
#[derive(Debug, Default, Clone)]
pub enum Slots {
    /// None held.
    #[default]
    None,
    /// Held by an embedded node.
    Local(Vec<HeldSlot>),
    /// Held by a remote node (its slot tokens).
    Remote(Vec<String>),
}

impl Slots {
    /// Whether any slot is held.
    pub fn is_empty(&self) -> bool {
        match self {
            Slots::None => true,
            Slots::Local(s) => s.is_empty(),
            Slots::Remote(s) => s.is_empty(),
        }
    }
}

/// What the node decided, as the HTTP edge needs it.
#[derive(Debug)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// When denied and a wait can help: how long.
    pub retry_after: Option<Duration>,
    /// Why it was denied (None when admitted).
    pub denial: Option<Denial>,
    /// The rule that decided: the denying one, else the one closest to its limit.
    pub rule: Option<DecidingRule>,
    /// The rate-limit headers for the answer (`ratelimit-policy`, `ratelimit`,
    /// `x-ratelimit-*`, and `retry-after` on a denial), as the node writes them.
    pub headers: Vec<(String, String)>,
    /// Concurrency slots held by this admission.
    pub slots: Slots,
    /// How long they live unless renewed (None: none held).
    pub slot_ttl: Option<Duration>,
}

/// Why no decision was made (the layer's fail mode then decides).
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The request cannot be decided (an invalid descriptor, say): the client's fault.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The deciding node could not be reached or failed.
    #[error("the rate limiter did not answer: {0}")]
    Unavailable(String),
}

/// Decides requests and takes back concurrency slots.
pub trait Decide: Clone + Send + Sync + 'static {
    /// Decides `request`.
    fn decide(
        &self,
        request: Request,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send;

    /// Gives back the slots an admission held (best effort: a slot not released expires
    /// with its TTL).
    fn release(&self, slots: Slots) -> impl Future<Output = ()> + Send;

    /// Renews the slots of a request still running, for their TTL from now (best effort: a
    /// slot not renewed expires with its TTL).
    fn renew(&self, slots: &Slots) -> impl Future<Output = ()> + Send;

    /// Decides `request` reserving its cost (the estimate) for `ttl`: admitted, the answer
    /// carries the reservation to [`Decide::settle`] (docs/reserve-settle.md).
    fn reserve(
        &self,
        request: Request,
        ttl: Duration,
    ) -> impl Future<Output = Result<(Decision, Option<String>), DecideError>> + Send;

    /// Charges the reservation `id` made for `request` its `actual` cost (best effort: an
    /// unsettled reservation stays charged at its estimate).
    fn settle(&self, request: Request, id: String, actual: u64) -> impl Future<Output = ()> + Send;
}

/// A [`Verdict`] as a [`Decision`].
pub fn decision_of(mut verdict: Verdict) -> Decision {
    let rule = verdict.decisive().map(|s| {
        let policy = tollgate_node::headers::status_policy(s);
        DecidingRule {
            id: s.rule.id.clone(),
            name: s.rule.name.clone(),
            quota: policy.as_ref().map_or(0, |p| p.quota),
            window: policy.and_then(|p| p.window),
            token_bucket: s.token_bucket(),
        }
    });
    let denial = verdict.denial();
    let headers = tollgate_node::headers::headers(&verdict)
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v))
        .collect();
    let retryable = denial.is_some_and(Denial::retryable);
    Decision {
        allowed: verdict.allowed,
        retry_after: (!verdict.allowed && retryable).then_some(verdict.retry_after),
        denial,
        rule,
        headers,
        slot_ttl: verdict.slot_ttl(),
        slots: Slots::Local(std::mem::take(&mut verdict.slots)),
    }
}

impl Decide for Node {
    async fn decide(&self, request: Request) -> Result<Decision, DecideError> {
        let verdict = self
            .check(&request)
            .await
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        Ok(decision_of(verdict))
    }

    async fn release(&self, slots: Slots) {
        if let Slots::Local(slots) = slots
            && !slots.is_empty()
            && let Err(e) = self.release_slots(&slots).await
        {
            tracing::debug!(error = %e, "slots not released; they expire with their TTL");
        }
    }

    async fn renew(&self, slots: &Slots) {
        if let Slots::Local(slots) = slots
            && !slots.is_empty()
            && let Err(e) = self.renew_slots(slots).await
        {
            tracing::debug!(error = %e, "slots not renewed; they expire with their TTL");
        }
    }

    async fn reserve(
        &self,
        request: Request,
        ttl: Duration,
    ) -> Result<(Decision, Option<String>), DecideError> {
        let (verdict, id) = self
            .check_and_reserve(&request, ttl)
            .await
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        Ok((decision_of(verdict), id))
    }

    async fn settle(&self, request: Request, id: String, actual: u64) {
        if let Err(e) = Node::settle(self, &request, &id, actual).await {
            tracing::debug!(error = %e, "reservation not settled; it stays charged at its estimate");
        }
    }
}

/// A Tollgate node reached over gRPC (its `CheckRateLimit` API).
#[derive(Debug, Clone)]
pub struct Remote {
    client: api::rate_limiter_client::RateLimiterClient<Channel>,
    timeout: Duration,
}

impl Remote {
    /// A client of the node at `url` (`http://host:8081`), connected lazily; a decision
    /// waits at most `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, DecideError> {
        let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|e| DecideError::Invalid(format!("{url}: {e}")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy();
        Ok(Self::over(channel, timeout))
    }

    /// A client over `channel` (TLS, a load balancer, a test's).
    pub fn over(channel: Channel, timeout: Duration) -> Self {
        Self {
            client: api::rate_limiter_client::RateLimiterClient::new(channel),
            timeout,
        }
    }
}

fn remote_denial(reason: i32) -> Option<Denial> {
    match api::DenyReason::try_from(reason).ok()? {
        api::DenyReason::OverLimit => Some(Denial::OverLimit),
        api::DenyReason::StoreUnavailable => Some(Denial::StoreUnavailable),
        api::DenyReason::CostExceedsLimit => Some(Denial::CostExceedsLimit),
        api::DenyReason::Blocked => Some(Denial::Blocked),
        api::DenyReason::Penalized => Some(Denial::Penalized),
        api::DenyReason::Unspecified => None,
    }
}

fn api_descriptors(descriptors: Vec<tollgate_node::runtime::Descriptor>) -> Vec<api::Descriptor> {
    descriptors
        .into_iter()
        .map(|d| api::Descriptor {
            entries: d
                .entries
                .into_iter()
                .map(|(key, value)| api::descriptor::Entry { key, value })
                .collect(),
        })
        .collect()
}

impl Decide for Remote {
    async fn decide(&self, request: Request) -> Result<Decision, DecideError> {
        self.ask(request, 0).await.map(|(decision, _)| decision)
    }

    async fn reserve(
        &self,
        request: Request,
        ttl: Duration,
    ) -> Result<(Decision, Option<String>), DecideError> {
        self.ask(request, (ttl.as_millis() as u64).max(1)).await
    }

    async fn settle(&self, request: Request, id: String, actual: u64) {
        let mut call = tonic::Request::new(api::SettleRequest {
            domain: request.domain,
            descriptors: api_descriptors(request.descriptors),
            reservation_id: id,
            actual,
        });
        call.set_timeout(self.timeout);
        if let Err(e) = self.client.clone().settle(call).await {
            tracing::debug!(error = %e, "reservation not settled; it stays charged at its estimate");
        }
    }

    async fn release(&self, slots: Slots) {
        self.release_remote(slots).await
    }

    async fn renew(&self, slots: &Slots) {
        self.renew_remote(slots).await
    }
}

impl Remote {
    /// `CheckRateLimit`, reserving for `reserve_ttl_ms` when it is not 0.
    async fn ask(
        &self,
        request: Request,
        reserve_ttl_ms: u64,
    ) -> Result<(Decision, Option<String>), DecideError> {
        let call = api::CheckRateLimitRequest {
            domain: request.domain,
            descriptors: api_descriptors(request.descriptors),
            cost: request.cost,
            with_headers: true,
            reserve_ttl_ms,
        };
        let mut call = tonic::Request::new(call);
        call.set_timeout(self.timeout);
        let answer = self
            .client
            .clone()
            .check_rate_limit(call)
            .await
            .map_err(|status| match status.code() {
                tonic::Code::InvalidArgument => DecideError::Invalid(status.message().to_owned()),
                _ => DecideError::Unavailable(status.to_string()),
            })?
            .into_inner();
        let allowed = answer.decision == api::Decision::Allow as i32;
        let rule = answer
            .rules
            .iter()
            .find(|r| r.rule == answer.matched_rule)
            .map(|r| DecidingRule {
                id: r.rule.clone(),
                name: r.name.clone(),
                quota: r.quota,
                window: (r.window_seconds > 0).then_some(r.window_seconds),
                token_bucket: (r.refill_per_second > 0.0).then_some((r.limit, r.refill_per_second)),
            });
        let denial = if allowed {
            None
        } else {
            remote_denial(answer.reason)
        };
        let retryable = denial.is_some_and(Denial::retryable);
        let reservation = (!answer.reservation_id.is_empty()).then_some(answer.reservation_id);
        let decision = Decision {
            allowed,
            retry_after: (!allowed && retryable)
                .then(|| Duration::from_millis(answer.retry_after_ms)),
            denial,
            rule,
            headers: answer
                .headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
            slots: Slots::Remote(answer.slots),
            slot_ttl: (answer.slot_ttl_ms > 0).then(|| Duration::from_millis(answer.slot_ttl_ms)),
        };
        Ok((decision, reservation))
    }

    async fn release_remote(&self, slots: Slots) {
        let Slots::Remote(slots) = slots else {
            return;
        };
        if slots.is_empty() {
            return;
        }
        let mut call = tonic::Request::new(api::ReleaseSlotsRequest {
            domain: String::new(),
            slots,
        });
        call.set_timeout(self.timeout);
        if let Err(e) = self.client.clone().release_slots(call).await {
            tracing::debug!(error = %e, "slots not released; they expire with their TTL");
        }
    }

    async fn renew_remote(&self, slots: &Slots) {
        let Slots::Remote(slots) = slots else {
            return;
        };
        if slots.is_empty() {
            return;
        }
        let mut call = tonic::Request::new(api::RenewSlotsRequest {
            domain: String::new(),
            slots: slots.clone(),
        });
        call.set_timeout(self.timeout);
        if let Err(e) = self.client.clone().renew_slots(call).await {
            tracing::debug!(error = %e, "slots not renewed; they expire with their TTL");
        }
    }
}
