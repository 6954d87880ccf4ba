//! What a run measured: overall, per rule, per second, and the invariants it checked. The
//! report holds virtual times only, in a fixed order, so one seed gives the same bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use tollgate_node::runtime::Outcome;

/// A whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Virtual seconds simulated.
    pub seconds: u64,
    /// Nodes, all regions.
    pub nodes: usize,
    /// Requests decided.
    pub decisions: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Calls that reached the stores (checks, lease acquisitions and returns, releases).
    pub store_calls: u64,
    /// Store calls per decision.
    pub store_calls_per_decision: f64,
    /// Store calls the nodes made, as their `tollgate_store_calls_total` counts them (calls
    /// sent, whatever came of them; not those an open breaker refused): what a real node's
    /// metrics are compared with. Calls that reached the store are `store_calls`.
    pub node_store_calls: u64,
    /// Store calls by operation (check, acquire, return, release, debit, demand, penalty).
    pub store_calls_by_op: BTreeMap<String, u64>,
    /// Calls refused by a store that was down.
    pub store_refused: u64,
    /// Live keys the stores evicted to stay within their memory (`store_memory_mb`): each
    /// starts its bucket full again.
    pub store_evictions: u64,
    /// Decision latency on virtual time, µs.
    pub latency_us: Latency,
    /// Per rule id.
    pub rules: BTreeMap<String, RuleReport>,
    /// Per virtual second.
    pub per_second: Vec<Second>,
    /// The fault windows, for reading the series.
    pub faults: Vec<FaultWindow>,
    /// The invariants checked, and what broke.
    pub invariants: Vec<Invariant>,
    /// What the scenario says that it may not mean (see [`crate::lint`]).
    pub findings: Vec<crate::lint::Finding>,
}

/// Latency percentiles.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Longest.
    pub max: u64,
}

/// How a rule's decisions came out: admitted or denied, and which were made without the store.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Decided {
    /// Requests it admitted.
    pub admitted: u64,
    /// Requests it denied (over the limit, failed closed, or another rule denied them).
    pub denied: u64,
    /// Admitted because the store failed and the rule fails open.
    pub failed_open: u64,
    /// Denied because the store failed and the rule fails closed.
    pub failed_closed: u64,
    /// Decided by the LOCAL fallback bucket.
    pub local_fallback: u64,
}

impl Decided {
    /// Counts one decision: `outcome` as the request's verdict saw it, `allowed` its own.
    pub fn count(&mut self, outcome: Outcome, allowed: bool) {
        match outcome {
            Outcome::Allowed => self.admitted += 1,
            Outcome::Denied => self.denied += 1,
            Outcome::ShadowDenied => {}
            Outcome::FailedOpen => {
                self.admitted += 1;
                self.failed_open += 1;
            }
            Outcome::FailedClosed => {
                self.denied += 1;
                self.failed_closed += 1;
            }
            Outcome::LocalFallback => {
                self.local_fallback += 1;
                if allowed {
                    self.admitted += 1;
                } else {
                    self.denied += 1;
                }
            }
        }
    }
}

/// One rule over the run (all its identities).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleReport {
    /// Its decisions.
    #[serde(flatten)]
    pub decided: Decided,
    /// What an exact limiter fed the same requests would have admitted.
    pub exact: u64,
    /// Admitted beyond what the exact limiter admitted (0 when Tollgate admitted less).
    pub overshoot: u64,
    /// Denied while the limit still had room (units leased to other nodes, pre-limits).
    pub false_denials: u64,
    /// SHADOW: requests it would have denied.
    pub shadow_denied: u64,
    /// Decided on the store's last answer while the store was slow (OPEN rules).
    pub on_last_answer: u64,
    /// Identities seen.
    pub identities: u64,
    /// The largest share of its bound any identity used (1.0: exactly at the bound).
    pub worst_bound_use: f64,
}

