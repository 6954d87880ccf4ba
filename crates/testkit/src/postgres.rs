//! Real PostgreSQL servers for tests: each on a free port in its own directory, stopped on
//! drop. Initialising a cluster takes seconds, so one template is initialised per machine
//! (and PostgreSQL version) and copied for each server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::process::{free_port, signal, wait_for};

/// PostgreSQL's binaries (`initdb`, `postgres`, `pg_isready`).
pub fn postgres_bin_dir() -> Result<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").is_file() {
            return Ok(dir);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    found.sort();
    found.pop().context(
        "PostgreSQL is not installed. Run the test command from the README (`scripts/test`), which \
         installs it, or `apt-get install postgresql`.",
    )
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a PostgreSQL binary, as the `postgres` user when we are root (PostgreSQL refuses root).
fn command(bin: &Path, as_postgres: bool) -> Command {
    if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

fn chown_postgres(path: &Path) -> Result<()> {
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()?;
    if !status.success() {
        bail!("chown {} failed", path.display());
    }
    Ok(())
}

/// The initialised template cluster, made once per machine.
fn template(bin: &Path, as_postgres: bool) -> Result<PathBuf> {
    let version = bin
        .parent()
        .and_then(|p| p.file_name())
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = std::env::temp_dir().join(format!("tollgate-pg-template-{version}"));
    if path.join("PG_VERSION").is_file() {
        return Ok(path);
    }
    let staging = tempfile::Builder::new()
        .prefix("tollgate-pg-staging-")
        .tempdir_in(std::env::temp_dir())?;
    let data = staging.path().join("data");
    std::fs::create_dir(&data)?;
    if as_postgres {
        Command::new("chmod")
            .args(["755"])
            .arg(staging.path())
            .status()?;
        chown_postgres(&data)?;
    }
    let out = command(&bin.join("initdb"), as_postgres)
        .args(["-D"])
        .arg(&data)
        .args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        ])
        .stdin(Stdio::null())
        .output()
        .context("running initdb")?;
    if !out.status.success() {
        bail!(
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Another test process may have finished first: either template is good.
    if std::fs::rename(&data, &path).is_err() && !path.join("PG_VERSION").is_file() {
        bail!(
            "could not install the PostgreSQL template at {}",
            path.display()
        );
    }
    Ok(path)
}

/// One PostgreSQL server (user `postgres`, trust authentication, database `postgres`).
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: TempDir,
    bin: PathBuf,
    as_postgres: bool,
    child: Option<Child>,
    paused: bool,
}

impl PostgresServer {
    /// Starts a server with an empty cluster.
    pub fn start() -> Result<Self> {
        let bin = postgres_bin_dir()?;
        let as_postgres = is_root();
        let template = template(&bin, as_postgres)?;
        let dir = tempfile::Builder::new().prefix("tollgate-pg-").tempdir()?;
        let data = dir.path().join("data");
        let status = Command::new("cp")
            .arg("-a")
            .arg(&template)
            .arg(&data)
            .status()
            .context("copying the template")?;
        if !status.success() {
            bail!("copying the PostgreSQL template failed");
        }
        if as_postgres {
            Command::new("chmod")
                .args(["755"])
                .arg(dir.path())
                .status()?;
            chown_postgres(dir.path())?;
        }
        let mut server = PostgresServer {
            port: 0,
            dir,
            bin,
            as_postgres,
            child: None,
            paused: false,
        };
        let mut last = None;
        for _ in 0..5 {
            server.port = free_port(false)?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("could not start postgres")))
    }

    fn spawn(&mut self) -> Result<()> {
        let data = self.dir.path().join("data");
        let log = std::fs::File::create(self.dir.path().join("postgres.log"))?;
        if self.as_postgres {
            chown_postgres(&self.dir.path().join("postgres.log"))?;
        }
        let child = command(&self.bin.join("postgres"), self.as_postgres)
            .arg("-D")
            .arg(&data)
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
            ])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting postgres")?;
        self.child = Some(child);
        let port = self.port;
        let isready = self.bin.join("pg_isready");
        let log_path = self.dir.path().join("postgres.log");
        wait_for(
            &format!("postgres on port {port}"),
            Duration::from_secs(30),
            || {
                if let Some(child) = self.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    return Some(Err(anyhow::anyhow!(
                        "postgres exited ({status}): {}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    )));
                }
                let ok = Command::new(&isready)
                    .args([
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &port.to_string(),
                        "-U",
                        "postgres",
                        "-t",
                        "1",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .ok()?
                    .success();
                ok.then_some(Ok(()))
            },
        )?
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs SQL through `psql` and returns its output (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> Result<String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-At",
                "-c",
                sql,
            ])
            .stdin(Stdio::null())
            .output()
            .context("running psql")?;
        if !out.status.success() {
            bail!("psql failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn pid(&self) -> Result<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .context("postgres is not running")
    }

    /// Kills the server (SIGKILL on the postmaster and its children).
    pub fn kill(&mut self) {
        self.stop();
    }

    /// Starts it again on the same port and data (committed data survives).
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }

    /// Freezes the postmaster (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&mut self) -> Result<()> {
        signal(self.pid()?, "STOP")?;
        self.paused = true;
        Ok(())
    }

    /// Thaws it.
    pub fn resume(&mut self) -> Result<()> {
        signal(self.pid()?, "CONT")?;
        self.paused = false;
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Under `runuser` the child is not the postmaster: signal the postmaster by the pid
            // it records, then reap the child.
            if self.paused {
                let _ = signal(child.id(), "CONT");
                self.paused = false;
            }
            let pid_file = self.dir.path().join("data").join("postmaster.pid");
            let postmaster = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()));
            if let Some(pid) = postmaster {
                // SIGQUIT: immediate shutdown of the postmaster and every backend.
                let _ = signal(pid, "QUIT");
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = wait_for("postgres to stop", Duration::from_secs(10), || {
                (!pid_file.exists()).then_some(())
            });
            if pid_file.exists() {
                let _ = std::fs::remove_file(&pid_file);
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}
