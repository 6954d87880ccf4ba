//! The link between two regions, in process: the real region-sync gRPC service and client
//! (tonic, HTTP/2) over in-memory byte pipes whose latency can change and which a partition
//! holds, as a network holds (and TCP retransmits) what it cannot deliver: bytes sent during
//! a partition arrive after it heals, unless the call's own deadline gave up first.
//!
//! Each connection a node opens to the peer region goes to one of the peer's live nodes, in
//! turn, the way a load balancer in front of the peer region would spread them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_stream::StreamExt as _;

/// Bytes one pipe carries per read.
const CHUNK: usize = 16 * 1024;

/// What the link between the regions does now (both directions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WireState {
    /// One-way latency.
    pub latency: Duration,
    /// Whether nothing gets through.
    pub partitioned: bool,
    /// The chance that a call reaches the peer twice (a retried or duplicated delivery).
    pub duplicate: f64,
    /// Calls are held up to this long more, at random, so later calls can overtake them.
    pub reorder: Duration,
}

/// The control of the link between the regions. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Wire {
    inner: Arc<WireInner>,
}

#[derive(Debug)]
struct WireInner {
    state: Mutex<WireState>,
    /// Draws for duplication and reordering.
    rng: Mutex<StdRng>,
    /// Wakes what a partition holds, in order (tokio's `watch` wakes in a random order).
    healed: Notify,
}

impl Wire {
    /// A link with `latency` one way, up; `seed` drives duplication and reordering.
    pub fn new(latency: Duration, seed: u64) -> Self {
        Self {
            inner: Arc::new(WireInner {
                state: Mutex::new(WireState {
                    latency,
                    partitioned: false,
                    duplicate: 0.0,
                    reorder: Duration::ZERO,
                }),
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                healed: Notify::new(),
            }),
        }
    }

    /// Cuts the link (true) or heals it (false).
    pub fn partition(&self, cut: bool) {
        self.inner.state.lock().partitioned = cut;
        self.inner.healed.notify_waiters();
    }

    /// Adds `extra` to the latency (a delay fault), or takes it away again.
    pub fn set_latency(&self, latency: Duration) {
        self.inner.state.lock().latency = latency;
    }

    /// Delivers calls twice with probability `p` (0 stops it).
    pub fn set_duplicate(&self, p: f64) {
        self.inner.state.lock().duplicate = p;
    }

    /// Holds calls up to `max` more at random (zero stops it).
    pub fn set_reorder(&self, max: Duration) {
        self.inner.state.lock().reorder = max;
    }

    /// For one call: whether it is delivered twice, and how long it is held.
    fn mangle(&self) -> (bool, Duration) {
        let state = self.state();
        if state.duplicate <= 0.0 && state.reorder.is_zero() {
            return (false, Duration::ZERO);
        }
        let mut rng = self.inner.rng.lock();
        let twice = state.duplicate > 0.0 && rng.random::<f64>() < state.duplicate;
        let held = state.reorder.mul_f64(rng.random::<f64>());
        (twice, held)
    }

    /// The link's state now.
    pub fn state(&self) -> WireState {
        *self.inner.state.lock()
    }

