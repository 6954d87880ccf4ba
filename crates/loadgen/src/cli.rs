//! The commands and their settings.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate-loadgen",
    version,
    about = "Load for Envoy RLS v3 servers, and a bare one"
)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Drive a server and report what it did.
    Run(Box<Run>),
    /// Serve Envoy's RLS answering OK to everything (the gRPC stack's ceiling).
    Bare(Bare),
}

/// `run`.
#[derive(Debug, Clone, Args)]
pub(crate) struct Run {
    /// The server, `http://host:port`.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub(crate) target: String,
    /// The request's domain.
    #[arg(long, default_value = "rl")]
    pub(crate) domain: String,
    /// The descriptor key whose value is the client key.
    #[arg(long, default_value = "remote_address")]
    pub(crate) key: String,
    /// Which keys: `hot` (one key), `zipf:N` (Zipf over N keys, exponent `--zipf-s`),
    /// `uniform:N`, `new` (every request a new key) or `new:R` (each new key R times).
    #[arg(long, default_value = "hot")]
    pub(crate) keys: String,
    /// Pad every key to this many bytes (long identities: a flood of 2 KB API keys).
    #[arg(long, default_value_t = 0)]
    pub(crate) key_bytes: usize,
    /// Put this in front of every key (several load generators, disjoint keys).
    #[arg(long, default_value = "")]
    pub(crate) key_prefix: String,
    /// Zipf's exponent.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) zipf_s: f64,
    /// Descriptors per request (each `{key: <client key>, d: <index>}` past the first).
    #[arg(long, default_value_t = 1)]
    pub(crate) descriptors: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 8)]
    pub(crate) connections: usize,
    /// Requests in flight on each connection (closed loop).
    #[arg(long, default_value_t = 32)]
    pub(crate) streams: usize,
    /// A fixed rate in requests per second, over all connections (instead of a closed loop).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// How long to measure (`10s`, `500ms`, `1m`).
    #[arg(long, value_parser = duration, default_value = "10s")]
    pub(crate) duration: Duration,
    /// How long to run before measuring.
    #[arg(long, value_parser = duration, default_value = "2s")]
    pub(crate) warmup: Duration,
    /// Client worker threads (0: the machine's).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
    /// A name for the run (the table's first column).
    #[arg(long, default_value = "run")]
    pub(crate) name: String,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub(crate) json: Option<std::path::PathBuf>,
    /// No progress line.
    #[arg(long)]
    pub(crate) quiet: bool,
}

/// `bare`.
#[derive(Debug, Clone, Args)]
pub(crate) struct Bare {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:9081")]
    pub(crate) listen: std::net::SocketAddr,
    /// `current` (one thread) or `multi:N` (N workers).
    #[arg(long, default_value = "current")]
    pub(crate) runtime: String,
    /// Answer every request with the response in this file (an encoded `RateLimitResponse`)
    /// instead of a bare OK.
    #[arg(long)]
    pub(crate) answer: Option<std::path::PathBuf>,
    /// Serve on Tollgate's coalesced connections (responses of a few hundred bytes share a
    /// system call) instead of plain TCP ones.
    #[arg(long)]
    pub(crate) coalesce: bool,
}

/// `10s`, `500ms`, `1m`, or seconds.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (10s, 500ms, 1m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        other => return Err(format!("unknown unit {other:?} in {text:?}")),
    };
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(format!("{text:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(seconds))
}
