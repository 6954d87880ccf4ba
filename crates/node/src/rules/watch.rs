//! Keeps the active rule set in step with its files: checks them every interval (size,
//! modification time and content), and on a change waits for them to hold still, then loads,
//! validates and compiles the whole set before swapping it in. An invalid new set is rejected
//! whole and the old one stays.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::metrics::Metrics;
use crate::rules::errors::CompileError;
use crate::rules::overrides::{self, AppliedOverride};
use crate::rules::set::{EnvoyDomainConfig, EnvoyFailModes, RuleSet};
use crate::rules::source::{self, LoadedRules, RulesError};
use tollgate_regionsync::policy::RegionView;

/// The active rule set, swapped atomically; readers never see a half-built set.
#[derive(Debug)]
pub struct ActiveRules {
    current: ArcSwap<RuleSet>,
    /// The active set's version, readable without loading the set.
    active_version: AtomicU64,
    next_version: AtomicU64,
    pub(crate) metrics: Arc<Metrics>,
    /// Where the active set came from (files, postgres, snapshot).
    source: parking_lot::Mutex<&'static str>,
    /// Whether the active set came from where it should (files, or the rule store or its
    /// snapshot); false before any, and while files stand in for a rule store never reached.
    loaded: std::sync::atomic::AtomicBool,
    /// Why the rules are not what their source holds right now (their source unreachable, a
    /// change to them rejected), in words for `/readyz`; None when they are.
    problem: parking_lot::Mutex<Option<String>>,
    /// The rule files as they were read for the set last installed from them (what the
    /// watcher compares against: a change made before it first looks is still a change).
    files_seen: parking_lot::Mutex<Vec<Seen>>,
    /// The fail mode of envoyproxy/ratelimit-format domains (the format has no field for it).
    envoy_fail_modes: parking_lot::Mutex<EnvoyFailModes>,
    /// Bumped by every swap, including recompiles for a new regional view.
    generation: AtomicU64,
    /// The rules last installed and their version, kept to recompile for a new view.
    installed: parking_lot::Mutex<Option<(LoadedRules, u64)>>,
    /// How this node sees the regions (None: a single region).
    region: parking_lot::Mutex<Option<RegionView>>,
    /// The mode overrides of the set last installed, and what each did.
    overrides: parking_lot::Mutex<Vec<AppliedOverride>>,
}

