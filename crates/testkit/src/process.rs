//! Helpers for driving real server processes from tests.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};

/// A port nobody listens on right now. Another process may take it before we do, so callers
/// verify the server they start is the one answering (and retry on a clash).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding an ephemeral port")?;
    Ok(listener.local_addr()?.port())
}

/// The path of `binary` on `PATH`, or an error that says how to get it.
pub fn require_binary(binary: &str, package: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(binary);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "`{binary}` is not installed. Run the test command from the README (`scripts/test`), which \
         installs it, or `apt-get install {package}`."
    )
}

/// Polls `probe` until it returns `Some`, or fails after `timeout`. Waiting on an external
/// process is the one place a test must poll real time.
#[allow(clippy::disallowed_methods)] // std::thread::sleep: real processes run on real time
pub fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Result<T> {
    let start = SystemTime::now();
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if start.elapsed().unwrap_or_default() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (e.g. `STOP`, `CONT`, `KILL`) to process `pid`.
pub fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -{signal} {pid} failed");
    }
    Ok(())
}
