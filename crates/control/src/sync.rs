//! Keeping a node's rules in step with PostgreSQL: everything is loaded at start; changes
//! arrive by LISTEN/NOTIFY (a push, typically within milliseconds) and, as a fallback for
//! missed notifications and reconnects, by polling the rule set's revision every few seconds.
//! Each change reloads the whole set at one revision and swaps it atomically. The same
//! connection hears counter resets (`POST /admin/v1/counters/reset` on any node), and the
//! node drops what it holds of the reset bucket.
//!
//! When PostgreSQL is down the node keeps enforcing its last set, retries with jittered
//! backoff and reports staleness (`tollgate_rules_staleness_seconds`). Every set loaded from
//! PostgreSQL is also written to a snapshot file, so a node that starts while PostgreSQL is
//! down serves its last snapshot (or else its rule files) and says so.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::store::{CHANNEL, ControlError, RESET_CHANNEL, ResetNotice, RuleStore, Snapshot};
use tollgate_node::Node;
use tollgate_node::rules::envoy::EnvoyConfig;
use tollgate_node::rules::set::EnvoyDomainConfig;
use tollgate_node::rules::source::{self, LoadedRules};
use tollgate_node::rules::watch::ActiveRules;

/// Where a node's rules came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RulesSource {
    /// PostgreSQL.
    Postgres,
    /// The snapshot on disk (PostgreSQL was unreachable at start).
    Snapshot,
    /// The rule files only (PostgreSQL unreachable and no snapshot).
    Files,
}

/// How a node follows PostgreSQL.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// How often the revision is polled.
    pub poll: Duration,
    /// Whether to LISTEN for pushed changes (off: polling only).
    pub listen: bool,
    /// Where the last set is kept on disk.
    pub snapshot: Option<PathBuf>,
    /// Rule files loaded alongside (e.g. envoyproxy/ratelimit YAML).
    pub files: Vec<PathBuf>,
}

/// Follows PostgreSQL for one node.
#[derive(Debug, Clone)]
pub struct RuleSync {
    store: RuleStore,
    rules: Arc<ActiveRules>,
    config: SyncConfig,
    /// Whether this process has applied the migrations (PostgreSQL may be down at start).
    migrated: Arc<std::sync::atomic::AtomicBool>,
    /// The node told of counter resets (it drops what it holds of a reset bucket).
    node: Option<Node>,
}

/// What the LISTEN connection hears.
#[derive(Debug)]
enum Heard {
    /// The rule set changed.
    Rules,
    /// A counter was reset (on any node).
    Reset(ResetNotice),
}

impl RuleSync {
    /// Follows `store` into `rules`.
    pub fn new(store: RuleStore, rules: Arc<ActiveRules>, config: SyncConfig) -> Self {
        Self {
            store,
            rules,
            config,
            migrated: Arc::default(),
            node: None,
        }
    }

    /// Tells `node` of counter resets as they are announced.
    pub fn with_node(mut self, node: Node) -> Self {
        self.node = Some(node);
        self
    }

    fn forget(&self, notice: &ResetNotice) {
        if let (Some(node), Some(identity)) = (&self.node, notice.identity()) {
            if notice.penalty_only {
                let known = node.operator().forget_block(&notice.rule_key, &identity);
                tracing::debug!(rule = %notice.rule_key, known, "a penalty block was lifted");
            } else {
                let held = node.operator().forget_held(&notice.rule_key, &identity);
                tracing::debug!(rule = %notice.rule_key, held, "a counter was reset");
            }
        }
    }

    /// The rules at start: PostgreSQL, else the snapshot, else the files.
    pub async fn initial_load(&self) -> Result<RulesSource, tollgate_node::rules::RulesError> {
        match self.reload().await {
            Ok(revision) => {
                tracing::info!(revision, "rules loaded from PostgreSQL");
                return Ok(RulesSource::Postgres);
            }
            Err(e) => {
                self.rules
                    .set_problem(Some(format!("cannot load the rules from PostgreSQL: {e}")));
                tracing::warn!(error = %e, "PostgreSQL is unreachable at start");
            }
        }
        if let Some(snapshot) = self.config.snapshot.as_deref().and_then(read_snapshot) {
            let revision = snapshot.revision;
            match self.install(&snapshot) {
                Ok(()) => {
                    self.rules.set_source("snapshot", true);
                    tracing::warn!(
                        revision,
                        "serving the rule snapshot on disk until PostgreSQL answers"
                    );
                    return Ok(RulesSource::Snapshot);
                }
                Err(e) => tracing::error!(error = %e, "the rule snapshot on disk is unusable"),
            }
        }
        self.rules.install_files(&self.config.files)?;
        self.rules.set_source("files", false);
        tracing::error!(
            "no rules from PostgreSQL and no snapshot: not ready; serving the rule files only \
             until PostgreSQL answers"
        );
        Ok(RulesSource::Files)
    }

