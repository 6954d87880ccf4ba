//! The run's books: what each region's buckets admitted against the bound each limit owes,
//! and what the exact limiter over both regions would have admitted.
//!
//! A run of the seed's peak sees millions of buckets, so the books are kept small: identities,
//! rule definitions and bucket names are numbered once ([`Names`]) and each book is found by
//! one 64-bit key; a book whose bucket has long been idle is checked and dropped
//! ([`Tally::retire`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

use crate::oracle::{BoundBook, ExactBook};
use crate::report::{RuleReport, RuleSecond};

/// The deterministic hasher for maps whose order could reach a report (Fx: no random seed,
/// and several times cheaper than SipHash on the per-request books).
pub(super) type Fixed = BuildHasherDefault<rustc_hash::FxHasher>;

/// A region's bucket: region, rule definition and identity, numbered ([`Names::bucket`]).
pub(super) type BucketId = u64;

/// The exact limiter's bucket: bucket name and identity, numbered ([`Names::exact`]).
pub(super) type ExactId = u64;

/// Identities, rule definitions and bucket names, each numbered as it is first seen.
#[derive(Default)]
pub(super) struct Names {
    identities: HashMap<Box<[u8]>, u32, Fixed>,
    identity_bytes: Vec<Box<[u8]>>,
    definitions: HashMap<u64, u16, Fixed>,
    definition_uids: Vec<u64>,
    keys: HashMap<String, u16, Fixed>,
    key_names: Vec<String>,
}

impl Names {
    /// The number of `identity` (no copy made once it is known).
    pub(super) fn identity(&mut self, identity: &[u8]) -> u32 {
        if let Some(&n) = self.identities.get(identity) {
            return n;
        }
        let n = self.identity_bytes.len() as u32;
        self.identities.insert(identity.into(), n);
        self.identity_bytes.push(identity.into());
        n
    }

    /// The number of rule definition `uid`.
    pub(super) fn definition(&mut self, uid: u64) -> u16 {
        if let Some(&n) = self.definitions.get(&uid) {
            return n;
        }
        let n = self.definition_uids.len() as u16;
        self.definitions.insert(uid, n);
        self.definition_uids.push(uid);
        n
    }

    /// The number of bucket name `key`.
    pub(super) fn key(&mut self, key: &str) -> u16 {
        if let Some(&n) = self.keys.get(key) {
            return n;
        }
        let n = self.key_names.len() as u16;
        self.keys.insert(key.to_owned(), n);
        self.key_names.push(key.to_owned());
        n
    }

    /// A region's bucket: `region`, definition number `definition`, identity number
    /// `identity`.
    pub(super) fn bucket(region: usize, definition: u16, identity: u32) -> BucketId {
        (region as u64) << 48 | u64::from(definition) << 32 | u64::from(identity)
    }

    /// The exact limiter's bucket: bucket name number `key`, identity number `identity`.
    pub(super) fn exact(key: u16, identity: u32) -> ExactId {
        u64::from(key) << 32 | u64::from(identity)
    }

    /// A region bucket's region, definition uid and identity.
    pub(super) fn of_bucket(&self, id: BucketId) -> (usize, u64, &[u8]) {
        let region = (id >> 48) as usize;
        let definition = self.definition_uids[((id >> 32) & 0xffff) as usize];
        (
            region,
            definition,
            &self.identity_bytes[(id & 0xffff_ffff) as usize],
        )
    }

    /// The identity number of a bucket of either kind.
    pub(super) fn identity_of(id: u64) -> u32 {
        (id & 0xffff_ffff) as u32
    }
}

/// What the run has seen so far, shared by the request tasks.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) names: Names,
    /// Each region's bucket: the bound.
    pub(super) buckets: HashMap<BucketId, BoundBook, Fixed>,
    /// The exact limiter over both regions (bucket name, identity), on the rule's whole limit.
    pub(super) exact: HashMap<ExactId, ExactBook, Fixed>,
    pub(super) rule_names: HashMap<u64, String, Fixed>,
    /// Each definition's bucket name (definitions of one rule share the store's bucket).
    pub(super) rule_keys: HashMap<u64, String, Fixed>,
    /// The rule definitions each region has charged (region, definition uid): a region's
    /// store keeps one account per bucket name, which two definitions of a rule share.
    pub(super) region_definitions: std::collections::HashSet<(usize, u64), Fixed>,
    /// Rules counted but never enforced (SHADOW): no bound, no false denials.
    pub(super) shadow: std::collections::HashSet<u64, Fixed>,
    /// The identities each rule has charged, by identity number.
    pub(super) identities: BTreeMap<String, Vec<u64>>,
    /// What the books dropped on the way said for the invariants.
    pub(super) retired: Retired,
    pub(super) rules: BTreeMap<String, RuleReport>,
    pub(super) second: BTreeMap<String, RuleSecond>,
    pub(super) decisions: u64,
    pub(super) second_decisions: u64,
    /// Admitted this second, per region.
    pub(super) region_admitted: BTreeMap<usize, u64>,
    pub(super) split_breaches: Vec<String>,
    pub(super) admitted: u64,
    /// Decision latencies (virtual µs) and how many decisions took each.
    pub(super) latency: BTreeMap<u64, u64>,
    pub(super) fail_mode_breaches: Vec<String>,
    pub(super) latency_breaches: u64,
    pub(super) longest: u64,
}

/// The invariants' findings on region buckets already checked and dropped.
#[derive(Default)]
pub(super) struct Retired {
    /// Buckets checked against their bound.
    pub(super) checked: u64,
    /// Buckets not checked: a decision of theirs went to a fail mode.
    pub(super) unanswered: u64,
    /// Each rule's highest share of its bound used.
    pub(super) worst: BTreeMap<String, f64>,
    /// Buckets over their bound, each with where it sorts.
    pub(super) breaches: Vec<(Sorted<u64>, String)>,
    /// Buckets whose ledger was checked, units handed out and never spent, and the breaches.
    pub(super) ledger_checked: usize,
    pub(super) unspent: u64,
    pub(super) ledger_breaches: Vec<(Sorted<String>, String)>,
}

/// Where a breach sorts in the report: region, rule (definition or bucket name), identity.
pub(super) type Sorted<R> = (usize, R, Vec<u8>);

impl Tally {
    /// Notes that rule `name` charged identity number `identity`.
    pub(super) fn saw_identity(&mut self, name: &str, identity: u32) {
        let bits = match self.identities.get_mut(name) {
            Some(bits) => bits,
            None => self.identities.entry(name.to_owned()).or_default(),
        };
        let (word, bit) = (identity as usize / 64, identity % 64);
        if bits.len() <= word {
            bits.resize(word + 1, 0);
        }
        bits[word] |= 1 << bit;
    }

    /// Distinct identities each rule charged, both regions and every definition together.
    pub(super) fn identity_counts(&self) -> BTreeMap<String, u64> {
        self.identities
            .iter()
            .map(|(name, bits)| {
                (
                    name.clone(),
                    bits.iter().map(|w| u64::from(w.count_ones())).sum(),
                )
            })
            .collect()
    }
}
