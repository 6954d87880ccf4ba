//! The region link over gRPC: a client for the peer region and the service this region
//! serves. Every call names its region (`x-tollgate-region`) and carries the shared secret
//! (`authorization: Bearer ...`); the service answers only the configured peer with the right
//! secret. Bodies are [`crate::codec`] frames, size-limited both ways.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tollgate_proto::tollgate::regionsync::v1::Frame;
use tollgate_proto::tollgate::regionsync::v1::region_sync_client::RegionSyncClient;
use tollgate_proto::tollgate::regionsync::v1::region_sync_server::{
    RegionSync as RegionSyncService, RegionSyncServer,
};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

use crate::codec::{self, MAX_MESSAGE_BYTES};
use crate::messages::{Batch, BatchAck, ForwardReply, ForwardRequest, Ping, Pong};
use crate::receiver::Receiver;

/// The metadata key naming the caller's region.
pub const REGION_HEADER: &str = "x-tollgate-region";

/// Why a call to the peer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The peer's address is not a valid URL.
    #[error("invalid peer URL {0:?}")]
    BadUrl(String),
    /// The secret or region name cannot be sent as metadata.
    #[error("invalid link credentials: {0}")]
    BadCredentials(String),
    /// No answer in time.
    #[error("the peer region did not answer within {0:?}")]
    Timeout(Duration),
    /// The peer answered with an error status.
    #[error("the peer region answered {code:?}: {message}")]
    Status {
        /// The gRPC code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// A message could not be encoded or decoded.
    #[error("{0}")]
    Codec(#[from] codec::CodecError),
}

impl LinkError {
    /// Whether the failure says the peer region is unreachable (no answer, a broken or refused
    /// connection), as opposed to an answer the peer gave (its store failed, it refused a
    /// batch): only the former counts against the peer's liveness.
    pub fn is_link_failure(&self) -> bool {
        match self {
            LinkError::Timeout(_) => true,
            LinkError::Status { code, .. } => matches!(
                code,
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
            ),
            _ => false,
        }
    }
}

/// A client of the peer region's link service.
#[derive(Debug, Clone)]
pub struct PeerClient {
    client: RegionSyncClient<Channel>,
    region: AsciiMetadataValue,
    authorization: AsciiMetadataValue,
}

impl PeerClient {
    /// A client for `url` (connected lazily, reconnecting as needed), calling as `region`.
    pub fn new(url: &str, region: &str, secret: &str) -> Result<Self, LinkError> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|_| LinkError::BadUrl(url.to_owned()))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(1))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let client = RegionSyncClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES + 64)
            .max_encoding_message_size(MAX_MESSAGE_BYTES + 64);
        let value = |v: String, what: &str| {
            AsciiMetadataValue::try_from(v)
                .map_err(|_| LinkError::BadCredentials(format!("{what} is not printable ASCII")))
        };
        Ok(Self {
            client,
            region: value(region.to_owned(), "the region name")?,
            authorization: value(format!("Bearer {secret}"), "the secret")?,
        })
    }

    async fn call<Q: Serialize, A: DeserializeOwned>(
        &self,
        method: Method,
        message: &Q,
        timeout: Duration,
    ) -> Result<(A, usize), LinkError> {
        let body = codec::encode(message)?;
        let size = body.len();
        let mut request = Request::new(Frame { body });
        request.set_timeout(timeout);
        let metadata = request.metadata_mut();
        metadata.insert(REGION_HEADER, self.region.clone());
        metadata.insert("authorization", self.authorization.clone());
        let mut client = self.client.clone();
        let call = async {
            match method {
                Method::Exchange => client.exchange(request).await,
                Method::Heartbeat => client.heartbeat(request).await,
                Method::Forward => client.forward(request).await,
            }
        };
        let reply = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| LinkError::Timeout(timeout))?
            .map_err(|s| LinkError::Status {
                code: s.code(),
                message: s.message().to_owned(),
            })?;
        Ok((codec::decode(&reply.into_inner().body)?, size))
    }

    /// Ships a batch; returns the acknowledgement and the encoded size.
    pub async fn exchange(
        &self,
        batch: &Batch,
        timeout: Duration,
    ) -> Result<(BatchAck, usize), LinkError> {
        self.call(Method::Exchange, batch, timeout).await
    }

    /// A liveness probe.
    pub async fn heartbeat(&self, ping: &Ping, timeout: Duration) -> Result<Pong, LinkError> {
        Ok(self.call(Method::Heartbeat, ping, timeout).await?.0)
    }

    /// A HOME_REGION decision by the home region, within `deadline`.
    pub async fn forward(
        &self,
        request: &ForwardRequest,
        deadline: Duration,
    ) -> Result<ForwardReply, LinkError> {
        Ok(self.call(Method::Forward, request, deadline).await?.0)
    }
}

