//! TLS on the node's listeners (rustls): the gRPC port, the HTTP port, the admin API and the
//! region link serve one certificate; the gRPC port and the region link may require client
//! certificates signed by a CA of their own (mutual TLS). The files are looked at every
//! `reload` interval and a changed set, once it has held still a moment (not caught half
//! written), is loaded without a restart: new connections get it, open ones keep theirs. A
//! set that does not load (a key that does not match) is refused and the previous one stays,
//! with a warning and `tollgate_tls_reload_errors_total`. See `docs/tls.md`.
//!
//! # Layout
//! - [`TlsFiles`]: what a listener serves (certificate, key, optional client CA).
//! - [`Acceptor`]: the current rustls server configuration of one listener, reloaded.
//! - [`handshaken`]: a listener's connections, handshaken; [`incoming`], the same as tonic
//!   takes them.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::Stream;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::server::TlsStream;

use tollgate_node::metrics::Metrics;
use tollgate_node::rules::watch::held_still;

use crate::listener::Guarded;

/// How long a client may take to finish its TLS handshake (one takes milliseconds; a client
/// that sends half a ClientHello and waits is holding a place).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections past TCP accept still handshaking, per listener: beyond it new ones wait.
const MAX_HANDSHAKES: usize = 1024;

/// Handshakes in flight from one source address, per listener: past it, a new connection from
/// that address is closed at once. About 1,400 half-sent ClientHellos from one client used to
/// fill every place, and a new connection then waited 7 to 12 s.
const MAX_HANDSHAKES_PER_SOURCE: u32 = 16;

/// A connection, plain or TLS (for servers that take either).
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// What one listener serves over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
}

/// Why a TLS configuration did not load.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{setting} {path}: {source}")]
    Read {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("{setting} {path}: {reason}")]
    Pem {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the set (a key that does not match the certificate, say).
    #[error("{what}: {source}")]
    Rustls {
        /// Which part.
        what: &'static str,
        /// Why.
        source: rustls::Error,
    },
}

/// The largest certificate, key or CA file read: a chain of a few certificates is a few KB; a
/// 300 MB "certificate" once took a node to 632 MB of RSS, which it kept.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// A TLS file's bytes, refused past [`MAX_FILE_BYTES`] before more than that is read (a file
/// that grows as it is read, or a device, included).
fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let error = |source| TlsError::Read {
        setting,
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(error)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(error)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(TlsError::Pem {
            setting,
            path: path.to_owned(),
            reason: format!("larger than {MAX_FILE_BYTES} bytes: not a certificate or key file"),
        });
    }
    Ok(bytes)
}

fn certificates(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(setting, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            setting,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            setting,
            path: path.to_owned(),
            reason: "no CERTIFICATE in the file".into(),
        });
    }
    Ok(certs)
}

impl TlsFiles {
    /// The files' bytes, to tell whether they changed.
    fn contents(&self) -> Vec<Option<Vec<u8>>> {
        [
            ("tls_cert", Some(&self.cert)),
            ("tls_key", Some(&self.key)),
            ("client_ca", self.client_ca.as_ref()),
        ]
        .into_iter()
        .map(|(setting, p)| p.and_then(|p| read(setting, p).ok()))
        .collect()
    }

