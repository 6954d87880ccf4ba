//! Region sync: this node's region and its peer's, the link between them and its secret,
//! how often they talk, and when the peer counts as down or back.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tollgate_regionsync::{PeerTls, RegionConfig};

use super::defaults;
use super::settings::{ConfigError, Settings, bad};
use super::tls::TlsSettings;

/// Region sync's settings and where its link listens.
#[derive(Debug, Clone)]
pub struct RegionSettings {
    /// The sync settings.
    pub sync: RegionConfig,
    /// Where this node serves the region link.
    pub listen: SocketAddr,
}

/// Reads the region settings: None without a region and a peer region. An `https://` peer
/// is reached with `tls`'s certificate, when the node has one.
pub(super) fn parse(
    s: &Settings,
    tls: Option<&TlsSettings>,
) -> Result<Option<RegionSettings>, ConfigError> {
    let (region, peer) = match (&s.region, &s.peer_region) {
        (None, None) => return Ok(None),
        (Some(region), Some(peer)) => (region, peer),
        (Some(_), None) => return Err(bad("peer_region", "is required with region")),
        (None, Some(_)) => return Err(bad("region", "is required with peer_region")),
    };
    let url = s
        .peer_url
        .as_ref()
        .ok_or_else(|| bad("peer_url", "is required with region and peer_region"))?;
    let secret = s
        .region_secret
        .as_ref()
        .ok_or_else(|| bad("region_secret", "is required with region and peer_region"))?;
    let mut sync = RegionConfig::new(region, peer, url, secret);
    match (&s.peer_ca, url.starts_with("https://")) {
        (Some(ca), true) => {
            let read = |field: &str, path: &Path| {
                std::fs::read(path).map_err(|e| bad(field, format!("{}: {e}", path.display())))
            };
            let identity = match tls {
                Some(t) => Some((read("tls_cert", &t.cert)?, read("tls_key", &t.key)?)),
                None => None,
            };
            sync.peer_tls = Some(PeerTls {
                ca_pem: read("peer_ca", ca)?,
                identity,
            });
        }
        (None, true) => return Err(bad("peer_ca", "is required with an https:// peer_url")),
        (Some(_), false) => return Err(bad("peer_url", "must be https:// with peer_ca")),
        (None, false) => {}
    }
    let positive = |field: &str, v: Option<u64>, default: Duration| match v {
        Some(0) => Err(bad(field, "must be at least 1")),
        Some(v) => Ok(Duration::from_millis(v)),
        None => Ok(default),
    };
    sync.sync_interval = positive(
        "region_sync_interval_ms",
        s.region_sync_interval_ms,
        defaults::REGION_SYNC_INTERVAL,
    )?;
    sync.heartbeat_interval = positive(
        "region_heartbeat_ms",
        s.region_heartbeat_ms,
        defaults::REGION_HEARTBEAT,
    )?;
    sync.liveness.failover_after = positive(
        "region_failover_after_ms",
        s.region_failover_after_ms,
        defaults::REGION_FAILOVER_AFTER,
    )?;
    sync.liveness.failback_after = positive(
        "region_failback_after_ms",
        s.region_failback_after_ms,
        defaults::REGION_FAILBACK_AFTER,
    )?;
    sync.forward_deadline = positive(
        "region_forward_deadline_ms",
        s.region_forward_deadline_ms,
        defaults::REGION_FORWARD_DEADLINE,
    )?;
    sync.default_share = match s.region_share {
        Some(share) if !(share > 0.0 && share <= 1.0) => {
            return Err(bad(
                "region_share",
                format!("must be above 0 and at most 1, got {share}"),
            ));
        }
        Some(share) => share,
        None => defaults::REGION_SHARE,
    };
    Ok(Some(RegionSettings {
        sync,
        listen: s.region_listen.unwrap_or(defaults::REGION_LISTEN),
    }))
}
