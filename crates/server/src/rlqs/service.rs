//! The RLQS stream: one per Envoy and domain. Reports come in (the first names the domain);
//! assignments and abandons go out whenever the broker decides, not only in answer.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use tollgate_proto::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::rlqs::broker::{Broker, BucketKey, StreamBuckets, Usage};

/// Answers a stream can have waiting before the broker skips pushes to it.
const OUTBOX: usize = 64;

/// The service.
#[derive(Debug, Clone)]
pub struct Rlqs {
    broker: Broker,
}

impl Rlqs {
    /// Serves `broker`'s buckets.
    pub fn new(broker: Broker) -> Self {
        Self { broker }
    }
}

/// How the stream's Envoy is named in logs: its `x-envoy-id` initial metadata, else its address.
fn envoy_name<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get("x-envoy-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(128).collect())
        .or_else(|| request.remote_addr().map(|a| a.to_string()))
        .unwrap_or_else(|| "unnamed".into())
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let envoy = envoy_name(&request);
        let span =
            tracing::info_span!("rlqs.stream", envoy = %envoy, domain = tracing::field::Empty);
        let (outbox, answers) = mpsc::channel(OUTBOX);
        let stream = self.broker.open(outbox.clone());
        tokio::spawn(
            serve(self.broker.clone(), request.into_inner(), outbox, stream).instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(answers)))
    }
}

/// Reads `inbound` until it ends, fails, or the Envoy stops listening.
async fn serve(
    broker: Broker,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    outbox: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    mut stream: StreamBuckets,
) {
    tracing::debug!("RLQS stream opened");
    let mut domain: Option<String> = None;
    loop {
        let reports = tokio::select! {
            message = inbound.message() => message,
            _ = outbox.closed() => break,
            _ = broker.stopping() => break,
        };
        let reports = match reports {
            Ok(Some(reports)) => reports,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(%status, "RLQS stream failed");
                break;
            }
        };
        if let Err(status) = check_domain(&mut domain, &reports.domain) {
            tracing::info!(%status, "RLQS stream refused");
            let _ = outbox.send(Err(status)).await;
            break;
        }
        let domain = domain.as_deref().unwrap_or_default();
        for usage in reports.bucket_quota_usages {
            let Some(id) = usage.bucket_id.as_ref() else {
                broker.refused();
                continue;
            };
            match BucketKey::of(domain, id) {
                Ok(key) => broker.report(
                    &mut stream,
                    Usage {
                        key,
                        allowed: usage.num_requests_allowed,
                        denied: usage.num_requests_denied,
                    },
                ),
                Err(why) => {
                    tracing::debug!(%why, "RLQS bucket refused");
                    broker.refused();
                }
            }
        }
    }
    broker.close(stream);
    tracing::debug!("RLQS stream closed");
}

/// The stream's domain: named by its first report, the same (or unsaid) in later ones.
fn check_domain(domain: &mut Option<String>, reported: &str) -> Result<(), Status> {
    match domain {
        None if reported.is_empty() => Err(Status::invalid_argument(
            "the first report of an RLQS stream must name its domain",
        )),
        None => {
            if reported.len() > 255 {
                return Err(Status::invalid_argument("domain is longer than 255 bytes"));
            }
            tracing::Span::current().record("domain", reported);
            *domain = Some(reported.to_owned());
            Ok(())
        }
        Some(known) if reported.is_empty() || reported == known => Ok(()),
        Some(known) => Err(Status::invalid_argument(format!(
            "an RLQS stream keeps its domain: it is {known:?}, this report says {reported:?} (open a new stream)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_report_names_the_domain_and_later_ones_keep_it() {
        let mut domain = None;
        assert_eq!(
            check_domain(&mut domain, "").map_err(|s| s.code()),
            Err(tonic::Code::InvalidArgument)
        );
        check_domain(&mut domain, "api").expect("named");
        check_domain(&mut domain, "").expect("unsaid");
        check_domain(&mut domain, "api").expect("the same");
        let Err(changed) = check_domain(&mut domain, "other") else {
            panic!("another domain is refused");
        };
        assert_eq!(changed.code(), tonic::Code::InvalidArgument);
        assert!(
            changed.message().contains("\"api\""),
            "{}",
            changed.message()
        );
    }
}
