//! A scenario as its YAML file states it: topology, rules, traffic and timed faults. Every
//! field is described in `docs/simulations.md`; a file that does not parse says which field,
//! and where.

use std::path::Path;
use std::time::Duration;

mod faults;
pub use faults::{Fault, FaultKind};

mod traffic;
pub use traffic::{Keys, Traffic};

use serde::Deserialize;

/// A whole scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A short name (reports and plots carry it).
    pub name: String,
    /// What the scenario shows, in a sentence.
    #[serde(default)]
    pub description: String,
    /// Virtual time simulated.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
    /// The seed when `--seed` is not given.
    #[serde(default = "one")]
    pub seed: u64,
    /// How often traffic is generated and faults are applied (virtual).
    #[serde(default = "millisecond", with = "humantime_serde")]
    pub tick: Duration,
    /// Regions and their nodes.
    pub topology: Topology,
    /// Runtime settings every node gets.
    #[serde(default)]
    pub runtime: RuntimeSettings,
    /// A rule file, in Tollgate's format or envoyproxy/ratelimit's (paste your own).
    pub rules: String,
    /// Streams of requests.
    pub traffic: Vec<Traffic>,
    /// Timed faults.
    #[serde(default)]
    pub faults: Vec<Fault>,
}

fn one() -> u64 {
    1
}

fn millisecond() -> Duration {
    Duration::from_millis(1)
}

/// Where the nodes run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The regions (one or two).
    pub regions: Vec<Region>,
    /// One-way latency of the link between two regions.
    #[serde(default = "link_latency", with = "humantime_serde")]
    pub link_latency: Duration,
    /// Region sync settings (two regions).
    #[serde(default)]
    pub sync: SyncSettings,
}

fn link_latency() -> Duration {
    Duration::from_millis(40)
}

/// How the regions sync (the node's `--region-*` settings).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncSettings {
    /// How often consumption is shipped.
    #[serde(default = "sync_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// How often the peer is probed.
    #[serde(default = "heartbeat", with = "humantime_serde")]
    pub heartbeat: Duration,
    /// How long the peer must be unreachable before it counts as down.
    #[serde(default = "ten_seconds", with = "humantime_serde")]
    pub failover_after: Duration,
    /// How long the peer must be reachable again before it counts as up.
    #[serde(default = "ten_seconds", with = "humantime_serde")]
    pub failback_after: Duration,
}

fn sync_interval() -> Duration {
    Duration::from_secs(2)
}

fn heartbeat() -> Duration {
    Duration::from_millis(500)
}

fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}

impl Default for SyncSettings {
    fn default() -> Self {
        Self {
            interval: sync_interval(),
            heartbeat: heartbeat(),
            failover_after: ten_seconds(),
            failback_after: ten_seconds(),
        }
    }
}

/// One region: its nodes share one store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// Its name; nodes are called `<name>-<index>`.
    pub name: String,
    /// Nodes (pods) in it.
    pub nodes: usize,
    /// How long one store call takes.
    #[serde(default)]
    pub store_latency: LatencySpec,
    /// Most memory the region's store holds for its keys, MiB (the in-memory store's
    /// `--memory-max-mb`, or a Redis `maxmemory` with an eviction policy): past it, keys are
    /// evicted and their buckets start full again. The in-memory store's default unless set.
    #[serde(default)]
    pub store_memory_mb: Option<usize>,
    /// What a node's first calls to the store cost beyond their latency: the connection set
    /// up, each script loaded (again after a failover). Calibrated on this machine by default
    /// (see [`SetupSpec::default`]).
    #[serde(default)]
    pub store_setup: SetupSpec,
}

/// A node's connection set-up and script loading on its first calls.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetupSpec {
    /// A fresh node's first connection to the store.
    #[serde(with = "humantime_serde")]
    pub connect: Duration,
    /// Connecting again after a failover dropped the connection.
    #[serde(default = "reconnect", with = "humantime_serde")]
    pub reconnect: Duration,
    /// Loading one script (the `NOSCRIPT` answer, the source sent, the compile).
    #[serde(with = "humantime_serde")]
    pub script_load: Duration,
}

