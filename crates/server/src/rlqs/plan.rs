//! The pure part of sharing a bucket: what its rules make of it ([`Plan`]), each stream's
//! target, what the units paid for afford, and each stream's share (max-min fair per Envoy
//! host, then among a host's streams). No I/O: the broker's loop draws, pushes and keeps time.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate_lease::Algorithm;
use tollgate_node::rules::{Mode, RuleKind};
use tollgate_node::runtime::Charge;

use crate::rlqs::shares::{Strategy, water_fill_by_group};
use crate::rlqs::streams::StreamHandle;

/// One bucket's state: the streams that share it and what was paid for them.
#[derive(Debug, Default)]
pub(crate) struct BucketState {
    pub(crate) streams: HashMap<u64, StreamShare>,
    /// Units drawn from each limited rule's bucket (by rule key) and not yet given to a share:
    /// negative when a new Envoy bucket's first token was given on credit.
    pub(crate) credit: HashMap<String, f64>,
    /// The summed rate of the shares, paid until `paid_until`.
    pub(crate) paid_rate: u64,
    pub(crate) paid_until: Option<Instant>,
    /// The rules the bucket matched at its last tick (domain, id), for the report counters.
    pub(crate) rules: Vec<(String, String)>,
    /// Removed from the broker: a stream that finds it so joins a new one.
    pub(crate) gone: bool,
}

/// One stream's share of a bucket.
#[derive(Debug)]
pub(crate) struct StreamShare {
    pub(crate) stream: Arc<StreamHandle>,
    /// False once the stream closed (its share lives on until `expires_at`).
    pub(crate) open: bool,
    /// What the Envoy was last told, and when.
    pub(crate) strategy: Option<Strategy>,
    pub(crate) pushed_at: Instant,
    /// When the Envoy's assignment runs out (None: it has none).
    pub(crate) expires_at: Option<Instant>,
    pub(crate) demand: Demand,
    pub(crate) idle_reports: u32,
    pub(crate) last_report: Instant,
    /// The stream's budget it holds (given back when it goes).
    pub(crate) bytes: usize,
}

impl StreamShare {
    pub(crate) fn new(stream: Arc<StreamHandle>, bytes: usize, now: Instant) -> Self {
        Self {
            stream,
            open: true,
            strategy: None,
            pushed_at: now,
            expires_at: None,
            demand: Demand::new(now),
            idle_reports: 0,
            last_report: now,
            bytes,
        }
    }

    /// The most requests its Envoy can have admitted over `elapsed`: what its token bucket
    /// holds and refills (it started full), or None when it holds none of ours.
    pub(crate) fn most_admitted(&self, elapsed: Duration) -> Option<u64> {
        let strategy = self.strategy?;
        let rate = strategy.per_second()?;
        Some(
            strategy
                .max_tokens()
                .saturating_add((rate as f64 * elapsed.as_secs_f64()).ceil() as u64),
        )
    }
}

/// A stream's demand for a bucket: requests reported (allowed and denied) per second of the
/// server's clock (Envoy's `time_elapsed` is in whole seconds).
#[derive(Debug)]
pub(crate) struct Demand {
    since: Instant,
    requests: u64,
    pub(crate) per_second: Option<f64>,
}

impl Demand {
    fn new(now: Instant) -> Self {
        Self {
            since: now,
            requests: 0,
            per_second: None,
        }
    }

    /// Counts a report; the rate is measured over at least a second.
    pub(crate) fn report(&mut self, now: Instant, requests: u64) {
        self.requests = self.requests.saturating_add(requests);
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= Duration::from_secs(1) {
            self.per_second = Some(self.requests as f64 / elapsed.as_secs_f64());
            self.requests = 0;
            self.since = now;
        }
    }
}

/// What a bucket's matched rules make of it.
pub(crate) enum Plan {
    /// No enforced rule limits it.
    AllowAll,
    /// An enforced rule blocks it.
    DenyAll,
    /// Shares of the tightest limited rule's rate, paid from every limited rule's bucket.
    Shares {
        charges: Vec<Charge>,
        /// Units per second and bucket size of the tightest rule.
        rate: f64,
        capacity: u64,
    },
}

impl Plan {
    pub(crate) fn of(charges: Vec<Charge>) -> Plan {
        let enforced: Vec<Charge> = charges
            .into_iter()
            .filter(|c| c.rule.mode == Mode::Enforce)
            .collect();
        if enforced
            .iter()
            .any(|c| matches!(c.rule.kind, RuleKind::Block(_)))
        {
            return Plan::DenyAll;
        }
        // A concurrency limit counts requests in flight, which an Envoy's reports do not
        // carry: RLQS enforces the bucket's other rules (docs/rlqs.md).
        let limited: Vec<Charge> = enforced
            .into_iter()
            .filter(|c| {
                c.rule
                    .limit()
                    .is_some_and(|l| l.algorithm() != Algorithm::Concurrency)
            })
            .collect();
        let mut rate = f64::INFINITY;
        let mut capacity = u64::MAX;
        for limit in limited.iter().filter_map(|c| c.rule.limit()) {
            rate = rate.min(limit.average_per_second().unwrap_or(f64::INFINITY));
            capacity = capacity.min(limit.capacity());
        }
        if limited.is_empty() {
            Plan::AllowAll
        } else {
            Plan::Shares {
                charges: limited,
                rate,
                capacity,
            }
        }
    }
}

