//! The layer and its service: extract, decide, then answer 429 or pass the request on with
//! the rate-limit headers, holding a concurrency rule's slot until the response body is done,
//! and (with [`RateLimitLayer::settle`]) settling the request's reserved cost at what the
//! response really cost when its body ends or the client goes away.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use crate::decide::{Decide, DecideError, Slots};
use crate::extract::Extractor;
use crate::response::{self, Answers, RequestFacts};

/// A boxed error, as bodies report theirs.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the layer does when the rate limiter cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Let the request through, without rate-limit headers (Envoy's default). The node's
    /// own per-rule fail modes decide when only its store is down; this is for the node
    /// itself being unreachable.
    #[default]
    Open,
    /// Answer 503 with `Retry-After: 1`.
    Closed,
}

/// Where a response's actual cost is read, to settle what its request reserved
/// (docs/reserve-settle.md). The request's cost (the [`Extractor`]'s) is the estimate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettleFrom {
    /// A response header holding a whole number (absent or not a number: nothing is settled,
    /// and the estimate stands).
    Header(http::HeaderName),
    /// An [`ActualCost`] the handler puts in the response's extensions (absent: the estimate
    /// stands).
    Extension,
    /// One unit per `bytes_per_unit` of response body sent, rounded up: what was sent when
    /// the body ended, or when the client went away.
    BodyBytes {
        /// Bytes one unit pays for.
        bytes_per_unit: u64,
    },
}

/// The actual cost of a response, set by its handler in the response's extensions (for
/// [`SettleFrom::Extension`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActualCost(pub u64);

#[derive(Debug, Clone)]
struct Config<D> {
    decider: D,
    extractor: Extractor,
    answers: Answers,
    on_error: FailMode,
    /// Reserve, then settle: where the actual cost is read, and how long a reservation lives.
    settle: Option<(SettleFrom, Duration)>,
}

/// Rate-limits every request of the service it wraps. See the crate docs.
#[derive(Debug)]
pub struct RateLimitLayer<D> {
    config: Arc<Config<D>>,
}

impl<D> Clone for RateLimitLayer<D> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
        }
    }
}

impl<D: Decide> RateLimitLayer<D> {
    /// Decides with `decider` what `extractor` makes of each request.
    pub fn new(decider: D, extractor: Extractor) -> Self {
        Self {
            config: Arc::new(Config {
                decider,
                extractor,
                answers: Answers::default(),
                on_error: FailMode::Open,
                settle: None,
            }),
        }
    }

    fn with(self, change: impl FnOnce(&mut Config<D>)) -> Self {
        let mut config = Arc::unwrap_or_clone(self.config);
        change(&mut config);
        Self {
            config: Arc::new(config),
        }
    }

    /// How denials read and which rules' headers are hidden on admission.
    pub fn answers(self, answers: Answers) -> Self {
        self.with(|c| c.answers = answers)
    }

    /// What to do when the rate limiter cannot answer.
    pub fn on_error(self, mode: FailMode) -> Self {
        self.with(|c| c.on_error = mode)
    }

    /// Reserves each request's cost (the [`Extractor`]'s, an estimate) for `ttl` instead of
    /// spending it, and settles it at the actual cost read from the response (`from`) when
    /// the response body ends, or when the client goes away first. A reservation never
    /// settled (the handler set no cost) expires charged at its estimate.
    pub fn settle(self, from: SettleFrom, ttl: Duration) -> Self {
        self.with(|c| c.settle = Some((from, ttl)))
    }
}

impl<S, D> tower::Layer<S> for RateLimitLayer<D> {
    type Service = RateLimitService<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] makes.
#[derive(Debug)]
pub struct RateLimitService<S, D> {
    inner: S,
    config: Arc<Config<D>>,
}

impl<S: Clone, D> Clone for RateLimitService<S, D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

