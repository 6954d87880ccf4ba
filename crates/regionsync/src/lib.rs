//! Cross-region sync for Tollgate.
//!
//! Two regions, each with its own Redis and its own nodes, hold limits that are global across
//! both, with no cross-region call on the request path (HOME_REGION's forwarding aside). Each
//! node runs a [`RegionSync`]: it records what the node admits under rules that sync, ships the
//! running totals to the peer region every few seconds, applies what the peer ships with the
//! lease store's debit-once, tracks whether the peer is reachable (which moves SPLIT shares),
//! and forwards HOME_REGION decisions. Design: `docs/regionsync.md`.
//!
//! # Layout
//! - [`policy`]: SPLIT, ASYNC_SYNC and HOME_REGION; where a rule's limit is held, at what share.
//! - [`consumption`]: the running totals per bucket and epoch.
//! - [`messages`] and [`codec`]: what goes over the link, and its encoding (bincode).
//! - [`link`]: the gRPC client and service, with authentication and size limits.
//! - [`receiver`]: applying the peer's batches; HOME_REGION decisions for the peer.
//! - [`peer`]: the failure detector.
//! - [`actor`]: the region-sync actor.
//! - [`metrics`]: what it reports.
//! - [`throttle`]: warnings said at most once per interval.

pub mod actor;
pub mod codec;
pub mod consumption;
pub mod link;
pub mod messages;
pub mod metrics;
pub mod peer;
pub mod policy;
pub mod receiver;
pub mod throttle;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use ractor::{Actor, ActorRef};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_lease::{Limit, Micros, SharedClock, Store};

use crate::actor::{SyncActor, SyncMsg, SyncParts};
use crate::consumption::ConsumptionLog;
use crate::link::{LinkService, PeerClient};
use crate::messages::{ForwardReply, ForwardRequest, Origin, PenaltyBatch, PenaltyBlock};
use crate::metrics::{OutcomeLabel, RegionMetrics};
use crate::peer::{Liveness, PeerTracker};
use crate::policy::{PeerState, RegionView};
use crate::receiver::Receiver;

pub use crate::policy::{Placement, RegionalDoc, RegionalPolicy, Role};

/// What the region-sync side needs from the node it runs in.
pub trait RegionHost: Send + Sync + 'static {
    /// The limit `rule` holds in this region, if its consumption syncs with the peer
    /// (ASYNC_SYNC): the peer's consumption is debited against it.
    fn synced_limit(&self, rule: &str) -> Option<Limit>;

    /// Decides a HOME_REGION request forwarded by the peer (this is the home region).
    fn decide_forwarded(
        &self,
        request: ForwardRequest,
    ) -> BoxFuture<'static, Result<ForwardReply, ForwardError>>;

    /// Blocks `identity` under `rule`'s penalty for `left`, as the peer region did: in this
    /// region's store, and on this node. Returns whether the block is held (false: the rule
    /// has no enforced penalty here, or the store did not take it). A host without penalty
    /// boxes holds none.
    fn impose_block(
        &self,
        rule: String,
        identity: Vec<u8>,
        left: Duration,
    ) -> BoxFuture<'static, bool> {
        let _ = (rule, identity, left);
        Box::pin(async { false })
    }
}

/// Why the home region could not decide a forwarded request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopping,
    /// The rule is not a HOME_REGION rule homed in this region (or is unknown here).
    #[error("rule {0:?} is not held in this region")]
    NotHeld(String),
    /// The decision had no status for the rule.
    #[error("no decision was made")]
    NoDecision,
}

/// A node's region settings.
#[derive(Debug, Clone)]
pub struct RegionConfig {
    /// This node's region.
    pub region: String,
    /// The other region.
    pub peer_region: String,
    /// Where the peer region's link service answers (`http://host:port`).
    pub peer_url: String,
    /// The secret both regions share.
    pub secret: String,
    /// How often consumption is shipped.
    pub sync_interval: Duration,
    /// How often the peer is probed.
    pub heartbeat_interval: Duration,
    /// When the peer counts as down, and when as back.
    pub liveness: Liveness,
    /// How long a HOME_REGION decision waits for the home region before deciding locally.
    pub forward_deadline: Duration,
    /// This region's SPLIT share for rules that name none.
    pub default_share: f64,
    /// The most buckets with consumption waiting to be shipped.
    pub max_keys: usize,
    /// This node's incarnation (told apart from its earlier lives by the peer): None draws
    /// one from the OS; a simulation pins it so a run can be repeated.
    pub incarnation: Option<u64>,
    /// TLS to the peer (an `https://` URL): None for plain HTTP/2.
    pub peer_tls: Option<PeerTls>,
}

