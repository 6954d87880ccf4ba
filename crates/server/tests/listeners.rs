//! Every listener bounds what a client can hold on it: a connection that does not open (an
//! HTTP/1 request head half sent, an HTTP/2 preface half sent, nothing at all) is closed at its
//! listener's deadline; one address cannot take every place; the HTTP port reads `POST /json`'s
//! body only after its token, up to a size and within a deadline. Swept over all five ports of
//! one node (gRPC, HTTP, probes, admin, region link), and the HTTP port flooded from outside a
//! real `tollgate` process, its memory read from /proc.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use support::Served;
use support::admin::postgres;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tollgate_server::config::Settings;
use tollgate_server::listener::Bounds;

const RULES: &str = "domain: rl\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

/// A connection to `to` from the loopback address `127.0.0.<from>` (every 127/8 address is
/// this machine's: tests play many clients on one).
async fn connect_from(from: u8, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, from)),
        0,
    ))?;
    socket.connect(to).await
}

/// How long until the server ends `stream` (EOF or reset), reading and dropping whatever it
/// sends; None if it still holds it after `limit`.
async fn closed_within(mut stream: TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// What a client that never finishes sends first on a port of `protocol`.
fn half_opening(http2: bool) -> &'static [u8] {
    if http2 {
        // 20 of the preface's 24 bytes.
        b"PRI * HTTP/2.0\r\n\r\nSM"
    } else {
        b"GET /healthz HTTP/1.1\r\nHost: tollgate\r\nX-Slow: "
    }
}

/// Ten connections that send half an opening and ten that send nothing, on one port: each is
/// closed by the server at its deadline (`silent` for those that sent nothing, `half` for the
/// others), allowing a second and a half for a busy machine, and none sooner.
async fn sweep(name: &str, addr: SocketAddr, http2: bool, silent: Duration, half: Duration) {
    let mut held = vec![];
    for i in 0..20u8 {
        let mut stream = connect_from(2 + i % 4, addr).await.expect("connect");
        let deadline = if i % 2 == 0 {
            stream
                .write_all(half_opening(http2))
                .await
                .expect("half an opening");
            half
        } else {
            silent
        };
        held.push((
            deadline,
            tokio::spawn(closed_within(stream, deadline + Duration::from_secs(5))),
        ));
    }
    for (i, (deadline, h)) in held.into_iter().enumerate() {
        let took = h.await.expect("join");
        let took = took.unwrap_or_else(|| panic!("{name}: connection {i} still held"));
        assert!(
            took >= deadline - Duration::from_millis(100)
                && took <= deadline + Duration::from_millis(1500),
            "{name}: connection {i} closed after {took:?}; its deadline is {deadline:?}"
        );
    }
}

