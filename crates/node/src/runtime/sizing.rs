//! How big a lease to ask for: sized by the key's demand, so a hot key leases up to the
//! maximum (about 50) and a trickle leases exactly its cost (a per-request store call, no
//! stranded units); and never more than a share of what remains, so other nodes do not starve
//! (the store applies `max_share`).
//!
//! A lease must also outlast its own refill, or the key's requests wait on every one: a key
//! that spends its lease faster than a refill comes back (50 units at 100,000 decisions/s last
//! 0.5 ms; a refill on a busy node takes a few) leases what it spends in four times the refill
//! time it observes, never more than half a lease lifetime of its demand: refilled at half, a
//! lease then has two refill times of headroom, which covers their jitter.

use std::time::Duration;

use tollgate_lease::Micros;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeasePolicy {
    /// The most units one lease takes.
    pub max_units: u64,
    /// How long a lease lives.
    pub ttl: Duration,
    /// The largest share of what remains globally one lease may take, in (0, 1].
    pub max_share: f64,
    /// Refill when a lease is down to this fraction of its size (refill before running dry):
    /// at half, a lease of 50 refilled at 10,000 decisions/s has 2.5 ms for the store call.
    pub refill_at: f64,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            max_units: 50,
            ttl: Duration::from_secs(1),
            max_share: 0.5,
            refill_at: 0.5,
        }
    }
}

/// A key's observed demand: units per second, smoothed.
#[derive(Debug, Clone, Default)]
pub struct Demand {
    rate: f64,
    last_grant_at: Option<Micros>,
    last_grant: u64,
    /// Seconds from asking for a lease to holding it, smoothed.
    refill_latency: f64,
}

impl Demand {
    /// Units per second, as last estimated.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Records that the previous grant was used up by `now` (a new lease is needed), which
    /// shows how fast units go.
    pub fn on_refill(&mut self, now: Micros) {
        if let Some(at) = self.last_grant_at {
            let elapsed = (now.saturating_sub(at)).max(100) as f64 / 1e6;
            let observed = self.last_grant as f64 / elapsed;
            self.rate = if self.rate == 0.0 {
                observed
            } else {
                0.5 * self.rate + 0.5 * observed
            };
        }
    }

    /// Seconds a refill takes, as last estimated.
    pub fn refill_latency(&self) -> f64 {
        self.refill_latency
    }

    /// Records a grant of `units` at `now` for an ask sent at `asked_at`.
    pub fn on_grant(&mut self, now: Micros, units: u64, asked_at: Micros) {
        self.last_grant_at = Some(now);
        self.last_grant = units;
        let latency = now.saturating_sub(asked_at) as f64 / 1e6;
        self.refill_latency = if self.refill_latency == 0.0 {
            latency
        } else {
            0.5 * self.refill_latency + 0.5 * latency
        };
    }
}

impl LeasePolicy {
    /// Units to ask for: enough for half a lease lifetime at the observed rate, at most the
    /// maximum, unless that would not outlast four refills (then what four refills take to
    /// spend); at least `need`, at most the bucket's capacity.
    pub fn want(&self, demand: &Demand, need: u64, capacity: u64) -> u64 {
        let rate = demand.rate();
        let by_rate = (rate * self.ttl.as_secs_f64() / 2.0).ceil() as u64;
        let outlast_refills = ((rate * 4.0 * demand.refill_latency()).ceil() as u64).min(by_rate);
        by_rate
            .min(self.max_units)
            .max(outlast_refills)
            .max(need)
            .min(capacity)
    }

    /// Whether a lease of `granted` units, down to `left`, should be refilled now. Leases of
    /// one unit (a trickle) are never refilled ahead: that would strand units.
    pub fn should_refill(&self, granted: u64, left: i64) -> bool {
        granted > 1 && (left as f64) <= (granted as f64 * self.refill_at).max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trickle_leases_its_cost_and_a_hot_key_the_maximum() {
        let policy = LeasePolicy::default();
        let mut demand = Demand::default();
        assert_eq!(policy.want(&demand, 1, 1000), 1, "no demand seen yet");
        demand.on_grant(0, 1, 0);
        demand.on_refill(2_000_000); // one unit in two seconds
        assert_eq!(policy.want(&demand, 1, 1000), 1);
        let mut hot = Demand::default();
        hot.on_grant(0, 10, 0);
        hot.on_refill(10_000); // ten units in 10 ms: 1000/s
        assert_eq!(policy.want(&hot, 1, 1000), 50);
        assert_eq!(policy.want(&hot, 1, 20), 20, "never above capacity");
        assert_eq!(
            policy.want(&hot, 80, 1000),
            80,
            "at least what the request needs"
        );
    }

    #[test]
    fn a_lease_outlasts_four_refills_of_it() {
        let policy = LeasePolicy::default();
        let mut hot = Demand::default();
        // 50 units spent in 0.5 ms (100,000/s); the refill took 5 ms to come back.
        hot.on_grant(0, 50, 0);
        hot.on_refill(500);
        assert_eq!(policy.want(&hot, 1, 1_000_000), 50, "no refill timed yet");
        hot.on_grant(5_500, 50, 500);
        hot.on_refill(6_000);
        assert_eq!(policy.want(&hot, 1, 1_000_000), 2_000, "20 ms at 100,000/s");
        assert_eq!(policy.want(&hot, 1, 300), 300, "never above capacity");
        let mut slow = Demand::default();
        // 1,000/s with refills of 400 ms: four refills would be 1,600 units, half a lifetime 500.
        slow.on_grant(0, 10, 0);
        slow.on_refill(10_000);
        slow.on_grant(410_000, 10, 10_000);
        slow.on_refill(420_000);
        assert_eq!(policy.want(&slow, 1, 1_000_000), 500);
        let mut warm = Demand::default();
        // 1,000/s with fast refills: the usual maximum.
        warm.on_grant(0, 10, 0);
        warm.on_refill(10_000);
        warm.on_grant(10_200, 10, 10_000);
        warm.on_refill(20_200);
        assert_eq!(policy.want(&warm, 1, 1_000_000), 50);
    }

    #[test]
    fn refills_come_before_the_lease_runs_dry() {
        let policy = LeasePolicy::default();
        assert!(!policy.should_refill(50, 30));
        assert!(policy.should_refill(50, 25));
        assert!(!policy.should_refill(1, 0), "a trickle never refills ahead");
    }
}
