//! What the node tells about itself: its log format and the traces it exports.

use super::defaults;
use super::settings::{ConfigError, Settings, bad};
use crate::telemetry::TraceSettings;

/// Logs and traces, as read.
#[derive(Debug)]
pub(super) struct Telemetry {
    /// Logs as JSON lines.
    pub(super) log_json: bool,
    /// Where sampled spans go (None: no traces).
    pub(super) traces: Option<TraceSettings>,
}

/// Reads the log and trace settings.
pub(super) fn parse(s: &Settings) -> Result<Telemetry, ConfigError> {
    let log_json = match s.log_format.as_deref().unwrap_or(defaults::LOG_FORMAT) {
        "text" => false,
        "json" => true,
        other => {
            return Err(bad(
                "log_format",
                format!("must be text or json, got {other:?}"),
            ));
        }
    };
    let traces = match &s.otlp_endpoint {
        None => None,
        Some(endpoint) => {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(bad(
                    "otlp_endpoint",
                    format!("must be an http:// or https:// URL, got {endpoint:?}"),
                ));
            }
            let sample_ratio = s.trace_sample_ratio.unwrap_or(defaults::TRACE_SAMPLE_RATIO);
            if !(0.0..=1.0).contains(&sample_ratio) {
                return Err(bad(
                    "trace_sample_ratio",
                    format!("must be between 0 and 1, got {sample_ratio}"),
                ));
            }
            Some(TraceSettings {
                endpoint: endpoint.clone(),
                sample_ratio,
            })
        }
    };
    Ok(Telemetry { log_json, traces })
}
