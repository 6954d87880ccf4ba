//! The simulated world: the regions' stores, the nodes (each life of each pod, with its region
//! link) and the faults that strike them.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tollgate_lease::{
    Latency, LinkedStore, MemoryConfig, MemoryStore, NodeCpu, Setup, SharedClock, Store, TokioClock,
};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::source::{self, LoadedRules};
use tollgate_node::rules::watch::ActiveRules;
use tollgate_node::{Node, RuntimeConfig};

use tollgate_regionsync::link::PeerClient;
use tollgate_regionsync::{RegionConfig, RegionSync};

use crate::scenario::{FaultKind, Scenario};
use crate::wire::{self, Listeners, Wire};

/// How the simulated region link names the peer, and the secret both regions share.
const PEER_URL: &str = "http://peer-region.sim";
const REGION_SECRET: &str = "simulated-region-secret";

/// A seed for one part of the run, derived from the run's seed.
pub(super) fn derive(seed: u64, part: &str, index: u64) -> u64 {
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

pub(crate) fn load_rules(yaml: &str, name: &str) -> Result<LoadedRules, RunError> {
    source::parse(yaml, std::path::Path::new(name)).map_err(|e| RunError::Rules(e.to_string()))
}

pub(super) struct SimNode {
    pub(super) name: String,
    pub(super) region: usize,
    /// Its index within its region.
    pub(super) index: usize,
    pub(super) node: Option<Node>,
    /// Bumped at each crash: a request that started on an earlier life does not release its
    /// slots (its pod is gone).
    pub(super) life: u64,
    /// Lease counters of earlier lives, so per-second deltas survive a restart.
    pub(super) carried: (u64, u64),
    /// False once this life crashed.
    pub(super) alive: Arc<AtomicBool>,
    /// The node's region-link server and its rule follower (two regions).
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    /// This life's CPU (None: the scenario models none).
    pub(super) cpu: Option<Arc<NodeCpu>>,
}

pub(super) struct World {
    pub(super) scenario: Scenario,
    pub(super) seed: u64,
    pub(super) clock: SharedClock,
    pub(super) stores: Vec<LinkedStore>,
    pub(super) nodes: Vec<SimNode>,
    pub(super) rules: LoadedRules,
    /// The link between the regions, and where each region's nodes accept it (two regions).
    pub(super) wire: Option<Wire>,
    pub(super) listeners: Vec<Listeners>,
}

impl World {
    /// Starts life `life` of node `index`: its CPU, its session on its region's store, the
    /// node (warmed up as `tollgate` does, unless the scenario says not), its region link.
    pub(super) async fn start_node(
        &self,
        index: usize,
        life: u64,
    ) -> Result<(Node, Vec<tokio::task::JoinHandle<()>>, Option<Arc<NodeCpu>>), RunError> {
        let n = &self.nodes[index];
        let region = &self.scenario.topology.regions[n.region];
        let metrics = if self.wire.is_some() {
            Metrics::with_regions()
        } else {
            Metrics::new()
        };
        let rules = ActiveRules::new(metrics.clone());
        rules
            .install(&self.rules)
            .map_err(|e| RunError::Rules(e.to_string()))?;
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
        let cpu = settings
            .cpu
            .map(|c| Arc::new(NodeCpu::new(c.cores, c.per_store_answer)));
        let setup = Setup {
            connect: region.store_setup.connect,
            reconnect: region.store_setup.reconnect,
            script_load: region.store_setup.script_load,
        };
        let store = Store::Linked(self.stores[n.region].for_node(setup, cpu.clone()));
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
        if settings.warm_up {
            node.warm_up().await;
        }
        let Some(wire) = &self.wire else {
            return Ok((node, vec![], cpu));
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
            node.region().host(),
            node.metrics().region.clone(),
            self.clock.clone(),
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
        let _ = node.region().attach(sync.clone());
        node.rules()
            .set_region_view(Some(sync.view()))
            .map_err(|e| failed(e.to_string()))?;
        let (accept, incoming) = tokio::sync::mpsc::unbounded_channel();
        self.listeners[n.region].set(n.index, Some(accept));
        let server = tokio::spawn(wire::serve(wire.clone(), sync.service(), incoming));
        let follow = tokio::spawn({
            let node = node.clone();
            async move { node.region().follow_view().await }
        });
        Ok((node, vec![server, follow], cpu))
    }

    pub(super) fn now(&self) -> u64 {
        self.clock.now_micros()
    }
}

pub(super) async fn apply_fault(
    world: &mut World,
    fault: &FaultKind,
    begins: bool,
) -> Result<(), RunError> {
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
                n.rules()
                    .install(&world.rules)
                    .map_err(|e| RunError::Rules(e.to_string()))?;
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
                    if let Some(region) = n.region().link() {
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
                    let (n, tasks, cpu) = world.start_node(index, life).await?;
                    world.nodes[index].node = Some(n);
                    world.nodes[index].tasks = tasks;
                    world.nodes[index].cpu = cpu;
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

/// The region a fault strikes the store of, and whether it lasts until its end (a stall, an
/// outage, a slowdown) rather than striking once (a failover).
pub(super) fn store_fault(world: &World, fault: &FaultKind) -> Option<(usize, bool)> {
    let region = |name: &str| world.scenario.region(name).unwrap_or(0);
    match fault {
        FaultKind::StoreDown { region: r }
        | FaultKind::StoreStall { region: r }
        | FaultKind::StoreSlow { region: r, .. } => Some((region(r), true)),
        FaultKind::StoreFailover { region: r } => Some((region(r), false)),
        _ => None,
    }
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

impl World {
    /// The stores and nodes of `scenario`, every node started (and its store warmed up) at
    /// once, as a deployment's pods do.
    pub(super) async fn build(scenario: &Scenario, seed: u64) -> Result<World, RunError> {
        let clock: SharedClock = Arc::new(TokioClock::starting_at(super::EPOCH));
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
                            max_bytes: r
                                .store_memory_mb
                                .map_or(tollgate_lease::DEFAULT_MEMORY_MAX_BYTES, |mb| mb << 20),
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
                store.memory().keep_eviction_record();
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
                    cpu: None,
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
        // Each region's store is swept of expired keys every 5 s, once (its nodes share it).
        for store in &world.stores {
            let memory = store.memory().clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
                loop {
                    tick.tick().await;
                    memory.purge_expired();
                }
            });
        }
        // Every node starts (and warms its store up) at once, as a deployment's pods do.
        let started =
            futures::future::join_all((0..world.nodes.len()).map(|i| world.start_node(i, 0))).await;
        for (i, started) in started.into_iter().enumerate() {
            let (node, tasks, cpu) = started?;
            world.nodes[i].node = Some(node);
            world.nodes[i].tasks = tasks;
            world.nodes[i].cpu = cpu;
        }
        Ok(world)
    }
}
