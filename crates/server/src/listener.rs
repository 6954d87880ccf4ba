//! Every listener's bounds: what a client can hold on any port, whoever it is. A connection
//! takes a place among its listener's (and among its source address's, so one client cannot
//! take every place), must send its first bytes within a deadline, and is closed past it; on
//! the HTTP/1 ports ([`serve_http1`]) its request headers have a deadline and a size, and the
//! handlers read a body only after checking who sends it, up to a size and within a deadline
//! (`tollgate_control::admin::MAX_BODY_BYTES`, `json_check`). TLS adds its handshake's own
//! deadline and caps (`crate::tls`). The figures and why: docs/operations.md, "What a
//! connection may hold".
//!
//! The gRPC ports (Envoy's, the region link) are HTTP/2: their header blocks and calls in
//! flight are bounded ([`MAX_HEADER_LIST_BYTES`], [`MAX_STREAMS_PER_CONNECTION`]), and a peer
//! that stops answering pings is dropped ([`KEEPALIVE_INTERVAL`]). A call's own deadline is
//! not set (tonic's costs a timer a call: 4 % of the hot path's throughput, measured); what a
//! caller can make a gRPC port buffer is bounded by count, not bytes (gateways only).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tollgate_node::metrics::Metrics;
use tollgate_node::metrics::connections::ConnectionRefusal;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The largest HTTP/2 header block a gRPC port takes (Envoy's calls send well under 1 KiB).
pub const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;

/// Calls in flight on one gRPC connection (Envoy's default circuit breaker lets 1,024 through
/// to a cluster; it opens another connection when a server says fewer).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

/// How often a gRPC port pings an idle peer; one that does not answer within
/// [`KEEPALIVE_TIMEOUT`] is dropped.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a gRPC peer has to answer a ping.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest HTTP/1 read buffer, and so the largest request head (431 past it).
pub const MAX_HTTP1_BUFFER_BYTES: usize = 32 * 1024;

/// A gRPC server with the HTTP/2 bounds every gRPC port has (the region link's are set by
/// `tollgate-regionsync` alike).
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// What one listener lets its clients hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// How the listener is named in metrics and logs.
    pub name: &'static str,
    /// Connections open at once (past it a new one is closed at once).
    pub max_connections: usize,
    /// Connections open at once from one source address.
    pub max_per_source: u32,
    /// A connection that has not sent its opening by then is closed ([`Opening`]).
    pub opening_within: Duration,
}

impl Bounds {
    /// Envoy's rate limit services and Tollgate's API: gateways, each with a few connections
    /// (an Envoy opens one per worker thread).
    pub const GRPC: Bounds = Bounds {
        name: "grpc",
        max_connections: 4096,
        max_per_source: 256,
        opening_within: Duration::from_secs(10),
    };
    /// Health, readiness, metrics and `POST /json`: probes and scrapes.
    pub const HTTP: Bounds = Bounds {
        name: "http",
        max_connections: 512,
        max_per_source: 64,
        opening_within: Duration::from_secs(3),
    };
    /// The plaintext probe port.
    pub const PROBES: Bounds = Bounds {
        name: "probes",
        max_connections: 128,
        max_per_source: 32,
        opening_within: Duration::from_secs(3),
    };
    /// The admin API: operators and their tools.
    pub const ADMIN: Bounds = Bounds {
        name: "admin",
        max_connections: 256,
        max_per_source: 32,
        opening_within: Duration::from_secs(3),
    };
    /// The region link: the peer region's nodes.
    pub const REGION_LINK: Bounds = Bounds {
        name: "region link",
        max_connections: 1024,
        max_per_source: 64,
        opening_within: Duration::from_secs(10),
    };
}

/// A place among a listener's connections, and its source's: given back when dropped.
#[derive(Debug)]
struct Place {
    _permit: OwnedSemaphorePermit,
    sources: Arc<parking_lot::Mutex<HashMap<IpAddr, u32>>>,
    source: IpAddr,
    open: Gauge,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.open.dec();
        let mut map = self.sources.lock();
        if let Some(held) = map.get_mut(&self.source) {
            *held -= 1;
            if *held == 0 {
                map.remove(&self.source);
            }
        }
    }
}

