//! The consumption log: what this node admitted under rules that sync (ASYNC_SYNC), per bucket
//! and epoch, as running totals. The region-sync actor ships the totals that grew; the peer
//! applies each total as a max, so shipping a total twice, late or out of order is harmless,
//! and a failed shipment is simply covered by the next one.
//!
//! An epoch is the limit's own window for window algorithms (aligned to the Unix epoch, as the
//! store aligns windows) and a 60 s period for token buckets. Its `until` is when its units stop
//! mattering to the peer: the window's end for a fixed window, one window later for a sliding
//! window or log (the previous window still weighs in), one period later for a token bucket.

use std::cell::RefCell;

use dashmap::DashMap;
use tollgate_lease::{Algorithm, Limit, Micros};

use crate::messages::Entry;

/// A token bucket's epoch length.
pub const TOKEN_BUCKET_EPOCH_US: u64 = 60_000_000;

/// The epoch of `limit` containing `now`: its end as a record's `until`.
pub fn epoch_until(limit: &Limit, now: Micros) -> Micros {
    let (length, weighs_for) = match limit.algorithm() {
        Algorithm::FixedWindow => (window_us(limit), 1),
        Algorithm::SlidingWindow | Algorithm::SlidingWindowLog => (window_us(limit), 2),
        Algorithm::TokenBucket
        | Algorithm::Gcra
        | Algorithm::LeakyBucket
        | Algorithm::Concurrency => (TOKEN_BUCKET_EPOCH_US, 2),
    };
    now - now % length + weighs_for * length
}

/// How long the consumption of one epoch of `limit` spans, µs (a window, or a token bucket's
/// period): its `until` lies one or two of these after it started.
pub fn epoch_length(limit: &Limit) -> u64 {
    match limit.algorithm() {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingWindowLog => {
            window_us(limit)
        }
        Algorithm::TokenBucket
        | Algorithm::Gcra
        | Algorithm::LeakyBucket
        | Algorithm::Concurrency => TOKEN_BUCKET_EPOCH_US,
    }
}

fn window_us(limit: &Limit) -> u64 {
    limit
        .window()
        .map_or(TOKEN_BUCKET_EPOCH_US, |w| (w.as_micros() as u64).max(1))
}

#[derive(Debug, Clone, Copy)]
struct Epoch {
    until: Micros,
    total: u64,
    at: Micros,
    /// The largest total the peer has acknowledged.
    shipped: u64,
}

#[derive(Debug)]
struct Counter {
    rule: String,
    identity: Vec<u8>,
    /// Units asked since the last demand sweep, admitted or not.
    asked: u64,
    /// At most a few: the current epoch, and earlier ones until they end or are shipped.
    epochs: Vec<Epoch>,
}

