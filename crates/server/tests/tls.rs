//! TLS on a real node, with certificates made by the test (rcgen): the gRPC and HTTP ports
//! serve TLS only (a plaintext client and a client that trusts another CA are refused),
//! mutual TLS on gRPC refuses a client without a certificate or with one of another CA, a
//! certificate replaced on disk is served without a restart (and a broken replacement is
//! refused, the previous one staying), the admin API serves TLS only, and two regions talk over a mutual-TLS link that
//! refuses a caller without a client certificate.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use support::Served;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_server::config::Settings;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const RULES: &str = "domain: api\nrules:\n  - {id: keys, match: {api_key: '*'}, algorithm: FIXED_WINDOW, limit: 100, window: 1m}\n";

/// A CA that signs certificates for the test.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("self-signed");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `localhost`: a client's when `client`, else a node's, which serves and is
    /// also the node's client certificate on the region link (both usages): (chain, key) PEM.
    fn leaf(&self, client: bool) -> (String, String) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.extended_key_usages = if client {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes a server certificate of `ca` to `dir` as cert.pem and key.pem.
fn write_server_cert(dir: &Path, ca: &Ca) -> (PathBuf, PathBuf) {
    let (cert, key) = ca.leaf(false);
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    // Written aside and renamed: a reload never sees half a file.
    for (path, text) in [(&key_path, &key), (&cert_path, &cert)] {
        let aside = path.with_extension("new");
        std::fs::write(&aside, text).expect("write");
        std::fs::rename(&aside, path).expect("rename");
    }
    (cert_path, key_path)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// A health check over gRPC to `addr` (TLS when `tls`); Err names what failed.
async fn grpc_health(
    addr: std::net::SocketAddr,
    tls: Option<ClientTlsConfig>,
) -> Result<(), String> {
    let endpoint = match tls {
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))
            .expect("url")
            .tls_config(tls.domain_name("localhost"))
            .map_err(|e| e.to_string())?,
        None => Endpoint::from_shared(format!("http://{addr}")).expect("url"),
    }
    .connect_timeout(Duration::from_secs(2))
    .timeout(Duration::from_secs(2));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .map(|_| ())
        .map_err(|e| format!("check: {e:?}"))
}

fn trusting(ca: &Ca) -> ClientTlsConfig {
    ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.pem))
}

/// GET `path` over TLS to `addr`, trusting `ca`: (status, body), or why it failed.
async fn https_get(
    addr: std::net::SocketAddr,
    ca: &Ca,
    path: &str,
) -> Result<(u16, String), String> {
    https_get_from(None, addr, ca, path).await
}

/// [`https_get`] from the local address `source` (None: any).
async fn https_get_from(
    source: Option<std::net::IpAddr>,
    addr: std::net::SocketAddr,
    ca: &Ca,
    path: &str,
) -> Result<(u16, String), String> {
    let out = https_exchange(
        source,
        addr,
        ca,
        &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
    )
    .await?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {out:?}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Sends `request` (the whole HTTP/1.1 request) over TLS to `addr`, trusting `ca`, from the
/// local address `source` (None: any); the whole answer, head and body.
async fn https_exchange(
    source: Option<std::net::IpAddr>,
    addr: std::net::SocketAddr,
    ca: &Ca,
    request: &str,
) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
        roots.add(cert.expect("pem")).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = match source {
        None => tokio::net::TcpStream::connect(addr).await,
        Some(source) => {
            let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
            socket
                .bind(std::net::SocketAddr::new(source, 0))
                .map_err(|e| e.to_string())?;
            socket.connect(addr).await
        }
    }
    .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    // A peer that closes without close_notify is an error to rustls; what was read counts.
    let _ = tls.read_to_string(&mut out).await;
    Ok(out)
}

use rustls::pki_types::pem::PemObject;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ports_serve_tls_only_and_a_replaced_certificate_without_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let (first, second, stranger) = (Ca::new("first"), Ca::new("second"), Ca::new("stranger"));
    let (cert, key) = write_server_cert(dir.path(), &first);
    let mut served = Served::start(
        RULES,
        Settings {
            tls_cert: Some(cert.clone()),
            tls_key: Some(key.clone()),
            tls_reload_ms: Some(100),
            ..Settings::default()
        },
    )
    .await;

    grpc_health(served.grpc, Some(trusting(&first)))
        .await
        .expect("gRPC over TLS");
    let plain = grpc_health(served.grpc, None).await;
    assert!(plain.is_err(), "a plaintext gRPC client was served");
    let wrong_ca = grpc_health(served.grpc, Some(trusting(&stranger))).await;
    assert!(
        wrong_ca.as_ref().is_err_and(|e| e.contains("connect")),
        "a client trusting another CA: {wrong_ca:?}"
    );
    assert_eq!(
        https_get(served.http, &first, "/healthz")
            .await
            .expect("HTTPS")
            .0,
        200
    );
    let (status, _) = served.get("/healthz").await;
    assert_eq!(status, 0, "plain HTTP was answered on the TLS port");
    assert!(https_get(served.http, &stranger, "/healthz").await.is_err());

    // The certificate is replaced on disk by one of another CA: served without a restart.
    write_server_cert(dir.path(), &second);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while https_get(served.http, &second, "/healthz").await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    grpc_health(served.grpc, Some(trusting(&second)))
        .await
        .expect("gRPC serves the new certificate");
    assert!(
        https_get(served.http, &first, "/healthz").await.is_err(),
        "the old certificate is still served"
    );
    assert!(served.node.metrics().tls_reloads.get() >= 1);

    // A broken replacement (a key that is not a key) is refused; the previous one stays.
    let errors = served.node.metrics().tls_reload_errors.get();
    std::fs::write(&key, "not a key").expect("write");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while served.node.metrics().tls_reload_errors.get() == errors {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broken key was never looked at"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        https_get(served.http, &second, "/healthz")
            .await
            .expect("still served")
            .0,
        200
    );
    served.stop().await;
}