    /// The rustls server configuration these files describe (HTTP/2 and HTTP/1.1 offered).
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates("tls_cert", &self.cert)?;
        let key_pem = read("tls_key", &self.key)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Pem {
            setting: "tls_key",
            path: self.key.clone(),
            reason: format!("no usable private key: {e}"),
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls {
                what: "protocol versions",
                source,
            })?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates("client_ca", path)? {
                    roots.add(cert).map_err(|source| TlsError::Rustls {
                        what: "client CA",
                        source,
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| TlsError::Pem {
                            setting: "client_ca",
                            path: path.clone(),
                            reason: e.to_string(),
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config =
            builder
                .with_single_cert(chain, key)
                .map_err(|source| TlsError::Rustls {
                    what: "certificate and key",
                    source,
                })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// One listener's TLS: the configuration in force, swapped when its files change.
#[derive(Clone)]
pub struct Acceptor {
    current: Arc<ArcSwap<rustls::ServerConfig>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor").finish_non_exhaustive()
    }
}

impl Acceptor {
    /// Loads `files` (an error names the setting and the file), and looks at them again every
    /// `reload`.
    pub fn start(
        files: TlsFiles,
        reload: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, TlsError> {
        let config = files.server_config()?;
        let acceptor = Self {
            current: Arc::new(ArcSwap::from_pointee(config)),
            metrics: metrics.clone(),
        };
        let current = Arc::downgrade(&acceptor.current);
        tokio::spawn(async move {
            let mut seen = files.contents();
            let mut tick = tokio::time::interval(reload);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(current) = current.upgrade() else {
                    return;
                };
                let now = files.contents();
                if now == seen {
                    continue;
                }
                // Not half way through a writer's work (a chain missing its intermediate
                // would load and be served).
                seen = held_still(now, || files.contents()).await;
                match files.server_config() {
                    Ok(config) => {
                        current.store(Arc::new(config));
                        metrics.tls_reloads.inc();
                        tracing::info!(cert = %files.cert.display(), client_ca = ?files.client_ca, "TLS certificate reloaded");
                    }
                    Err(e) => {
                        metrics.tls_reload_errors.inc();
                        tracing::warn!(cert = %files.cert.display(), error = %e, "TLS files changed but do not load; the previous certificate stays");
                    }
                }
            }
        });
        Ok(acceptor)
    }

    /// Handshakes `stream` with the configuration in force.
    pub async fn accept(&self, stream: Guarded) -> io::Result<TlsStream<Guarded>> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.current.load_full());
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }
}

/// Handshakes each of `connections` in its own task (a slow client holds up nobody); failed
/// handshakes are logged at debug level and dropped. At most [`MAX_HANDSHAKES`] are in flight
/// (then the next waits), [`MAX_HANDSHAKES_PER_SOURCE`] from one address (then its next is
/// closed at once).
pub fn handshaken(
    connections: impl Stream<Item = io::Result<Guarded>> + Send + 'static,
    acceptor: Acceptor,
    listener_name: &'static str,
) -> impl Stream<Item = TlsStream<Guarded>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let per_source: Arc<parking_lot::Mutex<HashMap<IpAddr, u32>>> = Arc::default();
    tokio::spawn(async move {
        use futures::StreamExt;
        tokio::pin!(connections);
        loop {
            let stream = tokio::select! {
                next = connections.next() => match next {
                    Some(Ok(stream)) => stream,
                    Some(Err(_)) => continue,
                    None => return,
                },
                () = tx.closed() => return,
            };
            let peer = stream.peer();
            let Some(source) = SourceSlot::take(&per_source, peer.ip()) else {
                acceptor.metrics.tls_handshakes_refused.inc();
                tracing::debug!(listener = listener_name, %peer, "too many TLS handshakes from one address: closed");
                continue;
            };
            let Ok(permit) = handshakes.clone().acquire_owned().await else {
                return;
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let _source = source;
                match acceptor.accept(stream).await {
                    Ok(tls) => {
                        let _ = tx.send(tls).await;
                    }
                    Err(e) => {
                        tracing::debug!(listener = listener_name, %peer, error = %e, "TLS handshake failed");
                    }
                }
            });
        }
    });
    futures::stream::unfold(
        rx,
        |mut rx: tokio::sync::mpsc::Receiver<TlsStream<Guarded>>| async move {
            rx.recv().await.map(|tls| (tls, rx))
        },
    )
}

/// A place among one source address's handshakes in flight, given back when dropped.
struct SourceSlot {
    counts: Arc<parking_lot::Mutex<HashMap<IpAddr, u32>>>,
    source: IpAddr,
}

impl SourceSlot {
    /// A place for `source`, unless it holds [`MAX_HANDSHAKES_PER_SOURCE`] already.
    fn take(
        counts: &Arc<parking_lot::Mutex<HashMap<IpAddr, u32>>>,
        source: IpAddr,
    ) -> Option<Self> {
        let mut map = counts.lock();
        let held = map.entry(source).or_insert(0);
        if *held >= MAX_HANDSHAKES_PER_SOURCE {
            return None;
        }
        *held += 1;
        Some(Self {
            counts: counts.clone(),
            source,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut map = self.counts.lock();
        if let Some(held) = map.get_mut(&self.source) {
            *held -= 1;
            if *held == 0 {
                map.remove(&self.source);
            }
        }
    }
}

/// `connections`, handshaken, as tonic's `serve_with_incoming` takes them.
pub fn incoming(
    connections: impl Stream<Item = io::Result<Guarded>> + Send + 'static,
    acceptor: Acceptor,
    listener_name: &'static str,
) -> impl Stream<Item = io::Result<TlsStream<Guarded>>> + Send + 'static {
    use futures::StreamExt;
    handshaken(connections, acceptor, listener_name).map(Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_too_large_to_be_a_certificate_is_refused_before_it_is_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("huge.pem");
        std::fs::write(&path, vec![b'A'; (MAX_FILE_BYTES + 1) as usize]).expect("write");
        let error = read("tls_cert", &path).expect_err("refused");
        assert!(error.to_string().contains("larger than"), "{error}");
        assert!(error.to_string().contains("tls_cert"), "{error}");
        // A device that never ends is read no further than the bound either.
        let error = read("tls_key", Path::new("/dev/zero")).expect_err("refused");
        assert!(error.to_string().contains("larger than"), "{error}");
        let files = TlsFiles {
            cert: path.clone(),
            key: path,
            client_ca: None,
        };
        assert_eq!(files.contents(), vec![None, None, None]);
    }
}