#[derive(Debug, Clone, Copy)]
enum Method {
    Exchange,
    Heartbeat,
    Forward,
}

/// The link service this region serves to its peer.
#[derive(Debug, Clone)]
pub struct LinkService {
    receiver: Arc<Receiver>,
    peer_region: String,
    secret: String,
}

impl LinkService {
    /// Serves `receiver` to `peer_region`, callers proving `secret`.
    pub fn new(receiver: Arc<Receiver>, peer_region: String, secret: String) -> Self {
        Self {
            receiver,
            peer_region,
            secret,
        }
    }

    /// Checks a call's credentials (before its body is read: see [`Authorizer`]).
    fn authorize(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let presented = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let matches: bool = presented.as_bytes().ct_eq(self.secret.as_bytes()).into();
        if !matches {
            self.receiver.reject("unauthenticated");
            return Err(Status::unauthenticated("a valid region secret is required"));
        }
        let region = metadata
            .get(REGION_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if region != self.peer_region {
            self.receiver.reject("unknown peer");
            return Err(Status::permission_denied(format!(
                "region {region:?} is not this region's peer"
            )));
        }
        Ok(())
    }

    fn decode<T: DeserializeOwned>(&self, frame: Frame) -> Result<T, Status> {
        codec::decode(&frame.body).map_err(|e| {
            self.receiver.reject("malformed");
            Status::invalid_argument(e.to_string())
        })
    }

    /// The service, with its message size limits and credentials checked before any body is
    /// read, to add to a tonic server.
    pub fn into_server(self) -> InterceptedService<RegionSyncServer<LinkService>, Authorizer> {
        let authorizer = Authorizer(self.clone());
        InterceptedService::new(
            RegionSyncServer::new(self)
                .max_decoding_message_size(MAX_MESSAGE_BYTES + 64)
                .max_encoding_message_size(MAX_MESSAGE_BYTES + 64),
            authorizer,
        )
    }

    /// Serves the link on `listener` until `shutdown`.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        Server::builder()
            .tcp_nodelay(true)
            .add_service(self.into_server())
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                shutdown,
            )
            .await
    }
}

/// Refuses a call without the peer's region and secret before its body is decoded.
#[derive(Debug, Clone)]
pub struct Authorizer(LinkService);

impl Interceptor for Authorizer {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.0.authorize(request.metadata())?;
        Ok(request)
    }
}

fn frame<T: Serialize>(message: &T) -> Result<Response<Frame>, Status> {
    let body = codec::encode(message).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(Frame { body }))
}

#[tonic::async_trait]
impl RegionSyncService for LinkService {
    async fn exchange(&self, request: Request<Frame>) -> Result<Response<Frame>, Status> {
        let batch: Batch = self.decode(request.into_inner())?;
        let ack = self.receiver.apply(batch).await?;
        frame(&ack)
    }

    async fn heartbeat(&self, request: Request<Frame>) -> Result<Response<Frame>, Status> {
        let ping: Ping = self.decode(request.into_inner())?;
        frame(&self.receiver.pong(&ping)?)
    }

    async fn forward(&self, request: Request<Frame>) -> Result<Response<Frame>, Status> {
        let forwarded: ForwardRequest = self.decode(request.into_inner())?;
        frame(&self.receiver.decide(forwarded).await?)
    }
}
