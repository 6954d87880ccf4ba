//! The RLQS stream: one per Envoy and domain. Reports come in (the first names the domain);
//! assignments and abandons go out whenever the broker decides, not only in answer.
//!
//! What a stream may do is bounded (docs/rlqs.md, "Bounds"): the node and each Envoy host hold
//! a bounded number of streams (past it a new one is refused, RESOURCE_EXHAUSTED); a stream
//! must send its first report at once; a report is at most `--rlqs-max-report-mb`; a stream
//! whose answers go unread is ended. Each is ended with a status Envoy logs (never the OK of a
//! stream that merely stopped), logged here at WARN at most every 10 s per cause, and counted
//! in `tollgate_rlqs_streams_ended_total`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tollgate_proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use tollgate_regionsync::throttle::Throttled;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::rlqs::broker::{Broker, BucketKey, StreamBuckets, Unusable, Usage};
use crate::rlqs::streams::{Answers, Outbox, Refusal};

/// How often a stream looks after itself: forgets buckets its Envoy forgot, and checks that
/// its answers are read.
const HOUSEKEEPING: Duration = Duration::from_secs(1);

/// Why the node ends streams, each warned of on its own pace.
#[derive(Debug, Default)]
struct Warnings {
    refused: Throttled,
    too_large: Throttled,
    unread: Throttled,
    silent: Throttled,
    unreadable: Throttled,
    not_utf8: Throttled,
}

/// The service.
#[derive(Debug, Clone)]
pub struct Rlqs {
    broker: Broker,
    warnings: Arc<Warnings>,
}

impl Rlqs {
    /// Serves `broker`'s buckets.
    pub fn new(broker: Broker) -> Self {
        Self {
            broker,
            warnings: Arc::default(),
        }
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

/// Logs at WARN, unless `throttle` held it back (then the next line says how many were).
fn warn(throttle: &Throttled, what: std::fmt::Arguments<'_>) {
    if let Some(held_back) = throttle.ready() {
        tracing::warn!(held_back, "RLQS: {what}");
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let envoy = envoy_name(&request);
        // The host is the connection's address: what a client cannot name itself.
        let host = request
            .remote_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip().to_canonical());
        let outbox = self.broker.outbox();
        let stream = match self.broker.open(host, outbox.clone()) {
            Ok(stream) => stream,
            Err(refusal) => {
                let (reason, message) = match refusal {
                    Refusal::Full => (
                        "too_many_streams",
                        format!(
                            "this node holds the most RLQS streams it may ({}); try another",
                            self.broker.config().max_streams
                        ),
                    ),
                    Refusal::HostFull => (
                        "too_many_from_host",
                        format!(
                            "host {host} holds the most RLQS streams one host may ({})",
                            self.broker.config().max_streams_per_host
                        ),
                    ),
                };
                self.broker.ended(reason);
                warn(
                    &self.warnings.refused,
                    format_args!("refused a stream of {envoy}: {message}"),
                );
                return Err(Status::resource_exhausted(message));
            }
        };
        let span =
            tracing::info_span!("rlqs.stream", envoy = %envoy, domain = tracing::field::Empty);
        let (answers, end) = Answers::new(outbox.clone());
        tokio::spawn(
            serve(
                self.broker.clone(),
                self.warnings.clone(),
                envoy,
                request.into_inner(),
                outbox,
                end,
                stream,
            )
            .instrument(span),
        );
        Ok(Response::new(answers))
    }
}

/// Reads `inbound` until it ends, fails, or the node ends it (with a status sent on `end`).
async fn serve(
    broker: Broker,
    warnings: Arc<Warnings>,
    envoy: String,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    outbox: Outbox,
    end: oneshot::Sender<Status>,
    mut stream: StreamBuckets,
) {
    tracing::debug!("RLQS stream opened");
    let config = broker.config().clone();
    let opened = Instant::now();
    let mut domain: Option<String> = None;
    let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
    housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ending = loop {
        let reports = tokio::select! {
            message = inbound.message() => message,
            _ = outbox.closed() => break None,
            _ = broker.stopping() => break None,
            _ = housekeeping.tick() => {
                let now = Instant::now();
                broker.sweep(&mut stream);
                if domain.is_none() && now.duration_since(opened) >= config.first_report_within {
                    broker.ended("no_first_report");
                    warn(&warnings.silent, format_args!(
                        "ended the stream of {envoy}: no report within {:?} of opening it \
                         (Envoy sends one with the stream)", config.first_report_within));
                    break Some(Status::deadline_exceeded(format!(
                        "no usage report within {:?} of opening the stream",
                        config.first_report_within
                    )));
                }
                if let Some(unread) = stream.unread_for(now)
                    && unread >= config.unread_for
                {
                    broker.ended("unread");
                    warn(&warnings.unread, format_args!(
                        "ended the stream of {envoy}: its answers went unread for {unread:?} \
                         ({} buckets held)", stream.held()));
                    break Some(Status::resource_exhausted(format!(
                        "the stream's answers went unread for {unread:?}"
                    )));
                }
                continue;
            }
        };
        let reports = match reports {
            Ok(Some(reports)) => reports,
            Ok(None) => break None,
            Err(status) => break Some(refused_report(&broker, &warnings, &envoy, status)),
        };
        if let Err(status) = check_domain(&mut domain, &reports.domain) {
            broker.ended("domain");
            tracing::info!(%status, "RLQS stream refused");
            break Some(status);
        }
        let domain = domain.as_deref().unwrap_or_default();
        for usage in reports.bucket_quota_usages {
            let Some(id) = usage.bucket_id.as_ref() else {
                broker.unusable(&Unusable::NoEntries);
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
                    broker.unusable(&why);
                    if matches!(why, Unusable::NotUtf8 { .. }) {
                        warn(
                            &warnings.not_utf8,
                            format_args!(
                                "{envoy} reported a bucket whose id is not UTF-8 ({why}): it gets \
                             no answer, as Envoy drops a stream whose answers are not UTF-8; \
                             match only printable keys in the Envoy's bucket matcher, as \
                             deploy/envoy/envoy-rlqs.yaml does"
                            ),
                        );
                    } else {
                        tracing::debug!(%why, "RLQS bucket refused");
                    }
                }
            }
        }
    };
    if let Some(status) = ending {
        let _ = end.send(status);
    }
    // Nothing more goes out but the end: what waited is dropped (an Envoy that stopped
    // reading would otherwise have it held for as long as its connection lives).
    outbox.close();
    broker.close(stream);
    tracing::debug!("RLQS stream closed");
}

/// The status a stream whose report could not be read is ended with: a report over the size
/// limit as RESOURCE_EXHAUSTED naming the setting (tonic says OUT_OF_RANGE), anything else as
/// it came.
fn refused_report(broker: &Broker, warnings: &Warnings, envoy: &str, status: Status) -> Status {
    if status.message().contains("message length too large") {
        let limit = broker.config().max_report_bytes;
        broker.ended("report_too_large");
        warn(
            &warnings.too_large,
            format_args!(
                "ended the stream of {envoy}: {} (the limit is {limit} bytes, \
                 --rlqs-max-report-mb: an Envoy reports every bucket it holds every 5 s)",
                status.message()
            ),
        );
        return Status::resource_exhausted(format!(
            "a usage report is larger than this node takes ({limit} bytes, \
             --rlqs-max-report-mb): {}",
            status.message()
        ));
    }
    broker.ended("unreadable");
    warn(
        &warnings.unreadable,
        format_args!("ended the stream of {envoy}: {}", status.message()),
    );
    status
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
