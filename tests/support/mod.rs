//! What the end-to-end tests share: the shipped deploy files, an upstream for Envoy, and a
//! shipped Envoy configuration started on free ports.

use tollgate_testkit::Envoy;

/// A file under the repository's `deploy/` folder, as shipped.
pub(crate) fn deploy(path: &str) -> std::path::PathBuf {
    tollgate_testkit::envoy::deploy(path)
}

/// An upstream on a free port that answers 200 "hello from upstream" to anything; its port.
pub(crate) async fn upstream() -> u16 {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let port = upstream.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "hello from upstream\n" });
        axum::serve(upstream, app).await.expect("upstream");
    });
    port
}

/// Starts Envoy on `deploy/envoy/{file}`, its ports rewritten (`tollgate_testkit::envoy::start_shipped`).
pub(crate) fn start_shipped_envoy(
    file: &str,
    upstream: u16,
    tollgate: u16,
    edits: &[(&str, &str)],
) -> (Envoy, u16) {
    tollgate_testkit::envoy::start_shipped(file, upstream, tollgate, edits)
}
