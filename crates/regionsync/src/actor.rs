//! The region-sync actor (one per node): every sync interval it ships the consumption totals
//! that grew to the peer region; every heartbeat interval it probes the peer and keeps the
//! peer tracker and the lag metric current. Network calls run in spawned tasks that report back
//! as messages, so a slow peer never blocks the actor; a tick that finds the previous call still
//! out skips (the next one ships the newer totals anyway).

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::consumption::ConsumptionLog;
use crate::link::{LinkError, PeerClient};
use crate::messages::{Batch, DemandBatch, Entry, Origin, Ping};
use crate::metrics::RegionMetrics;
use crate::peer::PeerTracker;
use crate::policy::PeerState;
use crate::receiver::{MAX_ENTRIES_PER_BATCH, Receiver};
use tollgate_lease::SharedClock;

/// Messages of the region-sync actor.
#[derive(Debug)]
pub enum SyncMsg {
    /// Ship what grew.
    Flush,
    /// A flush finished (true: every batch was acknowledged).
    Flushed(bool),
    /// Probe the peer.
    Beat,
    /// A probe finished.
    BeatDone(bool),
    /// Ship what is left, then stop.
    Stop(RpcReplyPort<()>),
}

/// What the actor works with.
#[derive(Debug, Clone)]
pub struct SyncParts {
    /// This node.
    pub origin: Origin,
    /// The consumption to ship.
    pub log: Arc<ConsumptionLog>,
    /// The peer.
    pub client: PeerClient,
    /// The peer's state.
    pub peer: Arc<PeerTracker>,
    /// What the peer sent (for the lag metric).
    pub receiver: Arc<Receiver>,
    /// Metrics.
    pub metrics: RegionMetrics,
    /// The node clock.
    pub clock: SharedClock,
    /// How often to ship.
    pub sync_interval: Duration,
    /// How often to probe.
    pub heartbeat_interval: Duration,
    /// Whether the peer speaks link version 1 only (no demand reports: allowances off).
    pub peer_v1: Arc<std::sync::atomic::AtomicBool>,
}

/// The actor (stateless; state in [`SyncState`]).
#[derive(Debug)]
pub struct SyncActor;

/// The actor's state.
#[derive(Debug)]
pub struct SyncState {
    parts: SyncParts,
    seq: Arc<std::sync::atomic::AtomicU64>,
    flushing: bool,
    beating: bool,
    timers: Vec<tokio::task::JoinHandle<()>>,
}

impl SyncParts {
    /// Ships every pending total, in batches; true if all were acknowledged. A batch the peer
    /// refuses does not hold back the others; an unreachable peer stops the flush (the next
    /// tick sends newer totals).
    async fn flush(&self, seq: &std::sync::atomic::AtomicU64) -> bool {
        let now = self.clock.now_micros();
        let pending = self.log.pending(now);
        self.metrics.pending_keys.set(pending.entries.len() as i64);
        let mut all = true;
        for chunk in batches(&pending.entries) {
            let batch = Batch {
                origin: self.origin.clone(),
                seq: seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                sent_at: self.clock.now_micros(),
                entries: chunk.to_vec(),
            };
            match self
                .client
                .exchange(&batch, self.sync_interval.max(Duration::from_millis(500)))
                .await
            {
                Ok((_ack, bytes)) => {
                    self.log.acknowledge(chunk);
                    self.metrics.batches_sent.inc();
                    self.metrics.bytes_sent.inc_by(bytes as u64);
                    self.metrics.entries_sent.inc_by(chunk.len() as u64);
                    self.peer.success(self.clock.now_micros());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "consumption batch not delivered; resent with the next");
                    self.metrics.batches_failed.inc();
                    all = false;
                    if e.is_link_failure() {
                        self.peer.failure(self.clock.now_micros());
                        break;
                    }
                }
            }
        }
        if all {
            self.metrics.units_sent.inc_by(pending.units);
        }
        all
    }

    /// Reports what this node's requests asked of synced buckets since the last tick: into
    /// this region's store, and to the peer region (the regional allowances' shares). A peer
    /// that does not know the call (link version 1) turns the allowances off until it does.
    async fn flush_demand(&self) {
        let items = self.log.take_demand();
        if items.is_empty() {
            return;
        }
        let interval_us = self.sync_interval.as_micros() as u64;
        if let Err(e) = self
            .receiver
            .report(&items, &self.origin, interval_us)
            .await
        {
            tracing::debug!(error = %e, "demand not recorded in this region's store");
        }
        if self.peer.state() == PeerState::Down {
            return;
        }
        for chunk in items.chunks(MAX_ENTRIES_PER_BATCH) {
            let batch = DemandBatch {
                origin: self.origin.clone(),
                interval_us,
                items: chunk.to_vec(),
            };
            match self
                .client
                .demand(&batch, self.sync_interval.max(Duration::from_millis(500)))
                .await
            {
                Ok(_) => {
                    if self
                        .peer_v1
                        .swap(false, std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::info!(
                            "the peer region now speaks link version 2: regional allowances on"
                        );
                        crate::Allowances::of(self.peer.state(), false).publish(&self.metrics);
                    }
                }
                Err(LinkError::Status {
                    code: tonic::Code::Unimplemented,
                    ..
                }) => {
                    if !self
                        .peer_v1
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::warn!(
                            "the peer region speaks link version 1 (no demand reports): ASYNC_SYNC \
                             runs without regional allowances, as in version 1, until it is upgraded"
                        );
                        crate::Allowances::of(self.peer.state(), true).publish(&self.metrics);
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "demand not delivered; the next tick reports anew");
                    if e.is_link_failure() {
                        return;
                    }
                }
            }
        }
    }

    /// Lets time alone move the peer's state (the state metric follows its changes), and
    /// updates the lag.
    fn observe(&self) {
        let now = self.clock.now_micros();
        self.peer.tick(now);
        let newest = self.receiver.newest_applied();
        if newest > 0 {
            self.metrics
                .sync_lag_ms
                .set((now.saturating_sub(newest) / 1000) as i64);
        }
    }
}