/// Half-sent ClientHellos cannot starve the listener: a flood of connections from one address,
/// each sending the first bytes of a handshake and then nothing (about 1,400 of them once
/// made a new HTTPS `/readyz` wait 12 s, a kubelet probe failing at 1 s), takes at most a few
/// places; a client from another address handshakes and is answered within a second, and the
/// plaintext probe port (`--probe-listen`) answers whatever the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_flood_leaves_probes_and_other_clients_answered() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = Ca::new("flood");
    let (cert, key) = write_server_cert(dir.path(), &ca);
    let mut served = Served::start(
        RULES,
        Settings {
            tls_cert: Some(cert),
            tls_key: Some(key),
            probe_listen: Some("127.0.0.1:0".parse().expect("addr")),
            ..Settings::default()
        },
    )
    .await;
    let mut flood = vec![];
    // A TLS record header that announces a 512-byte handshake, and then silence.
    let half_hello = [0x16, 0x03, 0x01, 0x02, 0x00];
    for _ in 0..1_400 {
        let Ok(mut stream) = tokio::net::TcpStream::connect(served.http).await else {
            break; // out of descriptors: enough of a flood
        };
        let _ = stream.write_all(&half_hello).await;
        flood.push(stream);
    }
    assert!(flood.len() >= 200, "only {} connections made", flood.len());
    let start = tokio::time::Instant::now();
    let answered = tokio::time::timeout(
        Duration::from_secs(1),
        https_get_from(
            Some("127.0.0.2".parse().expect("ip")),
            served.http,
            &ca,
            "/readyz",
        ),
    )
    .await;
    assert!(
        matches!(answered, Ok(Ok((200, _)))),
        "another client, during the flood of {}: {answered:?} after {:?}",
        flood.len(),
        start.elapsed()
    );
    let probes = served.serving_probe_addr().expect("the probe port");
    let probed = tokio::time::timeout(Duration::from_secs(1), async {
        let mut stream = tokio::net::TcpStream::connect(probes)
            .await
            .expect("connect");
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        stream.read_to_string(&mut out).await.expect("read");
        out
    })
    .await
    .expect("the probe port answers within a second");
    assert!(probed.starts_with("HTTP/1.1 200"), "{probed}");
    assert!(served.node.metrics().tls_handshakes_refused.get() > 0);
    drop(flood);
    served.stop().await;
}

