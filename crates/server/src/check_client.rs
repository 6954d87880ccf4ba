//! `tollgate check`: asks a running node whether a request may pass, from a shell, over the
//! gRPC port (Envoy's `ShouldRateLimit`, exactly as a gateway asks it), and prints the
//! answer for a person or, with `--json`, as `POST /json` does.
//!
//! ```text
//! $ tollgate check --domain public-api api_key=k_123
//! OK: admitted
//!   descriptor 0 {api_key=k_123}: OK, 49 left (api-key-default: 5 per second), resets in 0.2 s
//!   ratelimit-policy: "api-key-default";q=50;w=10
//!   ratelimit: "api-key-default";r=49;t=1
//! ```

use std::fmt::Write as _;
use std::time::Duration;

use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// What to ask.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The node's gRPC address: host:port, or http://host:port.
    #[arg(long, default_value = "localhost:8081")]
    pub node: String,
    /// The request's domain (a rule file's `domain`).
    #[arg(long)]
    pub domain: String,
    /// What the request costs (Envoy's hits_addend); unset: 1.
    #[arg(long)]
    pub cost: Option<u32>,
    /// Another descriptor, `key=value,key=value` (repeat for more); the entries given without
    /// a flag are the first.
    #[arg(long = "descriptor", value_name = "ENTRIES")]
    pub descriptors: Vec<String>,
    /// Print the answer as JSON (the form POST /json answers), for scripts.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the node, ms.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// The first descriptor's entries, `key=value` each.
    #[arg(value_name = "KEY=VALUE")]
    pub entries: Vec<String>,
}

/// Why a node could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The arguments do not make a request.
    #[error("{0}")]
    Usage(String),
    /// The node could not be reached.
    #[error("cannot reach the node at {node}: {reason}")]
    Unreachable {
        /// The address asked.
        node: String,
        /// Why.
        reason: String,
    },
    /// The node answered with an error.
    #[error("the node refused the request: {0}")]
    Refused(String),
}

impl CheckArgs {
    /// The request as Envoy would send it.
    pub fn request(&self) -> Result<RateLimitRequest, CheckError> {
        let mut descriptors = vec![];
        if !self.entries.is_empty() {
            descriptors.push(descriptor(self.entries.iter().map(String::as_str))?);
        }
        for given in &self.descriptors {
            descriptors.push(descriptor(given.split(','))?);
        }
        if descriptors.is_empty() {
            return Err(CheckError::Usage(
                "name at least one descriptor entry, key=value (e.g. api_key=k_123)".into(),
            ));
        }
        Ok(RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend: self.cost.unwrap_or(0),
        })
    }

    /// The node's gRPC URL.
    fn url(&self) -> String {
        if self.node.contains("://") {
            self.node.clone()
        } else {
            format!("http://{}", self.node)
        }
    }
}

fn descriptor<'a>(
    entries: impl Iterator<Item = &'a str>,
) -> Result<RateLimitDescriptor, CheckError> {
    let entries = entries
        .map(|entry| {
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| CheckError::Usage(format!("{entry:?} is not key=value")))?;
            if key.trim().is_empty() {
                return Err(CheckError::Usage(format!("{entry:?} names no key")));
            }
            Ok(Entry {
                key: key.trim().to_owned(),
                value: value.as_bytes().to_vec(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..RateLimitDescriptor::default()
    })
}

/// Asks the node.
pub async fn ask(args: &CheckArgs) -> Result<RateLimitResponse, CheckError> {
    let request = args.request()?;
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let unreachable = |reason: String| CheckError::Unreachable {
        node: args.node.clone(),
        reason,
    };
    let endpoint = tonic::transport::Endpoint::from_shared(args.url())
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| unreachable(describe(&e)))?;
    let mut client = RateLimitServiceClient::new(channel);
    client
        .should_rate_limit(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| CheckError::Refused(status.message().to_owned()))
}

/// An error and its causes, in one line.
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// The answer for a person: the decision, each descriptor's status, the headers.
pub fn render(request: &RateLimitRequest, answer: &RateLimitResponse) -> String {
    let over = answer.overall_code == Code::OverLimit as i32;
    let mut out = String::from(if over {
        "OVER_LIMIT: denied\n"
    } else {
        "OK: admitted\n"
    });
    for (i, status) in answer.statuses.iter().enumerate() {
        let entries = request
            .descriptors
            .get(i)
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| format!("{}={}", e.key, String::from_utf8_lossy(&e.value)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let code = Code::try_from(status.code)
            .unwrap_or(Code::Unknown)
            .as_str_name();
        let _ = write!(out, "  descriptor {i} {{{entries}}}: {code}");
        match &status.current_limit {
            Some(limit) => {
                let unit = Unit::try_from(limit.unit)
                    .unwrap_or(Unit::Unknown)
                    .as_str_name()
                    .to_ascii_lowercase();
                let _ = write!(
                    out,
                    ", {} left ({}: {} per {unit})",
                    status.limit_remaining, limit.name, limit.requests_per_unit
                );
            }
            None if status.limit_remaining == u32::MAX => out.push_str(", unlimited"),
            None => out.push_str(", no limit stated"),
        }
        // A denial a wait can help has a Retry-After; one it cannot (a cost above the limit)
        // has none, and its reset is only when the bucket is full again.
        let retryable = answer
            .response_headers_to_add
            .iter()
            .any(|h| h.key == "retry-after");
        if let Some(d) = &status.duration_until_reset {
            let secs = d.seconds as f64 + f64::from(d.nanos) / 1e9;
            let over = status.code == Code::OverLimit as i32;
            let when = if over && retryable { "retry" } else { "resets" };
            let _ = write!(out, ", {when} in {secs:.1} s");
        }
        out.push('\n');
    }
    for header in &answer.response_headers_to_add {
        let _ = writeln!(out, "  {}: {}", header.key, header.value);
    }
    out
}
