//! The receiving side of the link: applies the peer's consumption to this region's store,
//! answers heartbeats, and makes HOME_REGION decisions for the peer.
//!
//! A batch is decoded and every entry validated before anything is applied, so a malformed
//! batch changes nothing. Each entry is applied with the store's debit-once, so a batch
//! applied twice, late, or out of order changes nothing either.
//!
//! What the peer reports is bounded by what this region knows, not taken on trust from
//! whoever holds the link's secret: a consumption total no larger than twice what the rule's
//! limit admits over its epoch (the peer's view may be in debt by a bucket), demand reports
//! that live at most [`MAX_INTERVALS`] of this region's own sync interval, their units no more
//! than the limit admits over that time.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tollgate_lease::limit::{MAX_PERIOD, MAX_UNITS};
use tollgate_lease::{
    BucketKey, DebitItem, DebitOnce, DebitRequest, DemandReport, DemandRequest, LeaseStore,
    MAX_BUCKETS_PER_CALL, SharedClock, Store,
};
use tonic::Status;

use crate::RegionHost;
use crate::consumption::{epoch_length, epoch_until};
use crate::messages::{
    Batch, BatchAck, DemandAck, DemandBatch, DemandItem, ForwardReply, ForwardRequest, Origin,
    PenaltyAck, PenaltyBatch, Ping, Pong,
};
use crate::metrics::{ReasonLabel, RegionMetrics};

/// The most entries one batch may carry.
pub const MAX_ENTRIES_PER_BATCH: usize = 4096;

/// Why demand reports were not recorded.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// An item is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The store failed.
    #[error("the store failed: {0}")]
    Store(tollgate_lease::StoreError),
}

/// How many of this region's sync intervals a peer's demand report may live (its interval).
pub const MAX_INTERVALS: u64 = 4;

/// Store calls in flight while applying one batch.
const CONCURRENT_DEBITS: usize = 16;
/// The clock difference between regions a batch may show.
const CLOCK_SKEW_US: u64 = 60_000_000;

/// Applies what the peer region sends.
pub struct Receiver {
    store: Store,
    host: Arc<dyn RegionHost>,
    metrics: RegionMetrics,
    own: Origin,
    peer_region: String,
    clock: SharedClock,
    /// This region's sync interval, µs (bounds how long a peer's demand report lives).
    interval_us: u64,
    /// When the newest applied batch was sent (peer's clock), for the lag metric.
    newest_applied: AtomicU64,
    /// Paces the warning for what the peer sent and this region refused.
    refusals: crate::throttle::Throttled,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("own", &self.own)
            .field("peer_region", &self.peer_region)
            .finish_non_exhaustive()
    }
}

impl Receiver {
    /// A receiver for batches from `peer_region`, applied to `store`; `interval` is this
    /// region's sync interval.
    pub fn new(
        store: Store,
        host: Arc<dyn RegionHost>,
        metrics: RegionMetrics,
        own: Origin,
        peer_region: String,
        clock: SharedClock,
        interval: std::time::Duration,
    ) -> Self {
        Self {
            store,
            host,
            metrics,
            own,
            peer_region,
            clock,
            interval_us: (interval.as_micros() as u64).max(1),
            newest_applied: AtomicU64::new(0),
            refusals: crate::throttle::Throttled::default(),
        }
    }

