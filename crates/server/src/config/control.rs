//! The rule store in PostgreSQL, its admin API and how the node follows it: on only with a
//! database URL.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::defaults;
use super::settings::{ConfigError, Settings, bad};

/// The rule store, its admin API and how nodes follow it.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// PostgreSQL URL.
    pub database_url: String,
    /// Admin API address (moved to loopback when no token is configured).
    pub admin_listen: SocketAddr,
    /// Read-write tokens.
    pub admin_tokens: Vec<String>,
    /// Read-only tokens.
    pub admin_read_tokens: Vec<String>,
    /// How long a client may take to send a request's headers, and its body.
    pub admin_client_timeout: Duration,
    /// Domain of rules that name none (None: the node's only domain).
    pub default_domain: Option<String>,
    /// Revision poll interval.
    pub poll: Duration,
    /// LISTEN/NOTIFY on.
    pub listen: bool,
    /// Snapshot file.
    pub snapshot: PathBuf,
}

/// Reads the control plane's settings: None without a database URL. The admin tokens are
/// checked either way.
pub(super) fn parse(s: &Settings) -> Result<Option<ControlConfig>, ConfigError> {
    let ms = Duration::from_millis;
    if let Err(reason) = tollgate_control::auth::Tokens::parse(
        s.admin_tokens.as_deref().unwrap_or_default(),
        s.admin_read_tokens.as_deref().unwrap_or_default(),
    ) {
        let field = if reason.starts_with("admin_read_tokens") {
            "admin_read_tokens"
        } else {
            "admin_tokens"
        };
        return Err(bad(field, reason));
    }
    let Some(database_url) = s.database_url.as_ref().filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let default_domain = match &s.default_domain {
        Some(d) if d.is_empty() || d.len() > 64 => {
            return Err(bad("default_domain", "must be 1 to 64 characters"));
        }
        other => other.clone(),
    };
    Ok(Some(ControlConfig {
        database_url: database_url.clone(),
        admin_listen: s.admin_listen.unwrap_or(defaults::ADMIN_LISTEN),
        admin_tokens: s.admin_tokens.clone().unwrap_or_default(),
        admin_read_tokens: s.admin_read_tokens.clone().unwrap_or_default(),
        admin_client_timeout: s
            .admin_client_timeout_ms
            .map_or(defaults::ADMIN_CLIENT_TIMEOUT, ms)
            .max(ms(10)),
        default_domain,
        poll: s.rules_poll_ms.map_or(defaults::RULES_POLL, ms).max(ms(10)),
        listen: s.rules_listen.unwrap_or(defaults::RULES_LISTEN),
        snapshot: s
            .rules_snapshot
            .clone()
            .unwrap_or_else(|| PathBuf::from(defaults::RULES_SNAPSHOT)),
    }))
}
