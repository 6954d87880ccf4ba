//! The run's books: what each region's buckets admitted against the bound each limit owes,
//! and what the exact limiter over both regions would have admitted.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

use crate::oracle::BucketOracle;
use crate::report::{RuleReport, RuleSecond};

/// The deterministic hasher for maps whose order could reach a report (Fx: no random seed,
/// and several times cheaper than SipHash on the per-request books).
pub(super) type Fixed = BuildHasherDefault<rustc_hash::FxHasher>;

/// A region's bucket: region, rule definition, identity.
pub(super) type BucketId = (usize, u64, Vec<u8>);

/// The exact limiter's bucket: rule key (bucket name), identity.
pub(super) type ExactId = (String, Vec<u8>);

/// What the run has seen so far, shared by the request tasks.
#[derive(Default)]
pub(super) struct Tally {
    /// Each region's bucket (region, rule definition, identity): the bound and the real view.
    pub(super) buckets: HashMap<BucketId, BucketOracle, Fixed>,
    /// The exact limiter over both regions (rule key, identity), on the rule's whole limit.
    pub(super) exact: HashMap<ExactId, BucketOracle, Fixed>,
    pub(super) rule_names: HashMap<u64, String, Fixed>,
    /// Each definition's bucket name (definitions of one rule share the store's bucket).
    pub(super) rule_keys: HashMap<u64, String, Fixed>,
    /// Rules counted but never enforced (SHADOW): no bound, no false denials.
    pub(super) shadow: std::collections::HashSet<u64, Fixed>,
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