/// How the link reaches a peer over TLS.
#[derive(Clone)]
pub struct PeerTls {
    /// The CA (PEM) that signs the peer's certificate.
    pub ca_pem: Vec<u8>,
    /// This node's certificate chain and key (PEM), presented when the peer asks for one
    /// (mutual TLS).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls")
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl RegionConfig {
    /// Settings with the defaults: sync every 2 s, heartbeat every 500 ms, failover after
    /// 10 s, failback after 10 s of steady contact, forwarding deadline 50 ms, equal shares.
    pub fn new(region: &str, peer_region: &str, peer_url: &str, secret: &str) -> Self {
        Self {
            region: region.into(),
            peer_region: peer_region.into(),
            peer_url: peer_url.into(),
            secret: secret.into(),
            sync_interval: Duration::from_secs(2),
            heartbeat_interval: Duration::from_millis(500),
            liveness: Liveness {
                failover_after: Duration::from_secs(10),
                failback_after: Duration::from_secs(10),
            },
            forward_deadline: Duration::from_millis(50),
            default_share: 0.5,
            max_keys: 1_000_000,
            incarnation: None,
            peer_tls: None,
        }
    }
}

/// Why region sync could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is invalid.
    #[error("invalid region setting `{field}`: {reason}")]
    Config {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The actor could not start.
    #[error("the region-sync actor did not start: {0}")]
    Spawn(#[from] ractor::SpawnErr),
}

/// A node's region sync: consumption out, consumption in, the peer's state, forwarding.
#[derive(Debug)]
pub struct RegionSync {
    config: RegionConfig,
    origin: Origin,
    log: Arc<ConsumptionLog>,
    peer: Arc<PeerTracker>,
    client: PeerClient,
    receiver: Arc<Receiver>,
    metrics: RegionMetrics,
    clock: SharedClock,
    actor: ActorRef<SyncMsg>,
    peer_v1: Arc<std::sync::atomic::AtomicBool>,
    region_name: Arc<str>,
}

fn check_config(c: &RegionConfig) -> Result<(), StartError> {
    let bad = |field, reason: String| Err(StartError::Config { field, reason });
    if let Err(e) = policy::validate_region("region", &c.region) {
        return bad("region", e.reason);
    }
    if let Err(e) = policy::validate_region("peer_region", &c.peer_region) {
        return bad("peer_region", e.reason);
    }
    if c.region == c.peer_region {
        return bad("peer_region", "must differ from this node's region".into());
    }
    if c.secret.len() < 16 {
        return bad("region_secret", "must be at least 16 characters".into());
    }
    if !(c.default_share > 0.0 && c.default_share <= 1.0) {
        return bad(
            "region_share",
            format!("must be above 0 and at most 1, got {}", c.default_share),
        );
    }
    if c.sync_interval < Duration::from_millis(10) {
        return bad("region_sync_interval_ms", "must be at least 10 ms".into());
    }
    Ok(())
}

impl RegionSync {
    /// Starts region sync for a node: the actor, the client; the service is served with
    /// [`RegionSync::serve`]. `store` is this region's store (the peer's consumption is
    /// debited there).
    pub async fn start(
        config: RegionConfig,
        store: Store,
        host: Arc<dyn RegionHost>,
        metrics: RegionMetrics,
        clock: SharedClock,
    ) -> Result<Arc<Self>, StartError> {
        check_config(&config)?;
        let client = PeerClient::with_tls(
            &config.peer_url,
            &config.region,
            &config.secret,
            config.peer_tls.as_ref(),
        )
        .map_err(|e| StartError::Config {
            field: "peer_url",
            reason: e.to_string(),
        })?;
        Self::start_over(config, client, store, host, metrics, clock).await
    }

    /// [`RegionSync::start`] over a given client of the peer region (a simulation's
    /// in-process link, say) instead of one connecting to `config.peer_url`.
    pub async fn start_over(
        config: RegionConfig,
        client: PeerClient,
        store: Store,
        host: Arc<dyn RegionHost>,
        metrics: RegionMetrics,
        clock: SharedClock,
    ) -> Result<Arc<Self>, StartError> {
        check_config(&config)?;
        let origin = Origin {
            region: config.region.clone(),
            incarnation: config.incarnation.unwrap_or_else(rand::random),
        };
        let now = clock.now_micros();
        let peer = Arc::new(PeerTracker::new(config.liveness, now));
        let log = Arc::new(ConsumptionLog::new(config.max_keys));
        let receiver = Arc::new(Receiver::new(
            store,
            host,
            metrics.clone(),
            origin.clone(),
            config.peer_region.clone(),
            clock.clone(),
            config.sync_interval,
        ));
        // Not up until the peer has been heard from.
        metrics.peer_up.set(0);
        let peer_v1 = Arc::new(std::sync::atomic::AtomicBool::new(false));
        Allowances::of(peer.state(), false).publish(&metrics);
        let parts = SyncParts {
            origin: origin.clone(),
            log: log.clone(),
            client: client.clone(),
            peer: peer.clone(),
            receiver: receiver.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            sync_interval: config.sync_interval,
            heartbeat_interval: config.heartbeat_interval,
            peer_v1: peer_v1.clone(),
        };
        let (actor, _) = Actor::spawn(None, SyncActor, parts).await?;
        {
            let mut changes = peer.subscribe();
            let (metrics, peer, peer_v1) = (metrics.clone(), peer.clone(), peer_v1.clone());
            tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    metrics.peer_changes.inc();
                    let state = *changes.borrow_and_update();
                    metrics
                        .peer_up
                        .set(i64::from(state == PeerState::Up && peer.reached()));
                    Allowances::of(state, peer_v1.load(std::sync::atomic::Ordering::Relaxed))
                        .publish(&metrics);
                }
            });
        }
        tracing::info!(region = %config.region, peer = %config.peer_region, origin = %origin.name(), "region sync started");
        Ok(Arc::new(Self {
            region_name: config.region.as_str().into(),
            peer_v1,
            config,
            origin,
            log,
            peer,
            client,
            receiver,
            metrics,
            clock,
            actor,
        }))
    }

    /// This node's view of the regions, for compiling rules.
    pub fn view(&self) -> RegionView {
        RegionView {
            own: self.config.region.clone(),
            peer: self.config.peer_region.clone(),
            default_share: self.config.default_share,
            peer_state: self.peer.state(),
        }
    }

    /// Changes of the peer's state.
    pub fn subscribe(&self) -> watch::Receiver<PeerState> {
        self.peer.subscribe()
    }

    /// The peer's state.
    pub fn peer_state(&self) -> PeerState {
        self.peer.state()
    }

    /// This node's origin (region and incarnation).
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The metrics.
    pub fn metrics(&self) -> &RegionMetrics {
        &self.metrics
    }

    /// The settings.
    pub fn config(&self) -> &RegionConfig {
        &self.config
    }

    /// The regional allowance store calls of ASYNC_SYNC buckets carry (their share of the limit
    /// by demand, see `tollgate_lease::ops::allowance`): none while the peer is down (the
    /// survivor holds the whole limit, as before) or speaks link version 1 (it reports no
    /// demand and enforces none).
    pub fn allowance(&self) -> Option<tollgate_lease::Allowance> {
        if self.allowances() != Allowances::On {
            return None;
        }
        Some(tollgate_lease::Allowance {
            region: self.region_name.clone(),
            interval_us: self.config.sync_interval.as_micros() as u64,
            unknown_share: self.config.default_share,
        })
    }

    /// Whether ASYNC_SYNC buckets are held to regional allowances now, and if not, why.
    pub fn allowances(&self) -> Allowances {
        Allowances::of(
            self.peer.state(),
            self.peer_v1.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Notes that a request asked `units` of a synced rule's bucket (admitted or not).
    pub fn ask(&self, rule: &str, identity: &[u8], units: u64) {
        self.log.ask(rule, identity, units);
    }

    /// Records `units` admitted at `now` under a rule that syncs.
    pub fn record(&self, rule: &str, identity: &[u8], limit: &Limit, units: u64, now: Micros) {
        if !self.log.record(rule, identity, limit, units, now) {
            tracing::debug!(rule, "consumption log full; not shipped");
        }
    }

    /// Takes back `units` recorded at `at` that went back to this region's store unspent.
    pub fn unrecord(&self, rule: &str, identity: &[u8], limit: &Limit, units: u64, at: Micros) {
        self.log.unrecord(rule, identity, limit, units, at);
    }

    /// Tells the peer region that `identity` entered `rule`'s penalty box for `left`, so that
    /// it holds the block too. In the background; a peer that is down, or older than link
    /// version 3, does not hold it (logged at debug).
    pub fn share_block(&self, rule: &str, identity: &[u8], left: Duration) {
        if self.peer.state() == PeerState::Down {
            return;
        }
        let batch = PenaltyBatch {
            origin: self.origin.clone(),
            blocks: vec![PenaltyBlock {
                rule: rule.to_owned(),
                identity: identity.to_vec(),
                left_us: left.as_micros() as u64,
            }],
        };
        let client = self.client.clone();
        let timeout = self.config.forward_deadline.max(Duration::from_secs(1));
        let rule = rule.to_owned();
        tokio::spawn(async move {
            if let Err(e) = client.penalty(&batch, timeout).await {
                tracing::debug!(error = %e, rule, "the peer region did not take a penalty block");
            }
        });
    }

    /// Asks the home region to decide a HOME_REGION request. None when it cannot (peer down,
    /// deadline passed, error): the caller decides locally.
    pub async fn forward(&self, rule: &str, identity: &[u8], cost: u64) -> Option<ForwardReply> {
        let outcome = |o: &str| {
            self.metrics
                .forwarded
                .get_or_create(&OutcomeLabel { outcome: o.into() })
                .inc();
        };
        if self.peer.state() == PeerState::Down {
            outcome("fallback");
            return None;
        }
        let request = ForwardRequest {
            rule: rule.to_owned(),
            identity: identity.to_vec(),
            cost,
        };
        match self
            .client
            .forward(&request, self.config.forward_deadline)
            .await
        {
            Ok(reply) => {
                outcome(if reply.allowed { "allowed" } else { "denied" });
                self.peer.success(self.clock.now_micros());
                Some(reply)
            }
            Err(e) => {
                tracing::debug!(error = %e, rule, "forwarding failed; deciding locally");
                if e.is_link_failure() {
                    self.peer.failure(self.clock.now_micros());
                }
                outcome("fallback");
                None
            }
        }
    }

    /// What `/readyz` shows: the regions, the peer's state, seconds since contact, sync lag.
    pub fn status(&self) -> RegionStatus {
        let now = self.clock.now_micros();
        let (since_contact, since_change) = self.peer.ages(now);
        let newest = self.receiver.newest_applied();
        RegionStatus {
            region: self.config.region.clone(),
            peer: self.config.peer_region.clone(),
            peer_up: self.peer.state() == PeerState::Up && self.peer.reached(),
            peer_state: match (self.peer.state(), self.peer.reached()) {
                (PeerState::Down, _) => "down",
                (PeerState::Up, false) => "unreached",
                (PeerState::Up, true) => "up",
            },
            since_contact_ms: since_contact / 1000,
            since_change_ms: since_change / 1000,
            lag_ms: (newest > 0).then(|| now.saturating_sub(newest) / 1000),
            allowances: self.allowances(),
        }
    }

    /// The link service, to serve to the peer region.
    pub fn service(&self) -> LinkService {
        LinkService::new(
            self.receiver.clone(),
            self.config.peer_region.clone(),
            self.config.secret.clone(),
        )
    }

    /// Serves the link service on `listener` until `shutdown`.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        self.service().serve(listener, shutdown).await
    }

    /// Ships what is pending (if the peer is up) and stops the actor.
    pub async fn stop(&self) {
        let _ = self
            .actor
            .call(SyncMsg::Stop, Some(Duration::from_secs(5)))
            .await;
    }

    /// Stops the actor at once, shipping nothing (a crashed pod's region sync).
    pub fn kill(&self) {
        self.actor.kill();
    }
}

