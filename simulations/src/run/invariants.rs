//! The invariants a run checks at its end: no bucket the store always answered admitted more
//! than its bound, and no bucket spent more leased units than its store handed out.

use std::collections::HashMap;

use super::tally::{BucketId, Fixed, Retired, Tally};
use super::world::World;
use crate::oracle::BoundBook;
use crate::report::Invariant;
use tollgate_lease::Micros;

/// Checks region bucket `id` against its bound at `now`, into `out`: at the end of the run,
/// or when its book is dropped idle ([`super::Tally::retire`]).
pub(super) fn check_bound(
    tally: &Tally,
    world: &World,
    id: BucketId,
    book: &BoundBook,
    now: u64,
    out: &mut Retired,
) {
    let (region, uid, identity) = tally.names.of_bucket(id);
    if tally.shadow.contains(&uid) {
        return;
    }
    if book.failed_over_to_fail_mode {
        out.unanswered += 1;
        return;
    }
    out.checked += 1;
    // A failover of the store, or an eviction of this bucket's keys, starts it full again.
    let store = &world.stores[region];
    let evictions = if store.memory().evictions() == 0 {
        0
    } else {
        tally
            .rule_keys
            .get(&uid)
            .and_then(|rule| tollgate_lease::BucketKey::new(identity, rule).ok())
            .map_or(0, |bucket| store.memory().evictions_of(bucket.as_str()))
    };
    let bound = book.bound(now, store.link().failovers() + evictions);
    let measured = book.measured();
    let rule = tally
        .rule_names
        .get(&uid)
        .cloned()
        .unwrap_or_else(|| region.to_string());
    let use_ = if bound == 0 {
        0.0
    } else {
        measured as f64 / bound as f64
    };
    if measured > bound {
        out.breaches.push((
            (region, uid, identity.to_vec()),
            format!(
                "rule {rule} identity {:?}: {measured} admitted, bound {bound}",
                String::from_utf8_lossy(identity)
            ),
        ));
    }
    match out.worst.get_mut(&rule) {
        Some(w) => *w = w.max(use_),
        None => {
            out.worst.insert(rule, use_);
        }
    }
}

/// Checks one bucket's ledger: `spent` units admitted on the store's answers against what its
/// store handed out and took back, `ledger`.
pub(super) fn check_ledger(
    (region, key, identity): (usize, &str, &[u8]),
    spent: u64,
    ledger: tollgate_lease::Ledger,
    out: &mut Retired,
) {
    out.ledger_checked += 1;
    let handed = ledger.handed.saturating_sub(ledger.credited);
    if spent > handed {
        let bucket = tollgate_lease::BucketKey::new(identity, key)
            .map(|b| b.as_str().to_owned())
            .unwrap_or_else(|_| key.to_owned());
        out.ledger_breaches.push((
            (region, key.to_owned(), identity.to_vec()),
            format!(
                "{bucket}: {spent} spent, {} handed out and {} credited back",
                ledger.handed, ledger.credited
            ),
        ));
    } else {
        out.unspent += handed - spent;
    }
}

pub(super) fn bound_invariant(tally: &mut Tally, world: &World, end: u64) -> Invariant {
    let mut out = std::mem::take(&mut tally.retired);
    for (&id, book) in &tally.buckets {
        check_bound(tally, world, id, book, end, &mut out);
    }
    for (rule, w) in &out.worst {
        if let Some(r) = tally.rules.get_mut(rule) {
            r.worst_bound_use = (w * 1000.0).round() / 1000.0;
        }
    }
    out.breaches.sort();
    let breaches: Vec<String> = out.breaches.iter().map(|(_, line)| line.clone()).collect();
    let invariant = Invariant {
        name:
            "admitted ≤ the exact bound of each limit, for every bucket the store always answered"
                .into(),
        held: breaches.is_empty(),
        detail: if breaches.is_empty() {
            format!(
                "{} buckets checked; {} not, because a decision of theirs went to a fail mode",
                out.checked, out.unanswered
            )
        } else {
            first_few(&breaches)
        },
    };
    tally.retired = out;
    invariant
}

