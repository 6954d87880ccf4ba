//! Helpers for driving real server processes from tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};

/// Ports handed out to test servers: below Linux's ephemeral range (32768 and up), so the
/// kernel never gives them to outgoing connections, and low enough that a cluster node's bus
/// port (port + 10000) stays below it too. Picking at random from twelve thousand ports makes
/// two test processes that run at once unlikely to want the same one, even after one of them
/// kills a server and restarts it on the same port.
const TEST_PORTS: std::ops::Range<u16> = 10_000..22_000;

/// A port (with `port + 10000` also free when `with_bus` is set) nobody listens on right now.
/// Another process may still take it first, so callers verify the server they start is the one
/// answering, and retry on a clash.
pub fn free_port(with_bus: bool) -> Result<u16> {
    use std::hash::{BuildHasher, RandomState};
    let seed = RandomState::new().hash_one((std::process::id(), SystemTime::now()));
    let span = u64::from(TEST_PORTS.end - TEST_PORTS.start);
    for i in 0..1000u64 {
        let port = TEST_PORTS.start + ((seed.wrapping_add(i.wrapping_mul(7919))) % span) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && (!with_bus || free(port + 10_000)) {
            return Ok(port);
        }
    }
    bail!("no free port in {TEST_PORTS:?}")
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

/// A workspace binary of another package, next to `beside` (a binary Cargo built for this
/// target, e.g. `env!("CARGO_BIN_EXE_tollgate")`): built with `cargo build --release -p
/// package` when it is not there yet.
pub fn sibling_binary(beside: &Path, binary: &str, package: &str) -> Result<PathBuf> {
    let path = beside.with_file_name(binary);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "-p", package])
            .status()?;
        if !status.success() {
            bail!("building {package} failed");
        }
    }
    Ok(path)
}

/// Polls `probe` until it returns `Some`, or fails after `timeout`. Waiting on an external
/// process is the one place a test must poll real time.
#[allow(clippy::disallowed_methods)] // std::thread::sleep: real processes run on real time
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T> {
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

/// A child process that is killed, and waited for, when dropped.
#[derive(Debug)]
pub struct KilledOnDrop(pub Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tollgate-loadgen`, next to `tollgate` (built when it is not there yet; see
/// [`sibling_binary`]).
pub fn loadgen_beside(tollgate: &Path) -> Result<PathBuf> {
    sibling_binary(tollgate, "tollgate-loadgen", "tollgate-loadgen")
}

/// The whole number in the environment variable `name`, or `default` (a bench's settings).
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The resident memory of process `pid` in bytes (Linux: `VmRSS` of `/proc/<pid>/status`), or
/// None when it cannot be read (the process is gone).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Raises this process's open-file limit to at least `wanted` (child processes inherit it),
/// within the hard limit; an error says what the machine allows when that is too little.
pub fn raise_open_files(wanted: u64) -> Result<()> {
    let (soft, hard) = rlimit::Resource::NOFILE.get()?;
    if soft >= wanted {
        return Ok(());
    }
    if hard < wanted {
        anyhow::bail!(
            "this test opens {wanted} connections; the open-file limit is {soft} (hard {hard}): \
             raise it (ulimit -n {wanted})"
        );
    }
    rlimit::Resource::NOFILE.set(wanted, hard)?;
    Ok(())
}

/// A child process killed (and waited for) when dropped: a test that fails part-way leaves no
/// process behind.
#[derive(Debug)]
pub struct Killed(pub std::process::Child);

impl Killed {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
