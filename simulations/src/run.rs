//! One run of a scenario: the real node runtime (`tollgate_node::Node`: rules, matching, key
//! actors, leases, pre-limit, breaker, fail modes, rule swaps) on the real in-memory store
//! behind a [`LinkedStore`], all on one current-thread tokio runtime with paused time.
//!
//! Time only moves when every task is waiting, so a store call of 300 µs costs no wall time;
//! every random draw comes from generators seeded from the run's seed; the clock starts at a
//! fixed instant. Nodes are called in process, as a Rust gateway linking Tollgate calls them
//! (the gRPC layer is not simulated).
//!
//! # Layout
//! - `world`: the stores, the nodes and their lives, and the faults that strike them.
//! - `traffic`: each stream's rate and keys, and each request sent and counted.
//! - `tally`: the run's books, each region's buckets and the exact limiter over both.
//! - `invariants`: what the run checks at its end against the tally.
//! - here: the loop, one tick at a time, the figures of each second and the report.

mod invariants;
mod tally;
mod traffic;
mod world;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tollgate_lease::Micros;
use tollgate_node::{Node, RuntimeConfig};

use crate::report::{self, FaultWindow, Report, Second};
use crate::scenario::Scenario;
use tally::Tally;
use traffic::{Caller, Job, Stream};
use world::{World, apply_fault, derive};

pub(crate) use traffic::stream_request;
pub use world::RunError;
pub(crate) use world::load_rules;

/// Where the virtual clock starts: 2026-01-01T00:00:00Z (window boundaries fall where they
/// would in production).
const EPOCH: Micros = 1_767_225_600_000_000;

/// How often (virtual seconds) the books drop what has long been idle.
const RETIRE_EVERY_SECONDS: usize = 5;

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

