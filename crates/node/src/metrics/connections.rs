//! The connections each listener holds, and those it closed to stay within its bounds
//! (`tollgate-server`'s `listener` module): a port filling up shows here before it refuses a
//! gateway or a probe.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a listener closed a connection of its own accord.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionRefusal {
    /// Every place of the listener was taken.
    Full,
    /// Its source address held every place one address may.
    SourceFull,
    /// It sent nothing within the listener's deadline.
    SentNothing,
}

impl ConnectionRefusal {
    /// Its `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionRefusal::Full => "full",
            ConnectionRefusal::SourceFull => "source_full",
            ConnectionRefusal::SentNothing => "sent_nothing",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    listener: &'static str,
    reason: &'static str,
}

/// Every listener's connection metrics.
#[derive(Debug, Clone, Default)]
pub struct ConnectionMetrics {
    open: Family<ListenerLabels, Gauge>,
    refused: Family<RefusedLabels, Counter>,
}

impl ConnectionMetrics {
    /// Registers them under `registry`'s prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "connections_open",
            "Connections each listener holds",
            self.open.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections a listener closed to stay within its bounds, by reason",
            self.refused.clone(),
        );
    }

    /// The open connections of `listener`.
    pub fn open(&self, listener: &'static str) -> Gauge {
        self.open
            .get_or_create(&ListenerLabels { listener })
            .clone()
    }

    /// Connections `listener` closed for `reason`.
    pub fn refused(&self, listener: &'static str, reason: ConnectionRefusal) -> Counter {
        self.refused
            .get_or_create(&RefusedLabels {
                listener,
                reason: reason.as_str(),
            })
            .clone()
    }
}
