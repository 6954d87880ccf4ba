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
use tollgate_node::runtime::{Outcome, Verdict};
use tollgate_node::{Node, Request};

use super::tally::Tally;
use crate::oracle::BucketOracle;
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

    pub(super) fn request(&self, key: u64) -> Request {
        stream_request(&self.traffic, key)
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
}

impl Job {
    pub(super) async fn run(self) {
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
                oracle.follow(whole, arrived);
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

/// The key (bucket name) of the charged rule with definition `uid`.
fn key_of(charges: &[tollgate_node::runtime::Charge], uid: u64) -> String {
    charges
        .iter()
        .find(|c| c.rule.uid == uid)
        .map(|c| c.rule.key.clone())
        .unwrap_or_default()
}
