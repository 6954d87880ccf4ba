//! The gRPC server. It takes its listener and its shutdown signal, so tests and the binary run
//! the same code.

use std::future::Future;

use futures::TryStreamExt;
use tokio::net::TcpListener;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tollgate_proto::tollgate::ratelimit::v1::rate_limiter_server::RateLimiterServer;

use crate::grpc::check::Check;
use crate::grpc::rls::Rls;
use crate::listener::{Bounds, Opening, OpeningRule, Protocol};
use crate::rlqs::{Broker, Rlqs, RlqsConfig};
use tollgate_node::headers::XRateLimitHeaders;
use tollgate_node::runtime::Node;

/// Tollgate's compiled protos without the region link's (served on another port).
fn public_descriptors() -> prost_types::FileDescriptorSet {
    use prost::Message;
    let mut set = prost_types::FileDescriptorSet::decode(tollgate_proto::FILE_DESCRIPTOR_SET)
        .expect("the file descriptor set is compiled in and valid");
    set.file
        .retain(|f| !f.package().starts_with("tollgate.regionsync"));
    set
}

/// The largest request message accepted (Envoy's are a few hundred bytes).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// How long a stopping node waits for its gRPC connections to finish what they are doing
/// before it closes them.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves Envoy's RLS (its answers with or without the X-RateLimit trio) and RLQS, Tollgate's
/// API, health and reflection on `listener` until `shutdown`.
pub async fn serve(
    node: Node,
    rlqs: RlqsConfig,
    x_ratelimit: XRateLimitHeaders,
    listener: TcpListener,
    tls: Option<crate::tls::Acceptor>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitServiceServer<Rls>>().await;
    health.set_serving::<RateLimiterServer<Check>>().await;
    health
        .set_serving::<RateLimitQuotaServiceServer<Rlqs>>()
        .await;
    // Reflection, v1 and v1alpha (grpcurl and Python's reflection client ask v1alpha), lists
    // what this port serves: Envoy's RLS and RLQS, Tollgate's API, health. The region link is served
    // on its own port and is not described here.
    let public = public_descriptors();
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_file_descriptor_set(public.clone())
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name("envoy.service.ratelimit.v3.RateLimitService")
            .with_service_name("envoy.service.rate_limit_quota.v3.RateLimitQuotaService")
            .with_service_name("tollgate.ratelimit.v1.RateLimiter")
            .with_service_name("grpc.health.v1.Health")
            .with_service_name("grpc.reflection.v1.ServerReflection")
            .with_service_name("grpc.reflection.v1alpha.ServerReflection")
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("the file descriptor sets are compiled in and valid");
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("the file descriptor sets are compiled in and valid");
    let max_report = rlqs.max_report_bytes;
    let broker = Broker::new(node.clone(), rlqs);
    let rlqs = Rlqs::new(broker.clone());
    // RLQS streams stay open while their Envoys run: they are ended before the server waits
    // for its connections to finish.
    let (draining, drain_began) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        broker.shut_down();
        let _ = draining.send(());
    };
    let router = crate::listener::grpc_server()
        .add_service(
            RateLimitServiceServer::new(
                Rls::new(node.clone()).with_x_ratelimit_headers(x_ratelimit),
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            RateLimiterServer::new(Check::new(node.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(RateLimitQuotaServiceServer::new(rlqs).max_decoding_message_size(max_report))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    let metrics = node.metrics();
    let connections = crate::listener::accept(listener, Bounds::GRPC, metrics);
    let opening = OpeningRule::new(Protocol::Http2, &Bounds::GRPC, metrics);
    let served = async move {
        match tls {
            None => {
                router
                    .serve_with_incoming_shutdown(
                        opening.open_all(connections).map_ok(Opening::coalesced),
                        shutdown,
                    )
                    .await
            }
            Some(acceptor) => {
                router
                    .serve_with_incoming_shutdown(
                        opening.open_all(crate::tls::incoming(
                            connections,
                            acceptor,
                            Bounds::GRPC.name,
                        )),
                        shutdown,
                    )
                    .await
            }
        }
    };
    // A connection that will not finish (an RLQS stream whose Envoy stopped reading holds its
    // answer, status and all, behind HTTP/2 flow control) does not hold the node up for good.
    let drained = async move {
        if drain_began.await.is_ok() {
            tokio::time::sleep(DRAIN).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        served = served => served,
        () = drained => {
            tracing::warn!(
                "gRPC connections still open {DRAIN:?} after the node began stopping: closed"
            );
            Ok(())
        }
    }
}