impl ActiveRules {
    /// The metrics the rule set reports to (reload errors and staleness included, which the
    /// control plane's sync records too).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Starts with no rules.
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(RuleSet::default()),
            active_version: AtomicU64::new(0),
            next_version: AtomicU64::new(1),
            metrics,
            source: parking_lot::Mutex::new("files"),
            loaded: std::sync::atomic::AtomicBool::new(false),
            problem: parking_lot::Mutex::new(None),
            files_seen: parking_lot::Mutex::new(vec![]),
            envoy_fail_modes: parking_lot::Mutex::new(EnvoyFailModes::default()),
            generation: AtomicU64::new(0),
            installed: parking_lot::Mutex::new(None),
            region: parking_lot::Mutex::new(None),
            overrides: parking_lot::Mutex::new(vec![]),
        })
    }

    /// Changes with every swap of the active set (a new version, or the same rules recompiled
    /// for a new regional view): what a cached resolution compares against.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The regional view rules are compiled for.
    pub fn region_view(&self) -> Option<RegionView> {
        self.region.lock().clone()
    }

    /// Compiles the installed rules again for `view` (the peer region went down or came back)
    /// and swaps them in, at the same version.
    pub fn set_region_view(&self, view: Option<RegionView>) -> Result<(), CompileError> {
        let installed = self.installed.lock();
        *self.region.lock() = view.clone();
        if let Some((rules, version)) = installed.as_ref() {
            let set = RuleSet::compile_for(
                &rules.native,
                &rules.envoy,
                *version,
                &self.metrics,
                view.as_ref(),
            )?;
            self.swap(set, *version);
            tracing::info!(version, ?view, "rules recompiled for the regions' state");
        }
        drop(installed);
        Ok(())
    }

    fn swap(&self, set: RuleSet, version: u64) {
        let count = set.rules().len();
        set.publish_shares(&self.metrics);
        self.current.store(Arc::new(set));
        self.active_version.store(version, Ordering::Release);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.metrics.rules_version.set(version as i64);
        self.metrics.rules_loaded.set(count as i64);
    }

    /// The set requests are matched against right now.
    pub fn load(&self) -> arc_swap::Guard<Arc<RuleSet>> {
        self.current.load()
    }

    /// Where the active set came from: `files`, `postgres` or `snapshot`.
    pub fn source(&self) -> &'static str {
        *self.source.lock()
    }

    /// Records where the active set came from, and whether that is its source (false: a stand-in
    /// until the rule store answers).
    pub fn set_source(&self, source: &'static str, loaded: bool) {
        *self.source.lock() = source;
        self.loaded.store(loaded, Ordering::Release);
    }

    /// Records why the rules are not what their source holds (None: they are again).
    pub fn set_problem(&self, problem: Option<String>) {
        *self.problem.lock() = problem;
    }

    /// Why the rules are not what their source holds right now, if they are not: their
    /// source unreachable, or a change to them rejected (the previous set stays active).
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().clone()
    }

    /// Whether the node has its rules: loaded from their source, not a stand-in. A node that
    /// has not is not ready (it would allow what its rules deny).
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// The active set's version (0 before any set is installed).
    pub fn version(&self) -> u64 {
        self.active_version.load(Ordering::Acquire)
    }

    /// Compiles `rules` and swaps them in, or leaves the active set alone on error.
    pub fn install(&self, rules: &LoadedRules) -> Result<u64, CompileError> {
        let version = self.next_version.fetch_add(1, Ordering::Relaxed);
        self.install_at(rules, version)
    }

    /// Sets the fail mode of envoyproxy/ratelimit-format domains, for the sets installed from
    /// now on (set it before the first).
    pub fn set_envoy_fail_modes(&self, modes: EnvoyFailModes) {
        *self.envoy_fail_modes.lock() = modes;
    }

    /// Like [`ActiveRules::install`], with the version given (a rule store's revision).
    pub fn install_at(&self, rules: &LoadedRules, version: u64) -> Result<u64, CompileError> {
        let _span = tracing::debug_span!("rules_install", version).entered();
        let mut rules = rules.clone();
        let modes = self.envoy_fail_modes.lock().clone();
        for config in &mut rules.envoy {
            config.fail_mode = modes.of(&config.domain);
        }
        let applied = overrides::apply(&mut rules.native, &mut rules.envoy, &rules.overrides)?;
        let mut installed = self.installed.lock();
        self.next_version.fetch_max(version + 1, Ordering::Relaxed);
        let view = self.region.lock().clone();
        let set = RuleSet::compile_for(
            &rules.native,
            &rules.envoy,
            version,
            &self.metrics,
            view.as_ref(),
        )?;
        let count = set.rules().len();
        self.swap(set, version);
        *installed = Some((rules, version));
        for o in &applied {
            match (&o.rule_origin, o.rule_mode) {
                (Some(rule), Some(own)) if own != o.by.mode => tracing::warn!(
                    rule = %o.by.id, mode = %o.by.mode, own = %own, %rule, by = %o.by.origin,
                    "a mode override sets the rule's mode"
                ),
                (None, _) => tracing::info!(
                    rule = %o.by.id, mode = %o.by.mode, by = %o.by.origin,
                    "a mode override names no rule this node has; it waits for one"
                ),
                _ => {}
            }
        }
        *self.overrides.lock() = applied;
        if count == 0 {
            tracing::warn!(version, "the rule set is empty: every request is allowed");
        } else {
            tracing::info!(version, rules = count, "rule set installed");
        }
        Ok(version)
    }

    /// The mode overrides in effect, each with the mode and origin of the rule it overrides
    /// (none when no installed rule has its id), in id order.
    pub fn overrides(&self) -> Vec<AppliedOverride> {
        self.overrides.lock().clone()
    }

    /// Where the installed rule `id` (a Tollgate rule's id or an envoyproxy/ratelimit
    /// descriptor's path) was defined, disabled ones included; None when no installed rule has
    /// that id.
    pub fn rule_origin(&self, id: &str) -> Option<String> {
        // A descriptor disabled by an override has no limit left: its override remembers it.
        if let Some(o) = self.overrides.lock().iter().find(|o| o.by.id == id)
            && let Some(origin) = &o.rule_origin
        {
            return Some(origin.clone());
        }
        self.installed_rule(id, true, |r| r.origin.clone(), |c| c.origin.clone())
    }

    /// The domain of the installed rule `id`, disabled ones included (a DISABLED rule is not
    /// compiled, so the active set does not have it); None when no installed rule has that id.
    pub fn rule_domain(&self, id: &str) -> Option<String> {
        self.installed_rule(id, false, |r| r.domain.clone(), |c| c.domain.clone())
    }

    /// What `native` or `envoy` reads of the installed rule `id` (an envoyproxy/ratelimit
    /// descriptor path with a limit, when `limited`).
    fn installed_rule<T>(
        &self,
        id: &str,
        limited: bool,
        native: impl Fn(&crate::rules::model::Rule) -> T,
        envoy: impl Fn(&EnvoyDomainConfig) -> T,
    ) -> Option<T> {
        let installed = self.installed.lock();
        let (rules, _) = installed.as_ref()?;
        if let Some(rule) = rules.native.iter().find(|r| r.id == id) {
            return Some(native(rule));
        }
        rules
            .envoy
            .iter()
            .find(|config| defines(&config.nodes, id, limited))
            .map(envoy)
    }

    /// Loads every file under `paths` and installs the result.
    pub fn install_files(&self, paths: &[PathBuf]) -> Result<u64, RulesError> {
        // Seen before they are read: a change while they are read shows at the next look.
        let seen = fingerprint(paths);
        let loaded = source::load(paths)?;
        let version = self.install(&loaded).map_err(|error| RulesError {
            file: paths.first().cloned().unwrap_or_default(),
            line: None,
            message: error.to_string(),
        })?;
        *self.files_seen.lock() = seen;
        Ok(version)
    }
}