    /// Loads the whole set from PostgreSQL at one revision and swaps it in; writes the snapshot.
    pub async fn reload(&self) -> Result<i64, ControlError> {
        if !self.migrated.load(std::sync::atomic::Ordering::Acquire) {
            self.store.migrate().await?;
            self.migrated
                .store(true, std::sync::atomic::Ordering::Release);
        }
        let snapshot = self.store.snapshot().await?;
        self.install(&snapshot)?;
        self.rules.set_source("postgres", true);
        self.rules.set_problem(None);
        self.rules.metrics().rules_staleness_seconds.set(0);
        if let Some(path) = &self.config.snapshot
            && let Err(e) = write_snapshot(path, &snapshot)
        {
            tracing::warn!(error = %e, path = %path.display(), "could not write the rule snapshot");
        }
        Ok(snapshot.revision)
    }

    fn install(&self, snapshot: &Snapshot) -> Result<(), ControlError> {
        let loaded = to_rules(snapshot, &self.config.files)?;
        self.rules
            .install_at(&loaded, snapshot.revision.max(0) as u64)
            .map_err(|e| {
                self.rules.metrics().rules_reload_errors.inc();
                ControlError::Database(format!(
                    "the rule set at revision {} does not compile: {e}",
                    snapshot.revision
                ))
            })?;
        Ok(())
    }