/// One virtual second, all rules and per rule.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Second {
    /// The second (0-based).
    pub t: u64,
    /// Requests decided.
    pub decisions: u64,
    /// Store calls made.
    pub store_calls: u64,
    /// Lease units acquired from the stores.
    pub lease_units_acquired: u64,
    /// Lease units returned to the stores.
    pub lease_units_returned: u64,
    /// Key actors alive at the end of the second, all nodes.
    pub key_actors: u64,
    /// Per rule id.
    pub rules: BTreeMap<String, RuleSecond>,
    /// Per region (two regions).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub regions: BTreeMap<String, RegionSecond>,
}

/// One region in one second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RegionSecond {
    /// Requests its nodes admitted.
    pub admitted: u64,
    /// Its nodes that see the peer region up.
    pub peer_up: u64,
    /// The longest sync lag any of its nodes reports (ms since the newest consumption applied
    /// from the peer was recorded there).
    pub lag_ms: Option<u64>,
}

/// One rule in one second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleSecond {
    /// Its decisions.
    #[serde(flatten)]
    pub decided: Decided,
    /// What the exact limiter admitted.
    pub exact: u64,
    /// False denials.
    pub false_denials: u64,
}

/// A fault's window on virtual time.
#[derive(Debug, Clone, Serialize)]
pub struct FaultWindow {
    /// What happened.
    pub label: String,
    /// Its kind ([`crate::scenario::FaultKind::class`]).
    pub class: String,
    /// From, seconds.
    pub from: f64,
    /// Until, seconds (equal to `from` for an instant fault).
    pub until: f64,
}

/// One invariant's result.
#[derive(Debug, Clone, Serialize)]
pub struct Invariant {
    /// What it says.
    pub name: String,
    /// Whether it held.
    pub held: bool,
    /// Breaches (the first few), or how it was checked.
    pub detail: String,
}

impl Report {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.invariants.iter().all(|i| i.held)
    }

    /// The report as a table for a terminal.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} (seed {}): {} nodes, {} s virtual",
            self.scenario, self.seed, self.nodes, self.seconds
        );
        let _ = writeln!(
            out,
            "decisions {}  admitted {}  store calls {} ({:.4} per decision, {} refused)  store keys evicted {}  latency p50 {} µs  p99 {} µs  p999 {} µs  max {} µs",
            self.decisions,
            self.admitted,
            self.store_calls,
            self.store_calls_per_decision,
            self.store_refused,
            self.store_evictions,
            self.latency_us.p50,
            self.latency_us.p99,
            self.latency_us.p999,
            self.latency_us.max
        );
        let _ = writeln!(
            out,
            "\n| rule | admitted | exact | overshoot | denied | false denials | shadow denied | failed open | failed closed | local | on last answer | identities | worst bound use |"
        );
        let _ = writeln!(
            out,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for (id, r) in &self.rules {
            let _ = writeln!(
                out,
                "| {id} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.3} |",
                r.decided.admitted,
                r.exact,
                r.overshoot,
                r.decided.denied,
                r.false_denials,
                r.shadow_denied,
                r.decided.failed_open,
                r.decided.failed_closed,
                r.decided.local_fallback,
                r.on_last_answer,
                r.identities,
                r.worst_bound_use
            );
        }
        if !self.faults.is_empty() {
            let _ = writeln!(out, "\nfaults:");
            for f in &self.faults {
                let _ = writeln!(out, "  {:>7.3}s .. {:>7.3}s  {}", f.from, f.until, f.label);
            }
        }
        let _ = writeln!(out, "\ninvariants:");
        for i in &self.invariants {
            let _ = writeln!(
                out,
                "  [{}] {}: {}",
                if i.held { "ok" } else { "BROKEN" },
                i.name,
                i.detail
            );
        }
        if !self.findings.is_empty() {
            let _ = writeln!(out, "\nscenario notes:");
            for f in &self.findings {
                let what = if f.is_warning() { "warning" } else { "note" };
                let _ = writeln!(out, "  {what}: {f}");
            }
        }
        out
    }
}