/// Whether an envoyproxy/ratelimit tree has the descriptor path `id` (with a limit, when
/// `limited`).
fn defines(nodes: &[crate::rules::envoy::ValidNode], id: &str, limited: bool) -> bool {
    nodes.iter().any(|n| {
        (n.path == id && (n.limit.is_some() || !limited)) || defines(&n.children, id, limited)
    })
}

/// One file as last seen: its path, size and modification time, and a hash of its content.
type Seen = (PathBuf, Option<(u64, std::time::SystemTime)>, u64);

/// What the files looked like at the last check.
fn fingerprint(paths: &[PathBuf]) -> Vec<Seen> {
    let mut out = vec![];
    for path in paths {
        for file in source::rule_files(path).unwrap_or_else(|_| vec![path.clone()]) {
            let meta = std::fs::metadata(&file)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)));
            let content = std::fs::read(&file).map(|b| {
                use std::hash::{DefaultHasher, Hash, Hasher};
                let mut h = DefaultHasher::new();
                b.hash(&mut h);
                h.finish()
            });
            out.push((file, meta, content.unwrap_or(0)));
        }
    }
    out
}

/// How long changed rule files must stay as they are before they are read. A file written in
/// place (truncated, then written) can be caught empty or half written, and the first part
/// of a rule file is often a valid, smaller set of rules: installed, it would lift every limit
/// the rest of the file holds until the next look. Writing the files by rename is atomic and
/// needs no wait; this covers the editors and tools that do not.
pub const SETTLE: Duration = Duration::from_millis(100);

/// Files that were seen to change (`changed`, as `look` sees them), once two looks
/// [`SETTLE`] apart agree: what a reload may read without catching a writer half way.
pub async fn held_still<T: PartialEq>(mut changed: T, mut look: impl FnMut() -> T) -> T {
    loop {
        tokio::time::sleep(SETTLE).await;
        let again = look();
        if again == changed {
            return changed;
        }
        changed = again;
    }
}

