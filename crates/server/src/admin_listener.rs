//! The admin API's listener: `tollgate-control` makes the API (a router), this serves it on its
//! own port, with TLS when the node has it, within the admin port's bounds
//! ([`Bounds::ADMIN`]).

use std::future::Future;

use tokio::net::TcpListener;
use tollgate_control::admin::{AdminState, router};

use crate::listener::{Bounds, http1_connections, serve_http1};

/// Serves the admin API on `listener` until `shutdown`. A client that does not send a
/// request's headers within the state's `client_timeout` is disconnected; a body that takes
/// longer is answered 408.
pub async fn serve(
    state: AdminState,
    listener: TcpListener,
    tls: Option<crate::tls::Acceptor>,
    metrics: std::sync::Arc<tollgate_node::metrics::Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let header_timeout = state.client_timeout;
    let connections = http1_connections(listener, Bounds::ADMIN, tls, &metrics);
    serve_http1(router(state), connections, header_timeout, shutdown).await
}
