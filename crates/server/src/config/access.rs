//! What readers and callers are trusted with: how `/top-denied` shows identities (personal
//! data, or API keys) and who may read it on the HTTP port, and whether a request may set
//! its own limit.

use tollgate_node::runtime::top_denied::{IdentityShown, MIN_SECRET};

use super::defaults;
use super::settings::{ConfigError, Settings, bad};

/// The most-denied keys and descriptor overrides, as read.
#[derive(Debug)]
pub(super) struct Access {
    /// How the most-denied keys show identities.
    pub(super) top_denied: IdentityShown,
    /// Whether a request may set its own limit for a descriptor.
    pub(super) descriptor_overrides: bool,
    /// The bearer token `/top-denied` on the HTTP port requires (None: not served there).
    pub(super) top_denied_token: Option<String>,
}

/// Reads the top-denied and descriptor-override settings.
pub(super) fn parse(s: &Settings) -> Result<Access, ConfigError> {
    let top_denied = IdentityShown::parse(
        s.top_denied_identities
            .as_deref()
            .unwrap_or(defaults::TOP_DENIED_IDENTITIES),
        s.top_denied_secret.as_deref(),
    )
    .map_err(|reason| bad("top_denied_identities", reason))?;
    let descriptor_overrides = match s
        .descriptor_overrides
        .as_deref()
        .unwrap_or(defaults::DESCRIPTOR_OVERRIDES)
    {
        "allow" => true,
        "refuse" => false,
        other => {
            return Err(bad(
                "descriptor_overrides",
                format!("must be allow or refuse, got {other:?}"),
            ));
        }
    };
    let top_denied_token = match &s.top_denied_token {
        Some(token) if token.len() < MIN_SECRET => {
            return Err(bad(
                "top_denied_token",
                format!("must be at least {MIN_SECRET} characters"),
            ));
        }
        token => token.clone(),
    };
    Ok(Access {
        top_denied,
        descriptor_overrides,
        top_denied_token,
    })
}
