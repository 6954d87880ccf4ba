//! A TCP proxy that a test can cut and restore: the link between two regions, or any other
//! connection a test wants to break without stopping either end.
//!
//! While cut, every open connection is shut down and new ones are closed as soon as they are
//! accepted (the caller sees a reset or an end of stream at once, as with a refused route).
//! The target can be changed at any time (a peer that restarted elsewhere).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use anyhow::{Context, Result};

#[derive(Debug, Default)]
struct Shared {
    cut: AtomicBool,
    held: AtomicBool,
    stopped: AtomicBool,
    target: Mutex<Option<SocketAddr>>,
    open: Mutex<Vec<TcpStream>>,
}

/// A proxy on a free loopback port.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl TcpProxy {
    /// Listens on a free port; connections are refused until a target is set.
    pub fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the proxy")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept = shared.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if accept.stopped.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                let target = *accept.target.lock().expect("lock");
                let (false, Some(target)) = (accept.cut.load(Ordering::Acquire), target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let Ok(server) = TcpStream::connect(target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut open = accept.open.lock().expect("lock");
                    for s in [&client, &server] {
                        if let Ok(clone) = s.try_clone() {
                            open.push(clone);
                        }
                    }
                }
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    let link = accept.clone();
                    thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    while link.held.load(Ordering::Acquire)
                                        && !link.cut.load(Ordering::Acquire)
                                    {
                                        pause();
                                    }
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Ok(Self { addr, shared })
    }

    /// A proxy to `target`.
    pub fn to(target: SocketAddr) -> Result<Self> {
        let proxy = Self::start()?;
        proxy.set_target(target);
        Ok(proxy)
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, for gRPC clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where connections go from now on.
    pub fn set_target(&self, target: SocketAddr) {
        *self.shared.target.lock().expect("lock") = Some(target);
    }

    /// Breaks every open connection and refuses new ones until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::Release);
        for stream in self.shared.open.lock().expect("lock").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::Release);
    }

    /// Stalls every connection, open and new: what is sent is read and kept, not forwarded,
    /// until [`TcpProxy::release`] (a link that stops answering without closing, as a peer
    /// paused or a congested route does).
    pub fn hold(&self) {
        self.shared.held.store(true, Ordering::Release);
    }

    /// Forwards what was kept during a [`TcpProxy::hold`], in order, and everything after.
    pub fn release(&self) {
        self.shared.held.store(false, Ordering::Release);
    }

    /// Whether the proxy is cut.
    pub fn is_cut(&self) -> bool {
        self.shared.cut.load(Ordering::Acquire)
    }
}

/// A held link's forwarding thread waits (its own OS thread, on real time, as the sockets are).
#[allow(clippy::disallowed_methods)] // std::thread::sleep: the proxy's threads are not tokio's
fn pause() {
    thread::sleep(std::time::Duration::from_millis(1));
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.shared.stopped.store(true, Ordering::Release);
        // Wake the accept loop so it sees the stop.
        let _ = TcpStream::connect(self.addr);
    }
}