async fn simulate(
    scenario: &Scenario,
    seed: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<Report, RunError> {
    let findings = crate::lint::findings(scenario).await?;
    let mut world = World::build(scenario, seed).await?;

    let mut rng = StdRng::seed_from_u64(derive(seed, "traffic", 0));
    let mut streams = Stream::all(scenario, &world);

    let (events, windows) = fault_schedule(scenario);
    let mut next_event = 0;

    let tally = Arc::new(Mutex::new(Tally::default()));
    let budget = decision_budget(scenario);
    let books = Books {
        tally: tally.clone(),
        budget,
        per_decision: scenario
            .runtime
            .cpu
            .map_or(Duration::ZERO, |c| c.per_decision),
    };
    let start = Instant::now();
    let tick = scenario.tick;
    let ticks = (scenario.duration.as_micros() / tick.as_micros()) as u64;
    let ticks_per_second = (1_000_000 / tick.as_micros()).max(1) as u64;
    let mut per_second: Vec<Second> = vec![];
    let mut seconds = Seconds::default();
    let mut in_flight = tokio::task::JoinSet::new();
    let mut callers = Callers::new(&streams, world.nodes.len(), seed, start);
    let mut retirement = invariants::Retirement::new(scenario, budget);

    for n in 0..ticks {
        let t = tick * n as u32;
        tokio::time::sleep_until(start + t).await;
        while next_event < events.len() && events[next_event].0 <= t {
            let (_, i, begins) = events[next_event];
            next_event += 1;
            let kind = &scenario.faults[i].kind;
            apply_fault(&mut world, kind, begins).await?;
            if let Some((region, lasting)) = world::store_fault(&world, kind) {
                retirement.calm_since[region] = (!(begins && lasting)).then(|| world.now());
            }
        }
        for stream in &mut streams {
            stream.carry += stream.rate_at(t) * tick.as_secs_f64();
            let due = stream.carry.floor();
            stream.carry -= due;
            // Nodes start and stop only between ticks (faults): the live ones, once a tick.
            let live: Vec<usize> = stream
                .nodes
                .iter()
                .copied()
                .filter(|&i| world.nodes[i].node.is_some())
                .collect();
            for _ in 0..due as u64 {
                if live.is_empty() {
                    break;
                }
                let target = live[rng.random_range(0..live.len())];
                let key = stream.key(&mut rng);
                let request = stream.request(key);
                let Some(job) = job_on(&world, target, request, &stream.traffic, &books) else {
                    continue;
                };
                in_flight.spawn(job.run());
            }
        }
        callers.keep_going(&streams, &world, &books, scenario, t, &mut in_flight);
        // Reap finished requests now and then, so the set stays small.
        while in_flight.try_join_next().is_some() {}
        if (n + 1) % ticks_per_second == 0 {
            per_second.push(seconds.sample(&world, &tally, per_second.len()));
            progress(per_second.len() as u64);
            if per_second.len().is_multiple_of(RETIRE_EVERY_SECONDS) {
                retirement.retire(&mut tally.lock(), &world, world.now());
            }
        }
    }
    // Let the last requests finish.
    while in_flight.join_next().await.is_some() {}

    let tally = Arc::try_unwrap(tally)
        .map(Mutex::into_inner)
        .unwrap_or_else(|shared| std::mem::take(&mut *shared.lock()));
    let ended = Ended {
        tally,
        per_second,
        windows,
        findings,
        budget,
    };
    Ok(ended.report(&world, scenario, seed))
}

/// The closed loops of a run: the callers running per stream and node, and each stream's new
/// keys.
struct Callers {
    busy: Vec<Vec<Arc<std::sync::atomic::AtomicUsize>>>,
    new_keys: Vec<Arc<std::sync::atomic::AtomicU64>>,
    started: u64,
    seed: u64,
    start: Instant,
}

impl Callers {
    fn new(streams: &[Stream], nodes: usize, seed: u64, start: Instant) -> Self {
        Self {
            busy: streams
                .iter()
                .map(|_| (0..nodes).map(|_| Default::default()).collect())
                .collect(),
            new_keys: streams.iter().map(|_| Default::default()).collect(),
            started: 0,
            seed,
            start,
        }
    }

    /// Each node a stream reaches keeps its callers going (a caller stops with its node's
    /// life; the next tick starts callers for a restarted node).
    fn keep_going(
        &mut self,
        streams: &[Stream],
        world: &World,
        books: &Books,
        scenario: &Scenario,
        t: Duration,
        in_flight: &mut tokio::task::JoinSet<()>,
    ) {
        let tick = scenario.tick;
        for (si, stream) in streams.iter().enumerate() {
            let Some(callers) = stream.traffic.callers else {
                continue;
            };
            let from = stream.traffic.from.unwrap_or(Duration::ZERO);
            let until = stream
                .traffic
                .until
                .unwrap_or(scenario.duration)
                .min(scenario.duration);
            if t < from || t >= until {
                continue;
            }
            for &i in &stream.nodes {
                // Each request of a caller is this job with its own request and failovers.
                let placeholder = tollgate_node::Request::new(String::new());
                let Some(job) = job_on(world, i, placeholder, &stream.traffic, books) else {
                    continue;
                };
                let busy = self.busy[si][i].clone();
                while busy.load(std::sync::atomic::Ordering::Relaxed) < callers {
                    busy.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.started += 1;
                    let caller = Caller {
                        traffic: stream.traffic.clone(),
                        zipf: stream.zipf,
                        rng: StdRng::seed_from_u64(derive(self.seed, "caller", self.started)),
                        new_keys: self.new_keys[si].clone(),
                        stop: self.start + until,
                        tick,
                        busy: busy.clone(),
                        store: world.stores[job.region].clone(),
                        job: job.clone(),
                    };
                    in_flight.spawn(caller.run());
                }
            }
        }
    }
}

/// The figures of each second, as differences from the last.
#[derive(Default)]
struct Seconds {
    last_calls: u64,
    last_leases: (u64, u64),
}

impl Seconds {
    /// Second number `t`: its decisions, store calls, lease units and key actors.
    fn sample(&mut self, world: &World, tally: &Mutex<Tally>, t: usize) -> Second {
        let calls: u64 = world.stores.iter().map(|s| s.link().calls().total()).sum();
        let leases = lease_units(world);
        let actors: u64 = world
            .nodes
            .iter()
            .filter_map(|n| n.node.as_ref())
            .map(|n| n.operator().held().0 as u64)
            .sum();
        let regions = region_second(world, tally, t);
        let mut books = tally.lock();
        let second = Second {
            t: t as u64,
            decisions: std::mem::take(&mut books.second_decisions),
            store_calls: calls - self.last_calls,
            lease_units_acquired: leases.0 - self.last_leases.0,
            lease_units_returned: leases.1 - self.last_leases.1,
            key_actors: actors,
            rules: std::mem::take(&mut books.second),
            regions,
        };
        self.last_calls = calls;
        self.last_leases = leases;
        second
    }
}

/// The fault events of `scenario` in time order (when, which fault, whether it begins), and
/// the window of each fault for the report.
fn fault_schedule(scenario: &Scenario) -> (Vec<(Duration, usize, bool)>, Vec<FaultWindow>) {
    // Fault events in time order: starts, and the ends of faults that last.
    let mut events: Vec<(Duration, usize, bool)> = vec![];
    for (i, f) in scenario.faults.iter().enumerate() {
        events.push((f.at, i, true));
        if let Some(d) = f.lasts {
            events.push((f.at + d, i, false));
        }
    }
    events.sort_by_key(|&(t, i, start)| (t, !start, i));
    let windows: Vec<FaultWindow> = scenario
        .faults
        .iter()
        .map(|f| FaultWindow {
            label: f.kind.label(),
            class: f.kind.class().into(),
            from: f.at.as_secs_f64(),
            until: (f.at + f.lasts.unwrap_or_default()).as_secs_f64(),
        })
        .collect();
    (events, windows)
}

/// What a run has at its end: its books, its seconds, its fault windows, what the lint found.
struct Ended {
    tally: Tally,
    per_second: Vec<Second>,
    windows: Vec<FaultWindow>,
    findings: Vec<crate::lint::Finding>,
    budget: Duration,
}

impl Ended {
    /// The run's report: its invariants checked against the books, its figures, every node
    /// stopped.
    fn report(self, world: &World, scenario: &Scenario, seed: u64) -> Report {
        let end = world.now();
        let Ended {
            mut tally,
            per_second,
            windows,
            findings,
            budget,
        } = self;
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
        let invariants = invariants::check(&mut tally, world, end, budget);
        let count: u64 = tally.latency.values().sum();
        // The value at rank ⌊count·q⌋ of the sorted latencies.
        let pct = |q: f64| {
            let rank = ((count as f64 * q) as u64).min(count.saturating_sub(1));
            let mut seen = 0;
            for (&us, &n) in &tally.latency {
                seen += n;
                if seen > rank {
                    return us;
                }
            }
            0
        };
        let latency_us = report::Latency {
            p50: pct(0.5),
            p99: pct(0.99),
            p999: pct(0.999),
            max: tally.latency.keys().next_back().copied().unwrap_or(0),
        };
        let node_store_calls = world
            .nodes
            .iter()
            .filter_map(|n| n.node.as_ref())
            .map(|n| n.metrics().store_calls.get())
            .sum();
        for node in world.nodes.iter().filter_map(|n| n.node.as_ref()) {
            node.crash();
        }
        Report {
            node_store_calls,
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
            store_calls_by_op: calls_by_op(world),
            store_evictions: world.stores.iter().map(|s| s.memory().evictions()).sum(),
            latency_us,
            rules: tally.rules,
            per_second,
            faults: windows,
            invariants,
            findings,
        }
    }
}

/// What every job of a run shares: the tally, the decision budget, a decision's CPU cost.
struct Books {
    tally: Arc<Mutex<Tally>>,
    budget: Duration,
    per_decision: Duration,
}

/// `request` of a stream with `traffic` on node `i`, if it is up.
fn job_on(
    world: &World,
    i: usize,
    request: tollgate_node::Request,
    traffic: &crate::scenario::Traffic,
    books: &Books,
) -> Option<Job> {
    let sim = &world.nodes[i];
    Some(Job {
        node: sim.node.clone()?,
        request,
        hold: traffic.hold,
        region: sim.region,
        alive: sim.alive.clone(),
        clock: world.clock.clone(),
        tally: books.tally.clone(),
        failovers: world.stores[sim.region].link().failovers(),
        budget: books.budget,
        cpu: sim.cpu.clone().map(|c| (c, books.per_decision)),
    })
}

/// Store calls by operation, all regions together.
fn calls_by_op(world: &World) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for store in &world.stores {
        for (op, n) in store.link().calls().by_op() {
            *out.entry(op.to_owned()).or_default() += n;
        }
    }
    out
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
            if let Some(sync) = node.region().link() {
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
        let up = |n: &Node| n.region().link().is_some_and(|r| r.status().peer_up);
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