    /// Counts a refused call.
    pub(crate) fn reject(&self, reason: &str) {
        self.metrics
            .batches_rejected
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// When the newest applied batch was sent (0: none yet).
    pub fn newest_applied(&self) -> u64 {
        self.newest_applied.load(Ordering::Relaxed)
    }

    /// Counts a refused call or entry, and warns of it (at most once every few seconds, with
    /// how many were held back): what the peer sends and this region cannot take is a sign of
    /// a link that is wrong (two versions of a rule during a rollout, a peer in trouble, or a
    /// peer that is not what it says), which an operator must hear of.
    pub(crate) fn refuse(&self, reason: &str, detail: std::fmt::Arguments<'_>) {
        self.reject(reason);
        if let Some(held_back) = self.refusals.ready() {
            tracing::warn!(
                peer = %self.peer_region,
                reason,
                held_back,
                "region link: refused what the peer sent: {detail}"
            );
        }
    }

    fn invalid(&self, message: String) -> Status {
        self.refuse("invalid", format_args!("{message}"));
        Status::invalid_argument(message)
    }

    /// Refuses a `what` (a batch, demand) from another region than the peer, or with more
    /// than [`MAX_ENTRIES_PER_BATCH`] `items`.
    fn check_envelope(
        &self,
        origin: &Origin,
        count: usize,
        what: &str,
        items: &str,
    ) -> Result<(), Status> {
        if origin.region != self.peer_region {
            let message = format!(
                "{what} from region {:?}, not this region's peer",
                origin.region
            );
            self.refuse("unknown peer", format_args!("{message}"));
            return Err(Status::permission_denied(message));
        }
        if count > MAX_ENTRIES_PER_BATCH {
            return Err(self.invalid(format!(
                "{count} {items}; at most {MAX_ENTRIES_PER_BATCH} per batch"
            )));
        }
        Ok(())
    }

    /// Applies a batch: all of it is validated first; then every entry of a rule that syncs
    /// here is debited once.
    ///
    /// Longer than most: the whole batch validated before anything is applied, then applied,
    /// in one function, so that no path applies a batch it has not validated.
    pub async fn apply(&self, batch: Batch) -> Result<BatchAck, Status> {
        self.check_envelope(&batch.origin, batch.entries.len(), "batch", "entries")?;
        let origin = batch.origin.name();
        let now = self.clock.now_micros();
        // No epoch ends further out than two of the longest windows.
        let latest_until = now + 2 * MAX_PERIOD.as_micros() as u64;
        let mut by_identity: HashMap<String, Vec<DebitItem>> = HashMap::new();
        let mut skipped = 0u32;
        let mut checked = Vec::with_capacity(batch.entries.len());
        for (i, entry) in batch.entries.iter().enumerate() {
            let key = BucketKey::new(&entry.identity, &entry.rule)
                .map_err(|e| self.invalid(format!("entry {i}: {e}")))?;
            if entry.until == 0 || entry.at == 0 {
                return Err(self.invalid(format!("entry {i}: no epoch or time")));
            }
            if entry.until > latest_until {
                return Err(self.invalid(format!(
                    "entry {i}: an epoch ending at {} µs, beyond any window",
                    entry.until
                )));
            }
            if entry.total > MAX_UNITS {
                return Err(self.invalid(format!(
                    "entry {i}: a total of {} units; at most {MAX_UNITS}",
                    entry.total
                )));
            }
            let once = DebitOnce {
                origin: origin.clone(),
                until: entry.until,
            };
            checked.push((key, once, entry));
        }
        // A consumption's epoch ends no later than the rule's own window allows for time up to
        // now (and a minute of clock skew between the regions).
        let skewed_now = now + CLOCK_SKEW_US;
        let mut synced = Vec::with_capacity(checked.len());
        for (i, (key, once, entry)) in checked.into_iter().enumerate() {
            // Only ASYNC_SYNC rules (never concurrency limits: refused at validation).
            let Some(limit) = self.host.synced_limit(&entry.rule) else {
                skipped += 1;
                continue;
            };
            let latest = epoch_until(&limit, skewed_now);
            // The most the limit admits over one epoch's consumption, twice (the peer's view
            // of the bucket may be in debt by up to a bucket): a larger total is not
            // consumption, and would zero this region's bucket for the epoch.
            let most = limit
                .most_over(Duration::from_micros(epoch_length(&limit)))
                .saturating_mul(2);
            if entry.total > most {
                self.refuse(
                    "total beyond the limit",
                    format_args!(
                        "entry {i} of rule {:?} says {} were consumed in an epoch, where its \
                         rule admits at most {most} (skipped)",
                        entry.rule, entry.total
                    ),
                );
                skipped += 1;
                continue;
            }
            if entry.until > latest || entry.at > skewed_now {
                // This entry only (the regions may hold the rule differently during a
                // rollout): refusing the batch would stop every other total from landing.
                self.refuse(
                    "epoch beyond the window",
                    format_args!(
                        "entry {i} of rule {:?} has an epoch ending at {} µs, past the rule's \
                         window here ({latest} µs; skipped)",
                        entry.rule, entry.until
                    ),
                );
                skipped += 1;
                continue;
            }
            synced.push((key, once, entry, limit));
        }
        for (key, once, entry, limit) in synced {
            by_identity
                .entry(key.identity_prefix().to_owned())
                .or_default()
                .push(DebitItem {
                    key,
                    limit,
                    units: entry.total,
                    consumed_at: Some(entry.at),
                    once: Some(once),
                });
        }
        let mut requests = vec![];
        for (_, items) in by_identity {
            for chunk in items.chunks(MAX_BUCKETS_PER_CALL) {
                requests.push(
                    DebitRequest::new(chunk.to_vec()).map_err(|e| self.invalid(e.to_string()))?,
                );
            }
        }
        let calls = requests.into_iter().map(|request| {
            let store = self.store.clone();
            async move { store.debit(&request).await }
        });
        let mut results = futures::stream::iter(calls).buffer_unordered(CONCURRENT_DEBITS);
        let mut applied = 0u64;
        let mut failure = None;
        while let Some(result) = results.next().await {
            match result {
                Ok(units) => applied += units.iter().sum::<u64>(),
                Err(e) => failure = Some(e),
            }
        }
        self.metrics.units_applied.inc_by(applied);
        if let Some(e) = failure {
            // What was applied stays applied; the sender resends and the rest lands then. Not
            // a link failure: the sender keeps the peer Up.
            return Err(Status::aborted(format!("this region's store failed: {e}")));
        }
        self.metrics.batches_applied.inc();
        self.newest_applied
            .fetch_max(batch.sent_at.min(now), Ordering::Relaxed);
        Ok(BatchAck {
            applied_units: applied,
            skipped,
        })
    }

    /// Answers a heartbeat.
    pub fn pong(&self, ping: &Ping) -> Result<Pong, Status> {
        if ping.origin.region != self.peer_region {
            self.refuse(
                "unknown peer",
                format_args!("a heartbeat from region {:?}", ping.origin.region),
            );
            return Err(Status::permission_denied("not this region's peer"));
        }
        Ok(Pong {
            origin: self.own.clone(),
        })
    }

    /// Records the peer's demand for synced buckets in this region's store (the regional
    /// allowances' shares). Items of rules that do not sync here are skipped; a malformed
    /// batch is refused whole.
    pub async fn record_demand(&self, batch: DemandBatch) -> Result<DemandAck, Status> {
        self.check_envelope(&batch.origin, batch.items.len(), "demand", "demand items")?;
        let longest = MAX_INTERVALS * self.interval_us;
        if batch.interval_us == 0 || batch.interval_us > longest {
            return Err(self.invalid(format!(
                "demand over {} µs; this region takes reports over at most {longest} µs \
                 ({MAX_INTERVALS} of its sync intervals)",
                batch.interval_us
            )));
        }
        let recorded = self
            .report(&batch.items, &batch.origin, batch.interval_us)
            .await
            .map_err(|e| match e {
                ReportError::Invalid(m) => self.invalid(m),
                ReportError::Store(e) => {
                    Status::aborted(format!("this region's store failed: {e}"))
                }
            })?;
        Ok(DemandAck { recorded })
    }

    /// Writes demand reports of `origin` (this node, or a peer node) into this region's
    /// store; returns how many were recorded.
    pub async fn report(
        &self,
        items: &[DemandItem],
        origin: &Origin,
        interval_us: u64,
    ) -> Result<u32, ReportError> {
        let mut by_identity: HashMap<Vec<u8>, Vec<DemandReport>> = HashMap::new();
        let mut recorded = 0;
        for item in items {
            let key = BucketKey::new(&item.identity, &item.rule)
                .map_err(|e| ReportError::Invalid(format!("demand item {:?}: {e}", item.rule)))?;
            if item.units > MAX_UNITS {
                return Err(ReportError::Invalid(format!(
                    "demand item {:?}: {} units",
                    item.rule, item.units
                )));
            }
            let Some(limit) = self.host.synced_limit(&item.rule) else {
                continue;
            };
            // Demand beyond what the limit admits over the report's life says nothing more
            // about shares: it is taken as that much.
            let most = limit.most_over(Duration::from_micros(interval_us));
            let units = item.units.min(most);
            recorded += 1;
            by_identity
                .entry(item.identity.clone())
                .or_default()
                .push(DemandReport {
                    key,
                    origin: origin.name(),
                    region: origin.region.clone(),
                    units,
                    interval_us,
                });
        }
        let mut requests = vec![];
        for (_, reports) in by_identity {
            for chunk in reports.chunks(MAX_BUCKETS_PER_CALL) {
                requests.push(
                    DemandRequest::new(chunk.to_vec())
                        .map_err(|e| ReportError::Invalid(e.to_string()))?,
                );
            }
        }
        let calls = requests.into_iter().map(|request| {
            let store = self.store.clone();
            async move { store.report_demand(&request).await }
        });
        let mut results = futures::stream::iter(calls).buffer_unordered(CONCURRENT_DEBITS);
        let mut failure = None;
        while let Some(result) = results.next().await {
            if let Err(e) = result {
                failure = Some(e);
            }
        }
        match failure {
            Some(e) => Err(ReportError::Store(e)),
            None => Ok(recorded),
        }
    }

    /// Holds the peer's penalty blocks in this region: each identity blocked for the time left
    /// under the same rule here (a rule whose penalty is not enforced here is skipped). A
    /// malformed batch is refused whole.
    pub async fn impose(&self, batch: PenaltyBatch) -> Result<PenaltyAck, Status> {
        self.check_envelope(&batch.origin, batch.blocks.len(), "penalty", "blocks")?;
        for block in &batch.blocks {
            BucketKey::new(&block.identity, &block.rule)
                .map_err(|e| self.invalid(format!("block of {:?}: {e}", block.rule)))?;
            if block.left_us > MAX_PERIOD.as_micros() as u64 {
                return Err(self.invalid(format!(
                    "block of {:?} for {} µs",
                    block.rule, block.left_us
                )));
            }
        }
        let mut imposed = 0;
        for block in batch.blocks {
            let left = Duration::from_micros(block.left_us);
            if self
                .host
                .impose_block(block.rule, block.identity, left)
                .await
            {
                imposed += 1;
            }
        }
        Ok(PenaltyAck { imposed })
    }

    /// Makes a HOME_REGION decision for the peer.
    pub async fn decide(&self, request: ForwardRequest) -> Result<ForwardReply, Status> {
        BucketKey::new(&request.identity, &request.rule)
            .map_err(|e| self.invalid(e.to_string()))?;
        self.metrics.forwards_served.inc();
        self.host
            .decide_forwarded(request)
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))
    }
}
