//! The in-memory store behind a link whose behaviour can change while nodes run on it: each
//! call waits a latency drawn from a seeded distribution, and the link can be cut (calls fail
//! at once, as against a killed Redis), stalled (calls hang until it resumes, as against a
//! `SIGSTOP`ped Redis; the caller's budget ends first), or slowed. A failover wipes the state
//! (every bucket starts full again, as when a replica without the latest writes is promoted).
//!
//! The chaos simulations run every node of a region on one [`LinkedStore`] and drive its
//! [`StoreLink`] from their fault schedule. Latency is slept on tokio's clock, so on paused
//! time it costs no wall time; the draws come from the link's own seeded generator, so one
//! seed gives one sequence of latencies.
//!
//! Each node reaches the store through its own session ([`LinkedStore::for_node`]), which can
//! model what a real node pays and the shared link does not: a connection to set up and each
//! script to load on its first calls (again after a failover, which drops connections and
//! the script cache, as a restarted Redis does), and the node's own CPU, a queue that every
//! answer waits in before the node reads it ([`NodeCpu`]).
//!
//! As with Redis, a command runs once it has crossed the link, whether or not its caller still
//! waits (a caller's budget, [`LinkedStore::with_budget`], ends its wait, not the command); a
//! command held by a stalled link runs when the link resumes, and is lost if the link goes
//! down meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;

use crate::error::StoreError;
use crate::memory::MemoryStore;

/// How long one store call takes on the link: a log-normal distribution given by its median
/// and its 99th percentile (a round trip to a healthy Redis is about that shape: a tight body
/// and a long tail).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Half of all calls are faster.
    pub median: Duration,
    /// 99 % of all calls are faster.
    pub p99: Duration,
}

impl Latency {
    /// Every call takes exactly `d`.
    pub fn fixed(d: Duration) -> Self {
        Self { median: d, p99: d }
    }

    fn draw(&self, rng: &mut StdRng) -> Duration {
        let median = self.median.as_secs_f64();
        if self.p99 <= self.median || median == 0.0 {
            return self.median;
        }
        // z of the 99th percentile of a standard normal.
        let sigma = (self.p99.as_secs_f64() / median).ln() / 2.326_348;
        // Box-Muller: one standard normal from two uniforms.
        let (u1, u2): (f64, f64) = (rng.random::<f64>().max(f64::MIN_POSITIVE), rng.random());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        // A call never takes more than a minute, however far the tail is drawn.
        Duration::from_secs_f64((median * (sigma * z).exp()).min(60.0))
    }
}

/// What the link does to calls now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinkCondition {
    /// Calls take their drawn latency.
    Up,
    /// Calls fail at once with [`StoreError::Refused`] (connection refused).
    Down,
    /// Calls hang until the link is up or down again.
    Stalled,
    /// Calls take this much longer than their drawn latency.
    Slow(Duration),
}

/// Calls made over a link, by operation.
#[derive(Debug, Default)]
pub struct LinkCalls {
    /// Checks.
    pub check: AtomicU64,
    /// Lease acquisitions.
    pub acquire: AtomicU64,
    /// Lease returns.
    pub returns: AtomicU64,
    /// Slot releases.
    pub release: AtomicU64,
    /// Debits (consumption from the peer region).
    pub debit: AtomicU64,
    /// Demand reports (regional allowances' shares).
    pub demand: AtomicU64,
    /// Counter reads and resets (support's calls, and the breaker's probes).
    pub counter: AtomicU64,
    /// Denials noted towards penalties.
    pub penalty: AtomicU64,
    /// Calls that failed because the link was down.
    pub refused: AtomicU64,
}

impl LinkCalls {
    /// Calls that reached the store, by operation.
    pub fn by_op(&self) -> [(&'static str, u64); 8] {
        [
            ("check", &self.check),
            ("acquire", &self.acquire),
            ("return", &self.returns),
            ("release", &self.release),
            ("debit", &self.debit),
            ("demand", &self.demand),
            ("counter", &self.counter),
            ("penalty", &self.penalty),
        ]
        .map(|(op, n)| (op, n.load(Ordering::Relaxed)))
    }

    /// All calls that reached the store.
    pub fn total(&self) -> u64 {
        self.by_op().iter().map(|(_, n)| n).sum()
    }
}

/// What the store handed out and took back per bucket, as the link saw the answers: units a
/// check admitted or a lease granted, and units a return credited (concurrency slots are not
/// counted: they come back by release).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    /// Units admitted by checks and granted in leases.
    pub handed: u64,
    /// Units credited back by lease returns.
    pub credited: u64,
}

/// The control side of a link: change its condition, fail the store over, read its counts.
/// Cloning shares the link.
#[derive(Debug, Clone)]
pub struct StoreLink {
    inner: Arc<LinkInner>,
}