/// No bucket spent more than its store handed out: per region, rule and identity, the units
/// admitted on the store's answers are at most what checks admitted and leases granted there,
/// less what returns credited. The rest was handed out and never spent or returned.
pub(super) fn ledger_invariant(tally: &mut Tally, world: &World) -> Invariant {
    let mut spent: HashMap<(usize, &str, &[u8]), u64, Fixed> = HashMap::default();
    for (&id, o) in &tally.buckets {
        let (region, uid, identity) = tally.names.of_bucket(id);
        if tally.shadow.contains(&uid) || o.is_concurrency() {
            continue;
        }
        if let Some(key) = tally.rule_keys.get(&uid) {
            *spent.entry((region, key.as_str(), identity)).or_default() += o.store_backed();
        }
    }
    let mut out = std::mem::take(&mut tally.retired);
    for ((region, key, identity), units) in spent {
        let Ok(bucket) = tollgate_lease::BucketKey::new(identity, key) else {
            continue;
        };
        let Some(ledger) = world.stores[region].link().ledger_of(bucket.as_str()) else {
            continue;
        };
        check_ledger((region, key, identity), units, ledger, &mut out);
    }
    out.ledger_breaches.sort();
    let breaches: Vec<String> = out
        .ledger_breaches
        .iter()
        .map(|(_, line)| line.clone())
        .collect();
    let invariant = Invariant {
        name: "leased units are conserved: no bucket spends more than its store handed out".into(),
        held: breaches.is_empty(),
        detail: if breaches.is_empty() {
            format!(
                "{} buckets; {} units handed out were neither spent nor returned (expired in leases, held by crashed pods, or checks that ran after their caller gave up)",
                out.ledger_checked, out.unspent
            )
        } else {
            first_few(&breaches)
        },
    };
    tally.retired = out;
    invariant
}

pub(super) fn first_few(items: &[String]) -> String {
    let mut out: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
    let more;
    if items.len() > 5 {
        more = format!("and {} more", items.len() - 5);
        out.push(&more);
    }
    out.join("; ")
}

/// Every invariant of a run, checked against its books at `end` (the rules' overshoot and
/// distinct identities are counted on the way).
pub(super) fn check(
    tally: &mut Tally,
    world: &World,
    end: Micros,
    budget: std::time::Duration,
) -> Vec<Invariant> {
    let mut invariants = vec![];
    invariants.push(bound_invariant(tally, world, end));
    invariants.push(ledger_invariant(tally, world));
    for r in tally.rules.values_mut() {
        r.overshoot = r.decided.admitted.saturating_sub(r.exact);
    }
    // Distinct identities per rule, both regions and every definition together.
    for (name, n) in tally.identity_counts() {
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
    invariants
}

/// When the books of a run may drop what has long been idle.
pub(super) struct Retirement {
    /// How long a region's bucket must have been idle: by then its key actors have stopped on
    /// every node and given their leases back, and the leases have expired (twice the idle
    /// timeout and the lease's life, and a decision's budget).
    pub(super) horizon: u64,
    /// Per region, since when its store has had no fault (None: one is on now). A call held by
    /// a stall or slowed by a fault still lands after it ends.
    pub(super) calm_since: Vec<Option<u64>>,
}

impl Retirement {
    pub(super) fn new(scenario: &crate::scenario::Scenario, budget: std::time::Duration) -> Self {
        let defaults = tollgate_node::RuntimeConfig::default();
        let ttl = scenario.runtime.lease_ttl.unwrap_or(defaults.lease.ttl);
        let idle = defaults.idle_timeout.max(ttl * 2);
        let horizon = (idle + ttl) * 2 + budget;
        Self {
            horizon: horizon.as_micros() as u64,
            calm_since: vec![Some(0); scenario.topology.regions.len()],
        }
    }

    /// Drops, at `now`, the books of buckets idle past the horizon, each checked first as the
    /// run's end checks it: a region bucket against its bound and its store's ledger (taken
    /// away, so a bucket used again starts a fresh account), an exact bucket only once both
    /// its views are as a fresh one would be (so dropping it changes no answer). Buckets of a
    /// rule a region has charged under more than one definition (a rule changed in the run)
    /// share their store's account and are kept.
    pub(super) fn retire(&self, tally: &mut Tally, world: &World, now: u64) {
        let mut definitions: HashMap<(usize, &str), u32, Fixed> = HashMap::default();
        for (region, uid) in &tally.region_definitions {
            if let Some(key) = tally.rule_keys.get(uid) {
                *definitions.entry((*region, key.as_str())).or_default() += 1;
            }
        }
        let mut buckets = std::mem::take(&mut tally.buckets);
        let mut out = std::mem::take(&mut tally.retired);
        buckets.retain(|&id, book| {
            let (region, uid, identity) = tally.names.of_bucket(id);
            let Some(calm) = self.calm_since[region] else {
                return true;
            };
            if now.saturating_sub(book.last.max(calm)) < self.horizon
                || (book.is_concurrency() && book.in_flight() > 0)
            {
                return true;
            }
            let Some(key) = tally.rule_keys.get(&uid) else {
                return true;
            };
            if definitions
                .get(&(region, key.as_str()))
                .copied()
                .unwrap_or(0)
                != 1
            {
                return true;
            }
            check_bound(tally, world, id, book, now, &mut out);
            if !book.is_concurrency()
                && let Ok(bucket) = tollgate_lease::BucketKey::new(identity, key)
                && let Some(ledger) = world.stores[region].link().take_ledger(bucket.as_str())
                && !tally.shadow.contains(&uid)
            {
                check_ledger(
                    (region, key, identity),
                    book.store_backed(),
                    ledger,
                    &mut out,
                );
            }
            false
        });
        tally.buckets = buckets;
        tally.retired = out;
        tally.exact.retain(|_, book| !book.at_rest(now));
    }
}