/// The value of the shares already paid beyond `now` (negative: a gap since the last tick
/// that the shares admitted through and is still owed).
pub(crate) fn paid_ahead(state: &BucketState, now: Instant) -> f64 {
    let Some(until) = state.paid_until else {
        return 0.0;
    };
    let seconds = if until >= now {
        (until - now).as_secs_f64()
    } else {
        -(now - until).as_secs_f64()
    };
    state.paid_rate as f64 * seconds
}

/// How far above its measured demand a stream's target is: arrivals come in bursts around
/// their average, and a share of exactly the average denies every burst while the tokens it
/// did not use sit idle in the Envoy's bucket.
const HEADROOM: f64 = 1.25;

/// Open streams' target rates: their demand with headroom, or the whole rate until they
/// report one.
pub(crate) fn targets(state: &BucketState, rate: f64) -> Vec<(u64, f64)> {
    let mut out: Vec<(u64, f64)> = state
        .streams
        .iter()
        .filter(|(_, s)| s.open)
        // At least one a second: a stream that saw no request yet can admit its first.
        .map(|(id, s)| {
            let target = s.demand.per_second.map_or(rate, |d| d * HEADROOM + 1.0);
            (*id, target.max(1.0))
        })
        .collect();
    out.sort_by_key(|(id, _)| *id);
    out
}

/// The summed rate of closed streams' shares (paid until their TTLs pass).
pub(crate) fn closed_rate(state: &BucketState) -> u64 {
    state
        .streams
        .values()
        .filter(|s| !s.open)
        .filter_map(|s| s.strategy.and_then(|st| st.per_second()))
        .sum()
}

pub(crate) fn open_streams(state: &BucketState) -> usize {
    state.streams.values().filter(|s| s.open).count()
}

/// Open streams whose Envoy holds no token bucket of ours: the next one it gets starts full.
pub(crate) fn fresh_streams(state: &BucketState) -> usize {
    state.streams.values().filter(|s| is_fresh(s)).count()
}

/// [`fresh_streams`] among the streams `ids`.
fn fresh_streams_among(state: &BucketState, ids: &HashSet<u64>) -> usize {
    state
        .streams
        .iter()
        .filter(|(id, s)| ids.contains(id) && is_fresh(s))
        .count()
}

fn is_fresh(share: &StreamShare) -> bool {
    share.open && share.strategy.is_none_or(|st| st.per_second().is_none())
}

/// The first fill a new Envoy bucket is given: an even share of the rule's burst.
pub(crate) fn burst_each(capacity: u64, open: usize) -> f64 {
    (capacity as f64 / open.max(1) as f64).floor().max(1.0)
}

pub(crate) fn uniform(state: &BucketState, strategy: Strategy) -> Vec<Decided> {
    state
        .streams
        .iter()
        .filter(|(_, s)| s.open)
        .map(|(id, _)| Decided {
            stream: *id,
            strategy,
            fill: 0.0,
        })
        .collect()
}

/// What one open stream is to be told: its strategy, and what its first fill costs when the
/// Envoy gets a new token bucket (it starts full).
#[derive(Debug)]
pub(crate) struct Decided {
    pub(crate) stream: u64,
    pub(crate) strategy: Strategy,
    pub(crate) fill: f64,
}