/// Holds an admission's slots while the request runs: renews them every third of their TTL
/// (a request that runs longer than the TTL would otherwise lose its slot to another, and
/// more requests than the limit would run at once), and gives them back when dropped: with
/// the response body, or with the request's future when the client goes away or the service
/// fails first.
struct SlotGuard<D: Decide> {
    held: Option<(D, Slots)>,
    /// Dropped with the guard: the renewals stop.
    _renewing: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<D: Decide> SlotGuard<D> {
    fn new(decider: D, slots: Slots, ttl: Option<Duration>) -> Self {
        let renewing = ttl.and_then(|ttl| {
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
            let (decider, slots) = (decider.clone(), slots.clone());
            let every = (ttl / 3).max(Duration::from_millis(10));
            runtime.spawn(async move {
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(every) => decider.renew(&slots).await,
                        _ = &mut stopped => return,
                    }
                }
            });
            Some(stop)
        });
        Self {
            held: Some((decider, slots)),
            _renewing: renewing,
        }
    }
}

impl<D: Decide> Drop for SlotGuard<D> {
    fn drop(&mut self) {
        let Some((decider, slots)) = self.held.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { decider.release(slots).await });
            }
            Err(_) => tracing::debug!("no runtime to release slots on; they expire with their TTL"),
        }
    }
}

/// A type-erased guard (the body does not name the decider).
trait Held: Send {}
impl<D: Decide> Held for SlotGuard<D> {}

/// Settles a reservation when dropped (with the body's end, or with the body when the client
/// goes away): at the cost the response stated, or at what its body sent so far.
struct SettleGuard<D: Decide> {
    decider: D,
    request: Option<tollgate_node::Request>,
    id: String,
    /// The cost the response stated (header or extension).
    stated: Option<u64>,
    /// Per unit of body sent, when the cost is the body's size.
    bytes_per_unit: Option<u64>,
    sent: u64,
}

/// A type-erased settle guard that counts the body's bytes.
trait Settles: Send {
    fn sent(&mut self, bytes: u64);
}

impl<D: Decide> Settles for SettleGuard<D> {
    fn sent(&mut self, bytes: u64) {
        self.sent += bytes;
    }
}

impl<D: Decide> Drop for SettleGuard<D> {
    fn drop(&mut self) {
        let actual = match self.bytes_per_unit {
            Some(per) => Some(self.sent.div_ceil(per.max(1))),
            None => self.stated,
        };
        let (Some(actual), Some(request)) = (actual, self.request.take()) else {
            // No cost stated: the estimate stands (charged when the reservation expires).
            return;
        };
        let (decider, id) = (self.decider.clone(), std::mem::take(&mut self.id));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { decider.settle(request, id, actual).await });
            }
            Err(_) => tracing::debug!("no runtime to settle on; the estimate stands"),
        }
    }
}

/// The response body: the layer's own answer, or the inner service's body, holding the
/// admission's concurrency slots until it ends or is dropped.
pub struct RateLimitBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    Own(Full<Bytes>),
    Inner {
        body: Pin<Box<B>>,
        guard: Option<Box<dyn Held>>,
        settle: Option<Box<dyn Settles>>,
    },
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Own(_) => "own",
            Kind::Inner { guard, .. } if guard.is_some() => "inner, holding slots",
            Kind::Inner { .. } => "inner",
        };
        f.debug_struct("RateLimitBody")
            .field("kind", &kind)
            .finish()
    }
}

