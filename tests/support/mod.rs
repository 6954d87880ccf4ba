//! What the end-to-end tests share: the shipped deploy files, and an upstream for Envoy.

/// A file under the repository's `deploy/` folder, as shipped.
pub(crate) fn deploy(path: &str) -> std::path::PathBuf {
    format!("{}/../deploy/{path}", env!("CARGO_MANIFEST_DIR")).into()
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
