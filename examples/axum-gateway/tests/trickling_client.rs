//! A client that trickles its request body cannot hold the gateway (and the concurrency slot
//! its request took) for as long as it likes: the example gateway, run as its README says,
//! answers 408 at its body deadline and closes the connection.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

async fn start_gateway(extra: &[&str]) -> (Gateway, SocketAddr) {
    let listen = free_port();
    let upstream = free_port();
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/rules/example.yaml"
    );
    let child = Command::new(env!("CARGO_BIN_EXE_axum-gateway"))
        .args(["--listen", &listen.to_string(), "--rules", rules])
        .args(["--api-key", "k_gold=alice:gold"])
        .args(["--upstream", &format!("http://{upstream}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the gateway starts");
    let gateway = Gateway(child);
    let started = Instant::now();
    while TcpStream::connect(listen).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the gateway never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (gateway, listen)
}

#[tokio::test]
async fn a_body_trickled_a_byte_at_a_time_is_cut_off_at_the_deadline() {
    let (_gateway, address) = start_gateway(&["--body-timeout-ms", "500"]).await;
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(
            b"POST /orders HTTP/1.1\r\nhost: gateway\r\nx-api-key: k_gold\r\n\
              content-type: application/json\r\ncontent-length: 1000\r\n\r\n",
        )
        .await
        .expect("send the head");
    let sent = Instant::now();
    // One byte every 200 ms, for far longer than the deadline, while reading the answer.
    let (mut reader, mut writer) = stream.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..50 {
            if writer.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 1024];
        loop {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    trickle.abort();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "after {:?}: {answer:?}",
        sent.elapsed()
    );
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(
        read.is_ok(),
        "the connection was still open {:?} after the request began",
        sent.elapsed()
    );
}

#[tokio::test]
async fn a_request_past_its_deadline_is_answered_and_its_connection_closed() {
    // The body deadline is longer than the request's: the request deadline cuts it off.
    let (_gateway, address) =
        start_gateway(&["--body-timeout-ms", "60000", "--request-timeout-ms", "700"]).await;
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(
            b"POST /orders HTTP/1.1\r\nhost: gateway\r\nx-api-key: k_gold\r\n\
              content-length: 1000\r\n\r\nx",
        )
        .await
        .expect("send the head");
    let sent = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 504"),
        "after {:?}: {answer:?}",
        sent.elapsed()
    );
    assert!(read.is_ok(), "the connection stayed open");
}