/// Region sync as `/readyz` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    /// This region.
    pub region: String,
    /// The peer region.
    pub peer: String,
    /// Whether the peer is Up (and has been reached).
    pub peer_up: bool,
    /// `up`, `down`, or `unreached` (never answered yet; shares are split meanwhile).
    pub peer_state: &'static str,
    /// Milliseconds since the last successful call to the peer.
    pub since_contact_ms: u64,
    /// Milliseconds since the peer's state last changed.
    pub since_change_ms: u64,
    /// Age of the newest applied batch from the peer (None: none yet).
    pub lag_ms: Option<u64>,
    /// Whether ASYNC_SYNC buckets are held to regional allowances.
    pub allowances: Allowances,
}

/// Whether ASYNC_SYNC buckets are held to regional allowances by demand (see
/// `docs/regionsync.md`), and if not, why: each region then enforces the whole limit on its
/// view, as link version 1 did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowances {
    /// Held to allowances.
    On,
    /// Off while the peer is down: the survivor holds the whole limit.
    OffPeerDown,
    /// Off while the peer answers link version 1 (it reports no demand).
    OffPeerV1,
}

impl Allowances {
    /// With the peer in `state`, speaking link version 1 or not.
    pub fn of(state: PeerState, peer_v1: bool) -> Self {
        if state == PeerState::Down {
            Allowances::OffPeerDown
        } else if peer_v1 {
            Allowances::OffPeerV1
        } else {
            Allowances::On
        }
    }

    /// Sets the `region_allowances_on` gauge.
    pub(crate) fn publish(self, metrics: &RegionMetrics) {
        metrics.allowances_on.set(i64::from(self == Allowances::On));
    }

    /// As `/readyz` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Allowances::On => "on",
            Allowances::OffPeerDown => "off: peer down",
            Allowances::OffPeerV1 => "off: peer speaks link version 1",
        }
    }
}

#[cfg(test)]
mod tests;
