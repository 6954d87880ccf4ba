//! What the guard knows of each shard: its breaker, its pulse (when it last answered), its
//! calls out and its health as operators see it (`/readyz`, the outage log lines).

use super::*;

/// One shard as the runtime sees it: its breaker, its pulse and its calls out.
#[derive(Debug)]
pub(super) struct Shard {
    pub(super) breaker: Breaker,
    /// Calls out to it now (a call going out counts those ahead of it).
    pub(super) in_flight: Arc<AtomicU64>,
    /// When it last answered a call (node clock, µs; 0: never).
    pub(super) last_answer: Micros,
    /// A [`Prober`] is out.
    pub(super) probing: bool,
    /// Whether it answers, as the log and `/readyz` tell it.
    pub(super) health: Health,
    /// A key a call went to there (the first): what the heartbeat asks about.
    pub(super) probe_key: Option<BucketKey>,
    /// When a call to it last answered or failed.
    pub(super) last_outcome: Micros,
}

/// A shard's outage as operators see it: from its first failed call to its next answer.
#[derive(Debug, Default, Clone)]
pub struct Health {
    /// When calls began failing with no answer since (None: it answers).
    pub failing_since: Option<Micros>,
    /// Calls failed since.
    pub failed: u64,
    /// The last failure.
    pub last_error: String,
    /// When the outage was last written to the log.
    pub(super) logged: Micros,
}

/// How often an outage that lasts is written to the log again.
const OUTAGE_LOGGED_EVERY: Duration = Duration::from_secs(5);

/// A shard as `/readyz` and the metrics show it.
#[derive(Debug, Clone)]
pub struct ShardHealth {
    /// The shard (its first slot in a Redis Cluster; 0 otherwise).
    pub shard: u16,
    /// Its breaker.
    pub breaker: BreakerState,
    /// When it last answered (node clock, µs; 0: never).
    pub last_answer: Micros,
    /// Its outage, if it has one.
    pub health: Health,
}

impl ShardHealth {
    /// Whether it answers: no call has failed since its last answer, and its breaker is
    /// closed.
    pub fn answering(&self) -> bool {
        self.health.failing_since.is_none() && self.breaker == BreakerState::Closed
    }
}

impl Shard {
    /// A call failed at `now`: the outage starts (logged at once) or goes on (logged every
    /// few seconds).
    pub(super) fn failed(&mut self, shard: u16, now: Micros, error: &StoreError) {
        self.last_outcome = self.last_outcome.max(now);
        let h = &mut self.health;
        h.failed += 1;
        h.last_error = error.to_string();
        match h.failing_since {
            None => {
                h.failing_since = Some(now);
                h.logged = now;
                let since_answer_ms =
                    (self.last_answer > 0).then(|| now.saturating_sub(self.last_answer) / 1000);
                tracing::warn!(
                    shard,
                    error = %error,
                    since_answer_ms,
                    "the store is not answering: requests are decided by their rules' fail \
                     modes until it does"
                );
            }
            Some(since)
                if now.saturating_sub(h.logged) >= OUTAGE_LOGGED_EVERY.as_micros() as u64 =>
            {
                h.logged = now;
                tracing::warn!(
                    shard,
                    error = %error,
                    for_ms = now.saturating_sub(since) / 1000,
                    failed_calls = h.failed,
                    "the store is still not answering"
                );
            }
            Some(_) => {}
        }
    }

    /// The store answered at `now`: an outage ends (logged).
    pub(super) fn answered(&mut self, shard: u16, now: Micros) {
        self.last_answer = self.last_answer.max(now);
        self.last_outcome = self.last_outcome.max(now);
        if let Some(since) = self.health.failing_since.take() {
            tracing::info!(
                shard,
                after_ms = now.saturating_sub(since) / 1000,
                failed_calls = self.health.failed,
                "the store answers again"
            );
        }
        self.health.failed = 0;
    }
}

/// Every shard's breaker and pulse (shared with the probes that run on their own).
#[derive(Debug)]
pub(super) struct Breakers {
    pub(super) shards: DashMap<u16, Shard>,
    pub(super) config: BreakerConfig,
    pub(super) clock: SharedClock,
    pub(super) metrics: Arc<Metrics>,
    /// Cooldown jitter (seeded, so a simulation repeats).
    pub(super) jitter: parking_lot::Mutex<StdRng>,
}

impl Breakers {
    pub(super) fn shard(&self, shard: u16) -> dashmap::mapref::one::RefMut<'_, u16, Shard> {
        self.shards.entry(shard).or_insert_with(|| Shard {
            breaker: Breaker::new(self.config.clone()),
            in_flight: Arc::new(AtomicU64::new(0)),
            last_answer: 0,
            probing: false,
            health: Health::default(),
            probe_key: None,
            last_outcome: 0,
        })
    }

    pub(super) fn publish_state(&self) {
        let (worst, open) = self.shards.iter().fold((0, 0), |(worst, open), s| {
            let code = s.breaker.state().code();
            (worst.max(code), open + i64::from(code > 0))
        });
        self.metrics.breaker_state.set(worst);
        self.metrics.breakers_open.set(open);
    }
}