    /// Carries bytes from `from` to `to`, each chunk after the latency in force when it was
    /// read, in order, and none while the link is partitioned.
    fn pipe(
        &self,
        mut from: tokio::io::ReadHalf<DuplexStream>,
        mut to: tokio::io::WriteHalf<DuplexStream>,
    ) {
        let (queue, mut carried) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        let reader = self.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let due = Instant::now() + reader.state().latency;
                        if queue.send((due, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let wire = self.clone();
        tokio::spawn(async move {
            while let Some((due, bytes)) = carried.recv().await {
                tokio::time::sleep_until(due).await;
                loop {
                    let healed = wire.inner.healed.notified();
                    tokio::pin!(healed);
                    healed.as_mut().enable();
                    if !wire.state().partitioned {
                        break;
                    }
                    healed.await;
                }
                if to.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let _ = to.shutdown().await;
        });
    }
}

/// Where a region's nodes accept connections from the peer region: one queue per node, and
/// whether it is alive.
#[derive(Debug, Clone, Default)]
pub struct Listeners {
    inner: Arc<Mutex<Vec<Option<mpsc::UnboundedSender<DuplexStream>>>>>,
    next: Arc<AtomicUsize>,
}

impl Listeners {
    /// A region of `nodes` nodes, none listening yet.
    pub fn new(nodes: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(vec![None; nodes])),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Node `index` accepts connections from this queue (None: it is down).
    pub fn set(&self, index: usize, queue: Option<mpsc::UnboundedSender<DuplexStream>>) {
        self.inner.lock()[index] = queue;
    }

    /// The next live node's queue, in turn.
    fn pick(&self) -> Option<mpsc::UnboundedSender<DuplexStream>> {
        let nodes = self.inner.lock();
        let n = nodes.len();
        for _ in 0..n {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
            if let Some(q) = &nodes[i]
                && !q.is_closed()
            {
                return Some(q.clone());
            }
        }
        None
    }
}

/// A tonic channel from a node to the peer region over `wire`, connecting to `peer`'s nodes.
pub fn channel(wire: Wire, peer: Listeners) -> tonic::transport::Channel {
    let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| {
        let (wire, peer) = (wire.clone(), peer.clone());
        async move {
            let Some(listener) = peer.pick() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "no node of the peer region is up",
                ));
            };
            if wire.state().partitioned {
                // A connection can't be opened across a partition; the client retries later.
                tokio::time::sleep(Duration::from_secs(1)).await;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the link between the regions is partitioned",
                ));
            }
            let (client, client_wire) = tokio::io::duplex(CHUNK * 4);
            let (server_wire, server) = tokio::io::duplex(CHUNK * 4);
            let (from_client, to_client) = tokio::io::split(client_wire);
            let (from_server, to_server) = tokio::io::split(server_wire);
            wire.pipe(from_client, to_server);
            wire.pipe(from_server, to_client);
            listener.send(server).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the peer node stopped",
                )
            })?;
            Ok::<_, std::io::Error>(TokioIo::new(client))
        }
    });
    tonic::transport::Endpoint::from_static("http://peer-region.sim")
        .connect_timeout(Duration::from_secs(1))
        .connect_with_connector_lazy(connector)
}

/// Serves `service` to the connections `incoming` brings, until the queue's sender is gone.
pub async fn serve(
    wire: Wire,
    service: tollgate_regionsync::link::LinkService,
    incoming: mpsc::UnboundedReceiver<DuplexStream>,
) {
    let stream =
        tokio_stream::wrappers::UnboundedReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
    let _ = tonic::transport::Server::builder()
        .layer(tower::layer::layer_fn(move |inner| Mangled {
            inner,
            wire: wire.clone(),
        }))
        .add_service(service.into_server())
        .serve_with_incoming(stream)
        .await;
}

/// The peer's side of the link, where calls are duplicated and held (reordered): a tower
/// layer in front of the region-sync service, since HTTP/2 itself delivers in order.
#[derive(Debug, Clone)]
struct Mangled<S> {
    inner: S,
    wire: Wire,
}

type Call = tonic::codegen::http::Request<tonic::body::Body>;

impl<S, B> tower::Service<Call> for Mangled<S>
where
    S: tower::Service<Call, Response = tonic::codegen::http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: Call) -> Self::Future {
        // The service that was made ready answers this call; a clone takes its place.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let (twice, held) = self.wire.mangle();
        Box::pin(async move {
            if !held.is_zero() {
                tokio::time::sleep(held).await;
            }
            if !twice {
                return inner.call(call).await;
            }
            let (parts, body) = call.into_parts();
            let bytes = http_body_util::BodyExt::collect(body)
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let again = Call::from_parts(
                parts.clone(),
                tonic::body::Body::new(http_body_util::Full::new(bytes.clone())),
            );
            let first = Call::from_parts(
                parts,
                tonic::body::Body::new(http_body_util::Full::new(bytes)),
            );
            let answer = inner.call(first).await;
            // The duplicate arrives after the first was handled; its answer is lost.
            let _ = tower::ServiceExt::oneshot(inner, again).await;
            answer
        })
    }
}