/// A node with every listener: gRPC, HTTP, the probe port, the admin API (PostgreSQL) and the
/// region link (its peer region never answers).
async fn every_listener() -> (Served, tollgate_testkit::PostgresServer) {
    let pg = postgres().await;
    let served = Served::start(
        RULES,
        Settings {
            database_url: Some(pg.url()),
            admin_listen: Some("127.0.0.1:0".parse().expect("addr")),
            admin_tokens: Some(vec!["ops:an-admin-token-of-length".into()]),
            probe_listen: Some("127.0.0.1:0".parse().expect("addr")),
            region: Some("eu".into()),
            peer_region: Some("us".into()),
            peer_url: Some("http://127.0.0.1:9".into()),
            region_secret: Some("a-region-secret-of-some-length".into()),
            region_listen: Some("127.0.0.1:0".parse().expect("addr")),
            ..Settings::default()
        },
    )
    .await;
    (served, pg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_closes_connections_that_do_not_open_in_time() {
    let (mut served, _pg) = every_listener().await;
    let http = tollgate_server::http::CLIENT_TIMEOUT;
    // An HTTP/1 port closes a silent connection at its opening deadline (or its header
    // deadline, if sooner), a half-sent head at the header deadline; an HTTP/2 port closes
    // either at its opening deadline.
    let admin_heads = tollgate_server::config::defaults::ADMIN_CLIENT_TIMEOUT;
    let ports = [
        (
            "grpc",
            served.grpc,
            true,
            Bounds::GRPC.opening_within,
            Bounds::GRPC.opening_within,
        ),
        ("http", served.http, false, http, http),
        (
            "probes",
            served.serving_probe_addr().expect("probe port"),
            false,
            http,
            http,
        ),
        (
            "admin",
            served.admin.expect("admin port"),
            false,
            Bounds::ADMIN.opening_within.min(admin_heads),
            admin_heads,
        ),
        (
            "region link",
            served.serving_region_addr().expect("region link"),
            true,
            Bounds::REGION_LINK.opening_within,
            Bounds::REGION_LINK.opening_within,
        ),
    ];
    let sweeps: Vec<_> = ports
        .iter()
        .map(|&(name, addr, http2, silent, half)| {
            tokio::spawn(async move { sweep(name, addr, http2, silent, half).await })
        })
        .collect();
    // Meanwhile the ports still serve: a probe, and Envoy's check.
    let (status, _) = served.get("/healthz").await;
    assert_eq!(status, 200);
    let mut rls = served.rls().await;
    rls.should_rate_limit(support::rls_request(
        "rl",
        &[&[("remote_address", "10.0.0.1")]],
    ))
    .await
    .expect("decided");
    for s in sweeps {
        s.await.expect("every port closed what was left unfinished");
    }
    let metrics = served.node.metrics().render();
    for name in ["grpc", "http", "probes", "admin", "region link"] {
        let closed = tollgate_testkit::http::metric_sum(
            &metrics,
            "tollgate_connections_refused_total",
            &format!("listener=\"{name}\",reason=\"sent_nothing\""),
        );
        // HTTP/1 ports close a half-sent head at hyper's header deadline, not ours: only the
        // silent ones are counted there.
        assert!(
            closed >= 10.0,
            "{name}: {closed} closed for sending nothing\n{metrics}"
        );
    }
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_place() {
    let mut served = Served::start(RULES, Settings::default()).await;
    let cap = Bounds::HTTP.max_per_source as usize;
    let mut held = vec![];
    for _ in 0..cap + 20 {
        held.push(connect_from(7, served.http).await.expect("connect"));
    }
    // The places past the address's are closed at once.
    let watched: Vec<_> = held
        .into_iter()
        .map(|s| tokio::spawn(closed_within(s, Duration::from_millis(500))))
        .collect();
    let mut closed_at_once = 0;
    for w in watched {
        if w.await.expect("join").is_some() {
            closed_at_once += 1;
        }
    }
    assert_eq!(closed_at_once, 20);
    // Another address is served meanwhile.
    let mut other = connect_from(8, served.http).await.expect("connect");
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = String::new();
    other.read_to_string(&mut answer).await.expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let metrics = served.node.metrics().render();
    assert_eq!(
        tollgate_testkit::http::metric_sum(
            &metrics,
            "tollgate_connections_refused_total",
            "listener=\"http\",reason=\"source_full\""
        ),
        20.0
    );
    served.stop().await;
}

/// `POST /json` with a token configured: a request without it is refused before its body is
/// read (a 2 MiB body announced and not sent gets its 401 at once), one with it gets 413 past
/// 64 KiB, and 408 when the body does not come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_checks_its_token_before_the_body_and_bounds_the_body() {
    let mut served = Served::start(
        RULES,
        Settings {
            json_check_token: Some("a-json-check-token".into()),
            ..Settings::default()
        },
    )
    .await;
    let ask = async |head: String, body: &[u8]| {
        let mut stream = connect_from(1, served.http).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("head");
        let _ = stream.write_all(body).await;
        let started = Instant::now();
        let mut answer = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
            .await
            .expect("answered")
            .unwrap_or(0);
        (
            String::from_utf8_lossy(&answer[..n]).into_owned(),
            started.elapsed(),
        )
    };
    let (unauthorized, took) = ask(
        "POST /json HTTP/1.1\r\nHost: t\r\nContent-Length: 2097152\r\n\r\n".into(),
        b"",
    )
    .await;
    assert!(unauthorized.starts_with("HTTP/1.1 401"), "{unauthorized}");
    assert!(took < Duration::from_secs(2), "refused at once: {took:?}");
    let auth = "Authorization: Bearer a-json-check-token\r\n";
    let (large, _) = ask(
        format!("POST /json HTTP/1.1\r\nHost: t\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"),
        &[b"10001\r\n".as_slice(), &[b' '; 0x10001], b"\r\n"].concat(),
    )
    .await;
    assert!(large.starts_with("HTTP/1.1 413"), "{large}");
    let (slow, took) = ask(
        format!("POST /json HTTP/1.1\r\nHost: t\r\n{auth}Content-Length: 100\r\n\r\n"),
        b"{\"domain\":",
    )
    .await;
    assert!(slow.starts_with("HTTP/1.1 408"), "{slow}");
    assert!(
        took >= tollgate_server::http::CLIENT_TIMEOUT - Duration::from_millis(100),
        "{took:?}"
    );
    served.stop().await;
}

/// The process's resident memory, in MB.
fn rss_mb(pid: u32) -> f64 {
    tollgate_testkit::process::rss_bytes(pid).unwrap_or(0) as f64 / (1 << 20) as f64
}

/// A real `tollgate` process (in-memory store, the example rules), its HTTP port flooded from
/// ten addresses: 400 connections each sending 1.9 MiB of a 2 MiB `POST /json` body and
/// stopping, then 2,000 half-sent request heads. Its memory stays under 300 MB throughout, and
/// every connection is closed by its deadline (or at once, past the port's places).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_holds_little_of_what_it_is_sent() {
    // 2,400 client sockets here, and the node's (which inherits the limit).
    tollgate_testkit::process::raise_open_files(8192).expect("open files");
    let dir = tempfile::tempdir().expect("tempdir");
    let (grpc, http) = (
        tollgate_testkit::process::free_port(false).expect("port"),
        tollgate_testkit::process::free_port(false).expect("port"),
    );
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--rules")
        .arg(format!(
            "{}/../../deploy/rules/example.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .args(["--grpc-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("node.log")).expect("log"))
        .spawn()
        .expect("tollgate starts");
    let child = tollgate_testkit::process::Killed(child);
    let pid = child.id();
    let addr: SocketAddr = format!("127.0.0.1:{http}").parse().expect("addr");
    let ready = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < ready, "the node never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = rss_mb(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_mb(pid) as u64, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let chunk = vec![b'x'; 64 * 1024];
    let mut held = vec![];
    for i in 0..400u32 {
        let chunk = chunk.clone();
        held.push(tokio::spawn(async move {
            let mut stream = connect_from(10 + (i % 10) as u8, addr)
                .await
                .map_err(|e| format!("body {i}: could not connect: {e}"))?;
            let head = "POST /json HTTP/1.1\r\nHost: t\r\nContent-Length: 2097152\r\n\r\n";
            stream
                .write_all(head.as_bytes())
                .await
                .map_err(|e| format!("body {i}: head not sent: {e}"))?;
            let mut sent = 0;
            while sent < 1_900_000 {
                if stream.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            closed_within(stream, Duration::from_secs(10))
                .await
                .ok_or_else(|| format!("body {i}: still held 10 s after its last byte"))
        }));
    }
    for i in 0..2000u32 {
        held.push(tokio::spawn(async move {
            let mut stream = connect_from(30 + (i % 40) as u8, addr)
                .await
                .map_err(|e| format!("header {i}: could not connect: {e}"))?;
            let _ = stream.write_all(half_opening(false)).await;
            closed_within(stream, Duration::from_secs(10))
                .await
                .ok_or_else(|| format!("header {i}: still held after 10 s"))
        }));
    }
    let mut latest = Duration::ZERO;
    for h in held {
        let took = h.await.expect("join").unwrap_or_else(|why| panic!("{why}"));
        latest = latest.max(took);
    }
    sampler.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("RSS before {before:.0} MB, peak {peak} MB; last connection closed after {latest:?}");
    assert!(
        peak < 300,
        "the node held {peak} MB of what it was sent (it started at {before:.0} MB)"
    );
    assert!(
        latest <= tollgate_server::http::CLIENT_TIMEOUT + Duration::from_millis(1500),
        "every connection closed by its deadline: the last after {latest:?}"
    );
    let answer = tollgate_testkit::http::get(http, "/healthz", &[]).expect("the node still serves");
    assert_eq!(answer.status, 200);
    drop(child);
}
