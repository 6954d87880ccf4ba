//! Real Redis servers for tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::process::{free_port, require_binary, signal, wait_for};

/// The server binary tests start: `redis-server`, or the one `TOLLGATE_REDIS_SERVER` names (a
/// path or a name on `PATH`: `valkey-server` runs the same tests against Valkey).
pub fn server_binary() -> String {
    std::env::var("TOLLGATE_REDIS_SERVER")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// One `redis-server` process on a free port, in its own temporary directory. Nothing is
/// persisted. Dropping it kills the process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: TempDir,
    extra_args: Vec<String>,
    paused: bool,
}

impl RedisServer {
    /// Starts a standalone server.
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(extra_args: &[&str]) -> Result<Self> {
        let binary = server_binary();
        if binary == "redis-server" {
            require_binary("redis-server", "redis-server")?;
        }
        let mut last_error = None;
        for _ in 0..5 {
            let mut server = Self {
                port: free_port(extra_args.contains(&"--cluster-enabled"))?,
                child: None,
                dir: tempfile::Builder::new()
                    .prefix("tollgate-redis-")
                    .tempdir()?,
                extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
                paused: false,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                // Most likely another process took the port first: try another one.
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("could not start redis-server")))
    }

    fn spawn(&mut self) -> Result<()> {
        let log = self.dir.path().join("redis.log");
        let child = Command::new(server_binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {}", server_binary()))?;
        let pid = child.id();
        self.child = Some(child);
        let port = self.port;
        wait_for(
            &format!("redis-server on port {port}"),
            Duration::from_secs(10),
            || {
                if let Some(child) = self.child.as_mut()
                    && let Ok(Some(_)) = child.try_wait()
                {
                    return Some(Err(anyhow::anyhow!(
                        "redis-server exited at start: {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )));
                }
                // The server answering must be ours, not another one that took the port.
                let info = cli(port, &["INFO", "server"]).ok()?;
                let ours = info
                    .lines()
                    .any(|l| l.trim() == format!("process_id:{pid}"));
                Some(if ours {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("port {port} is taken"))
                })
            },
        )?
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory (holds `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `redis-cli` against it and returns the output.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        cli(self.port, args)
    }

    /// The process id.
    pub fn pid(&self) -> Result<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .context("redis-server is not running")
    }

    /// Freezes the process (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&mut self) -> Result<()> {
        signal(self.pid()?, "STOP")?;
        self.paused = true;
        Ok(())
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&mut self) -> Result<()> {
        signal(self.pid()?, "CONT")?;
        self.paused = false;
        Ok(())
    }

    /// Kills the process (SIGKILL) and waits for it to die. Its state is lost.
    pub fn kill(&mut self) {
        self.stop();
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                let _ = signal(child.id(), "CONT");
                self.paused = false;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn cli(port: u16, args: &[&str]) -> Result<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running redis-cli")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || text.starts_with("Could not connect") {
        bail!(
            "redis-cli -p {port} {args:?} failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}

/// A Redis Cluster of real servers: `primaries` primaries, each with `replicas` replicas, slots
/// spread evenly. A short node timeout (1 s) makes failovers take seconds, not tens of seconds.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    _dir: PathBuf,
}

/// How long a node may be unreachable before the cluster fails it over.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1000;

impl RedisCluster {
    /// Starts and forms the cluster on Redis's defaults (as `redis-cli --cluster create`
    /// leaves them: `cluster-require-full-coverage yes`), and waits until every slot is served
    /// and every replica is in sync.
    pub fn start(primaries: usize, replicas: usize) -> Result<Self> {
        Self::start_with(primaries, replicas, &[])
    }

    /// [`RedisCluster::start`] with `extra` server arguments (a test that needs one says why:
    /// it is a setting the product must tell operators about).
    pub fn start_with(primaries: usize, replicas: usize, extra: &[&str]) -> Result<Self> {
        require_binary("redis-cli", "redis-tools")?;
        let timeout = CLUSTER_NODE_TIMEOUT_MS.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
        ];
        args.extend_from_slice(extra);
        let count = primaries * (1 + replicas);
        let nodes = (0..count)
            .map(|_| RedisServer::start_with(&args))
            .collect::<Result<Vec<_>>>()?;
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .context("running redis-cli --cluster create")?;
        if !out.status.success() {
            bail!(
                "cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let cluster = Self {
            _dir: nodes[0].dir().to_path_buf(),
            nodes,
        };
        cluster.wait_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Waits until every live node sees all slots served and every live replica is in sync.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        wait_for("a healthy cluster", timeout, || {
            for node in self.nodes.iter().filter(|n| n.child.is_some()) {
                let info = node.cli(&["CLUSTER", "INFO"]).ok()?;
                if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                    return None;
                }
                let repl = node.cli(&["INFO", "replication"]).ok()?;
                if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                    return None;
                }
            }
            Some(())
        })
    }

    /// Seed URLs for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node currently serving `key`'s slot as primary (as the first live node sees it).
    pub fn primary_for(&self, key: &str) -> Result<u16> {
        let any = self.live_node()?;
        let slot: u16 = any.cli(&["CLUSTER", "KEYSLOT", key])?.trim().parse()?;
        self.primary_for_slot(slot)
    }

    /// The node currently serving `slot` as primary (as the first live node sees it).
    pub fn primary_for_slot(&self, slot: u16) -> Result<u16> {
        let nodes = self.live_node()?.cli(&["CLUSTER", "NODES"])?;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            for range in &fields[8..] {
                let (lo, hi) = match range.split_once('-') {
                    Some((lo, hi)) => (lo.parse::<u16>()?, hi.parse::<u16>()?),
                    None => (range.parse::<u16>()?, range.parse::<u16>()?),
                };
                if (lo..=hi).contains(&slot) {
                    let port = fields[1].split(['@', ':']).nth(1).context("node address")?;
                    return Ok(port.parse()?);
                }
            }
        }
        bail!("no primary serves slot {slot}")
    }

    fn live_node(&self) -> Result<&RedisServer> {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .context("no live node")
    }

    /// The node listening on `port`.
    pub fn node(&mut self, port: u16) -> Result<&mut RedisServer> {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .context("no such node")
    }

    /// `CLUSTER SLOTS` calls the live nodes have served so far (from `INFO commandstats`):
    /// how often clients read the topology.
    pub fn slot_reads(&self) -> u64 {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .filter_map(|n| n.cli(&["INFO", "commandstats"]).ok())
            .filter_map(|info| {
                let line = info
                    .lines()
                    .find(|l| l.starts_with("cmdstat_cluster|slots:"))?;
                let calls = line.split("calls=").nth(1)?.split(',').next()?;
                calls.parse::<u64>().ok()
            })
            .sum()
    }

    /// Kills the primary serving `key` and returns its port.
    pub fn kill_primary_for(&mut self, key: &str) -> Result<u16> {
        let port = self.primary_for(key)?;
        self.node(port)?.kill();
        Ok(port)
    }

    /// Ports of the nodes, primaries and replicas alike.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// Per node: port → role line as the node reports it.
    pub fn roles(&self) -> HashMap<u16, String> {
        self.nodes
            .iter()
            .filter_map(|n| {
                let repl = n.cli(&["INFO", "replication"]).ok()?;
                let role = repl
                    .lines()
                    .find(|l| l.starts_with("role:"))?
                    .trim()
                    .to_owned();
                Some((n.port(), role))
            })
            .collect()
    }
}