/// A TCP connection holding its place among its listener's (given back when it closes).
#[derive(Debug)]
pub struct Guarded {
    stream: TcpStream,
    peer: SocketAddr,
    _place: Place,
}

impl Guarded {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

/// The opening a connection must send in time: HTTP/2's preface and the SETTINGS frame's
/// header that follows it (a gRPC port: no server of this stack sets a deadline on it), or
/// any byte (an HTTP/1 port, whose server then holds the request head to its own deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 (gRPC): 24 bytes of preface, then a 9-byte frame header.
    Http2,
    /// HTTP/1.1.
    Http1,
}

impl Protocol {
    fn opening_bytes(self) -> usize {
        match self {
            Protocol::Http2 => 24 + 9,
            Protocol::Http1 => 1,
        }
    }
}

/// A connection (plain or TLS: the opening is counted in what the server reads) that is
/// closed, its next read failing, when it has not sent its opening within its listener's
/// deadline.
#[derive(Debug)]
pub struct Opening<S> {
    inner: S,
    /// Bytes still to come before the opening is complete.
    awaited: usize,
    deadline: Option<Pin<Box<Sleep>>>,
    timed_out: Counter,
}

/// What a listener's connections must open with, and by when ([`Opening`]).
#[derive(Debug, Clone)]
pub struct OpeningRule {
    bytes: usize,
    within: Duration,
    timed_out: Counter,
}

impl OpeningRule {
    /// `protocol`'s opening, within `bounds.opening_within`.
    pub fn new(protocol: Protocol, bounds: &Bounds, metrics: &Metrics) -> Self {
        Self {
            bytes: protocol.opening_bytes(),
            within: bounds.opening_within,
            timed_out: metrics
                .connections
                .refused(bounds.name, ConnectionRefusal::SentNothing),
        }
    }

    /// `inner`, held to the rule from now.
    pub fn open<S>(&self, inner: S) -> Opening<S> {
        Opening {
            inner,
            awaited: self.bytes,
            deadline: Some(Box::pin(tokio::time::sleep(self.within))),
            timed_out: self.timed_out.clone(),
        }
    }

    /// Each of `connections`, held to the rule.
    pub fn open_all<S, T>(self, connections: S) -> impl Stream<Item = io::Result<Opening<T>>>
    where
        S: Stream<Item = io::Result<T>>,
    {
        use futures::TryStreamExt;
        connections.map_ok(move |c| self.open(c))
    }
}

impl<S> Opening<S> {
    /// Tells h2 the connection does not write vectored (see `tollgate_proto::coalesced`).
    pub fn coalesced(self) -> tollgate_proto::coalesced::CoalescedConnection<Self> {
        tollgate_proto::coalesced::CoalescedConnection::new(self)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Opening<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.deadline.is_some() {
                    this.awaited = this
                        .awaited
                        .saturating_sub(buf.filled().len().saturating_sub(before));
                    if this.awaited == 0 {
                        this.deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if let Some(deadline) = this.deadline.as_mut()
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    this.deadline = None;
                    this.timed_out.inc();
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not open its connection in time",
                    )));
                }
                Poll::Pending
            }
            failed => failed,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Opening<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for Opening<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> S::ConnectInfo {
        self.inner.connect_info()
    }
}

/// What a listener needs to hand out places.
struct Places {
    bounds: Bounds,
    all: Arc<Semaphore>,
    sources: Arc<parking_lot::Mutex<HashMap<IpAddr, u32>>>,
    open: Gauge,
    refused_full: Counter,
    refused_source: Counter,
}

impl Places {
    fn new(bounds: Bounds, metrics: &Metrics) -> Self {
        Self {
            bounds,
            all: Arc::new(Semaphore::new(bounds.max_connections)),
            sources: Arc::default(),
            open: metrics.connections.open(bounds.name),
            refused_full: metrics
                .connections
                .refused(bounds.name, ConnectionRefusal::Full),
            refused_source: metrics
                .connections
                .refused(bounds.name, ConnectionRefusal::SourceFull),
        }
    }

