//! TLS on every listener: the certificate and key, how often they are reloaded, and the CAs
//! whose client certificates the gRPC port and the region link require.

use std::path::PathBuf;
use std::time::Duration;

use super::defaults;
use super::settings::{ConfigError, Settings, bad};

/// TLS on the node's listeners (see `docs/tls.md`).
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The certificate chain every listener serves.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// How often the files are looked at.
    pub reload: Duration,
    /// Clients of the gRPC port must present a certificate of this CA.
    pub grpc_client_ca: Option<PathBuf>,
    /// The peer region's nodes must present a certificate of this CA.
    pub region_client_ca: Option<PathBuf>,
}

impl TlsSettings {
    /// What a listener serves: this node's certificate, and `client_ca` to require.
    pub fn files(&self, client_ca: Option<&PathBuf>) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: client_ca.cloned(),
        }
    }
}

/// Reads the TLS settings: None without a certificate and key, and then no client CA either
/// (mutual TLS is TLS).
pub(super) fn parse(s: &Settings) -> Result<Option<TlsSettings>, ConfigError> {
    let ms = Duration::from_millis;
    match (&s.tls_cert, &s.tls_key) {
        (None, None) => {
            for (field, set) in [
                ("grpc_client_ca", s.grpc_client_ca.is_some()),
                ("region_client_ca", s.region_client_ca.is_some()),
            ] {
                if set {
                    return Err(bad(field, "needs tls_cert and tls_key (mutual TLS is TLS)"));
                }
            }
            Ok(None)
        }
        (Some(_), None) => Err(bad("tls_key", "is required with tls_cert")),
        (None, Some(_)) => Err(bad("tls_cert", "is required with tls_key")),
        (Some(cert), Some(key)) => Ok(Some(TlsSettings {
            cert: cert.clone(),
            key: key.clone(),
            reload: s.tls_reload_ms.map_or(defaults::TLS_RELOAD, ms).max(ms(10)),
            grpc_client_ca: s.grpc_client_ca.clone(),
            region_client_ca: s.region_client_ca.clone(),
        })),
    }
}
