//! One run of a scenario: the real node runtime (`tollgate_node::Node`: rules, matching, key
//! actors, leases, pre-limit, breaker, fail modes, rule swaps) on the real in-memory store
//! behind a [`LinkedStore`], all on one current-thread tokio runtime with paused time.
//!
//! Time only moves when every task is waiting, so a store call of 300 µs costs no wall time;
//! every random draw comes from generators seeded from the run's seed; the clock starts at a
//! fixed instant. Nodes are called in process, as a Rust gateway linking Tollgate calls them
//! (the gRPC layer is not simulated).

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tokio::time::Instant;
use tollgate_lease::{
    Latency, LinkedStore, MemoryConfig, MemoryStore, Micros, SharedClock, Store, TokioClock,
};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::source::{self, LoadedRules};
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::rules::{FailMode, Mode};
use tollgate_node::runtime::{Outcome, Verdict};
use tollgate_node::{Node, Request, RuntimeConfig};

use tollgate_regionsync::link::PeerClient;
use tollgate_regionsync::{RegionConfig, RegionSync};

use crate::oracle::BucketOracle;
use crate::report::{self, FaultWindow, Invariant, Report, RuleReport, RuleSecond, Second};
use crate::scenario::{FaultKind, Keys, Scenario, Traffic};
use crate::wire::{self, Listeners, Wire};

/// Where the virtual clock starts: 2026-01-01T00:00:00Z (window boundaries fall where they
/// would in production).
const EPOCH: Micros = 1_767_225_600_000_000;

/// How the simulated region link names the peer, and the secret both regions share.
const PEER_URL: &str = "http://peer-region.sim";
const REGION_SECRET: &str = "simulated-region-secret";

