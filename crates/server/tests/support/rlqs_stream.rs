//! One Envoy's RLQS stream, spoken by a gRPC client as Envoy 1.40 speaks it: shared by the
//! RLQS tests and the `rlqs_push` bench (which includes this file by path).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_proto::envoy::r#type::v3::rate_limit_strategy::Strategy;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use tollgate_proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tonic::Streaming;

/// One Envoy's stream.
pub struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    /// What the server sent, for a test reading it raw.
    pub answers: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    /// Opens a stream to the node at `grpc` with its first report (`domain`, `buckets` as
    /// (id, allowed, denied)): the call is answered (its headers sent) once the server has
    /// it, as Envoy opens one.
    pub async fn open(grpc: SocketAddr, domain: &str, buckets: &[(&BucketId, u64, u64)]) -> Stream {
        Self::try_open_from(None, grpc, Some(usage_reports(domain, buckets)))
            .await
            .expect("stream")
    }

    /// Opens a stream from the loopback address `from` (an Envoy host of its own; every
    /// 127/8 address is this machine's), sending `first` if given: the node's answer to the
    /// opening, or the status it refused it with.
    pub async fn try_open_from(
        from: Option<std::net::IpAddr>,
        grpc: SocketAddr,
        first: Option<RateLimitQuotaUsageReports>,
    ) -> Result<Stream, tonic::Status> {
        Self::try_open_with(
            tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
                .expect("endpoint")
                .local_address(from),
            first,
        )
        .await
    }

    /// [`Stream::try_open_from`] on `endpoint` as configured (a small HTTP/2 window, say:
    /// an Envoy that does not read its stream is one whose window has filled).
    pub async fn try_open_with(
        endpoint: tonic::transport::Endpoint,
        first: Option<RateLimitQuotaUsageReports>,
    ) -> Result<Stream, tonic::Status> {
        let channel = endpoint.connect().await.expect("connect");
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (reports, rx) = mpsc::channel(16);
        if let Some(first) = first {
            reports.send(first).await.expect("first report");
        }
        let answers = tokio::time::timeout(
            Duration::from_secs(5),
            client.stream_rate_limit_quotas(ReceiverStream::new(rx)),
        )
        .await
        .expect("the stream is answered")?
        .into_inner();
        Ok(Stream { reports, answers })
    }

    /// The status the node ended the stream with, within `within` (answers skipped).
    pub async fn ended(&mut self, within: Duration) -> tonic::Status {
        tokio::time::timeout(within, async {
            loop {
                match self.answers.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return tonic::Status::ok("ended"),
                    Err(status) => return status,
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the stream did not end within {within:?}"))
    }

    /// Sends a report.
    pub async fn report(&self, domain: &str, buckets: &[(&BucketId, u64, u64)]) {
        self.reports
            .send(usage_reports(domain, buckets))
            .await
            .expect("report sent");
    }

    /// A way to report on this stream while its answers are read elsewhere.
    pub fn reporter(&self) -> Reporter {
        Reporter(self.reports.clone())
    }
}

/// Sends reports on a stream whose answers are read elsewhere.
pub struct Reporter(mpsc::Sender<RateLimitQuotaUsageReports>);

impl Reporter {
    /// Sends a report.
    pub async fn report(&self, domain: &str, buckets: &[(&BucketId, u64, u64)]) {
        self.0
            .send(usage_reports(domain, buckets))
            .await
            .expect("report sent");
    }

    /// Reports queued on this side, not yet taken by the connection.
    #[allow(dead_code)] // Not every test that shares this module waits on it.
    pub fn queued(&self) -> usize {
        self.0.max_capacity() - self.0.capacity()
    }
}

impl Stream {
    /// The next action for `id` (others skipped), within `within`.
    pub async fn next_for(&mut self, id: &BucketId, within: Duration) -> Action {
        tokio::time::timeout(within, async {
            loop {
                let answer = self
                    .answers
                    .message()
                    .await
                    .expect("stream ok")
                    .expect("stream open");
                for action in answer.bucket_action {
                    if action.bucket_id.as_ref() == Some(id) {
                        return action.bucket_action.expect("an action");
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no action for {id:?} within {within:?}"))
    }

    /// The next token bucket rate (tokens per fill) pushed for `id`, other actions skipped.
    pub async fn next_rate(&mut self, id: &BucketId, within: Duration) -> u32 {
        loop {
            if let Action::QuotaAssignmentAction(a) = self.next_for(id, within).await
                && let Some(Strategy::TokenBucket(b)) =
                    a.rate_limit_strategy.and_then(|s| s.strategy)
            {
                return b.tokens_per_fill.unwrap_or(0);
            }
        }
    }
}

/// A report of `buckets` as (id, allowed, denied) in `domain`.
pub fn usage_reports(
    domain: &str,
    buckets: &[(&BucketId, u64, u64)],
) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: buckets
            .iter()
            .map(|(id, allowed, denied)| BucketQuotaUsage {
                bucket_id: Some((*id).clone()),
                time_elapsed: Some(prost_types::Duration::default()),
                num_requests_allowed: *allowed,
                num_requests_denied: *denied,
                last_report: None,
            })
            .collect(),
    }
}

/// The bucket of deploy/envoy/envoy-rlqs.yaml's builder for `api_key`.
pub fn key(api_key: &str) -> BucketId {
    BucketId {
        bucket: HashMap::from([
            ("name".to_owned(), b"per-key".to_vec()),
            ("api_key".to_owned(), api_key.as_bytes().to_vec()),
        ]),
    }
}