impl Default for SetupSpec {
    /// Measured against a local `redis-server` 7.0 from a fresh release node: see
    /// BENCHMARKS.md, "The simulator against real processes".
    fn default() -> Self {
        Self {
            connect: Duration::from_micros(CONNECT_US),
            reconnect: reconnect(),
            script_load: Duration::from_micros(SCRIPT_LOAD_US),
        }
    }
}

/// The calibration of [`SetupSpec::default`], µs: a fresh release node's warm-up took 7-16 ms
/// (its log's `took_ms`), of which the 14 script loads about 1.1 ms; a connection and a ping
/// from a warm process to the same Redis took 90-150 µs.
const CONNECT_US: u64 = 6_000;
const RECONNECT_US: u64 = 300;

fn reconnect() -> Duration {
    Duration::from_micros(RECONNECT_US)
}
const SCRIPT_LOAD_US: u64 = 100;

/// A node's CPU: what its decisions and its store answers cost, on how many cores. Past its
/// capacity a node queues: its decisions wait, and so do its store answers, inside the store
/// budget (what made a saturated real node's calls late).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSpec {
    /// Cores the node's runtime runs on (its worker threads).
    pub cores: usize,
    /// CPU one decision costs beyond its store calls (the gRPC request and answer, the rules,
    /// the key's actor).
    #[serde(with = "humantime_serde")]
    pub per_decision: Duration,
    /// CPU reading one store answer costs (the client's decode, waking the caller).
    #[serde(with = "humantime_serde")]
    pub per_store_answer: Duration,
}

impl Default for CpuSpec {
    /// Calibrated from the benches on this machine: see BENCHMARKS.md, "The simulator against
    /// real processes".
    fn default() -> Self {
        Self {
            cores: 2,
            per_decision: Duration::from_micros(PER_DECISION_US),
            per_store_answer: Duration::from_micros(PER_STORE_ANSWER_US),
        }
    }
}

/// The calibration of [`CpuSpec::default`], µs.
const PER_DECISION_US: u64 = 10;
const PER_STORE_ANSWER_US: u64 = 10;

fn default_cpu() -> Option<CpuSpec> {
    Some(CpuSpec::default())
}

fn warm_up() -> bool {
    true
}

/// A latency distribution: log-normal through a median and a 99th percentile.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencySpec {
    /// Half of all calls are faster.
    #[serde(with = "humantime_serde")]
    pub median: Duration,
    /// 99 % of all calls are faster.
    #[serde(with = "humantime_serde")]
    pub p99: Duration,
}

impl Default for LatencySpec {
    /// A Redis in the same zone: 300 µs median, 2 ms p99.
    fn default() -> Self {
        Self {
            median: Duration::from_micros(300),
            p99: Duration::from_millis(2),
        }
    }
}

/// The node settings a scenario may change (the rest are the node's defaults).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSettings {
    /// The budget of one store call (`--store-timeout-ms`).
    #[serde(default = "store_timeout", with = "humantime_serde")]
    pub store_timeout: Duration,
    /// Lease lifetime (`--lease-ttl-ms`).
    #[serde(default, with = "humantime_serde")]
    pub lease_ttl: Option<Duration>,
    /// The most units one lease carries (`--lease-max-units`).
    #[serde(default)]
    pub lease_max_units: Option<u64>,
    /// The local pre-limit factor (0 turns it off).
    #[serde(default)]
    pub prelimit_factor: Option<f64>,
    /// The node's CPU (`null`: a node decides in no time, as the simulator did before it
    /// modelled one).
    #[serde(default = "default_cpu")]
    pub cpu: Option<CpuSpec>,
    /// Whether a node warms its store up before it serves, as `tollgate` does (connected,
    /// scripts loaded, up to its start-up patience); false: its first requests pay for it.
    #[serde(default = "warm_up")]
    pub warm_up: bool,
}

fn store_timeout() -> Duration {
    Duration::from_millis(5)
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            store_timeout: store_timeout(),
            lease_ttl: None,
            lease_max_units: None,
            prelimit_factor: None,
            cpu: default_cpu(),
            warm_up: true,
        }
    }
}

