//! What readers and callers are trusted with: how `/top-denied` shows identities (personal
//! data, or API keys) and who may read it on the HTTP port, who may call `POST /json`, and
//! whether a request may set its own limit.

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
    /// Whether the HTTP port serves `POST /json`.
    pub(super) json_check: bool,
    /// The bearer token `POST /json` requires (None: loopback callers only).
    pub(super) json_check_token: Option<String>,
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
    let token = |field: &str, value: &Option<String>| match value {
        Some(token) if token.len() < MIN_SECRET => Err(bad(
            field,
            format!("must be at least {MIN_SECRET} characters"),
        )),
        token => Ok(token.clone()),
    };
    Ok(Access {
        top_denied,
        descriptor_overrides,
        top_denied_token: token("top_denied_token", &s.top_denied_token)?,
        json_check: s.json_check.unwrap_or(defaults::JSON_CHECK),
        json_check_token: token("json_check_token", &s.json_check_token)?,
    })
}