    /// `stream` with its place, or None (and it is closed) when there is none.
    fn admit(&self, stream: TcpStream, peer: SocketAddr) -> Option<Guarded> {
        let Ok(permit) = self.all.clone().try_acquire_owned() else {
            self.refused_full.inc();
            tracing::debug!(listener = self.bounds.name, %peer, "connection refused: every place is taken");
            return None;
        };
        {
            let mut sources = self.sources.lock();
            let held = sources.entry(peer.ip()).or_insert(0);
            if *held >= self.bounds.max_per_source {
                self.refused_source.inc();
                tracing::debug!(listener = self.bounds.name, %peer, "connection refused: its address holds every place it may");
                return None;
            }
            *held += 1;
        }
        self.open.inc();
        let _ = stream.set_nodelay(true);
        Some(Guarded {
            stream,
            peer,
            _place: Place {
                _permit: permit,
                sources: self.sources.clone(),
                source: peer.ip(),
                open: self.open.clone(),
            },
        })
    }
}

/// The connections `listener` accepts, each holding its place (those past the bounds are
/// closed at once, counted in `tollgate_connections_refused_total`). Never ends, never fails:
/// an accept that fails (out of file descriptors) is logged and retried after a pause.
pub fn accept(
    listener: TcpListener,
    bounds: Bounds,
    metrics: &Metrics,
) -> impl Stream<Item = io::Result<Guarded>> + Send + 'static {
    let places = Places::new(bounds, metrics);
    futures::stream::unfold((listener, places), |(listener, places)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    if let Some(guarded) = places.admit(stream, peer) {
                        return Some((Ok(guarded), (listener, places)));
                    }
                }
                Err(e) => {
                    tracing::warn!(listener = places.bounds.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// Serves `app` over HTTP/1.1 on `connections` until `shutdown`: request heads within
/// `header_timeout` (between requests too: an idle keep-alive connection is closed after it)
/// and at most [`MAX_HTTP1_BUFFER_BYTES`] (hyper's own server sets no header deadline without
/// a timer, so a half-sent request could hold its connection forever). Connections finish the
/// request they are on when `shutdown` comes, for at most a few seconds.
pub async fn serve_http1<S>(
    app: axum::Router,
    connections: S,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()>
where
    S: Stream<Item = (Box<dyn crate::tls::Io>, SocketAddr)> + Send + 'static,
{
    use futures::StreamExt;
    use hyper_util::rt::{TokioIo, TokioTimer};
    let (closing, closed) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    tokio::pin!(connections);
    loop {
        let (stream, peer) = tokio::select! {
            next = connections.next() => match next {
                Some(connection) => connection,
                None => break,
            },
            () = &mut shutdown => break,
        };
        // Handlers may ask who is calling (`ConnectInfo<SocketAddr>`).
        let service = hyper_util::service::TowerToHyperService::new(
            app.clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
        );
        let mut closed = closed.clone();
        let stop = async move {
            let _ = closed.wait_for(|c| *c).await;
        };
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_buf_size(MAX_HTTP1_BUFFER_BYTES);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "HTTP connection ended");
                    }
                }
                () = stop => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(closed);
    let _ = closing.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), closing.closed()).await;
    Ok(())
}

/// An HTTP/1 port's connections, plain or TLS, with their clients' addresses.
pub type Http1Connections =
    Pin<Box<dyn Stream<Item = (Box<dyn crate::tls::Io>, SocketAddr)> + Send>>;

/// `listener`'s connections, bounded, plain or over TLS, with their clients' addresses, as
/// [`serve_http1`] takes them.
pub fn http1_connections(
    listener: TcpListener,
    bounds: Bounds,
    tls: Option<crate::tls::Acceptor>,
    metrics: &Metrics,
) -> Http1Connections {
    use futures::StreamExt;
    let guarded = accept(listener, bounds, metrics);
    let rule = OpeningRule::new(Protocol::Http1, &bounds, metrics);
    match tls {
        None => Box::pin(guarded.filter_map(move |c| {
            let c = c.ok().map(|c| {
                let peer = c.peer();
                (Box::new(rule.open(c)) as Box<dyn crate::tls::Io>, peer)
            });
            async move { c }
        })),
        Some(acceptor) => Box::pin(crate::tls::handshaken(guarded, acceptor, bounds.name).map(
            move |c| {
                let peer = c.get_ref().0.peer();
                (Box::new(rule.open(c)) as Box<dyn crate::tls::Io>, peer)
            },
        )),
    }
}