/// Why a scenario can't be run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file can't be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// A field is missing, unknown or of the wrong type.
    #[error("{file}: `{field}`: {message}")]
    Field {
        /// The file.
        file: String,
        /// The field's path (`traffic[0].keys`).
        field: String,
        /// What is wrong, with the line where the parser knows it.
        message: String,
    },
    /// Its rules (or a rule change's) do not load: the line is the scenario file's.
    #[error("{file}:{line}: `{field}`: {message}")]
    Rules {
        /// The file.
        file: String,
        /// The scenario file's line of the error (the block's first line when unknown).
        line: usize,
        /// `rules`, or `faults[i].rules.yaml`.
        field: String,
        /// What is wrong, naming the rule field.
        message: String,
    },
    /// The scenario parses but doesn't make sense.
    #[error("{file}: `{field}`: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl Scenario {
    /// Reads and checks a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            file: file.clone(),
            source,
        })?;
        Self::parse(&text, &file)
    }

    /// Parses and checks a scenario given as text (`file` names it in errors).
    pub fn parse(text: &str, file: &str) -> Result<Self, ScenarioError> {
        let de = yaml_serde::Deserializer::from_str(text);
        let scenario: Scenario =
            serde_path_to_error::deserialize(de).map_err(|e| ScenarioError::Field {
                file: file.into(),
                field: e.path().to_string(),
                message: e.inner().to_string(),
            })?;
        scenario.check(file)?;
        scenario.check_rules(text, file)?;
        Ok(scenario)
    }

    /// Loads the rules and every rule change, saying an error at the scenario file's line.
    fn check_rules(&self, text: &str, file: &str) -> Result<(), ScenarioError> {
        let blocks = std::iter::once(("rules".to_owned(), self.rules.as_str())).chain(
            self.faults
                .iter()
                .enumerate()
                .filter_map(|(i, f)| match &f.kind {
                    FaultKind::Rules { yaml } => {
                        Some((format!("faults[{i}].rules.yaml"), yaml.as_str()))
                    }
                    _ => None,
                }),
        );
        for (field, yaml) in blocks {
            if let Err(e) = tollgate_node::rules::source::parse(yaml, Path::new(file)) {
                let start = block_start(text, yaml);
                return Err(ScenarioError::Rules {
                    file: file.into(),
                    line: match (start, e.line) {
                        (Some(start), Some(line)) => start + line - 1,
                        (Some(start), None) => start,
                        (None, _) => 1,
                    },
                    field,
                    message: e.message,
                });
            }
        }
        Ok(())
    }

    /// Every field the types cannot check, in the order of the file, each error naming its
    /// field: longer than most, read as the format is.
    fn check(&self, file: &str) -> Result<(), ScenarioError> {
        let bad = |field: String, message: String| {
            Err(ScenarioError::Invalid {
                file: file.into(),
                field,
                message,
            })
        };
        if self.duration.is_zero() {
            return bad("duration".into(), "must be above zero".into());
        }
        if self.tick.is_zero() || self.tick > Duration::from_secs(1) {
            return bad("tick".into(), "must be above zero and at most 1s".into());
        }
        if self.topology.regions.is_empty() || self.topology.regions.len() > 2 {
            return bad(
                "topology.regions".into(),
                format!("one region or two, got {}", self.topology.regions.len()),
            );
        }
        if let [a, b] = &self.topology.regions[..]
            && a.name == b.name
        {
            return bad(
                "topology.regions[1].name".into(),
                "the regions need two names".into(),
            );
        }
        for (i, r) in self.topology.regions.iter().enumerate() {
            if r.nodes == 0 {
                return bad(
                    format!("topology.regions[{i}].nodes"),
                    "must be at least 1".into(),
                );
            }
            if r.store_latency.p99 < r.store_latency.median {
                return bad(
                    format!("topology.regions[{i}].store_latency.p99"),
                    "must be at least the median".into(),
                );
            }
        }
        if self.traffic.is_empty() {
            return bad("traffic".into(), "at least one stream".into());
        }
        for (i, t) in self.traffic.iter().enumerate() {
            let rates = [Some(t.rate), t.ramp_to];
            if rates.iter().flatten().any(|r| !r.is_finite() || *r < 0.0) {
                return bad(format!("traffic[{i}].rate"), "must be a rate ≥ 0".into());
            }
            if t.descriptors.is_empty() {
                return bad(format!("traffic[{i}].descriptors"), "at least one".into());
            }
            if t.callers.is_some() && (t.rate > 0.0 || t.ramp_to.is_some()) {
                return bad(
                    format!("traffic[{i}].callers"),
                    "a stream has a rate (open loop) or callers (closed loop), not both".into(),
                );
            }
            if t.callers == Some(0) {
                return bad(format!("traffic[{i}].callers"), "must be at least 1".into());
            }
            match t.keys {
                Keys::Zipf { n: 0, .. } | Keys::Uniform { n: 0 } => {
                    return bad(format!("traffic[{i}].keys.n"), "must be at least 1".into());
                }
                Keys::Zipf { s, .. } if !(s > 0.0 && s.is_finite()) => {
                    return bad(format!("traffic[{i}].keys.s"), "must be above 0".into());
                }
                _ => {}
            }
            if let Some(regions) = &t.regions {
                for r in regions {
                    if self.region(r).is_none() {
                        return bad(format!("traffic[{i}].regions"), format!("no region {r:?}"));
                    }
                }
            }
        }
        for (i, f) in self.faults.iter().enumerate() {
            let field = |name: &str| format!("faults[{i}].{name}");
            match &f.kind {
                FaultKind::StoreDown { region }
                | FaultKind::StoreStall { region }
                | FaultKind::StoreSlow { region, .. } => {
                    if self.region(region).is_none() {
                        return bad(field("region"), format!("no region {region:?}"));
                    }
                    if f.lasts.is_none() {
                        return bad(field("for"), "a store outage needs a duration".into());
                    }
                }
                FaultKind::StoreFailover { region } => {
                    if self.region(region).is_none() {
                        return bad(field("region"), format!("no region {region:?}"));
                    }
                }
                FaultKind::Crash { node } | FaultKind::Restart { node } => {
                    if self.node_index(node).is_none() {
                        return bad(field("node"), format!("no node {node:?}"));
                    }
                }
                FaultKind::LinkDuplicate { probability } if !(0.0..=1.0).contains(probability) => {
                    return bad(field("probability"), "must be in [0, 1]".into());
                }
                FaultKind::Partition {}
                | FaultKind::LinkDelay { .. }
                | FaultKind::LinkDuplicate { .. }
                | FaultKind::LinkReorder { .. } => {
                    if self.topology.regions.len() < 2 {
                        return bad(field("partition"), "needs two regions".into());
                    }
                    if f.lasts.is_none() {
                        return bad(field("for"), "a link fault needs a duration".into());
                    }
                }
                FaultKind::Rules { .. } => {}
            }
        }
        Ok(())
    }

    /// The index of region `name`.
    pub fn region(&self, name: &str) -> Option<usize> {
        self.topology.regions.iter().position(|r| r.name == name)
    }

    /// The region and index of node `name` (`<region>-<index>`).
    pub fn node_index(&self, name: &str) -> Option<(usize, usize)> {
        let (region, index) = name.rsplit_once('-')?;
        let r = self.region(region)?;
        let i: usize = index.parse().ok()?;
        (i < self.topology.regions[r].nodes).then_some((r, i))
    }
}

/// The scenario file's line (1-based) where the block scalar `yaml` starts: the first line of
/// `text` after which the block's lines follow, each indented alike. None when it cannot be
/// found (a quoted or flow string).
fn block_start(text: &str, yaml: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let wanted: Vec<&str> = yaml.lines().collect();
    let first = wanted.iter().position(|l| !l.trim().is_empty())?;
    (0..lines.len()).find_map(|at| {
        let matches = wanted[first..].iter().enumerate().all(|(k, want)| {
            lines.get(at + k).is_some_and(|got| {
                got.trim_end().ends_with(want.trim_end())
                    && (want.trim().is_empty() || got.trim() == want.trim())
            })
        });
        // The line of the block's first line, less the blank lines above it in the block.
        matches.then_some(at + 1 - first)
    })
}

#[cfg(test)]
mod tests;