#[derive(Debug)]
struct LinkInner {
    condition: Mutex<LinkCondition>,
    /// Wakes calls a stall holds, in the order they came (tokio's `watch` wakes its
    /// receivers in a random order, which a simulation could not repeat).
    resumed: Notify,
    latency: Mutex<(Latency, StdRng)>,
    calls: LinkCalls,
    failovers: AtomicU64,
    /// Per bucket key, when kept ([`LinkedStore::keep_ledger`]).
    ledger: Mutex<Option<std::collections::HashMap<String, Ledger>>>,
}

impl StoreLink {
    /// Sets the link's condition (a stalled call resumes when the link is no longer stalled).
    pub fn set_condition(&self, condition: LinkCondition) {
        *self.inner.condition.lock() = condition;
        self.inner.resumed.notify_waiters();
    }

    /// The calls made so far.
    pub fn calls(&self) -> &LinkCalls {
        &self.inner.calls
    }

    /// Failovers so far.
    pub fn failovers(&self) -> u64 {
        self.inner.failovers.load(Ordering::Relaxed)
    }

    /// What the store handed out and took back for `key`, if the ledger is kept.
    pub fn ledger_of(&self, key: &str) -> Option<Ledger> {
        self.inner
            .ledger
            .lock()
            .as_ref()
            .map(|l| l.get(key).copied().unwrap_or_default())
    }

    /// Takes `key`'s ledger away, if the ledger is kept: what its store handed out and took
    /// back so far (a simulation checks a bucket's books once nothing of it can still be on
    /// its way, then counts it afresh).
    pub fn take_ledger(&self, key: &str) -> Option<Ledger> {
        self.inner
            .ledger
            .lock()
            .as_mut()
            .map(|l| l.remove(key).unwrap_or_default())
    }

    fn book(&self, key: &str, entry: impl FnOnce(&mut Ledger)) {
        if let Some(ledger) = self.inner.ledger.lock().as_mut() {
            // The key is copied only the first time it is booked.
            match ledger.get_mut(key) {
                Some(l) => entry(l),
                None => entry(ledger.entry(key.to_owned()).or_default()),
            }
        }
    }
}

/// What a node's first calls cost on a fresh connection, beyond a call's latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Setup {
    /// A fresh node's first connection (TCP, the client's hello, and the fresh process's own
    /// first steps): every call waits for it.
    pub connect: Duration,
    /// Connecting again after a failover dropped the connection (a warm process: much less).
    pub reconnect: Duration,
    /// A script's first call: `EVALSHA` answered `NOSCRIPT`, then the source sent and
    /// compiled (one more round trip and the compile).
    pub script_load: Duration,
}

/// A node's CPU: `cores` servers of one queue. Work arriving at `t` starts when a core is
/// free and holds it for its cost; past its capacity a node queues, and everything it does
/// (its decisions, reading its store answers) waits in that queue.
#[derive(Debug)]
pub struct NodeCpu {
    /// When each core is next free (tokio's clock).
    free_at: Mutex<Vec<tokio::time::Instant>>,
    /// What reading one store answer costs (decoding it, waking its caller).
    per_answer: Duration,
}

impl NodeCpu {
    /// A CPU of `cores` cores on which reading one store answer costs `per_answer`.
    pub fn new(cores: usize, per_answer: Duration) -> Self {
        Self {
            free_at: Mutex::new(vec![tokio::time::Instant::now(); cores.max(1)]),
            per_answer,
        }
    }

    /// Runs `cost` of work arriving now: returns once a core has done it. tokio's timers
    /// count whole milliseconds, so work done within the millisecond it arrived in returns at
    /// once: the cores' books still advance, and once their queue is a millisecond long, work
    /// waits for it (a node's capacity holds per millisecond, not per microsecond).
    pub async fn run(&self, cost: Duration) {
        if cost.is_zero() {
            return;
        }
        let now = tokio::time::Instant::now();
        let done = {
            let mut cores = self.free_at.lock();
            let core = cores.iter_mut().min().expect("a CPU has at least one core");
            *core = (*core).max(now) + cost;
            *core
        };
        if done - now >= TIMER_RESOLUTION {
            tokio::time::sleep_until(done).await;
        }
    }

    /// Waits until a core is free of the work queued now (at once when that is within the
    /// millisecond), adding none.
    pub async fn drain(&self) {
        let queue = self.queue();
        if queue >= TIMER_RESOLUTION {
            tokio::time::sleep(queue).await;
        } else {
            tokio::task::yield_now().await;
        }
    }

    /// How long work arriving now would wait for a core.
    pub fn queue(&self) -> Duration {
        let now = tokio::time::Instant::now();
        self.free_at
            .lock()
            .iter()
            .min()
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }
}

