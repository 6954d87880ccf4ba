//! A request to decide, as the APIs hand it to the runtime, and its validation.
//!
//! What validation refuses is a request's shape, which the caller's configuration sets (its
//! domain, how many descriptors and entries, their keys): never the length or bytes of a value,
//! which come from a client's request. A value of any length is matched as sent and its
//! bucket keyed by a bounded identity ([`crate::rules::identity`]).

use std::time::Duration;

use tollgate_lease::limit::MAX_UNITS;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The longest domain, in bytes.
pub const MAX_DOMAIN_BYTES: usize = 256;
/// The longest descriptor entry key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// How rules see a request's descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matching {
    /// Each descriptor on its own (Envoy's rate limit service: one status per descriptor).
    PerDescriptor,
    /// All descriptors together as one set of request attributes (`CheckRateLimit`: a rule
    /// may match `plan` from one descriptor and `route` from another).
    Merged,
}

/// A limit the request itself sets for a descriptor (Envoy's `RateLimitOverride`): it replaces
/// the configured rules for that descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests: u32,
    /// The unit.
    pub unit: Duration,
}

/// One descriptor: entries, and optionally its own cost and limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// `(key, value)` entries, in order.
    pub entries: Vec<(String, String)>,
    /// Overrides the request's cost for this descriptor (0 peeks).
    pub cost: Option<u64>,
    /// A limit set by the request.
    pub limit: Option<LimitOverride>,
}

impl Descriptor {
    /// A descriptor of `entries`.
    pub fn new<K: Into<String>, V: Into<String>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            ..Self::default()
        }
    }
}

/// A request to decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The domain whose rules apply.
    pub domain: String,
    /// The descriptors.
    pub descriptors: Vec<Descriptor>,
    /// Units it costs (0 means 1).
    pub cost: u64,
    /// How rules see the descriptors.
    pub matching: Matching,
}

impl Request {
    /// A request in `domain` with no descriptors yet, cost 1, descriptors merged.
    pub fn new(domain: impl Into<String>) -> Self {
        Self {
            domain: domain.into(),
            descriptors: vec![],
            cost: 1,
            matching: Matching::Merged,
        }
    }

    /// Adds a descriptor.
    pub fn descriptor<K: Into<String>, V: Into<String>>(
        mut self,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.descriptors.push(Descriptor::new(entries));
        self
    }

    /// Sets the cost.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Sets how rules see the descriptors.
    pub fn matching(mut self, matching: Matching) -> Self {
        self.matching = matching;
        self
    }

    /// The cost of descriptor `index`.
    pub fn cost_of(&self, index: usize) -> u64 {
        self.descriptors[index].cost.unwrap_or(self.cost.max(1))
    }

    /// Checks the request's shape.
    pub fn validate(&self) -> Result<(), RequestError> {
        if self.domain.is_empty() {
            return Err(RequestError::EmptyDomain);
        }
        if self.domain.len() > MAX_DOMAIN_BYTES {
            return Err(RequestError::DomainTooLong {
                bytes: self.domain.len(),
            });
        }
        if self.descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        if self.descriptors.len() > MAX_DESCRIPTORS {
            return Err(RequestError::TooManyDescriptors {
                count: self.descriptors.len(),
            });
        }
        if self.cost > MAX_UNITS {
            return Err(RequestError::CostTooLarge { cost: self.cost });
        }
        for (index, d) in self.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(RequestError::EmptyDescriptor { index });
            }
            if d.entries.len() > MAX_ENTRIES {
                return Err(RequestError::TooManyEntries {
                    index,
                    count: d.entries.len(),
                });
            }
            for (k, _) in &d.entries {
                if k.is_empty() {
                    return Err(RequestError::EmptyKey { index });
                }
                if k.len() > MAX_KEY_BYTES {
                    return Err(RequestError::KeyTooLong {
                        index,
                        bytes: k.len(),
                    });
                }
            }
            if let Some(cost) = d.cost.filter(|c| *c > MAX_UNITS) {
                return Err(RequestError::CostTooLarge { cost });
            }
            if let Some(o) = d.limit {
                if o.unit.is_zero() || o.unit.subsec_nanos() != 0 {
                    return Err(RequestError::BadOverride {
                        index,
                        reason: "the unit must be a whole number of seconds".into(),
                    });
                }
                if o.requests > 0
                    && let Err(e) = (tollgate_lease::LimitSpec::FixedWindow {
                        limit: f64::from(o.requests),
                        window: o.unit,
                    })
                    .validate()
                {
                    return Err(RequestError::BadOverride {
                        index,
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A malformed request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No domain.
    #[error("`domain` must not be empty")]
    EmptyDomain,
    /// A domain too long to be one.
    #[error("`domain` is {bytes} bytes long; at most {MAX_DOMAIN_BYTES} are allowed")]
    DomainTooLong {
        /// Its length.
        bytes: usize,
    },
    /// No descriptors.
    #[error("at least one descriptor is required")]
    NoDescriptors,
    /// Too many descriptors.
    #[error("{count} descriptors; at most {MAX_DESCRIPTORS} are allowed")]
    TooManyDescriptors {
        /// How many.
        count: usize,
    },
    /// A descriptor with no entries.
    #[error("descriptors[{index}] has no entries")]
    EmptyDescriptor {
        /// Which.
        index: usize,
    },
    /// A descriptor with too many entries.
    #[error("descriptors[{index}] has {count} entries; at most {MAX_ENTRIES} are allowed")]
    TooManyEntries {
        /// Which.
        index: usize,
        /// How many.
        count: usize,
    },
    /// An entry without a key.
    #[error("descriptors[{index}] has an entry with an empty key")]
    EmptyKey {
        /// Which.
        index: usize,
    },
    /// An entry key too long to be one.
    #[error("descriptors[{index}] has a key of {bytes} bytes; at most {MAX_KEY_BYTES} are allowed")]
    KeyTooLong {
        /// Which descriptor.
        index: usize,
        /// The key's length.
        bytes: usize,
    },
    /// A cost too large to count exactly.
    #[error("cost {cost} is larger than the maximum {MAX_UNITS}")]
    CostTooLarge {
        /// The cost.
        cost: u64,
    },
    /// A limit override on a node told to refuse them (`--descriptor-overrides refuse`).
    #[error(
        "descriptors[{index}].limit: this node does not take limits from its callers (descriptor_overrides: refuse)"
    )]
    OverrideRefused {
        /// Which.
        index: usize,
    },
    /// A limit override that cannot be held.
    #[error("descriptors[{index}].limit: {reason}")]
    BadOverride {
        /// Which.
        index: usize,
        /// Why.
        reason: String,
    },
}
