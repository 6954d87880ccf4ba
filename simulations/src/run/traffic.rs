//! The traffic: each stream's rate and keys, and each request it sends, decided by a node and
//! counted in the tally.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use rand::Rng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Zipf};
use tokio::time::Instant;
use tollgate_lease::SharedClock;
use tollgate_node::rules::{FailMode, Mode};

use super::world::World;
use crate::scenario::Scenario;
use tollgate_node::runtime::{Outcome, Verdict};
use tollgate_node::{Node, Request};

use std::collections::BTreeMap;

use super::tally::{BucketId, ExactId, Names, Tally};
use crate::oracle::{BoundBook, ExactBook};
use crate::scenario::{Keys, Traffic};

/// One request's traffic stream, ready to draw keys.
pub(super) struct Stream {
    pub(super) traffic: Traffic,
    pub(super) zipf: Option<Zipf<f64>>,
    pub(super) carry: f64,
    pub(super) next_new: u64,
    pub(super) nodes: Vec<usize>,
}

impl Stream {
    pub(super) fn rate_at(&self, t: Duration) -> f64 {
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

    pub(super) fn key(&mut self, rng: &mut StdRng) -> u64 {
        draw_key(&self.traffic.keys, self.zipf.as_ref(), rng).unwrap_or_else(|| {
            self.next_new += 1;
            self.next_new
        })
    }

    pub(super) fn request(&self, key: u64) -> Request {
        stream_request(&self.traffic, key)
    }
}

/// A key drawn from `keys` (None for `new`: the caller numbers new keys itself).
fn draw_key(keys: &Keys, zipf: Option<&Zipf<f64>>, rng: &mut StdRng) -> Option<u64> {
    match keys {
        Keys::Hot => Some(0),
        Keys::Uniform { n } => Some(rng.random_range(0..*n)),
        Keys::Zipf { .. } => Some(zipf.map_or(0, |z| z.sample(rng) as u64 - 1)),
        Keys::New => None,
    }
}

/// The request `traffic` sends for key number `key`.
pub(crate) fn stream_request(traffic: &Traffic, key: u64) -> Request {
    let key = format!("k{key}");
    let mut request = Request::new(traffic.domain.clone()).cost(traffic.cost);
    for d in &traffic.descriptors {
        request = request.descriptor(d.iter().map(|(k, v)| (k.clone(), v.replace("{key}", &key))));
    }
    request
}

/// One caller of a closed loop: sends a request to its node, waits for the answer, sends the
/// next, until its stream stops or its node's life ends.
pub(super) struct Caller {
    pub(super) traffic: Traffic,
    pub(super) zipf: Option<Zipf<f64>>,
    pub(super) rng: StdRng,
    pub(super) new_keys: Arc<std::sync::atomic::AtomicU64>,
    pub(super) stop: Instant,
    pub(super) tick: Duration,
    pub(super) busy: Arc<std::sync::atomic::AtomicUsize>,
    /// Its node and books: each request is this job with its own request and failovers.
    pub(super) job: Job,
    pub(super) store: tollgate_lease::LinkedStore,
}

impl Caller {
    pub(super) async fn run(mut self) {
        while Instant::now() < self.stop && self.job.node_alive() {
            let key = draw_key(&self.traffic.keys, self.zipf.as_ref(), &mut self.rng)
                .unwrap_or_else(|| {
                    self.new_keys
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        + 1
                });
            let job = Job {
                request: stream_request(&self.traffic, key),
                failovers: self.store.link().failovers(),
                ..self.job.clone()
            };
            let sent = Instant::now();
            job.run().await;
            // Answered in no time with no CPU to fill (none modelled, a lease spent locally):
            // the caller waits a tick, or it would send forever at one instant. With a CPU, its
            // queue fills and makes the caller wait.
            let cpu_fills = self.job.cpu.as_ref().is_some_and(|(_, c)| !c.is_zero());
            if Instant::now() == sent && !cpu_fills {
                tokio::time::sleep(self.tick).await;
            }
        }
        self.busy.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[derive(Clone)]
pub(super) struct Job {
    pub(super) node: Node,
    pub(super) request: Request,
    pub(super) hold: Option<Duration>,
    pub(super) region: usize,
    pub(super) alive: Arc<AtomicBool>,
    pub(super) clock: SharedClock,
    pub(super) tally: Arc<Mutex<Tally>>,
    pub(super) failovers: u64,
    pub(super) budget: Duration,
    /// The node's CPU and what one decision costs on it.
    pub(super) cpu: Option<(Arc<tollgate_lease::NodeCpu>, Duration)>,
}

impl Job {
    pub(super) async fn run(self) {
        let charges = match self.node.charges(&self.request) {
            Ok(c) => c,
            Err(_) => return,
        };
        let arrived = self.node_now();
        let keys;
        {
            // The exact limiter sees every request as it arrives, and decides it whole: admitted
            // when every enforced rule has room, and then charged at each.
            let mut t = self.tally.lock();
            let t = &mut *t;
            // Each charge's books: its region's bucket and the exact limiter's over both
            // regions, found by number.
            keys = charges
                .iter()
                .map(|c| {
                    let identity = t.names.identity(&c.identity);
                    let definition = t.names.definition(c.rule.uid);
                    let key = t.names.key(&c.rule.key);
                    (
                        Names::bucket(self.region, definition, identity),
                        Names::exact(key, identity),
                    )
                })
                .collect::<Vec<(BucketId, ExactId)>>();
            let mut fits_all = true;
            for (c, (bucket, exact)) in charges.iter().zip(&keys) {
                let Some(limit) = c.rule.limit() else {
                    continue;
                };
                if !t.rule_names.contains_key(&c.rule.uid) {
                    if c.rule.mode != Mode::Enforce {
                        t.shadow.insert(c.rule.uid);
                    }
                    t.rule_names.insert(c.rule.uid, c.rule.id.clone());
                    t.rule_keys.insert(c.rule.uid, c.rule.key.clone());
                }
                match t.buckets.get_mut(bucket) {
                    Some(book) => book.last = arrived,
                    None => {
                        t.buckets
                            .insert(*bucket, BoundBook::new(limit, arrived, self.failovers));
                        t.saw_identity(&c.rule.id, Names::identity_of(*bucket));
                        t.region_definitions.insert((self.region, c.rule.uid));
                    }
                }
                let whole = c.rule.whole.unwrap_or(limit);
                let oracle = t
                    .exact
                    .entry(*exact)
                    .or_insert_with(|| ExactBook::new(whole, arrived));
                oracle.follow(whole, arrived);
                if c.rule.mode == Mode::Enforce && !oracle.fits(arrived, c.cost) {
                    fits_all = false;
                }
            }
            if fits_all {
                for (c, (_, exact)) in charges.iter().zip(&keys) {
                    if let Some(oracle) = t.exact.get_mut(exact) {
                        oracle.ideal_take(arrived, c.cost);
                        rule_entry(&mut t.rules, &c.rule.id).exact += 1;
                        rule_entry(&mut t.second, &c.rule.id).exact += 1;
                    }
                }
            }
        }
        let started = Instant::now();
        // The node reads the request, and decides it, once a core is free (past its capacity,
        // requests queue here, and its store answers queue behind them).
        if let Some((cpu, cost)) = &self.cpu {
            cpu.run(*cost).await;
        }
        let read = Instant::now();
        // Boxed: the decision's future is large, and a task moves its future as it spawns.
        let Ok(verdict) = Box::pin(self.node.check(&self.request)).await else {
            return;
        };
        let took = started.elapsed().as_micros() as u64;
        let deciding = read.elapsed().as_micros() as u64;
        let decided = self.node_now();
        let held_costs = self.record(&charges, &keys, &verdict, decided, (took, deciding));
        if let (Some(hold), false) = (self.hold, verdict.slots.is_empty()) {
            tokio::time::sleep(hold).await;
            // A request whose pod crashed meanwhile is gone with it: nothing releases its slots.
            if self.node_alive() {
                let _ = Box::pin(self.node.release_slots(&verdict.slots)).await;
            }
            let mut t = self.tally.lock();
            for (bucket, exact, cost) in held_costs {
                if let Some(o) = t.buckets.get_mut(&bucket) {
                    o.released(cost);
                }
                if let Some(o) = t.exact.get_mut(&exact) {
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
        keys: &[(BucketId, ExactId)],
        verdict: &Verdict,
        now: u64,
        (took, deciding): (u64, u64),
    ) -> Vec<(BucketId, ExactId, u64)> {
        let mut held = vec![];
        let mut t = self.tally.lock();
        t.decisions += 1;
        t.second_decisions += 1;
        if verdict.allowed {
            t.admitted += 1;
            *t.region_admitted.entry(self.region).or_default() += 1;
        }
        *t.latency.entry(took).or_default() += 1;
        t.longest = t.longest.max(took);
        // The budget bounds the decision once the node reads the request: a node past its
        // capacity makes requests queue before that, as any saturated server does.
        if deciding > self.budget.as_micros() as u64 {
            t.latency_breaches += 1;
        }
        for status in &verdict.statuses {
            let Some(outcome) = status.outcome else {
                continue;
            };
            let rule = &status.rule;
            let at = charges.iter().position(|c| c.rule.uid == rule.uid);
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
                    "rule {} ({:?} fail mode) {what}, allowed {}",
                    rule.id, rule.fail_mode, status.allowed
                );
                t.fail_mode_breaches.push(line);
            }
            // A rule that would admit a request another rule denied charged nothing.
            let own = outcome;
            let outcome = match outcome {
                Outcome::Allowed if !verdict.allowed => Outcome::Denied,
                other => other,
            };
            let r = rule_entry(&mut t.rules, &rule.id);
            if status.on_last_answer {
                r.on_last_answer += 1;
            }
            if outcome == Outcome::ShadowDenied {
                r.shadow_denied += 1;
            }
            r.decided.count(outcome, status.allowed);
            rule_entry(&mut t.second, &rule.id)
                .decided
                .count(outcome, status.allowed);
            let (Some(at), Mode::Enforce) = (at, rule.mode) else {
                continue;
            };
            let (charge, (bucket, exact)) = (&charges[at], &keys[at]);
            let mut false_denial = false;
            if let Some(o) = t.buckets.get_mut(bucket) {
                o.last = o.last.max(now);
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
                    o.admitted(charge.cost, from_store);
                    if status
                        .limit
                        .is_some_and(|l| l.algorithm() == tollgate_lease::Algorithm::Concurrency)
                    {
                        held.push((*bucket, *exact, charge.cost));
                    }
                }
            }
            // False denials are judged on the whole limit, fed what both regions admitted.
            if let Some(g) = t.exact.get_mut(exact) {
                if verdict.allowed {
                    g.admitted(now, charge.cost);
                } else if own == Outcome::Denied && g.denied(now, charge.cost) {
                    false_denial = true;
                }
            }
            if false_denial {
                rule_entry(&mut t.rules, &rule.id).false_denials += 1;
                rule_entry(&mut t.second, &rule.id).false_denials += 1;
            }
        }
        held
    }
}

/// A rule's entry in a map of rules by id, made when it is missing (no id copied otherwise).
fn rule_entry<'a, T: Default>(map: &'a mut BTreeMap<String, T>, id: &str) -> &'a mut T {
    if !map.contains_key(id) {
        map.insert(id.to_owned(), T::default());
    }
    map.get_mut(id).expect("just made")
}

impl Stream {
    /// Every stream of `scenario`, each with the nodes it reaches.
    pub(super) fn all(scenario: &Scenario, world: &World) -> Vec<Stream> {
        scenario
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
            .collect()
    }
}