/// Reloads `paths` into `rules` whenever they change and have held still for [`SETTLE`],
/// until `stop` resolves.
pub async fn watch(
    paths: Vec<PathBuf>,
    rules: Arc<ActiveRules>,
    interval: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    // From the files as the active set was read from them, not as they are when this task
    // first runs: a change made in between would otherwise never be loaded.
    let mut seen = rules.files_seen.lock().clone();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ticker.tick() => {}
        }
        let now = fingerprint(&paths);
        if now == seen {
            continue;
        }
        let now = tokio::select! {
            _ = &mut stop => return,
            now = held_still(now, || fingerprint(&paths)) => now,
        };
        seen = now;
        match rules.install_files(&paths) {
            Ok(version) => {
                rules.set_problem(None);
                tracing::info!(version, "rules reloaded");
            }
            Err(e) => {
                rules.metrics.rules_reload_errors.inc();
                rules.set_problem(Some(format!(
                    "rejected the changed rule files, the previous set stays active: {e}"
                )));
                tracing::error!(error = %e, "rejected the changed rules; the previous set stays active");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "domain: d\nrules:\n  - {id: r, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: LIMIT, window: 1m}\n";

    fn limit_of(rules: &ActiveRules) -> Option<u64> {
        rules.load().rules()[0].limit().map(|l| l.capacity())
    }

    /// A watcher of `file` looking every 10 ms, and what stops it.
    fn watching(
        file: PathBuf,
        rules: &Arc<ActiveRules>,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let watcher = tokio::spawn(watch(
            vec![file],
            rules.clone(),
            Duration::from_millis(10),
            async {
                let _ = stopped.await;
            },
        ));
        (stop, watcher)
    }

    /// Waits (up to 10 s) for the first rule's limit to be `limit`.
    async fn until_limit(rules: &ActiveRules, limit: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while limit_of(rules) != Some(limit) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the change was never loaded"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A node installs its rule files, then starts watching them: a change made in between
    /// (the watcher's task had not run yet) is loaded, not taken for the state already
    /// installed.
    #[tokio::test]
    async fn a_change_before_the_watcher_first_looks_is_loaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, RULES.replace("LIMIT", "3")).expect("write");
        let rules = ActiveRules::new(Metrics::new());
        rules
            .install_files(std::slice::from_ref(&file))
            .expect("installs");
        assert_eq!(limit_of(&rules), Some(3));
        std::fs::write(&file, RULES.replace("LIMIT", "7")).expect("write");
        let (stop, watcher) = watching(file, &rules);
        until_limit(&rules, 7).await;
        let _ = stop.send(());
        watcher.await.expect("watcher");
    }

    /// A rule file written in place is seen half written: its first rule alone, a valid set
    /// that has lost the second rule's limit. The watcher waits for the file to hold still and
    /// installs only the whole change, once. (Paused time orders the writes and the looks.)
    #[tokio::test(start_paused = true)]
    async fn a_file_caught_half_written_is_not_installed() {
        const TWO: &str = "domain: d\nrules:\n  - {id: r, match: {k: '*'}, algorithm: FIXED_WINDOW, limit: LIMIT, window: 1m}\n  - {id: s, match: {j: '*'}, algorithm: FIXED_WINDOW, limit: 5, window: 1m}\n";
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, TWO.replace("LIMIT", "3")).expect("write");
        let rules = ActiveRules::new(Metrics::new());
        let first = rules
            .install_files(std::slice::from_ref(&file))
            .expect("installs");
        let (stop, watcher) = watching(file.clone(), &rules);
        let whole = TWO.replace("LIMIT", "7");
        let half = &whole[..whole.find("  - {id: s").expect("second rule")];
        std::fs::write(&file, half).expect("write the first part");
        tokio::time::sleep(SETTLE / 3).await;
        std::fs::write(&file, &whole).expect("write the rest");
        until_limit(&rules, 7).await;
        assert_eq!(rules.load().rules().len(), 2, "both rules are in force");
        assert_eq!(
            rules.version(),
            first + 1,
            "one install: the half-written file never was"
        );
        let _ = stop.send(());
        watcher.await.expect("watcher");
    }
}