    /// Follows changes until `stop` resolves.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut poll = tokio::time::interval(self.config.poll);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sync = tokio::time::Instant::now();
        let mut listener: Option<(tokio_postgres::Client, mpsc::UnboundedReceiver<Heard>)> = None;
        let mut backoff = Duration::from_millis(100);
        let mut next_listen = tokio::time::Instant::now();
        loop {
            if self.config.listen
                && listener.is_none()
                && tokio::time::Instant::now() >= next_listen
            {
                match listen(self.store.url()).await {
                    Ok(rx) => {
                        listener = Some(rx);
                        backoff = Duration::from_millis(100);
                        // Changes may have been missed while not listening.
                        self.sync_if_changed(&mut last_sync).await;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot LISTEN for rule changes yet");
                        next_listen = tokio::time::Instant::now()
                            + backoff.mul_f64(0.5 + rand::random::<f64>());
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
            let notified = async {
                match listener.as_mut() {
                    Some((_, rx)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => return,
                message = notified => match message {
                    Some(Heard::Reset(notice)) => self.forget(&notice),
                    Some(Heard::Rules) => {
                        // A burst of changes: one reload (resets heard meanwhile are applied).
                        while let Some(Ok(heard)) = listener.as_mut().map(|(_, rx)| rx.try_recv()) {
                            if let Heard::Reset(notice) = heard {
                                self.forget(&notice);
                            }
                        }
                        self.sync(&mut last_sync).await;
                    }
                    None => {
                        tracing::warn!("lost the rule-change listener; polling until it reconnects");
                        listener = None;
                        next_listen = tokio::time::Instant::now() + backoff;
                    }
                },
                _ = poll.tick() => self.sync_if_changed(&mut last_sync).await,
            }
        }
    }

    async fn sync(&self, last_sync: &mut tokio::time::Instant) {
        match self.reload().await {
            Ok(revision) => {
                *last_sync = tokio::time::Instant::now();
                tracing::info!(revision, "rules reloaded from PostgreSQL");
            }
            Err(e) => self.stale(last_sync, &e),
        }
    }

    async fn sync_if_changed(&self, last_sync: &mut tokio::time::Instant) {
        match self.store.revision().await {
            Ok(revision) if revision.max(0) as u64 == self.rules.version() => {
                *last_sync = tokio::time::Instant::now();
                self.rules.metrics().rules_staleness_seconds.set(0);
            }
            Ok(_) => self.sync(last_sync).await,
            Err(e) => self.stale(last_sync, &e),
        }
    }

    fn stale(&self, last_sync: &tokio::time::Instant, error: &ControlError) {
        let stale_for = last_sync.elapsed().as_secs() as i64;
        self.rules.metrics().rules_staleness_seconds.set(stale_for);
        self.rules.set_problem(Some(format!(
            "cannot refresh the rules from PostgreSQL (enforcing the last set): {error}"
        )));
        tracing::warn!(error = %error, stale_for, "cannot refresh rules; enforcing the last set");
    }
}

/// A dedicated connection that LISTENs (rule changes and counter resets); each notification
/// becomes a message.
/// The client is returned to be kept: dropping it closes the connection.
async fn listen(
    url: &str,
) -> Result<(tokio_postgres::Client, mpsc::UnboundedReceiver<Heard>), tokio_postgres::Error> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let heard = if n.channel() == RESET_CHANNEL {
                        match serde_json::from_str(n.payload()) {
                            Ok(notice) => Heard::Reset(notice),
                            Err(e) => {
                                tracing::warn!(error = %e, "an unreadable counter reset notice");
                                continue;
                            }
                        }
                    } else {
                        Heard::Rules
                    };
                    if tx.send(heard).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {RESET_CHANNEL}"))
        .await?;
    Ok((client, rx))
}

/// The rule files' rules and the store's, as one set. A rule or envoyproxy/ratelimit domain in
/// PostgreSQL replaces the file's of the same id or domain: an admin write can never make the
/// combined set fail to compile.
fn to_rules(snapshot: &Snapshot, files: &[PathBuf]) -> Result<LoadedRules, ControlError> {
    let mut loaded = source::load(files).map_err(|e| ControlError::Database(e.to_string()))?;
    // PostgreSQL's overrides first: an override file's (later) wins where both name a rule.
    let from_files = std::mem::take(&mut loaded.overrides);
    for stored in &snapshot.overrides {
        loaded.overrides.push(stored.to_override()?);
    }
    loaded.overrides.extend(from_files);
    let stored_ids: std::collections::HashSet<&str> = snapshot
        .rules
        .iter()
        .filter_map(|d| d.id.as_deref())
        .collect();
    loaded.native.retain(|rule| {
        let overridden = stored_ids.contains(rule.id.as_str());
        if overridden {
            tracing::debug!(id = %rule.id, origin = %rule.origin, "PostgreSQL's rule replaces the file's");
        }
        !overridden
    });
    let stored_domains: std::collections::HashSet<&str> = snapshot
        .envoy
        .iter()
        .filter_map(|c| c.get("domain").and_then(serde_json::Value::as_str))
        .collect();
    loaded
        .envoy
        .retain(|config| !stored_domains.contains(config.domain.as_str()));
    for doc in &snapshot.rules {
        let id = doc.id.clone().unwrap_or_default();
        let rule = doc
            .validate(None, format!("postgres rule {id}"))
            .map_err(|e| ControlError::Database(format!("stored rule {id:?} is invalid: {e}")))?;
        loaded.native.push(rule);
    }
    for config in &snapshot.envoy {
        let parsed: EnvoyConfig = serde_json::from_value(config.clone())
            .map_err(|e| ControlError::Database(format!("stored envoy domain: {e}")))?;
        let nodes = parsed.validate().map_err(|e| {
            ControlError::Database(format!("stored envoy domain {}: {e}", parsed.domain))
        })?;
        loaded.envoy.push(EnvoyDomainConfig {
            origin: format!("postgres envoy domain {}", parsed.domain),
            domain: parsed.domain,
            nodes,
            // The format has none: ActiveRules sets the node's (EnvoyFailModes).
            fail_mode: tollgate_node::rules::FailMode::Open,
        });
    }
    Ok(loaded)
}

fn read_snapshot(path: &Path) -> Option<Snapshot> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text)
        .map_err(
            |e| tracing::error!(error = %e, path = %path.display(), "unreadable rule snapshot"),
        )
        .ok()
}

/// Writes the snapshot atomically (a temporary file renamed over the old one).
fn write_snapshot(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec(snapshot).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(tmp, path)
}