impl<B> RateLimitBody<B> {
    fn own(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Own(body),
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Own(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Kind::Inner {
                body,
                guard,
                settle,
            } => {
                let polled = body.as_mut().poll_frame(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(settle)) = (&polled, settle.as_mut())
                    && let Some(data) = frame.data_ref()
                {
                    settle.sent(data.len() as u64);
                }
                if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
                    // The response is done (or broken): the slot goes back now, and the
                    // reservation is settled.
                    guard.take();
                    settle.take();
                }
                polled.map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Own(body) => body.is_end_stream(),
            Kind::Inner { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Own(body) => body.size_hint(),
            Kind::Inner { body, .. } => body.size_hint(),
        }
    }
}

impl<S, D, ReqBody, ResBody> tower::Service<Request<ReqBody>> for RateLimitService<S, D>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    D: Decide,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let config = self.config.clone();
        Box::pin(async move {
            let facts = RequestFacts {
                method: request.method().to_string(),
                route: Extractor::route_of(&request)
                    .and_then(|r| r.split_once(' ').map(|(_, t)| t.to_owned()))
                    .unwrap_or_else(|| request.uri().path().to_owned()),
            };
            let own = |response: Response<Full<Bytes>>| response.map(RateLimitBody::own);
            let wanted = match config.extractor.extract(&request) {
                Ok(wanted) => wanted,
                Err(e) => {
                    return Ok(own(response::plain_problem(
                        StatusCode::BAD_REQUEST,
                        "Bad Request",
                        e.to_string(),
                    )));
                }
            };
            let (estimated, decided) = match &config.settle {
                None => (None, config.decider.decide(wanted).await),
                Some((_, ttl)) => match config.decider.reserve(wanted.clone(), *ttl).await {
                    Ok((decision, id)) => (id.map(|id| (wanted, id)), Ok(decision)),
                    Err(e) => (None, Err(e)),
                },
            };
            let decision = match decided {
                Ok(decision) => decision,
                Err(DecideError::Invalid(reason)) => {
                    return Ok(own(response::plain_problem(
                        StatusCode::BAD_REQUEST,
                        "Bad Request",
                        reason,
                    )));
                }
                Err(e @ DecideError::Unavailable(_)) => match config.on_error {
                    FailMode::Open => {
                        tracing::warn!(error = %e, "rate limiter unavailable: request let through");
                        let response = inner.call(request).await?;
                        return Ok(response.map(|body| RateLimitBody {
                            kind: Kind::Inner {
                                body: Box::pin(body),
                                guard: None,
                                settle: None,
                            },
                        }));
                    }
                    FailMode::Closed => {
                        let mut response = response::plain_problem(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "Service Unavailable",
                            "the rate limiter cannot decide right now".into(),
                        );
                        response.headers_mut().insert(
                            http::header::RETRY_AFTER,
                            http::HeaderValue::from_static("1"),
                        );
                        return Ok(own(response));
                    }
                },
            };
            if !decision.allowed {
                return Ok(own(response::denied(&config.answers, &decision, &facts)));
            }
            let mut decision = decision;
            let slots = std::mem::take(&mut decision.slots);
            let guard: Option<Box<dyn Held>> = (!slots.is_empty()).then(|| {
                Box::new(SlotGuard::new(
                    config.decider.clone(),
                    slots,
                    decision.slot_ttl,
                )) as Box<dyn Held>
            });
            // Dropped here (the slot released) if the service fails or the client goes away.
            let mut settle: Option<SettleGuard<D>> = estimated.map(|(request, id)| SettleGuard {
                decider: config.decider.clone(),
                request: Some(request),
                id,
                stated: None,
                bytes_per_unit: None,
                sent: 0,
            });
            // Dropped here if the service fails or the client goes away before the response:
            // a body-size cost settles at 0; a stated one was not stated, the estimate stands.
            let mut response = inner.call(request).await?;
            if let (Some(guard), Some((from, _))) = (settle.as_mut(), &config.settle) {
                match from {
                    SettleFrom::Header(name) => {
                        guard.stated = response
                            .headers()
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.trim().parse().ok());
                    }
                    SettleFrom::Extension => {
                        guard.stated = response.extensions().get::<ActualCost>().map(|c| c.0);
                    }
                    SettleFrom::BodyBytes { bytes_per_unit } => {
                        guard.bytes_per_unit = Some(*bytes_per_unit);
                    }
                }
            }
            response::add_allowed_headers(&mut response, &config.answers, &decision);
            Ok(response.map(|body| RateLimitBody {
                kind: Kind::Inner {
                    body: Box::pin(body),
                    guard,
                    settle: settle.map(|s| Box::new(s) as Box<dyn Settles>),
                },
            }))
        })
    }
}