/// The deterministic hasher for maps whose order could reach a report.
type Fixed = BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// A seed for one part of the run, derived from the run's seed.
fn derive(seed: u64, part: &str, index: u64) -> u64 {
    // FNV-1a over the part's name, mixed with the seed and index (stable across builds).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.rotate_left(17) ^ index.wrapping_mul(0x9e37);
    for b in part.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The scenario's rules don't load.
    #[error("rules: {0}")]
    Rules(String),
    /// A node did not start.
    #[error("node {node} did not start: {reason}")]
    Node {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The runtime could not be built.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Runs `scenario` with `seed`; `progress` hears each virtual second as it completes.
pub fn run(
    scenario: &Scenario,
    seed: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<Report, RunError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    runtime.block_on(simulate(scenario, seed, progress))
}

fn load_rules(yaml: &str, name: &str) -> Result<LoadedRules, RunError> {
    source::parse(yaml, std::path::Path::new(name)).map_err(|e| RunError::Rules(e.to_string()))
}

struct SimNode {
    name: String,
    region: usize,
    /// Its index within its region.
    index: usize,
    node: Option<Node>,
    /// Bumped at each crash: a request that started on an earlier life does not release its
    /// slots (its pod is gone).
    life: u64,
    /// Lease counters of earlier lives, so per-second deltas survive a restart.
    carried: (u64, u64),
    /// False once this life crashed.
    alive: Arc<AtomicBool>,
    /// The node's region-link server and its rule follower (two regions).
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct World {
    scenario: Scenario,
    seed: u64,
    clock: SharedClock,
    stores: Vec<LinkedStore>,
    nodes: Vec<SimNode>,
    rules: LoadedRules,
    /// The link between the regions, and where each region's nodes accept it (two regions).
    wire: Option<Wire>,
    listeners: Vec<Listeners>,
}

impl World {
    async fn start_node(
        &self,
        index: usize,
        life: u64,
    ) -> Result<(Node, Vec<tokio::task::JoinHandle<()>>), RunError> {
        let n = &self.nodes[index];
        let region = &self.scenario.topology.regions[n.region];
        let metrics = if self.wire.is_some() {
            Metrics::with_regions()
        } else {
            Metrics::new()
        };
        let rules = ActiveRules::new(metrics.clone());
        rules.install(&self.rules).map_err(RunError::Rules)?;
        let settings = &self.scenario.runtime;
        let mut config = RuntimeConfig {
            cluster_nodes: region.nodes as u32,
            seed: Some(derive(self.seed, &n.name, life)),
            ..RuntimeConfig::default()
        };
        if let Some(ttl) = settings.lease_ttl {
            config.lease.ttl = ttl;
            config.idle_timeout = config.idle_timeout.max(ttl * 2);
        }
        if let Some(units) = settings.lease_max_units {
            config.lease.max_units = units;
        }
        if let Some(f) = settings.prelimit_factor {
            config.prelimit_factor = (f > 0.0).then_some(f);
        }
        let failed = |reason: String| RunError::Node {
            node: n.name.clone(),
            reason,
        };
        let store = Store::Linked(self.stores[n.region].clone());
        let node = Node::start(
            store.clone(),
            rules,
            config,
            self.clock.clone(),
            metrics,
            settings.store_timeout,
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
        let Some(wire) = &self.wire else {
            return Ok((node, vec![]));
        };
        // Two regions: the node's region sync, over the simulated link to the peer region.
        let regions = &self.scenario.topology.regions;
        let peer = 1 - n.region;
        let sync = &self.scenario.topology.sync;
        let mut config =
            RegionConfig::new(&region.name, &regions[peer].name, PEER_URL, REGION_SECRET);
        config.sync_interval = sync.interval;
        config.heartbeat_interval = sync.heartbeat;
        config.liveness.failover_after = sync.failover_after;
        config.liveness.failback_after = sync.failback_after;
        config.incarnation = Some(derive(self.seed, &n.name, life));
        let client = PeerClient::over(
            wire::channel(wire.clone(), self.listeners[peer].clone()),
            PEER_URL,
            &region.name,
            REGION_SECRET,
        )
        .map_err(|e| failed(e.to_string()))?;
        let sync = RegionSync::start_over(
            config,
            client,
            store,
            node.region_host(),
            node.metrics().region.clone(),
            self.clock.clone(),
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
        let _ = node.attach_region(sync.clone());
        node.rules()
            .set_region_view(Some(sync.view()))
            .map_err(|e| failed(e.to_string()))?;
        let (accept, incoming) = tokio::sync::mpsc::unbounded_channel();
        self.listeners[n.region].set(n.index, Some(accept));
        let server = tokio::spawn(wire::serve(wire.clone(), sync.service(), incoming));
        let follow = tokio::spawn({
            let node = node.clone();
            async move { node.follow_region_view().await }
        });
        Ok((node, vec![server, follow]))
    }

    fn now(&self) -> u64 {
        self.clock.now_micros()
    }
}

/// What the run has seen so far, shared by the request tasks.
#[derive(Default)]
struct Tally {
    /// Each region's bucket (region, rule definition, identity): the bound and the real view.
    buckets: HashMap<BucketId, BucketOracle, Fixed>,
    /// The exact limiter over both regions (rule key, identity), on the rule's whole limit.
    exact: HashMap<(String, Vec<u8>), BucketOracle, Fixed>,
    rule_names: HashMap<u64, String, Fixed>,
    /// Each definition's bucket name (definitions of one rule share the store's bucket).
    rule_keys: HashMap<u64, String, Fixed>,
    /// Rules counted but never enforced (SHADOW): no bound, no false denials.
    shadow: std::collections::HashSet<u64, Fixed>,
    rules: BTreeMap<String, RuleReport>,
    second: BTreeMap<String, RuleSecond>,
    decisions: u64,
    second_decisions: u64,
    /// Admitted this second, per region.
    region_admitted: BTreeMap<usize, u64>,
    split_breaches: Vec<String>,
    admitted: u64,
    latency: Vec<u64>,
    fail_mode_breaches: Vec<String>,
    latency_breaches: u64,
    longest: u64,
}

/// One request's traffic stream, ready to draw keys.
struct Stream {
    traffic: Traffic,
    zipf: Option<Zipf<f64>>,
    carry: f64,
    next_new: u64,
    nodes: Vec<usize>,
}

impl Stream {
    fn rate_at(&self, t: Duration) -> f64 {
        let from = self.traffic.from.unwrap_or(Duration::ZERO);
        if t < from || self.traffic.until.is_some_and(|u| t >= u) {
            return 0.0;
        }
        match (self.traffic.ramp_to, self.traffic.until) {
            (Some(to), Some(until)) if until > from => {
                let f = (t - from).as_secs_f64() / (until - from).as_secs_f64();
                self.traffic.rate + (to - self.traffic.rate) * f
            }
            _ => self.traffic.rate,
        }
    }

    fn key(&mut self, rng: &mut StdRng) -> u64 {
        match &self.traffic.keys {
            Keys::Hot => 0,
            Keys::Uniform { n } => rng.random_range(0..*n),
            Keys::Zipf { .. } => self.zipf.as_ref().map_or(0, |z| z.sample(rng) as u64 - 1),
            Keys::New => {
                self.next_new += 1;
                self.next_new
            }
        }
    }

    fn request(&self, key: u64) -> Request {
        let key = format!("k{key}");
        let mut request = Request::new(self.traffic.domain.clone()).cost(self.traffic.cost);
        for d in &self.traffic.descriptors {
            request =
                request.descriptor(d.iter().map(|(k, v)| (k.clone(), v.replace("{key}", &key))));
        }
        request
    }
}

async fn simulate(
    scenario: &Scenario,
    seed: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<Report, RunError> {
    let clock: SharedClock = Arc::new(TokioClock::starting_at(EPOCH));
    let rules = load_rules(&scenario.rules, "<scenario rules>")?;
    let stores = scenario
        .topology
        .regions
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let store = LinkedStore::new(
                MemoryStore::with_clock(
                    clock.clone(),
                    MemoryConfig {
                        id_seed: Some(derive(seed, "ids", i as u64)),
                        ..MemoryConfig::default()
                    },
                ),
                Latency {
                    median: r.store_latency.median,
                    p99: r.store_latency.p99,
                },
                derive(seed, "store", i as u64),
            );
            store.keep_ledger();
            store
        })
        .collect();
    let mut nodes = vec![];
    for (r, region) in scenario.topology.regions.iter().enumerate() {
        for i in 0..region.nodes {
            nodes.push(SimNode {
                name: format!("{}-{i}", region.name),
                region: r,
                index: i,
                node: None,
                life: 0,
                carried: (0, 0),
                alive: Arc::new(AtomicBool::new(true)),
                tasks: vec![],
            });
        }
    }
    let mut world = World {
        scenario: scenario.clone(),
        seed,
        clock,
        stores,
        nodes,
        rules,
        wire: (scenario.topology.regions.len() == 2)
            .then(|| Wire::new(scenario.topology.link_latency, derive(seed, "wire", 0))),
        listeners: scenario
            .topology
            .regions
            .iter()
            .map(|r| Listeners::new(r.nodes))
            .collect(),
    };
    for i in 0..world.nodes.len() {
        let (node, tasks) = world.start_node(i, 0).await?;
        world.nodes[i].node = Some(node);
        world.nodes[i].tasks = tasks;
    }

    let mut rng = StdRng::seed_from_u64(derive(seed, "traffic", 0));
    let mut streams: Vec<Stream> = scenario
        .traffic
        .iter()
        .map(|t| Stream {
            zipf: match t.keys {
                Keys::Zipf { n, s } => Zipf::new(n as f64, s).ok(),
                _ => None,
            },
            carry: 0.0,
            next_new: 0,
            nodes: (0..world.nodes.len())
                .filter(|&i| {
                    t.regions.as_ref().is_none_or(|rs| {
                        rs.iter()
                            .any(|r| scenario.region(r) == Some(world.nodes[i].region))
                    })
                })
                .collect(),
            traffic: t.clone(),
        })
        .collect();

    // Fault events in time order: starts, and the ends of faults that last.
    let mut events: Vec<(Duration, usize, bool)> = vec![];
    for (i, f) in scenario.faults.iter().enumerate() {
        events.push((f.at, i, true));
        if let Some(d) = f.lasts {
            events.push((f.at + d, i, false));
        }
    }
    events.sort_by_key(|&(t, i, start)| (t, !start, i));
    let mut next_event = 0;
    let windows: Vec<FaultWindow> = scenario
        .faults
        .iter()
        .map(|f| FaultWindow {
            label: f.kind.label(),
            from: f.at.as_secs_f64(),
            until: (f.at + f.lasts.unwrap_or_default()).as_secs_f64(),
        })
        .collect();

    let tally = Arc::new(Mutex::new(Tally::default()));
    let budget = decision_budget(scenario);
    let start = Instant::now();
    let tick = scenario.tick;
    let ticks = (scenario.duration.as_micros() / tick.as_micros()) as u64;
    let ticks_per_second = (1_000_000 / tick.as_micros()).max(1) as u64;
    let mut per_second: Vec<Second> = vec![];
    let mut last_calls = 0u64;
    let mut last_leases = (0u64, 0u64);
    let mut in_flight = tokio::task::JoinSet::new();

    for n in 0..ticks {
        let t = tick * n as u32;
        tokio::time::sleep_until(start + t).await;
        while next_event < events.len() && events[next_event].0 <= t {
            let (_, i, begins) = events[next_event];
            next_event += 1;
            apply_fault(&mut world, &scenario.faults[i].kind, begins).await?;
        }
        for stream in &mut streams {
            stream.carry += stream.rate_at(t) * tick.as_secs_f64();
            let due = stream.carry.floor();
            stream.carry -= due;
            for _ in 0..due as u64 {
                let live: Vec<usize> = stream
                    .nodes
                    .iter()
                    .copied()
                    .filter(|&i| world.nodes[i].node.is_some())
                    .collect();
                if live.is_empty() {
                    break;
                }
                let target = live[rng.random_range(0..live.len())];
                let key = stream.key(&mut rng);
                let request = stream.request(key);
                let sim = &world.nodes[target];
                let Some(node) = sim.node.clone() else {
                    continue;
                };
                let job = Job {
                    node,
                    request,
                    hold: stream.traffic.hold,
                    region: sim.region,
                    alive: sim.alive.clone(),
                    clock: world.clock.clone(),
                    tally: tally.clone(),
                    failovers: world.stores[sim.region].link().failovers(),
                    budget,
                };
                in_flight.spawn(job.run());
            }
        }
        // Reap finished requests now and then, so the set stays small.
        while in_flight.try_join_next().is_some() {}
        if (n + 1) % ticks_per_second == 0 {
            let calls: u64 = world.stores.iter().map(|s| s.link().calls().total()).sum();
            let leases = lease_units(&world);
            let actors: u64 = world
                .nodes
                .iter()
                .filter_map(|n| n.node.as_ref())
                .map(|n| n.held().0 as u64)
                .sum();
            let regions = region_second(&world, &tally, per_second.len());
            let mut t = tally.lock();
            per_second.push(Second {
                t: per_second.len() as u64,
                decisions: std::mem::take(&mut t.second_decisions),
                store_calls: calls - last_calls,
                lease_units_acquired: leases.0 - last_leases.0,
                lease_units_returned: leases.1 - last_leases.1,
                key_actors: actors,
                rules: std::mem::take(&mut t.second),
                regions,
            });
            last_calls = calls;
            last_leases = leases;
            drop(t);
            progress(per_second.len() as u64);
        }
    }
    // Let the last requests finish.
    while in_flight.join_next().await.is_some() {}

    let end = world.now();
    let mut tally = Arc::try_unwrap(tally)
        .map(Mutex::into_inner)
        .unwrap_or_else(|shared| std::mem::take(&mut *shared.lock()));
    let store_calls: u64 = world.stores.iter().map(|s| s.link().calls().total()).sum();
    let refused: u64 = world
        .stores
        .iter()
        .map(|s| {
            s.link()
                .calls()
                .refused
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    let mut invariants = vec![];
    invariants.push(bound_invariant(&mut tally, &world, end));
    invariants.push(ledger_invariant(&tally, &world));
    for r in tally.rules.values_mut() {
        r.overshoot = r.decided.admitted.saturating_sub(r.exact);
    }
    // Distinct identities per rule, both regions and every definition together.
    let mut identities: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen: std::collections::HashSet<(&str, &[u8]), Fixed> = Default::default();
    for (_, uid, identity) in tally.buckets.keys() {
        if let Some(name) = tally.rule_names.get(uid)
            && seen.insert((name.as_str(), identity.as_slice()))
        {
            *identities.entry(name.clone()).or_default() += 1;
        }
    }
    for (name, n) in identities {
        tally.rules.entry(name).or_default().identities = n;
    }
    invariants.push(Invariant {
        name: "each fail mode is honoured while the store is down".into(),
        held: tally.fail_mode_breaches.is_empty(),
        detail: if tally.fail_mode_breaches.is_empty() {
            "every fail-open admitted, every fail-closed denied, each by a rule of that fail mode"
                .into()
        } else {
            first_few(&tally.fail_mode_breaches)
        },
    });
    if world.wire.is_some() {
        invariants.push(Invariant {
            name: "SPLIT shares sum to at most the limit while the regions see each other".into(),
            held: tally.split_breaches.is_empty(),
            detail: if tally.split_breaches.is_empty() {
                "checked every second".into()
            } else {
                first_few(&tally.split_breaches)
            },
        });
    }
    invariants.push(Invariant {
        name: format!(
            "no decision waits longer than the store budget ({} µs)",
            budget.as_micros()
        ),
        held: tally.latency_breaches == 0,
        detail: format!(
            "{} decisions over; the longest took {} µs",
            tally.latency_breaches, tally.longest
        ),
    });
    tally.latency.sort_unstable();
    let pct = |q: f64| {
        tally
            .latency
            .get(
                ((tally.latency.len() as f64 * q) as usize)
                    .min(tally.latency.len().saturating_sub(1)),
            )
            .copied()
            .unwrap_or(0)
    };
    let latency_us = report::Latency {
        p50: pct(0.5),
        p99: pct(0.99),
        p999: pct(0.999),
        max: tally.latency.last().copied().unwrap_or(0),
    };
    for node in world.nodes.iter().filter_map(|n| n.node.as_ref()) {
        node.crash();
    }
    Ok(Report {
        scenario: scenario.name.clone(),
        seed,
        seconds: per_second.len() as u64,
        nodes: world.nodes.len(),
        decisions: tally.decisions,
        admitted: tally.admitted,
        store_calls,
        store_calls_per_decision: if tally.decisions == 0 {
            0.0
        } else {
            store_calls as f64 / tally.decisions as f64
        },
        store_refused: refused,
        latency_us,
        rules: tally.rules,
        per_second,
        faults: windows,
        invariants,
    })
}

/// This second's figures per region, and the SPLIT check.
fn region_second(
    world: &World,
    tally: &Mutex<Tally>,
    second: usize,
) -> BTreeMap<String, crate::report::RegionSecond> {
    let mut out = BTreeMap::new();
    if world.wire.is_none() {
        return out;
    }
    let mut admitted = std::mem::take(&mut tally.lock().region_admitted);
    let mut sample: Vec<Option<&Node>> = vec![None; world.stores.len()];
    for (r, region) in world.scenario.topology.regions.iter().enumerate() {
        let mut figures = crate::report::RegionSecond {
            admitted: admitted.remove(&r).unwrap_or(0),
            ..Default::default()
        };
        for n in world.nodes.iter().filter(|n| n.region == r) {
            let Some(node) = &n.node else { continue };
            sample[r].get_or_insert(node);
            if let Some(sync) = node.region() {
                let status = sync.status();
                figures.peer_up += u64::from(status.peer_up);
                if let Some(lag) = status.lag_ms {
                    figures.lag_ms = Some(figures.lag_ms.unwrap_or(0).max(lag));
                }
            }
        }
        out.insert(region.name.clone(), figures);
    }
    // SPLIT: while a node of each region sees the other up, their shares fit in the limit.
    if let [Some(a), Some(b)] = sample[..] {
        let up = |n: &Node| n.region().is_some_and(|r| r.status().peer_up);
        if up(a) && up(b) {
            let (ra, rb) = (a.rules().load(), b.rules().load());
            for x in ra.rules() {
                let Some(whole) = x.whole else { continue };
                if x.placement.role != tollgate_regionsync::policy::Role::Local {
                    continue;
                }
                let Some(y) = rb.rules().iter().find(|y| y.id == x.id) else {
                    continue;
                };
                let (Some(la), Some(lb)) = (x.limit(), y.limit()) else {
                    continue;
                };
                if la.capacity() + lb.capacity() > whole.capacity() {
                    tally.lock().split_breaches.push(format!(
                        "second {second}: rule {} shares {} + {} over its limit {}",
                        x.id,
                        la.capacity(),
                        lb.capacity(),
                        whole.capacity()
                    ));
                }
            }
        }
    }
    out
}

fn first_few(items: &[String]) -> String {
    let mut out: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
    let more;
    if items.len() > 5 {
        more = format!("and {} more", items.len() - 5);
        out.push(&more);
    }
    out.join("; ")
}

/// The longest a decision may take: a lease acquisition's patience or a store call's budget,
/// whichever is longer, plus one store call and the key actor's margin (20 ms).
fn decision_budget(scenario: &Scenario) -> Duration {
    let patience = RuntimeConfig::default().store_patience;
    let call = scenario.runtime.store_timeout;
    patience.max(call) + call + Duration::from_millis(20)
}

fn lease_units(world: &World) -> (u64, u64) {
    let mut total = (0, 0);
    for n in &world.nodes {
        total.0 += n.carried.0;
        total.1 += n.carried.1;
        if let Some(node) = &n.node {
            let m = node.metrics();
            total.0 += m.lease_units_acquired.get();
            total.1 += m.lease_units_returned.get();
        }
    }
    total
}

async fn apply_fault(world: &mut World, fault: &FaultKind, begins: bool) -> Result<(), RunError> {
    use tollgate_lease::LinkCondition;
    let region_of = |world: &World, name: &str| world.scenario.region(name).unwrap_or(0);
    match fault {
        FaultKind::StoreDown { region }
        | FaultKind::StoreStall { region }
        | FaultKind::StoreSlow { region, .. } => {
            let r = region_of(world, region);
            let condition = match (begins, fault) {
                (false, _) => LinkCondition::Up,
                (true, FaultKind::StoreDown { .. }) => LinkCondition::Down,
                (true, FaultKind::StoreStall { .. }) => LinkCondition::Stalled,
                (true, FaultKind::StoreSlow { latency, .. }) => LinkCondition::Slow(*latency),
                (true, _) => LinkCondition::Up,
            };
            world.stores[r].link().set_condition(condition);
        }
        FaultKind::StoreFailover { region } if begins => {
            let r = region_of(world, region);
            world.stores[r].fail_over();
        }
        FaultKind::Rules { yaml } if begins => {
            world.rules = load_rules(yaml, "<rules fault>")?;
            for n in world.nodes.iter().filter_map(|n| n.node.as_ref()) {
                n.rules().install(&world.rules).map_err(RunError::Rules)?;
            }
        }
        FaultKind::Crash { node } if begins => {
            if let Some((r, i)) = world.scenario.node_index(node) {
                let index = node_slot(world, r, i);
                let sim = &mut world.nodes[index];
                if let Some(n) = sim.node.take() {
                    let m = n.metrics();
                    sim.carried.0 += m.lease_units_acquired.get();
                    sim.carried.1 += m.lease_units_returned.get();
                    n.crash();
                    if let Some(region) = n.region() {
                        region.kill();
                    }
                    for task in sim.tasks.drain(..) {
                        task.abort();
                    }
                    world.listeners[r].set(i, None);
                    sim.alive.store(false, std::sync::atomic::Ordering::Relaxed);
                    sim.life += 1;
                }
            }
        }
        FaultKind::Restart { node } if begins => {
            if let Some((r, i)) = world.scenario.node_index(node) {
                let index = node_slot(world, r, i);
                if world.nodes[index].node.is_none() {
                    let life = world.nodes[index].life;
                    let (n, tasks) = world.start_node(index, life).await?;
                    world.nodes[index].node = Some(n);
                    world.nodes[index].tasks = tasks;
                    world.nodes[index].alive = Arc::new(AtomicBool::new(true));
                }
            }
        }
        FaultKind::Partition {} => {
            if let Some(wire) = &world.wire {
                wire.partition(begins);
            }
        }
        FaultKind::LinkDuplicate { probability } => {
            if let Some(wire) = &world.wire {
                wire.set_duplicate(if begins { *probability } else { 0.0 });
            }
        }
        FaultKind::LinkReorder { max_delay } => {
            if let Some(wire) = &world.wire {
                wire.set_reorder(if begins { *max_delay } else { Duration::ZERO });
            }
        }
        FaultKind::LinkDelay { latency } => {
            if let Some(wire) = &world.wire {
                wire.set_latency(if begins {
                    *latency
                } else {
                    world.scenario.topology.link_latency
                });
            }
        }
        _ => {}
    }
    Ok(())
}

fn node_slot(world: &World, region: usize, index: usize) -> usize {
    world
        .scenario
        .topology
        .regions
        .iter()
        .take(region)
        .map(|r| r.nodes)
        .sum::<usize>()
        + index
}

fn bound_invariant(tally: &mut Tally, world: &World, end: u64) -> Invariant {
    let mut breaches = vec![];
    let mut keys: Vec<&BucketId> = tally.buckets.keys().collect();
    keys.sort();
    let mut worst: BTreeMap<String, f64> = BTreeMap::new();
    let mut unanswered = 0;
    for key in keys {
        if tally.shadow.contains(&key.1) {
            continue;
        }
        let oracle = &tally.buckets[key];
        if oracle.failed_over_to_fail_mode {
            unanswered += 1;
            continue;
        }
        let failovers = world.stores[key.0].link().failovers();
        let bound = oracle.bound(end, failovers);
        let measured = oracle.measured();
        let rule = oracle_rule(tally, key);
        let use_ = if bound == 0 {
            0.0
        } else {
            measured as f64 / bound as f64
        };
        let w = worst.entry(rule.clone()).or_insert(0.0);
        *w = w.max(use_);
        if measured > bound {
            breaches.push(format!(
                "rule {rule} identity {:?}: {measured} admitted, bound {bound}",
                String::from_utf8_lossy(&key.2)
            ));
        }
    }
    for (rule, w) in worst {
        if let Some(r) = tally.rules.get_mut(&rule) {
            r.worst_bound_use = (w * 1000.0).round() / 1000.0;
        }
    }
    Invariant {
        name:
            "admitted ≤ the exact bound of each limit, for every bucket the store always answered"
                .into(),
        held: breaches.is_empty(),
        detail: if breaches.is_empty() {
            format!(
                "{} buckets checked; {unanswered} not, because a decision of theirs went to a fail mode",
                tally.buckets.len() - unanswered
            )
        } else {
            first_few(&breaches)
        },
    }
}

/// No bucket spent more than its store handed out: per region, rule and identity, the units
/// admitted on the store's answers are at most what checks admitted and leases granted there,
/// less what returns credited. The rest was handed out and never spent or returned.
fn ledger_invariant(tally: &Tally, world: &World) -> Invariant {
    let mut spent: BTreeMap<(usize, &str, &[u8]), u64> = BTreeMap::new();
    for ((region, uid, identity), o) in &tally.buckets {
        if tally.shadow.contains(uid) || o.is_concurrency() {
            continue;
        }
        if let Some(key) = tally.rule_keys.get(uid) {
            *spent
                .entry((*region, key.as_str(), identity.as_slice()))
                .or_default() += o.store_backed();
        }
    }
    let (mut breaches, mut unspent, mut checked) = (vec![], 0u64, 0usize);
    for ((region, key, identity), units) in spent {
        let Ok(bucket) = tollgate_lease::BucketKey::new(identity, key) else {
            continue;
        };
        let Some(ledger) = world.stores[region].link().ledger_of(bucket.as_str()) else {
            continue;
        };
        checked += 1;
        let handed = ledger.handed.saturating_sub(ledger.credited);
        if units > handed {
            breaches.push(format!(
                "{bucket}: {units} spent, {} handed out and {} credited back",
                ledger.handed, ledger.credited
            ));
        } else {
            unspent += handed - units;
        }
    }
    Invariant {
        name: "leased units are conserved: no bucket spends more than its store handed out".into(),
        held: breaches.is_empty(),
        detail: if breaches.is_empty() {
            format!(
                "{checked} buckets; {unspent} units handed out were neither spent nor returned (expired in leases, held by crashed pods, or checks that ran after their caller gave up)"
            )
        } else {
            first_few(&breaches)
        },
    }
}

/// A region's bucket: region, rule definition, identity.
type BucketId = (usize, u64, Vec<u8>);

/// The key (bucket name) of the charged rule with definition `uid`.
fn key_of(charges: &[tollgate_node::runtime::Charge], uid: u64) -> String {
    charges
        .iter()
        .find(|c| c.rule.uid == uid)
        .map(|c| c.rule.key.clone())
        .unwrap_or_default()
}

/// The rule id a bucket belongs to (kept beside the oracle).
fn oracle_rule(tally: &Tally, key: &BucketId) -> String {
    tally
        .rule_names
        .get(&key.1)
        .cloned()
        .unwrap_or_else(|| key.0.to_string())
}

struct Job {
    node: Node,
    request: Request,
    hold: Option<Duration>,
    region: usize,
    alive: Arc<AtomicBool>,
    clock: SharedClock,
    tally: Arc<Mutex<Tally>>,
    failovers: u64,
    budget: Duration,
}

impl Job {
    async fn run(self) {
        let charges = match self.node.charges(&self.request) {
            Ok(c) => c,
            Err(_) => return,
        };
        let arrived = self.node_now();
        {
            // The exact limiter sees every request as it arrives, and decides it whole: admitted
            // when every enforced rule has room, and then charged at each.
            let mut t = self.tally.lock();
            let mut fits_all = true;
            for c in &charges {
                let Some(limit) = c.rule.limit() else {
                    continue;
                };
                if c.rule.mode != Mode::Enforce {
                    t.shadow.insert(c.rule.uid);
                }
                t.rule_names
                    .entry(c.rule.uid)
                    .or_insert_with(|| c.rule.id.clone());
                t.rule_keys
                    .entry(c.rule.uid)
                    .or_insert_with(|| c.rule.key.clone());
                t.buckets
                    .entry((self.region, c.rule.uid, c.identity.clone()))
                    .or_insert_with(|| BucketOracle::new(limit, arrived, self.failovers));
                let whole = c.rule.whole.unwrap_or(limit);
                let oracle = t
                    .exact
                    .entry((c.rule.key.clone(), c.identity.clone()))
                    .or_insert_with(|| BucketOracle::new(whole, arrived, 0));
                if c.rule.mode == Mode::Enforce && !oracle.fits(arrived, c.cost) {
                    fits_all = false;
                }
            }
            if fits_all {
                for c in &charges {
                    let key = (c.rule.key.clone(), c.identity.clone());
                    if let Some(oracle) = t.exact.get_mut(&key) {
                        oracle.ideal_take(arrived, c.cost);
                        let id = c.rule.id.clone();
                        t.rules.entry(id.clone()).or_default().exact += 1;
                        t.second.entry(id).or_default().exact += 1;
                    }
                }
            }
        }
        let started = Instant::now();
        let Ok(verdict) = self.node.check(&self.request).await else {
            return;
        };
        let took = started.elapsed().as_micros() as u64;
        let decided = self.node_now();
        let held_costs = self.record(&charges, &verdict, decided, took);
        if let (Some(hold), false) = (self.hold, verdict.slots.is_empty()) {
            tokio::time::sleep(hold).await;
            // A request whose pod crashed meanwhile is gone with it: nothing releases its slots.
            if self.node_alive() {
                let _ = self.node.release_slots(&verdict.slots).await;
            }
            let mut t = self.tally.lock();
            for (uid, identity, cost) in held_costs {
                if let Some(o) = t.buckets.get_mut(&(self.region, uid, identity.clone())) {
                    o.released(cost);
                }
                if let Some(o) = t.exact.get_mut(&(key_of(&charges, uid), identity)) {
                    o.released(cost);
                }
            }
        }
    }

    fn node_now(&self) -> u64 {
        // The nodes and the stores share this one clock.
        self.clock.now_micros()
    }

    fn node_alive(&self) -> bool {
        self.alive.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts the verdict; returns the concurrency units it holds.
    fn record(
        &self,
        charges: &[tollgate_node::runtime::Charge],
        verdict: &Verdict,
        now: u64,
        took: u64,
    ) -> Vec<(u64, Vec<u8>, u64)> {
        let mut held = vec![];
        let mut t = self.tally.lock();
        t.decisions += 1;
        t.second_decisions += 1;
        if verdict.allowed {
            t.admitted += 1;
            *t.region_admitted.entry(self.region).or_default() += 1;
        }
        t.latency.push(took);
        t.longest = t.longest.max(took);
        if took > self.budget.as_micros() as u64 {
            t.latency_breaches += 1;
        }
        for status in &verdict.statuses {
            let Some(outcome) = status.outcome else {
                continue;
            };
            let rule = &status.rule;
            let id = rule.id.clone();
            let charge = charges.iter().find(|c| c.rule.uid == rule.uid);
            let mut breach = None;
            match outcome {
                Outcome::FailedOpen if !(status.allowed && rule.fail_mode == FailMode::Open) => {
                    breach = Some("failed open");
                }
                Outcome::FailedClosed if status.allowed || rule.fail_mode != FailMode::Closed => {
                    breach = Some("failed closed");
                }
                Outcome::LocalFallback if rule.fail_mode != FailMode::Local => {
                    breach = Some("local fallback");
                }
                _ => {}
            }
            if let Some(what) = breach {
                let line = format!(
                    "rule {id} ({:?} fail mode) {what}, allowed {}",
                    rule.fail_mode, status.allowed
                );
                t.fail_mode_breaches.push(line);
            }
            // A rule that would admit a request another rule denied charged nothing.
            let own = outcome;
            let outcome = match outcome {
                Outcome::Allowed if !verdict.allowed => Outcome::Denied,
                other => other,
            };
            let r = t.rules.entry(id.clone()).or_default();
            if status.on_last_answer {
                r.on_last_answer += 1;
            }
            if outcome == Outcome::ShadowDenied {
                r.shadow_denied += 1;
            }
            r.decided.count(outcome, status.allowed);
            t.second
                .entry(id.clone())
                .or_default()
                .decided
                .count(outcome, status.allowed);
            let (Some(charge), Mode::Enforce) = (charge, rule.mode) else {
                continue;
            };
            let key = (self.region, rule.uid, charge.identity.clone());
            let mut false_denial = false;
            if let Some(o) = t.buckets.get_mut(&key) {
                if status.on_last_answer
                    || matches!(
                        own,
                        Outcome::FailedOpen | Outcome::FailedClosed | Outcome::LocalFallback
                    )
                {
                    o.failed_over_to_fail_mode = true;
                }
                if verdict.allowed {
                    // The bound and the ledger cover what the store decided: not fail-open,
                    // LOCAL or the store's last answer.
                    let from_store = !status.on_last_answer
                        && !matches!(outcome, Outcome::FailedOpen | Outcome::LocalFallback);
                    o.admitted(now, charge.cost, from_store);
                    if status
                        .limit
                        .is_some_and(|l| l.algorithm() == tollgate_lease::Algorithm::Concurrency)
                    {
                        held.push((key.1, key.2.clone(), charge.cost));
                    }
                }
            }
            // False denials are judged on the whole limit, fed what both regions admitted.
            if let Some(g) = t
                .exact
                .get_mut(&(rule.key.clone(), charge.identity.clone()))
            {
                if verdict.allowed {
                    g.admitted(now, charge.cost, false);
                } else if own == Outcome::Denied && g.denied(now, charge.cost) {
                    false_denial = true;
                }
            }
            if false_denial {
                t.rules.entry(id.clone()).or_default().false_denials += 1;
                t.second.entry(id).or_default().false_denials += 1;
            }
        }
        held
    }
}
