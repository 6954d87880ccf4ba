//! What the end-to-end tests share: the shipped deploy files, an upstream for Envoy, and a
//! shipped Envoy configuration started on free ports.

use tollgate_testkit::Envoy;
use tollgate_testkit::process::free_port;

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

/// Starts Envoy on `deploy/envoy/{file}`, unchanged but for its ports (admin 9901, listener
/// 10000, upstream 8000, Tollgate 8081, each rewritten to a free or given port) and `edits`
/// (text replaced as is). Returns the Envoy and its listener's port.
pub(crate) fn start_shipped_envoy(
    file: &str,
    upstream: u16,
    tollgate: u16,
    edits: &[(&str, &str)],
) -> (Envoy, u16) {
    let path = deploy(&format!("envoy/{file}"));
    let mut config = std::fs::read_to_string(&path).expect("shipped envoy config");
    for (from, to) in edits {
        assert!(config.contains(from), "{} names {from}", path.display());
        config = config.replace(from, to);
    }
    // A port found free can be taken by another test before Envoy binds it: then again, on
    // other ports.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (port, admin) = (
            free_port(false).expect("port"),
            free_port(false).expect("port"),
        );
        let mut config = config.clone();
        for (from, to) in [
            (9901, admin),
            (10000, port),
            (8000, upstream),
            (8081, tollgate),
        ] {
            let (from, to) = (format!("port_value: {from} "), format!("port_value: {to} "));
            assert!(config.contains(&from), "{} names {from}", path.display());
            config = config.replace(&from, &to);
        }
        match Envoy::start(&config, admin) {
            Ok(envoy) => return (envoy, port),
            Err(e) if attempts < 3 && format!("{e:#}").contains("Address already in use") => {
                eprintln!("envoy's port was taken before it bound it; again on others: {e:#}");
            }
            Err(e) => panic!("envoy starts: {e:?}"),
        }
    }
}
