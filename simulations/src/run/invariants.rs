//! The invariants a run checks at its end: no bucket the store always answered admitted more
//! than its bound, and no bucket spent more leased units than its store handed out.

use std::collections::BTreeMap;

use super::tally::{BucketId, Fixed, Tally};
use super::world::World;
use crate::report::Invariant;
use tollgate_lease::Micros;

pub(super) fn bound_invariant(tally: &mut Tally, world: &World, end: u64) -> Invariant {
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
        // A failover of the store, or an eviction of this bucket's keys, starts it full again.
        let store = &world.stores[key.0];
        let evictions = tally
            .rule_keys
            .get(&key.1)
            .and_then(|rule| tollgate_lease::BucketKey::new(&key.2, rule).ok())
            .map_or(0, |bucket| store.memory().evictions_of(bucket.as_str()));
        let bound = oracle.bound(end, store.link().failovers() + evictions);
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
pub(super) fn ledger_invariant(tally: &Tally, world: &World) -> Invariant {
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

/// The rule id a bucket belongs to (kept beside the oracle).
fn oracle_rule(tally: &Tally, key: &BucketId) -> String {
    tally
        .rule_names
        .get(&key.1)
        .cloned()
        .unwrap_or_else(|| key.0.to_string())
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
    invariants
}
