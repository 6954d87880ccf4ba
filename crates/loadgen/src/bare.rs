//! The bare server: Envoy's RLS from the same protos, answering OK to every request, with no
//! limiter behind it. What it reaches is the gRPC stack's own ceiling on a machine.
//!
//! With `--answer FILE` it answers every request with the response in FILE instead (an encoded
//! `RateLimitResponse`, such as one Tollgate gave): what the stack spends sending a limiter's
//! full answer (statuses with their limits, rate-limit headers), with no limiter deciding it.
//! With `--coalesce` its connections are Tollgate's [`CoalescedConnection`] (h2 told they do
//! not write vectored, so answers of a few hundred bytes share a system call), the best the
//! stack does with such answers.

use futures::TryStreamExt;
use prost::Message;
use tollgate_proto::coalesced::CoalescedConnection;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use tollgate_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::cli::Bare;

#[derive(Debug, Default)]
struct AlwaysOk {
    /// The answer to give every request (else: OK, one empty status per descriptor).
    answer: Option<RateLimitResponse>,
}

#[tonic::async_trait]
impl RateLimitService for AlwaysOk {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let descriptors = request.into_inner().descriptors.len();
        // A fresh copy per request, as a limiter builds a fresh answer.
        Ok(Response::new(match &self.answer {
            Some(answer) => answer.clone(),
            None => RateLimitResponse {
                overall_code: Code::Ok as i32,
                statuses: vec![Default::default(); descriptors],
                ..Default::default()
            },
        }))
    }
}

/// Serves until killed.
pub(crate) fn main(bare: Bare) -> anyhow::Result<()> {
    let answer = match &bare.answer {
        None => None,
        Some(path) => {
            let bytes = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("--answer {}: {e}", path.display()))?;
            Some(RateLimitResponse::decode(bytes.as_slice()).map_err(|e| {
                anyhow::anyhow!(
                    "--answer {}: not an encoded RateLimitResponse: {e}",
                    path.display()
                )
            })?)
        }
    };
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
        let router = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(RateLimitServiceServer::new(AlwaysOk { answer }));
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        if bare.coalesce {
            router
                .serve_with_incoming(incoming.map_ok(CoalescedConnection::new))
                .await?;
        } else {
            router.serve_with_incoming(incoming).await?;
        }
        Ok(())
    })
}
