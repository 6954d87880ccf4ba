//! What a lease is in the in-memory store: how many units one grant takes, how long it lives,
//! what its id says, and how its unspent units go back to the bucket.

use super::bucket::{Bucket, Keys, Value};
use crate::algorithm::entry_log::member_units;
use crate::algorithm::ttl_ms;
use crate::algorithm::zset::ZSet;
use crate::clock::Micros;
use crate::limit::{Kind, Limit};

/// Added to a lease's algorithm code when the lease was also taken from an allowance.
pub(super) const ALLOWANCE_CODE: u8 = 10;

/// How many units one grant takes: at most `want`, at most `max_share` of what is available
/// (but never less than `min`), and nothing unless `min` units are available.
pub(crate) fn grant_size(available: u64, want: u64, min: u64, max_share: f64) -> u64 {
    if available < min {
        return 0;
    }
    let share = (available as f64 * max_share).floor() as u64;
    want.min(share.max(min))
}

/// How long a lease lives, and the window it belongs to (0 for token buckets; the entry's
/// time for the log). A lease never outlives its window.
pub(super) fn lease_validity(
    limit: &Limit,
    bucket: &Bucket,
    now: Micros,
    ttl_us: u64,
) -> (u64, Micros) {
    match (bucket, limit.kind()) {
        (Bucket::FixedWindow(b), Kind::FixedWindow { window_us, .. }) => {
            (ttl_us.min(b.until_end(window_us, now)), b.ws)
        }
        (Bucket::SlidingWindow(b), Kind::SlidingWindow { window_us, .. }) => {
            (ttl_us.min((b.ws + window_us).saturating_sub(now)), b.ws)
        }
        (Bucket::Log(_), Kind::SlidingWindowLog { window_us, .. }) => (ttl_us.min(window_us), now),
        _ => (ttl_us, 0),
    }
}

pub(super) fn store_leases(keys: &mut Keys, lease_key: &str, leases: ZSet, now: Micros) {
    match leases.max_score() {
        None => {
            keys.remove(lease_key);
        }
        Some(last) => {
            let expires_at = now + ttl_ms(last.saturating_sub(now)) * 1000;
            keys.put(lease_key, Value::Sorted(leases), expires_at);
        }
    }
}

/// Gives `credit` units back to a counting bucket (the window's only if the lease was taken
/// in it); returns what was credited.
pub(super) fn credit_bucket(b: &mut Bucket, limit: &Limit, credit: u64, ws: Micros) -> u64 {
    match b {
        Bucket::TokenBucket(tb) => {
            tb.credit(credit, limit.capacity());
            credit
        }
        Bucket::Gcra(g) => {
            g.credit(credit, limit.refill_per_second().unwrap_or(1.0));
            credit
        }
        Bucket::LeakyBucket(lb) => {
            lb.credit(credit);
            credit
        }
        Bucket::FixedWindow(fw) if fw.ws == ws => {
            let c = credit.min(fw.count);
            fw.count -= c;
            c
        }
        Bucket::SlidingWindow(sw) if sw.ws == ws => {
            let c = credit.min(sw.cur);
            sw.cur -= c;
            c
        }
        _ => 0,
    }
}

/// Gives `credit` back as [`credit_bucket`] does; returns what the bucket kept of it, in whole
/// units (lib.lua `credit_kept`): into a token bucket already full (a GCRA key at now, a leaky
/// bucket empty), none.
pub(super) fn credit_kept(b: &mut Bucket, limit: &Limit, credit: u64, ws: Micros) -> u64 {
    let level = |b: &Bucket| match b {
        Bucket::TokenBucket(tb) => Some(tb.tokens),
        Bucket::Gcra(g) => Some(
            -g.ahead
                / crate::algorithm::gcra::interval_us(limit.refill_per_second().unwrap_or(1.0)),
        ),
        Bucket::LeakyBucket(lb) => Some(-lb.level),
        _ => None,
    };
    let before = level(b);
    let credited = credit_bucket(b, limit, credit, ws);
    match (before, level(b)) {
        (Some(before), Some(after)) => {
            // Whole units, to the nearest: a bucket that refilled a hair meanwhile still
            // says it kept the unit it was given.
            let kept = (after - before).round().max(0.0) as u64;
            kept.min(credit)
        }
        _ => credited,
    }
}

/// The fields of a lease id: `<id>:<units>:<ws>:<algorithm>:<nonce>`.
pub(super) struct ParsedLease<'a> {
    pub(super) id: &'a str,
    pub(super) entry: String,
    pub(super) units: u64,
    pub(super) ws: Micros,
    pub(super) algorithm: u8,
}

impl<'a> ParsedLease<'a> {
    pub(super) fn parse(text: &'a str) -> Option<Self> {
        let mut parts = text.split(':');
        let id = parts.next()?;
        let units_text = parts.next()?;
        let ws = parts.next()?.parse().ok()?;
        let algorithm = parts.next()?.parse().ok()?;
        parts.next()?;
        let entry = format!("{id}:{units_text}");
        Some(Self {
            id,
            units: member_units(&entry),
            entry,
            ws,
            algorithm,
        })
    }
}
