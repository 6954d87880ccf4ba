//! The admin API's listener: `tollgate-control` makes the API (a router), this serves it on its
//! own port, with TLS when the node has it.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate_control::admin::{AdminState, router};

/// Serves the admin API on `listener` until `shutdown`. A client that does not send a
/// request's headers within the state's `client_timeout` is disconnected (hyper's header
/// timeout, which needs a timer: axum's own `serve` sets none, so a half-sent request could
/// hold a connection forever); a body that takes longer is answered 408.
pub async fn serve(
    state: AdminState,
    listener: TcpListener,
    tls: Option<crate::tls::Acceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let header_timeout = state.client_timeout;
    let app = router(state);
    let (closing, closed) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: pause rather than spin.
                    tracing::warn!(error = %e, "admin API: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut closed = closed.clone();
        let stop = async move {
            let _ = closed.wait_for(|c| *c).await;
        };
        let tls = tls.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let stream: Box<dyn crate::tls::Io> = match tls {
                None => Box::new(stream),
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(tls) => Box::new(tls),
                    Err(e) => {
                        tracing::debug!(error = %e, "admin API: TLS handshake failed");
                        return;
                    }
                },
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "admin API connection ended");
                    }
                }
                () = stop => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    // Connections finish their requests (for at most a few seconds), as axum's own graceful
    // shutdown does.
    drop(closed);
    let _ = closing.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), closing.closed()).await;
    Ok(())
}