/// The finest wait tokio's timers keep.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// One node's session on the link: its connection, the scripts it has loaded, its CPU.
#[derive(Debug)]
struct Session {
    setup: Setup,
    cpu: Option<Arc<NodeCpu>>,
    state: Mutex<SessionState>,
}

#[derive(Debug, Default)]
struct SessionState {
    /// The store failovers seen when the connection was made (None: never connected).
    epoch: Option<u64>,
    /// When the connection is (or was) ready.
    ready_at: Option<tokio::time::Instant>,
    /// Scripts loaded on this connection, and when each is loaded.
    scripts: std::collections::HashMap<&'static str, tokio::time::Instant>,
}

impl Session {
    /// Connects if the session has no connection to the store as it is since `epoch`
    /// failovers: the first time a fresh node's connect, after a failover a reconnect, and
    /// no script loaded on it.
    fn connect(&self, state: &mut SessionState, epoch: u64, now: tokio::time::Instant) {
        if state.epoch == Some(epoch) {
            return;
        }
        let cost = if state.epoch.is_none() {
            self.setup.connect
        } else {
            self.setup.reconnect
        };
        state.epoch = Some(epoch);
        state.ready_at = Some(now + cost);
        state.scripts.clear();
    }

    /// What a call of `script` issued now waits before it crosses the link: the connection
    /// set-up if there is none (or the store failed over since: a restart drops it and its
    /// scripts), and the script's load if this connection has not loaded it yet.
    fn delay(&self, script: &'static str, epoch: u64, drawn: Duration) -> Duration {
        let now = tokio::time::Instant::now();
        let mut state = self.state.lock();
        self.connect(&mut state, epoch, now);
        let ready = state.ready_at.unwrap_or(now).max(now);
        let mut wait = ready - now;
        match state.scripts.get(script) {
            Some(loaded) if *loaded <= ready => {}
            Some(_) => {
                // Sent while the first caller's load is still on its way: NOSCRIPT as well.
                wait += self.setup.script_load;
            }
            None => {
                wait += self.setup.script_load;
                state
                    .scripts
                    .insert(script, ready + drawn + self.setup.script_load);
            }
        }
        wait
    }

    /// Warms the session up as a node does before it serves: connected, every script loaded.
    fn warm(&self, epoch: u64, scripts: &[&'static str]) -> Duration {
        let now = tokio::time::Instant::now();
        let mut state = self.state.lock();
        self.connect(&mut state, epoch, now);
        let ready = state.ready_at.unwrap_or(now).max(now);
        let done = ready + self.setup.script_load * scripts.len() as u32;
        for script in scripts {
            state.scripts.entry(script).or_insert(done);
        }
        done - now
    }
}

/// The scripts a Redis store loads, by the names the link's calls give them.
const SCRIPTS: &[&str] = &[
    "check", "acquire", "return", "release", "renew", "debit", "settle", "demand", "counter",
    "penalty",
];

/// A [`MemoryStore`] reached over a [`StoreLink`]. Cloning shares the store and the link (and
/// the node's session, for a store made by [`LinkedStore::for_node`]).
#[derive(Debug, Clone)]
pub struct LinkedStore {
    store: MemoryStore,
    link: StoreLink,
    /// How long a caller waits for an answer (None: as long as it takes).
    budget: Option<Duration>,
    /// The node's session (None: calls pay their latency only).
    session: Option<Arc<Session>>,
}

impl LinkedStore {
    /// `store` behind a link that is up, with `latency` per call drawn from a generator seeded
    /// with `seed`.
    pub fn new(store: MemoryStore, latency: Latency, seed: u64) -> Self {
        Self {
            store,
            link: StoreLink {
                inner: Arc::new(LinkInner {
                    condition: Mutex::new(LinkCondition::Up),
                    resumed: Notify::new(),
                    latency: Mutex::new((latency, StdRng::seed_from_u64(seed))),
                    calls: LinkCalls::default(),
                    failovers: AtomicU64::new(0),
                    ledger: Mutex::new(None),
                }),
            },
            budget: None,
            session: None,
        }
    }

    /// The same store and link, reached by one node: its first calls pay `setup`, and with a
    /// `cpu` every answer waits for the node to read it.
    pub fn for_node(&self, setup: Setup, cpu: Option<Arc<NodeCpu>>) -> Self {
        Self {
            session: Some(Arc::new(Session {
                setup,
                cpu,
                state: Mutex::new(SessionState::default()),
            })),
            ..self.clone()
        }
    }

    /// What a task yielding to its node's runtime waits: on a node with a CPU, until the work
    /// queued on it is done (a yield puts the task behind every runnable one); otherwise two
    /// plain yields.
    pub async fn yield_to_runtime(&self) {
        match self.session.as_ref().and_then(|s| s.cpu.as_ref()) {
            Some(cpu) => cpu.drain().await,
            None => {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
            }
        }
    }

