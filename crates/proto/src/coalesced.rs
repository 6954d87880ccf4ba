//! The TCP connection the gRPC server writes to, told to h2 as one without vectored writes.
//!
//! h2 copies a DATA frame into its write buffer, to go out with the frames around it in one
//! `writev`, only when the frame is smaller than its chain threshold: 256 bytes when the
//! connection says it writes vectored (TCP does), 1,024 otherwise. A frame at or above the
//! threshold is sent on its own and the buffer is flushed before the next frame is taken, one
//! system call per response. An RLS answer with its rate-limit headers is about 260 bytes, so
//! with TCP's answer every response cost a `writev` (about 40 % of a core at 60,000 responses
//! a second, measured with `strace -c` and perf). Said without vectored writes, responses up
//! to 1 KB are coalesced as the bare server's 9-byte ones are (h2load's data bytes per response); h2 still writes its whole
//! buffer in one call.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A TCP connection (a plain one, or one a listener bounds) that writes through its
/// buffer-sized writes only (see the module docs).
#[derive(Debug)]
pub struct CoalescedConnection<T = TcpStream>(T);

impl<T> CoalescedConnection<T> {
    /// Wraps `stream`.
    pub fn new(stream: T) -> Self {
        Self(stream)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CoalescedConnection<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalescedConnection<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<T: Connected<ConnectInfo = TcpConnectInfo>> Connected for CoalescedConnection<T> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn h2_is_told_the_connection_does_not_write_vectored() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let client = client.expect("connect");
        let (server, _) = accepted.expect("accept");
        assert!(server.is_write_vectored(), "TCP writes vectored");
        let wrapped = CoalescedConnection::new(server);
        assert!(!wrapped.is_write_vectored());
        assert_eq!(
            wrapped.connect_info().remote_addr(),
            client.local_addr().ok()
        );
    }
}
