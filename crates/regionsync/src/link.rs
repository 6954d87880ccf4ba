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
use crate::messages::{
    Batch, BatchAck, DemandAck, DemandBatch, ForwardReply, ForwardRequest, PenaltyAck,
    PenaltyBatch, Ping, Pong,
};
use crate::receiver::Receiver;
use crate::throttle::Throttled;

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
    url: Arc<str>,
    /// Failures to reach the peer, logged at most once per interval.
    warned: Arc<Throttled>,
}

impl PeerClient {
    /// A client for `url` (connected lazily, reconnecting as needed), calling as `region`.
    pub fn new(url: &str, region: &str, secret: &str) -> Result<Self, LinkError> {
        Self::with_tls(url, region, secret, None)
    }

    /// A client for `url` over TLS when `tls` is given (an `https://` URL).
    pub fn with_tls(
        url: &str,
        region: &str,
        secret: &str,
        tls: Option<&crate::PeerTls>,
    ) -> Result<Self, LinkError> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|_| LinkError::BadUrl(url.to_owned()))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(1))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            let mut config = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(tonic::transport::Identity::from_pem(cert, key));
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| LinkError::BadCredentials(format!("TLS to the peer: {e}")))?;
        }
        Self::over(endpoint.connect_lazy(), url, region, secret)
    }

    /// A client over `channel` (however it connects: a simulation's in-process link, say);
    /// `url` names the peer in logs.
    pub fn over(
        channel: Channel,
        url: &str,
        region: &str,
        secret: &str,
    ) -> Result<Self, LinkError> {
        let client = RegionSyncClient::new(channel)
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
            url: url.into(),
            warned: Arc::new(Throttled::default()),
        })
    }

    /// Says clearly, at most once per interval, why the peer could not be reached.
    fn complain(&self, error: &LinkError) {
        let Some(held_back) = self.warned.ready() else {
            return;
        };
        let url = &*self.url;
        match error {
            LinkError::Status {
                code: tonic::Code::Unauthenticated,
                ..
            } => tracing::warn!(
                %url, held_back,
                "region link: the peer region refused this region's secret (is --region-secret the same in both regions?)"
            ),
            LinkError::Status {
                code: tonic::Code::PermissionDenied,
                message,
            } => tracing::warn!(
                %url, held_back, %message,
                "region link: the peer region refused this region (is this region its --peer-region?)"
            ),
            other if other.is_link_failure() => tracing::warn!(
                %url, held_back, error = %other,
                "region link: cannot reach the peer region (is --peer-url right, and the peer serving?)"
            ),
            _ => {}
        }
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
                Method::Demand => client.demand(request).await,
                Method::Penalty => client.penalty(request).await,
            }
        };
        let call = tracing::Instrument::instrument(
            call,
            tracing::debug_span!("region_link", method = ?method, bytes = size),
        );
        let reply = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| LinkError::Timeout(timeout))
            .and_then(|r| {
                r.map_err(|s| LinkError::Status {
                    code: s.code(),
                    message: s.message().to_owned(),
                })
            })
            .inspect_err(|e| self.complain(e))?;
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

    /// Ships this node's demand (link version 2; a version 1 peer answers UNIMPLEMENTED).
    pub async fn demand(
        &self,
        batch: &DemandBatch,
        timeout: Duration,
    ) -> Result<DemandAck, LinkError> {
        Ok(self.call(Method::Demand, batch, timeout).await?.0)
    }

    /// Ships penalty blocks started in this region (link version 3; a version 2 peer answers
    /// UNIMPLEMENTED).
    pub async fn penalty(
        &self,
        batch: &PenaltyBatch,
        timeout: Duration,
    ) -> Result<PenaltyAck, LinkError> {
        Ok(self.call(Method::Penalty, batch, timeout).await?.0)
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
    Demand,
    Penalty,
}

/// The link service this region serves to its peer.
#[derive(Debug, Clone)]
pub struct LinkService {
    receiver: Arc<Receiver>,
    peer_region: String,
    secret: String,
    /// Refused callers, logged at most once per interval.
    warned: Arc<Throttled>,
}

impl LinkService {
    /// Serves `receiver` to `peer_region`, callers proving `secret`.
    pub fn new(receiver: Arc<Receiver>, peer_region: String, secret: String) -> Self {
        Self {
            receiver,
            peer_region,
            secret,
            warned: Arc::new(Throttled::default()),
        }
    }

    /// Checks a call's credentials (before its body is read: see [`Authorizer`]).
    fn authorize(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let presented = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.split_once(' ')
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                    .map(|(_, token)| token)
            })
            .unwrap_or("");
        let matches: bool = presented.as_bytes().ct_eq(self.secret.as_bytes()).into();
        let region = metadata
            .get(REGION_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !matches {
            self.receiver.reject("unauthenticated");
            if let Some(held_back) = self.warned.ready() {
                tracing::warn!(
                    caller = region,
                    held_back,
                    "region link: refused a call with a wrong secret (is --region-secret the same in both regions?)"
                );
            }
            return Err(Status::unauthenticated("a valid region secret is required"));
        }
        if region != self.peer_region {
            self.receiver.reject("unknown peer");
            if let Some(held_back) = self.warned.ready() {
                tracing::warn!(
                    caller = region, peer = %self.peer_region, held_back,
                    "region link: refused a call from a region that is not this region's peer"
                );
            }
            return Err(Status::permission_denied(format!(
                "region {region:?} is not this region's peer"
            )));
        }
        Ok(())
    }

    fn decode<T: DeserializeOwned>(&self, frame: Frame) -> Result<T, Status> {
        codec::decode(&frame.body).map_err(|e| {
            self.receiver.refuse(
                "malformed",
                format_args!("a message that does not decode: {e}"),
            );
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
        self.serve_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
    }

    /// Serves the link on the connections `incoming` yields (TLS ones, say) until `shutdown`.
    pub async fn serve_incoming<I, IO, IE>(
        self,
        incoming: I,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error>
    where
        I: futures::Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        Server::builder()
            .tcp_nodelay(true)
            .add_service(self.into_server())
            .serve_with_incoming_shutdown(incoming, shutdown)
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

    async fn demand(&self, request: Request<Frame>) -> Result<Response<Frame>, Status> {
        let batch: DemandBatch = self.decode(request.into_inner())?;
        frame(&self.receiver.record_demand(batch).await?)
    }

    async fn penalty(&self, request: Request<Frame>) -> Result<Response<Frame>, Status> {
        let batch: PenaltyBatch = self.decode(request.into_inner())?;
        frame(&self.receiver.impose(batch).await?)
    }
}