/// The admin API (rules in a real PostgreSQL) serves TLS only: its bearer tokens never cross
/// the wire in the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_serves_tls_only() {
    let pg = support::admin::postgres().await;
    let dir = tempfile::tempdir().expect("dir");
    let ca = Ca::new("admin");
    let (cert, key) = write_server_cert(dir.path(), &ca);
    let mut served = Served::with_database(
        &pg.url(),
        "",
        Settings {
            tls_cert: Some(cert),
            tls_key: Some(key),
            admin_tokens: Some(vec!["ops:0123456789abcdef0123".into()]),
            ..Settings::default()
        },
    )
    .await;
    let admin = served.admin.expect("the admin API runs");
    let (status, body) = https_get(admin, &ca, "/admin/v1/openapi.yaml")
        .await
        .expect("the admin API over TLS");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("openapi"), "{body}");
    let (status, _) = https_get(admin, &ca, "/admin/v1/rules")
        .await
        .expect("HTTPS");
    assert_eq!(status, 401, "tokens are still asked for over TLS");
    // The console's session cookie over TLS: Secure, and bound to this host (`__Host-`).
    let form = "token=0123456789abcdef0123";
    let signed_in = https_exchange(
        None,
        admin,
        &ca,
        &format!(
            "POST /console/sign-in HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    )
    .await
    .expect("sign in over TLS");
    let cookie = signed_in
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .unwrap_or_else(|| panic!("no session cookie: {signed_in}"));
    assert!(
        cookie.starts_with("__Host-tollgate-console=")
            && cookie.ends_with("; Path=/; Max-Age=28800; HttpOnly; SameSite=Strict; Secure"),
        "{cookie}"
    );
    // Plaintext on the admin port gets no answer.
    let mut plain = tokio::net::TcpStream::connect(admin)
        .await
        .expect("connect");
    plain
        .write_all(b"GET /admin/v1/openapi.yaml HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut out = vec![];
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut out)).await;
    assert!(
        !String::from_utf8_lossy(&out).starts_with("HTTP/"),
        "plain HTTP was answered on the admin port: {:?}",
        String::from_utf8_lossy(&out)
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_on_grpc_refuses_clients_without_a_certificate_of_its_ca() {
    let dir = tempfile::tempdir().expect("dir");
    let (servers, clients, stranger) =
        (Ca::new("servers"), Ca::new("clients"), Ca::new("stranger"));
    let (cert, key) = write_server_cert(dir.path(), &servers);
    let client_ca = write(dir.path(), "clients.pem", &clients.pem);
    let mut served = Served::start(
        RULES,
        Settings {
            tls_cert: Some(cert),
            tls_key: Some(key),
            grpc_client_ca: Some(client_ca),
            ..Settings::default()
        },
    )
    .await;
    let with = |ca: &Ca| {
        let (cert, key) = ca.leaf(true);
        trusting(&servers).identity(Identity::from_pem(cert, key))
    };
    grpc_health(served.grpc, Some(with(&clients)))
        .await
        .expect("a client certificate of the CA is served");
    assert!(
        grpc_health(served.grpc, Some(trusting(&servers)))
            .await
            .is_err(),
        "a client without a certificate was served"
    );
    assert!(
        grpc_health(served.grpc, Some(with(&stranger)))
            .await
            .is_err(),
        "a client certificate of another CA was served"
    );
    // The HTTP port asks for no client certificate (probes and scrapers have none).
    assert_eq!(
        https_get(served.http, &servers, "/healthz")
            .await
            .expect("HTTPS")
            .0,
        200
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_talk_over_mutual_tls_and_refuse_a_caller_without_a_certificate() {
    use tollgate_regionsync::policy::PeerState;
    let dir = tempfile::tempdir().expect("dir");
    let ca = Ca::new("regions");
    let (cert, key) = write_server_cert(dir.path(), &ca);
    let ca_file = write(dir.path(), "ca.pem", &ca.pem);
    const SECRET: &str = "a-shared-secret-for-tests";
    let listener = |_: ()| std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let (us_port, eu_port) = (listener(()), listener(()));
    let (us_addr, eu_addr) = (
        us_port.local_addr().expect("addr"),
        eu_port.local_addr().expect("addr"),
    );
    drop((us_port, eu_port));
    let region = |name: &str,
                  peer: &str,
                  listen: std::net::SocketAddr,
                  peer_at: std::net::SocketAddr| Settings {
        tls_cert: Some(cert.clone()),
        tls_key: Some(key.clone()),
        region_client_ca: Some(ca_file.clone()),
        peer_ca: Some(ca_file.clone()),
        region: Some(name.into()),
        peer_region: Some(peer.into()),
        peer_url: Some(format!("https://localhost:{}", peer_at.port())),
        region_secret: Some(SECRET.into()),
        region_listen: Some(listen),
        region_heartbeat_ms: Some(100),
        ..Settings::default()
    };
    let mut us = Served::start(RULES, region("us", "eu", us_addr, eu_addr)).await;
    let mut eu = Served::start(RULES, region("eu", "us", eu_addr, us_addr)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let up = |s: &Served| {
            let r = s.node.region().link().expect("region");
            r.peer_state() == PeerState::Up && r.status().peer_up
        };
        if up(&us) && up(&eu) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the regions never reached each other over mutual TLS: us {:?}, eu {:?}",
            us.node.region().link().map(|r| r.status()),
            eu.node.region().link().map(|r| r.status())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A caller that knows the secret but has no client certificate never gets a call in.
    let anonymous = tollgate_regionsync::link::PeerClient::with_tls(
        &format!("https://localhost:{}", eu_addr.port()),
        "us",
        SECRET,
        Some(&tollgate_regionsync::PeerTls {
            ca_pem: ca.pem.clone().into_bytes(),
            identity: None,
        }),
    )
    .expect("client");
    let ping = tollgate_regionsync::messages::Ping {
        origin: tollgate_regionsync::messages::Origin {
            region: "us".into(),
            incarnation: 7,
        },
        sent_at: 0,
    };
    let refused = anonymous.heartbeat(&ping, Duration::from_secs(2)).await;
    assert!(
        refused.is_err(),
        "a caller without a certificate was served"
    );
    us.stop().await;
    eu.stop().await;
}
