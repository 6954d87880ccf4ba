//! Regional allowances (ASYNC_SYNC across two regions, `docs/regional-budgets.md`).
//!
//! A bucket whose consumption syncs with a peer region is its region's *view* of the global
//! bucket (its own consumption plus the peer's, debited as it arrives). Alone, a view lets each
//! region spend the whole capacity before it hears of the other's spending. An [`Allowance`]
//! on a check item, lease ask or lease return adds a second bucket beside the view,
//! `<key>:allowance`, of the same algorithm at this region's **share** of the limit, counting
//! this region's own consumption only: a request must fit both, and is taken from both.
//!
//! The share follows demand. Every node reports, once per sync interval, the units its
//! requests asked of the bucket in the last interval (admitted or not), into its own region's
//! store, and ships the same report to the peer region, whose receiver writes it into that
//! region's store ([`DemandReport`]). Both stores therefore hold both regions' reports, in
//! `<key>:demand`, and compute the share the same way at each call:
//!
//! - the peer has reported within the horizon (two intervals and a second): own demand over
//!   both regions', within [[`FLOOR_SHARE`], 1 − [`FLOOR_SHARE`]] (own demand not reported yet:
//!   the floor);
//! - it has not, and this region has asked for longer than one interval and a second (the
//!   peer's report would have arrived): the peer is idle, 1 − floor;
//! - before that: `unknown_share`, the cautious split (a burst in both regions at once is
//!   split, not doubled).
//!
//! A token bucket allowance keeps its *used* tokens when its share moves (its capacity is
//! stored with it), so a region whose share rises may spend the difference at once. Windows
//! keep their count, as they do on any limit change. The sliding log is not given an
//! allowance (its entries are per admission; the node passes none for it).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::Micros;
use crate::error::InvalidInput;
use crate::key::BucketKey;
use crate::limit::{Kind, Limit, MAX_PERIOD};
use crate::ops::debit::is_origin_name;
use crate::ops::{Repeats, check_units, validate_keys};

/// The smallest share a region is given while it has demand, and what an idle peer keeps.
pub const FLOOR_SHARE: f64 = 0.05;

/// Margin added to the interval before a missing report means an idle peer (delivery time).
pub const REPORT_MARGIN_US: u64 = 1_000_000;

/// A bucket's regional allowance, as a caller in one region asks for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowance {
    /// The caller's region (reports from other regions are the peer's).
    pub region: Arc<str>,
    /// How often every node reports demand (the sync interval), microseconds.
    pub interval_us: u64,
    /// The share before the peer's demand is known, in (0, 1].
    pub unknown_share: f64,
}

impl Allowance {
    /// How long a report counts.
    pub fn horizon_us(&self) -> u64 {
        2 * self.interval_us + REPORT_MARGIN_US
    }

    pub(crate) fn validate(&self, key: &BucketKey) -> Result<(), InvalidInput> {
        let bad = |reason: String| InvalidInput::BadAllowance {
            key: key.to_string(),
            reason,
        };
        if !is_region_name(&self.region) {
            return Err(bad(format!(
                "region {:?} is not a region name",
                self.region
            )));
        }
        if self.interval_us < 1_000 || self.interval_us > 3_600_000_000 {
            return Err(bad(format!(
                "interval must be 1 ms to 1 h, got {} µs",
                self.interval_us
            )));
        }
        if !(self.unknown_share > 0.0 && self.unknown_share <= 1.0) {
            return Err(bad(format!(
                "unknown share must be in (0, 1], got {}",
                self.unknown_share
            )));
        }
        Ok(())
    }
}

/// Whether `name` is a region name: 1 to 32 characters of `[a-z0-9-]`.
pub fn is_region_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// What one node asked of one bucket in its last interval, reported to a region's store.
#[derive(Debug, Clone, PartialEq)]
pub struct DemandReport {
    /// The bucket (its view's key; the report lands in `<key>:demand`).
    pub key: BucketKey,
    /// The reporting node's origin name (`<region>/<incarnation>`).
    pub origin: String,
    /// The reporting node's region.
    pub region: String,
    /// Units asked in its last interval, admitted or not.
    pub units: u64,
    /// The reporter's interval, microseconds (the report lives two of them and a second).
    pub interval_us: u64,
}