/// Shares the rate the bucket can pay for among its open streams that are in `drawn_for`: the
/// streams the tick's draw was sized for. One that joined while the draw was out waits for
/// the next tick: its first fill was not drawn, and given now it would be one unit, and the
/// rule's burst would stay in the store for good (shares only pay for the rate). Three
/// Envoys on one busy node admitted 0.73 of the bound when that happened.
pub(crate) fn share_out(
    state: &BucketState,
    charges: &[Charge],
    rate: f64,
    capacity: u64,
    now: Instant,
    tick: Duration,
    drawn_for: &HashSet<u64>,
) -> Vec<Decided> {
    let tick_s = tick.as_secs_f64();
    let credit = min_credit(state, charges);
    let fresh = fresh_streams_among(state, drawn_for) as f64;
    // What the paid-for units afford until the next tick, a token set aside for each new
    // Envoy bucket (it starts full), never above the rule's rate. One tick of the rule's rate
    // and a unit may be owed (drawn at the next tick, before anything new is given): a store
    // that refilled a hair less than a tick's worth since the last draw does not make every
    // share shrink and grow back, each time pushed to every Envoy.
    let slack = rate * tick_s + 1.0;
    let affordable = ((credit + paid_ahead(state, now) - fresh + slack) / tick_s).max(0.0);
    let mut targets = targets(state, rate);
    targets.retain(|(id, _)| drawn_for.contains(id));
    // An Envoy bucket of ours is kept (at one unit a second) rather than replaced by DENY_ALL
    // while the credit is short: a new one would start full, and its first fill would deepen
    // the debt that cut it (the unit is paid for at the next draws).
    // Only while the debt is under one bucket: a store kept empty by other callers must not
    // let the floor run up a debt without end (repaid later by starving them).
    let held = if credit > -(capacity as f64) {
        targets
            .iter()
            .filter(|(id, _)| {
                state.streams[id]
                    .strategy
                    .is_some_and(|s| s.per_second().is_some())
            })
            .count() as u64
    } else {
        0
    };
    let budget = (affordable.floor() as u64)
        .max(held)
        .min(rate.floor() as u64);
    let open_budget = budget.saturating_sub(closed_rate(state));
    // Max-min fair per Envoy host first, then among a host's streams.
    let mut hosts: Vec<std::net::IpAddr> = vec![];
    let demands: Vec<(usize, f64)> = targets
        .iter()
        .map(|(id, t)| {
            let host = state.streams[id].stream.host;
            let group = hosts.iter().position(|h| *h == host).unwrap_or_else(|| {
                hosts.push(host);
                hosts.len() - 1
            });
            (group, *t)
        })
        .collect();
    let mut rates = water_fill_by_group(open_budget, &demands);
    // A stream holding a bucket of ours is not cut to DENY_ALL while a new stream gets a unit:
    // it takes the unit from a new one (which waits for its first bucket). Shared out
    // evenly, a budget of two over two such streams and a newcomer gave the newcomer a unit
    // and one of them DENY_ALL: its Envoy dropped its bucket, and the rule's whole burst in it
    // (three Envoys on a busy node admitted 0.73 of the bound).
    if held > 0 {
        let holds = |id: &u64| {
            state.streams[id]
                .strategy
                .is_some_and(|s| s.per_second().is_some())
        };
        let mut givers: Vec<usize> = (0..targets.len())
            .filter(|&i| !holds(&targets[i].0) && rates[i] > 0)
            .collect();
        for i in 0..targets.len() {
            if holds(&targets[i].0) && rates[i] == 0 {
                let Some(&giver) = givers.last() else { break };
                rates[giver] -= 1;
                rates[i] += 1;
                if rates[giver] == 0 {
                    givers.pop();
                }
            }
        }
    }
    // First fills of new Envoy buckets: an even share of the burst, out of what is left.
    let burst = burst_each(capacity, targets.len());
    let mut pool = (credit - fresh).max(0.0);
    let mut out = Vec::with_capacity(targets.len());
    for ((stream, _), per_second) in targets.iter().zip(rates) {
        // An Envoy bucket holds at least one second of its rate (Envoy adds a fill interval's
        // tokens at once, and a smaller bucket would drop them); raising it may add tokens at
        // once, up to the difference, which is paid for.
        let decided = match state.streams[stream].strategy {
            Some(Strategy::TokenBucket { max_tokens, .. }) if per_second > 0 => {
                let max_tokens = u64::from(max_tokens);
                Decided {
                    stream: *stream,
                    strategy: Strategy::share(per_second, max_tokens.max(per_second)),
                    fill: per_second.saturating_sub(max_tokens) as f64,
                }
            }
            _ if per_second == 0 => Decided {
                stream: *stream,
                strategy: Strategy::DenyAll,
                fill: 0.0,
            },
            _ => {
                let extra = (burst - 1.0).min(pool.floor()).max(0.0);
                pool -= extra;
                let fill = (1.0 + extra).max(per_second as f64);
                Decided {
                    stream: *stream,
                    strategy: Strategy::share(per_second, fill as u64),
                    fill,
                }
            }
        };
        out.push(decided);
    }
    out
}

/// The least credit over the bucket's limited rules.
pub(crate) fn min_credit(state: &BucketState, charges: &[Charge]) -> f64 {
    charges
        .iter()
        .map(|c| state.credit.get(&c.rule.key).copied().unwrap_or(0.0))
        .fold(f64::INFINITY, f64::min)
}

/// Pays, out of each rule's credit, the first fills given this tick and the shares the
/// Envoys now hold until the next tick (what was paid beyond now counts toward them).
pub(crate) fn pay(
    state: &mut BucketState,
    charges: &[Charge],
    fills: f64,
    now: Instant,
    tick: Duration,
) {
    let held: u64 = state
        .streams
        .values()
        .filter_map(|s| s.strategy.and_then(|st| st.per_second()))
        .sum();
    let cost = held as f64 * tick.as_secs_f64() + fills - paid_ahead(state, now);
    for c in charges {
        *state.credit.entry(c.rule.key.clone()).or_insert(0.0) -= cost;
    }
    state.paid_rate = held;
    state.paid_until = Some(now + tick);
}

#[cfg(test)]
mod tests;
