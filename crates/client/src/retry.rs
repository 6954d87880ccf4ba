//! The policy in the two places HTTP clients take one: a [`tower::retry::Policy`] for tower
//! and hyper clients, and a `reqwest-middleware` middleware for reqwest.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::policy::{RetryPolicy, RetryReport};

/// [`RetryPolicy`] as a [`tower::retry::Policy`] over `http` requests whose bodies can be
/// cloned (`Full<Bytes>`, `String`...). The final response carries a [`RetryReport`] in its
/// extensions.
#[derive(Debug, Clone)]
pub struct TowerRetry {
    policy: Arc<RetryPolicy>,
    report: RetryReport,
    waited: Duration,
}

impl TowerRetry {
    /// Retries as `policy` says.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy: Arc::new(policy),
            report: RetryReport::default(),
            waited: Duration::ZERO,
        }
    }
}

impl<B: Clone, ResB, E> tower::retry::Policy<http::Request<B>, http::Response<ResB>, E>
    for TowerRetry
{
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        request: &mut http::Request<B>,
        result: &mut Result<http::Response<ResB>, E>,
    ) -> Option<Self::Future> {
        let Ok(response) = result else {
            return None;
        };
        self.report.attempts += 1;
        let decision = if self.policy.may_retry(request.method(), request.headers()) {
            self.policy.next(
                self.report.attempts,
                self.waited,
                response.status(),
                response.headers(),
                &mut rand::rng(),
            )
        } else if self.policy.statuses.contains(&response.status()) {
            Some(Err(format!(
                "{} is not retried (not idempotent)",
                request.method()
            )))
        } else {
            None
        };
        match decision {
            Some(Ok((wait, source))) => {
                self.report.waits.push((wait, source));
                self.waited += wait;
                Some(Box::pin(tokio::time::sleep(wait)))
            }
            Some(Err(why)) => {
                self.report.gave_up = Some(why);
                response.extensions_mut().insert(self.report.clone());
                None
            }
            None => {
                response.extensions_mut().insert(self.report.clone());
                None
            }
        }
    }

    fn clone_request(&mut self, request: &http::Request<B>) -> Option<http::Request<B>> {
        let mut copy = http::Request::new(request.body().clone());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

/// [`RetryPolicy`] as a `reqwest-middleware` middleware. A request whose body cannot be
/// cloned (a stream) is sent once. The final response carries a [`RetryReport`] in its
/// extensions.
#[derive(Debug, Clone, Default)]
pub struct RetryMiddleware {
    policy: RetryPolicy,
}

impl RetryMiddleware {
    /// Retries as `policy` says.
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy }
    }
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for RetryMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut report = RetryReport::default();
        let mut waited = Duration::ZERO;
        let mut current = request;
        loop {
            let again = current.try_clone();
            let may = again.is_some() && self.policy.may_retry(current.method(), current.headers());
            let method = current.method().clone();
            report.attempts += 1;
            let mut response = next.clone().run(current, extensions).await?;
            let decision = if may {
                self.policy.next(
                    report.attempts,
                    waited,
                    response.status(),
                    response.headers(),
                    &mut rand::rng(),
                )
            } else if self.policy.statuses.contains(&response.status()) {
                Some(Err(format!(
                    "{method} is not retried (not idempotent, or a streamed body)"
                )))
            } else {
                None
            };
            match (decision, again) {
                (Some(Ok((wait, source))), Some(again)) => {
                    report.waits.push((wait, source));
                    waited += wait;
                    tokio::time::sleep(wait).await;
                    current = again;
                }
                (decision, _) => {
                    if let Some(Err(why)) = decision {
                        report.gave_up = Some(why);
                    }
                    response.extensions_mut().insert(report);
                    return Ok(response);
                }
            }
        }
    }
}