/// A validated batch of demand reports of one identity's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct DemandRequest {
    reports: Vec<DemandReport>,
}

impl DemandRequest {
    /// Validates the reports: one identity, region names, origin without `|`, an interval.
    pub fn new(reports: Vec<DemandReport>) -> Result<Self, InvalidInput> {
        validate_keys(reports.iter().map(|r| &r.key), Repeats::Allowed)?;
        for r in &reports {
            check_units("demand", r.units)?;
            let bad = |reason: String| InvalidInput::BadAllowance {
                key: r.key.to_string(),
                reason,
            };
            if !is_region_name(&r.region) {
                return Err(bad(format!("region {:?} is not a region name", r.region)));
            }
            if !is_origin_name(&r.origin) {
                return Err(InvalidInput::BadOrigin {
                    origin: r.origin.chars().take(80).collect(),
                });
            }
            if r.interval_us < 1_000 || r.interval_us > 3_600_000_000 {
                return Err(bad(format!(
                    "interval must be 1 ms to 1 h, got {} µs",
                    r.interval_us
                )));
            }
        }
        Ok(Self { reports })
    }

    /// The reports.
    pub fn reports(&self) -> &[DemandReport] {
        &self.reports
    }
}

/// The demand record of a bucket (`<key>:demand`), mirrored in `lib.lua` (`demand_*`): per
/// reporter `r:<origin>` = `<region>|<units>|<expires at>`; `since`, `last`: when this
/// region's current stretch of asking began and last asked.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Demand {
    pub(crate) reports: BTreeMap<String, (String, u64, Micros)>,
    pub(crate) since: Micros,
    pub(crate) last: Micros,
}

impl Demand {
    /// Records a report (a later report of the same reporter replaces it).
    pub(crate) fn report(&mut self, r: &DemandReport, now: Micros) {
        self.reports.retain(|_, (_, _, until)| *until > now);
        let until = now + 2 * r.interval_us + REPORT_MARGIN_US;
        self.reports
            .insert(r.origin.clone(), (r.region.clone(), r.units, until));
    }

    /// This region's share at `now`, noting that it asks now.
    pub(crate) fn share(&mut self, a: &Allowance, now: Micros) -> f64 {
        self.reports.retain(|_, (_, _, until)| *until > now);
        if self.last == 0 || now.saturating_sub(self.last) > a.horizon_us() {
            self.since = now;
        }
        self.last = now;
        let (mut own, mut peer, mut peer_known) = (0u64, 0u64, false);
        for (region, units, _) in self.reports.values() {
            if **region == *a.region {
                own += units;
            } else {
                peer += units;
                peer_known = true;
            }
        }
        share_from(own, peer, peer_known, now.saturating_sub(self.since), a)
    }

    /// When the record may be forgotten: its last report and its last ask (`horizon_us`
    /// after it) are over, as `lib.lua`'s `demand_expire` sets it.
    pub(crate) fn expires_at(&self, horizon_us: u64, now: Micros) -> Micros {
        let latest = self.reports.values().map(|r| r.2).max().unwrap_or(0);
        let until = latest.max(self.last + horizon_us);
        now + crate::algorithm::ttl_ms(until.saturating_sub(now)) * 1000
    }
}

/// The share rule (see the module doc), in the order of operations `lib.lua` uses.
fn share_from(own: u64, peer: u64, peer_known: bool, asking_for: u64, a: &Allowance) -> f64 {
    if !peer_known {
        if asking_for >= a.interval_us + REPORT_MARGIN_US {
            1.0 - FLOOR_SHARE
        } else {
            a.unknown_share
        }
    } else if own == 0 {
        FLOOR_SHARE
    } else {
        let s = own as f64 / (own as f64 + peer as f64);
        s.clamp(FLOOR_SHARE, 1.0 - FLOOR_SHARE)
    }
}