thread_local! {
    static LOOKUP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The map key: the rule id (ASCII, without 0xFF), 0xFF, the identity.
fn map_key(rule: &str, identity: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(rule.as_bytes());
    out.push(0xFF);
    out.extend_from_slice(identity);
}

/// Per bucket, this node's running totals per epoch.
#[derive(Debug)]
pub struct ConsumptionLog {
    counters: DashMap<Box<[u8]>, Counter>,
    max_keys: usize,
}

/// What a sweep found to ship.
#[derive(Debug, Default)]
pub struct Pending {
    /// The totals that grew since the peer last acknowledged them.
    pub entries: Vec<Entry>,
    /// Units they add over what was acknowledged.
    pub units: u64,
}

impl ConsumptionLog {
    /// A log of at most `max_keys` buckets (beyond it new buckets are not recorded).
    pub fn new(max_keys: usize) -> Self {
        Self {
            counters: DashMap::new(),
            max_keys,
        }
    }

    /// Buckets with a live epoch.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// Records `units` admitted at `now` in `rule`'s bucket for `identity`. False when the log
    /// is full and the bucket is new (the units are then not shipped).
    pub fn record(
        &self,
        rule: &str,
        identity: &[u8],
        limit: &Limit,
        units: u64,
        now: Micros,
    ) -> bool {
        if units == 0 {
            return true;
        }
        let until = epoch_until(limit, now);
        let add = |c: &mut Counter| {
            c.epochs.retain(|e| e.until > now);
            match c.epochs.iter_mut().find(|e| e.until == until) {
                Some(e) => {
                    e.total += units;
                    e.at = e.at.max(now);
                }
                None => c.epochs.push(Epoch {
                    until,
                    total: units,
                    at: now,
                    shipped: 0,
                }),
            }
        };
        self.with_counter(rule, identity, add)
    }

    /// Notes that a request asked `units` of `rule`'s bucket for `identity` (admitted or not):
    /// the demand the regional allowances share by. False when the log is full.
    pub fn ask(&self, rule: &str, identity: &[u8], units: u64) -> bool {
        self.with_counter(rule, identity, |c| c.asked += units)
    }

    /// Runs `change` on the bucket's counter, made if new; false when the log is full and the
    /// bucket is new.
    fn with_counter(&self, rule: &str, identity: &[u8], change: impl FnOnce(&mut Counter)) -> bool {
        let mut change = Some(change);
        let found = LOOKUP.with_borrow_mut(|key| {
            map_key(rule, identity, key);
            match self.counters.get_mut(key.as_slice()) {
                Some(mut c) => {
                    if let Some(f) = change.take() {
                        f(&mut c);
                    }
                    true
                }
                None => false,
            }
        });
        if found {
            return true;
        }
        if self.counters.len() >= self.max_keys {
            return false;
        }
        let mut key = Vec::with_capacity(rule.len() + 1 + identity.len());
        map_key(rule, identity, &mut key);
        let mut counter = self
            .counters
            .entry(key.into_boxed_slice())
            .or_insert_with(|| Counter {
                rule: rule.to_owned(),
                identity: identity.to_vec(),
                asked: 0,
                epochs: Vec::with_capacity(2),
            });
        if let Some(f) = change.take() {
            f(&mut counter);
        }
        true
    }

    /// The demand asked since the last sweep, per bucket (and the sweep starts over).
    pub fn take_demand(&self) -> Vec<crate::messages::DemandItem> {
        let mut out = vec![];
        for mut c in self.counters.iter_mut() {
            if c.asked > 0 {
                out.push(crate::messages::DemandItem {
                    rule: c.rule.clone(),
                    identity: c.identity.clone(),
                    units: std::mem::take(&mut c.asked),
                });
            }
        }
        out
    }

    /// Takes back `units` recorded at `at` that went back to this region's store unspent (a
    /// returned lease), as far as the peer has not been told of them yet: a total never drops
    /// below what was shipped (the peer applies totals as a max, so a lower one would change
    /// nothing there anyway).
    pub fn unrecord(&self, rule: &str, identity: &[u8], limit: &Limit, units: u64, at: Micros) {
        let until = epoch_until(limit, at);
        LOOKUP.with_borrow_mut(|key| {
            map_key(rule, identity, key);
            if let Some(mut c) = self.counters.get_mut(key.as_slice())
                && let Some(e) = c.epochs.iter_mut().find(|e| e.until == until)
            {
                e.total = e.total.saturating_sub(units).max(e.shipped);
            }
        });
    }

    /// The totals to ship: every live epoch whose total grew beyond what was acknowledged.
    /// Buckets whose epochs have all ended are forgotten.
    pub fn pending(&self, now: Micros) -> Pending {
        let mut out = Pending::default();
        self.counters.retain(|_, c| {
            c.epochs.retain(|e| e.until > now);
            for e in &c.epochs {
                if e.total > e.shipped {
                    out.units += e.total - e.shipped;
                    out.entries.push(Entry {
                        rule: c.rule.clone(),
                        identity: c.identity.clone(),
                        until: e.until,
                        total: e.total,
                        at: e.at,
                    });
                }
            }
            !c.epochs.is_empty() || c.asked > 0
        });
        out
    }

    /// Marks `entries` as acknowledged by the peer.
    pub fn acknowledge(&self, entries: &[Entry]) {
        let mut key = Vec::new();
        for entry in entries {
            map_key(&entry.rule, &entry.identity, &mut key);
            if let Some(mut c) = self.counters.get_mut(key.as_slice())
                && let Some(e) = c.epochs.iter_mut().find(|e| e.until == entry.until)
            {
                e.shipped = e.shipped.max(entry.total);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn totals_grow_per_epoch_and_ship_until_acknowledged() {
        let log = ConsumptionLog::new(10);
        let fw = Limit::fixed_window(100, Duration::from_secs(10)).expect("limit");
        let t0 = 1_000_000_000_000;
        assert!(log.record("r", b"k", &fw, 3, t0));
        assert!(log.record("r", b"k", &fw, 2, t0 + 1));
        let first = log.pending(t0 + 2);
        assert_eq!(first.entries.len(), 1);
        assert_eq!((first.entries[0].total, first.units), (5, 5));
        assert_eq!(first.entries[0].until, t0 + 10_000_000);
        // Not acknowledged (the send failed): the next sweep ships the newer total.
        assert!(log.record("r", b"k", &fw, 1, t0 + 3));
        let second = log.pending(t0 + 4);
        assert_eq!((second.entries[0].total, second.units), (6, 6));
        log.acknowledge(&second.entries);
        assert!(log.pending(t0 + 5).entries.is_empty());
        // A new window: a new epoch; the old one is forgotten once it ends.
        assert!(log.record("r", b"k", &fw, 4, t0 + 10_000_000));
        let third = log.pending(t0 + 10_000_001);
        assert_eq!(third.entries.len(), 1);
        assert_eq!(third.entries[0].total, 4);
        log.acknowledge(&third.entries);
        assert!(log.pending(t0 + 20_000_000).entries.is_empty());
        assert!(log.is_empty(), "every epoch ended");
    }

    #[test]
    fn the_log_is_bounded() {
        let log = ConsumptionLog::new(2);
        let tb = Limit::token_bucket(10, 1.0).expect("limit");
        assert!(log.record("r", b"a", &tb, 1, 1));
        assert!(log.record("r", b"b", &tb, 1, 1));
        assert!(!log.record("r", b"c", &tb, 1, 1));
        assert!(
            log.record("r", b"a", &tb, 1, 2),
            "known buckets still record"
        );
    }
}