/// The most bytes of entries put in one batch (well under the link's message limit, whatever
/// the identities' lengths).
const MAX_BATCH_BYTES: usize = 1 << 20;

/// Splits entries into batches of at most [`MAX_ENTRIES_PER_BATCH`] entries and about
/// [`MAX_BATCH_BYTES`] bytes.
fn batches(entries: &[Entry]) -> Vec<&[Entry]> {
    let mut out = vec![];
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in entries.iter().enumerate() {
        let size = e.rule.len() + e.identity.len() + 48;
        if i > start && (i - start == MAX_ENTRIES_PER_BATCH || bytes + size > MAX_BATCH_BYTES) {
            out.push(&entries[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < entries.len() {
        out.push(&entries[start..]);
    }
    out
}

impl Actor for SyncActor {
    type Msg = SyncMsg;
    type State = SyncState;
    type Arguments = SyncParts;

    async fn pre_start(
        &self,
        myself: ActorRef<SyncMsg>,
        parts: SyncParts,
    ) -> Result<SyncState, ActorProcessingErr> {
        let timers = vec![
            myself.send_interval(parts.sync_interval, || SyncMsg::Flush),
            myself.send_interval(parts.heartbeat_interval, || SyncMsg::Beat),
        ];
        Ok(SyncState {
            parts,
            seq: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            flushing: false,
            beating: false,
            timers,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SyncMsg>,
        msg: SyncMsg,
        state: &mut SyncState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SyncMsg::Flush => {
                if !state.flushing {
                    state.flushing = true;
                    let (parts, seq, me) = (state.parts.clone(), state.seq.clone(), myself.clone());
                    tokio::spawn(async move {
                        let ok = parts.flush(&seq).await;
                        parts.flush_demand().await;
                        let _ = me.cast(SyncMsg::Flushed(ok));
                    });
                }
            }
            SyncMsg::Flushed(_) => state.flushing = false,
            SyncMsg::Beat => {
                state.parts.observe();
                if !state.beating {
                    state.beating = true;
                    let (parts, me) = (state.parts.clone(), myself.clone());
                    tokio::spawn(async move {
                        let ping = Ping {
                            origin: parts.origin.clone(),
                            sent_at: parts.clock.now_micros(),
                        };
                        let timeout = parts.heartbeat_interval.max(Duration::from_millis(250));
                        let ok = parts.client.heartbeat(&ping, timeout).await.is_ok();
                        let now = parts.clock.now_micros();
                        if ok {
                            parts.peer.success(now);
                        } else {
                            parts.peer.failure(now);
                        }
                        let _ = me.cast(SyncMsg::BeatDone(ok));
                    });
                }
            }
            SyncMsg::BeatDone(_) => {
                state.beating = false;
                state.parts.observe();
            }
            SyncMsg::Stop(reply) => {
                for timer in state.timers.drain(..) {
                    timer.abort();
                }
                if state.parts.peer.state() == PeerState::Up {
                    state.parts.flush(&state.seq).await;
                }
                let _ = reply.send(());
                myself.stop(None);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(identity_len: usize) -> Entry {
        Entry {
            rule: "r".into(),
            identity: vec![b'k'; identity_len],
            until: 1,
            total: 1,
            at: 1,
        }
    }

    #[test]
    fn batches_are_bounded_by_count_and_by_bytes() {
        let small: Vec<Entry> = (0..10_000).map(|_| entry(8)).collect();
        let sizes: Vec<usize> = batches(&small).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [4096, 4096, 1808]);
        let large: Vec<Entry> = (0..4096).map(|_| entry(4096)).collect();
        let split = batches(&large);
        assert!(split.len() > 1);
        for batch in &split {
            let bytes = crate::codec::encode(&Batch {
                origin: Origin {
                    region: "us".into(),
                    incarnation: 1,
                },
                seq: 1,
                sent_at: 1,
                entries: batch.to_vec(),
            })
            .expect("encodes under the limit")
            .len();
            assert!(bytes <= MAX_BATCH_BYTES + 64 * 1024, "{bytes}");
        }
        assert_eq!(split.iter().map(|b| b.len()).sum::<usize>(), 4096);
        assert!(batches(&[]).is_empty());
    }
}