/// `limit` at `share`: counts rounded down but at least 1, a token bucket's rate scaled too
/// (never slower than refilling from empty in the longest period). Mirrored in `lib.lua`
/// (`share_params`).
pub fn share_of(limit: &Limit, share: f64) -> Limit {
    if share >= 1.0 {
        return *limit;
    }
    let part = |n: u64| (n as f64 * share).floor().max(1.0) as u64;
    let kind = match limit.kind() {
        Kind::TokenBucket {
            capacity,
            refill_per_second,
        } => {
            let capacity = part(capacity);
            let mut rate = refill_per_second * share;
            let slowest = capacity as f64 / MAX_PERIOD.as_secs_f64();
            if rate < slowest {
                rate = slowest;
            }
            Kind::TokenBucket {
                capacity,
                refill_per_second: rate,
            }
        }
        Kind::Gcra {
            burst,
            rate_per_second,
        } => {
            let burst = part(burst);
            let mut rate = rate_per_second * share;
            let slowest = burst as f64 / MAX_PERIOD.as_secs_f64();
            if rate < slowest {
                rate = slowest;
            }
            Kind::Gcra {
                burst,
                rate_per_second: rate,
            }
        }
        Kind::LeakyBucket {
            burst,
            leak_per_second,
            limit,
            duration_us,
        } => {
            // The store sees the burst and the leak, scaled as a token bucket's are; the
            // limit as written goes with them, for headers.
            let burst = part(burst);
            let mut leak = leak_per_second * share;
            let slowest = burst as f64 / MAX_PERIOD.as_secs_f64();
            if leak < slowest {
                leak = slowest;
            }
            Kind::LeakyBucket {
                burst,
                leak_per_second: leak,
                limit: part(limit),
                duration_us,
            }
        }
        Kind::FixedWindow { limit, window_us } => Kind::FixedWindow {
            limit: part(limit),
            window_us,
        },
        Kind::SlidingWindow { limit, window_us } => Kind::SlidingWindow {
            limit: part(limit),
            window_us,
        },
        Kind::SlidingWindowLog { limit, window_us } => Kind::SlidingWindowLog {
            limit: part(limit),
            window_us,
        },
        Kind::Concurrency {
            max_in_flight,
            slot_ttl_us,
        } => Kind::Concurrency {
            max_in_flight: part(max_in_flight),
            slot_ttl_us,
        },
    };
    Limit::of_kind(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowance() -> Allowance {
        Allowance {
            region: "us".into(),
            interval_us: 2_000_000,
            unknown_share: 0.5,
        }
    }

    fn report(region: &str, origin: &str, units: u64) -> DemandReport {
        DemandReport {
            key: BucketKey::new(b"k", "r").expect("key"),
            origin: origin.into(),
            region: region.into(),
            units,
            interval_us: 2_000_000,
        }
    }

    #[test]
    fn the_share_is_cautious_then_follows_demand() {
        let a = allowance();
        let mut d = Demand::default();
        let t0 = 1_000_000_000;
        assert_eq!(d.share(&a, t0), 0.5, "nothing known: the cautious split");
        assert_eq!(d.share(&a, t0 + 2_999_999), 0.5);
        assert_eq!(
            d.share(&a, t0 + 3_000_000),
            0.95,
            "no report from the peer after an interval and a second: it is idle"
        );
        d.report(&report("eu", "eu/1", 300), t0 + 3_000_000);
        assert_eq!(
            d.share(&a, t0 + 3_000_001),
            0.05,
            "own demand not reported yet"
        );
        d.report(&report("us", "us/1", 100), t0 + 3_100_000);
        d.report(&report("us", "us/2", 200), t0 + 3_100_000);
        assert_eq!(d.share(&a, t0 + 3_200_000), 0.5, "300 against 300");
        d.report(&report("eu", "eu/1", 0), t0 + 4_000_000);
        assert_eq!(d.share(&a, t0 + 4_000_001), 0.95, "the peer went quiet");
        // Reports expire: after the horizon the peer is unknown again, and idle at once
        // (this region has been asking all along).
        assert_eq!(d.share(&a, t0 + 4_000_000 + 5_000_001), 0.95);
    }

    #[test]
    fn a_share_scales_every_algorithm_and_keeps_at_least_one() {
        let tb = Limit::token_bucket(600, 10.0).expect("limit");
        let half = share_of(&tb, 0.5);
        assert_eq!(
            (half.capacity(), half.refill_per_second()),
            (300, Some(5.0))
        );
        assert_eq!(share_of(&tb, 1.0), tb);
        let fw = Limit::fixed_window(10, std::time::Duration::from_secs(60)).expect("limit");
        assert_eq!(share_of(&fw, 0.05).capacity(), 1);
    }
}