    /// Warms the node's session up within `timeout`, as a node does before it serves
    /// (connected, every script loaded): at once without a session; refused when the link
    /// is down; held by a stalled link.
    pub async fn warm_up(&self, timeout: Duration) -> Result<(), StoreError> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        let attempt = async {
            loop {
                let resumed = self.link.inner.resumed.notified();
                tokio::pin!(resumed);
                resumed.as_mut().enable();
                let condition = *self.link.inner.condition.lock();
                match condition {
                    LinkCondition::Down => {
                        return Err(StoreError::Refused(
                            "connection refused (the simulated link is down)".into(),
                        ));
                    }
                    LinkCondition::Stalled => resumed.await,
                    LinkCondition::Up | LinkCondition::Slow(_) => break,
                }
            }
            let wait = session.warm(self.link.failovers(), SCRIPTS);
            tokio::time::sleep(wait).await;
            Ok(())
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout { budget: timeout }),
        }
    }

    /// Keeps a [`Ledger`] per bucket from now on (what every answer handed out and took back).
    pub fn keep_ledger(&self) {
        self.link
            .inner
            .ledger
            .lock()
            .get_or_insert_with(Default::default);
    }

    /// The link's control side.
    pub fn link(&self) -> &StoreLink {
        &self.link
    }

    /// The store behind the link.
    pub fn memory(&self) -> &MemoryStore {
        &self.store
    }

    /// Fails the store over to a replica that has none of its state: every bucket starts full
    /// and every lease and slot is forgotten.
    pub fn fail_over(&self) {
        self.store.clear();
        self.link.inner.failovers.fetch_add(1, Ordering::Relaxed);
    }

    /// The same store and link, with calls that give up after `budget` (as the Redis store's
    /// do). The command still runs when its latency is over, as a command sent to Redis runs
    /// whether or not its client still waits: a check that timed out may have spent.
    pub fn with_budget(&self, budget: Duration) -> Self {
        Self {
            budget: Some(budget),
            ..self.clone()
        }
    }

    /// Runs `op` on the store once the link has carried it: at once an error when the link is
    /// down; after the drawn latency otherwise (a stalled link holds it until it resumes). The
    /// command runs in its own task, so a caller that gives up does not unsend it.
    async fn call<T, F, Fut>(
        &self,
        script: &'static str,
        counter: fn(&LinkCalls) -> &AtomicU64,
        op: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(MemoryStore) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let inner = &self.link.inner;
        if *inner.condition.lock() == LinkCondition::Down {
            inner.calls.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Refused(
                "connection refused (the simulated link is down)".into(),
            ));
        }
        let drawn = {
            let mut latency = inner.latency.lock();
            let (dist, rng) = &mut *latency;
            dist.draw(rng)
        };
        let setup = self.session.as_ref().map_or(Duration::ZERO, |s| {
            s.delay(script, self.link.failovers(), drawn)
        });
        let cpu = self.session.as_ref().and_then(|s| s.cpu.clone());
        let link = self.link.clone();
        let store = self.store.clone();
        let carried = tokio::spawn(async move {
            if !setup.is_zero() {
                tokio::time::sleep(setup).await;
            }
            loop {
                let resumed = link.inner.resumed.notified();
                tokio::pin!(resumed);
                // Registered before the condition is read: a change in between still wakes it.
                resumed.as_mut().enable();
                let now = *link.inner.condition.lock();
                match now {
                    LinkCondition::Stalled => resumed.await,
                    // Killed while it held the command: the command is lost.
                    LinkCondition::Down => {
                        return Err(StoreError::Unavailable(
                            "connection reset (the simulated link went down)".into(),
                        ));
                    }
                    LinkCondition::Up | LinkCondition::Slow(_) => {
                        let extra = match now {
                            LinkCondition::Slow(d) => d,
                            _ => Duration::ZERO,
                        };
                        tokio::time::sleep(drawn + extra).await;
                        counter(&link.inner.calls).fetch_add(1, Ordering::Relaxed);
                        let answer = op(store).await;
                        // The answer waits for the node to read it.
                        if let Some(cpu) = &cpu {
                            cpu.run(cpu.per_answer).await;
                        }
                        return answer;
                    }
                }
            }
        });
        let joined = |r: Result<Result<T, StoreError>, tokio::task::JoinError>| {
            r.unwrap_or_else(|e| {
                Err(StoreError::Unavailable(format!(
                    "the simulated call failed: {e}"
                )))
            })
        };
        match self.budget {
            None => joined(carried.await),
            Some(budget) => match tokio::time::timeout(budget, carried).await {
                Ok(r) => joined(r),
                Err(_) => Err(StoreError::Timeout { budget }),
            },
        }
    }
}

mod operations;

#[cfg(test)]
mod tests;
