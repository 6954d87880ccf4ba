//! A scenario's timed faults: what happens to the store, the link or the nodes, when, and
//! for how long.

use std::time::Duration;

use super::*;

/// A fault: what happens, when, and for how long.
#[derive(Debug, Clone, Deserialize)]
pub struct Fault {
    /// When it starts.
    #[serde(with = "humantime_serde")]
    pub at: Duration,
    /// How long it lasts, for faults that end (store outages).
    #[serde(default, rename = "for", with = "humantime_serde")]
    pub lasts: Option<Duration>,
    /// What happens.
    #[serde(flatten)]
    pub kind: FaultKind,
}

/// What a fault does.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The region's store refuses connections (a killed Redis).
    StoreDown {
        /// The region.
        region: String,
    },
    /// The region's store stops answering (a `SIGSTOP`ped Redis).
    StoreStall {
        /// The region.
        region: String,
    },
    /// The region's store answers slowly.
    StoreSlow {
        /// The region.
        region: String,
        /// Added to every call.
        #[serde(with = "humantime_serde")]
        latency: Duration,
    },
    /// The region's store fails over to a replica without its state (buckets start full).
    StoreFailover {
        /// The region.
        region: String,
    },
    /// A new rule file replaces the rules on every node (capacity cut, SHADOW → ENFORCE, a
    /// kill switch).
    Rules {
        /// The new rule file.
        yaml: String,
    },
    /// A node crashes, holding what it leased and the slots its requests held.
    Crash {
        /// The node (`<region>-<index>`).
        node: String,
    },
    /// Nothing crosses the link between the regions (what is sent arrives after the heal,
    /// unless its call gave up first).
    Partition {},
    /// The link between the regions takes this long one way.
    LinkDelay {
        /// The one-way latency while it lasts.
        #[serde(with = "humantime_serde")]
        latency: Duration,
    },
    /// Calls across the link reach the peer twice, with this probability.
    LinkDuplicate {
        /// In [0, 1].
        probability: f64,
    },
    /// Calls across the link are held up to this long more, at random, so later calls
    /// overtake earlier ones.
    LinkReorder {
        /// The longest extra hold.
        #[serde(with = "humantime_serde")]
        max_delay: Duration,
    },
    /// A crashed node starts again, empty.
    Restart {
        /// The node.
        node: String,
    },
}

impl FaultKind {
    /// The kind of fault, one word for each colour a plot gives it: `store-down`,
    /// `store-stall`, `store-slow`, `store-failover`, `rules`, `crash`, `restart`,
    /// `partition`, `link`.
    pub fn class(&self) -> &'static str {
        match self {
            FaultKind::StoreDown { .. } => "store-down",
            FaultKind::StoreStall { .. } => "store-stall",
            FaultKind::StoreSlow { .. } => "store-slow",
            FaultKind::StoreFailover { .. } => "store-failover",
            FaultKind::Rules { .. } => "rules",
            FaultKind::Crash { .. } => "crash",
            FaultKind::Restart { .. } => "restart",
            FaultKind::Partition {} => "partition",
            FaultKind::LinkDuplicate { .. }
            | FaultKind::LinkReorder { .. }
            | FaultKind::LinkDelay { .. } => "link",
        }
    }

    /// A short label for reports and plots.
    pub fn label(&self) -> String {
        match self {
            FaultKind::StoreDown { region } => format!("store down ({region})"),
            FaultKind::StoreStall { region } => format!("store stalled ({region})"),
            FaultKind::StoreSlow { region, latency } => {
                format!(
                    "store slow +{} ({region})",
                    humantime::format_duration(*latency)
                )
            }
            FaultKind::StoreFailover { region } => format!("store failover ({region})"),
            FaultKind::Rules { .. } => "rules changed".into(),
            FaultKind::Crash { node } => format!("{node} crashed"),
            FaultKind::Restart { node } => format!("{node} restarted"),
            FaultKind::Partition {} => "regions partitioned".into(),
            FaultKind::LinkDuplicate { probability } => {
                format!("region link duplicates {:.0} %", probability * 100.0)
            }
            FaultKind::LinkReorder { max_delay } => {
                format!(
                    "region link reorders (up to {})",
                    humantime::format_duration(*max_delay)
                )
            }
            FaultKind::LinkDelay { latency } => {
                format!(
                    "region link {} one way",
                    humantime::format_duration(*latency)
                )
            }
        }
    }
}
