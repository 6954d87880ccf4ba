//! The bare server: Envoy's RLS from the same protos, answering OK to every request, with no
//! limiter behind it. What it reaches is the gRPC stack's own ceiling on a machine.

use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use tollgate_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::cli::Bare;

#[derive(Debug, Default)]
struct AlwaysOk;

#[tonic::async_trait]
impl RateLimitService for AlwaysOk {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let descriptors = request.into_inner().descriptors.len();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![Default::default(); descriptors],
            ..Default::default()
        }))
    }
}

/// Serves until killed.
pub(crate) fn main(bare: Bare) -> anyhow::Result<()> {
    let runtime = match bare.runtime.split_once(':') {
        None if bare.runtime == "current" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some(("multi", n)) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n.parse()?)
            .enable_all()
            .build()?,
        _ => anyhow::bail!("--runtime is current or multi:N, not {:?}", bare.runtime),
    };
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(bare.listen).await?;
        eprintln!("bare RLS server on {}", listener.local_addr()?);
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(RateLimitServiceServer::new(AlwaysOk))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await?;
        Ok(())
    })
}
