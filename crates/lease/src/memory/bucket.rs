//! One bucket of the in-memory store, loaded at `now`: the same steps the Lua scripts take,
//! on the pure state of [`crate::algorithm`].

use std::collections::HashMap;

use crate::algorithm::entry_log::EntryLog;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::leaky_bucket::LeakyBucket;
use crate::algorithm::sliding_window::SlidingWindow;
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::ttl_ms;
use crate::algorithm::zset::ZSet;
use crate::clock::Micros;
use crate::limit::{Kind, Limit};

/// What a key holds, as Redis would: a hash for the counters, a sorted set for the rest.
#[derive(Debug, Clone)]
pub(crate) enum Value {
    TokenBucket(TokenBucket),
    Gcra(Gcra),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    SlidingWindow(SlidingWindow),
    Sorted(ZSet),
    /// Debit-once records (a hash of running totals).
    Marks(HashMap<String, u64>),
    /// Demand reports of a bucket with regional allowances.
    Demand(crate::ops::allowance::Demand),
    /// An identity's denials counted towards a penalty, or its block.
    Penalty(crate::algorithm::penalty_box::PenaltyRecord),
    /// The lift epoch of a bucket's penalty records.
    Epoch(u64),
    /// A bucket's reservations awaiting their settlement.
    Reservations(crate::algorithm::reservations::Reservations),
}

/// What one key costs beyond its name and its value's contents: the map's entry, the name's
/// and the value's headers (an estimate, as Redis's own accounting is).
pub(crate) const ENTRY_OVERHEAD: usize = 96;

impl Value {
    /// About how many bytes the value holds.
    fn bytes(&self) -> usize {
        let contents = match self {
            Value::TokenBucket(_)
            | Value::Gcra(_)
            | Value::LeakyBucket(_)
            | Value::FixedWindow(_)
            | Value::SlidingWindow(_)
            | Value::Penalty(_)
            | Value::Epoch(_) => 0,
            Value::Sorted(z) => z.bytes(),
            Value::Marks(m) => m.keys().map(|k| k.len() + 48).sum(),
            Value::Reservations(r) => r.bytes(),
            Value::Demand(d) => d
                .reports
                .iter()
                .map(|(k, (region, _, _))| k.len() + region.len() + 80)
                .sum(),
        };
        std::mem::size_of::<Value>() + contents
    }
}

/// A key's value and when it expires.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) value: Value,
    pub(crate) expires_at: Micros,
    /// What it was counted as, name included (see [`Keys::bytes`]).
    bytes: usize,
}

/// The keys of one shard. Expired keys read as absent, as in Redis. The bytes they hold are
/// counted as they change, so a shard knows when it is full without looking.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    map: HashMap<String, Stored>,
    bytes: usize,
}

/// The bucket a stored key belongs to: `rl:{tag}:rule` of `rl:{tag}:rule[:suffix]`.
pub(crate) fn bucket_of(key: &str) -> &str {
    let Some(at) = key.find("}:") else {
        return key;
    };
    let rule = rule_of(key);
    &key[..at + 2 + rule.len()]
}

/// The rule a key belongs to: `rl:{tag}:<rule>[:<suffix>]` (tags and rules are escaped, so
/// neither holds `}` or `:`); "" for anything else.
pub(crate) fn rule_of(key: &str) -> &str {
    key.find("}:")
        .map(|at| &key[at + 2..])
        .map_or("", |rest| rest.split(':').next().unwrap_or(""))
}

impl Keys {
    pub(crate) fn get(&self, key: &str, now: Micros) -> Option<&Value> {
        self.map
            .get(key)
            .filter(|s| s.expires_at > now)
            .map(|s| &s.value)
    }

    /// Keys held, expired or not.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// About how many bytes the keys hold (names, values and the map's entries).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets every key.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }

    pub(crate) fn put(&mut self, key: &str, value: Value, expires_at: Micros) {
        let bytes = ENTRY_OVERHEAD + key.len() + value.bytes();
        self.bytes += bytes;
        match self.map.get_mut(key) {
            Some(stored) => {
                self.bytes -= stored.bytes;
                *stored = Stored {
                    value,
                    expires_at,
                    bytes,
                };
            }
            None => {
                self.map.insert(
                    key.to_owned(),
                    Stored {
                        value,
                        expires_at,
                        bytes,
                    },
                );
            }
        }
    }

    /// `DEL key`.
    pub(crate) fn remove(&mut self, key: &str) {
        if let Some(stored) = self.map.remove(key) {
            self.bytes -= stored.bytes;
        }
    }

    /// Takes a sorted set out of its key (leaving it empty in place, with its expiry), so it
    /// can be changed without a copy. Every caller then writes it back with
    /// [`Keys::restore_sorted`] or replaces the key.
    pub(crate) fn take_sorted(&mut self, key: &str, now: Micros) -> ZSet {
        match self.map.get_mut(key) {
            Some(Stored {
                value: Value::Sorted(z),
                expires_at,
                ..
            }) if *expires_at > now => std::mem::take(z),
            _ => ZSet::default(),
        }
    }

    /// Takes a bucket's reservation records out of their key (leaving them empty in place), so
    /// they can be changed without a copy; [`Keys::keep_reservations`] puts them back.
    pub(crate) fn take_reservations(
        &mut self,
        key: &str,
        now: Micros,
    ) -> crate::algorithm::reservations::Reservations {
        match self.map.get_mut(key) {
            Some(Stored {
                value: Value::Reservations(r),
                expires_at,
                ..
            }) if *expires_at > now => std::mem::take(r),
            _ => Default::default(),
        }
    }

    /// Puts reservation records back, to live until their last end (as `keep_reservations`
    /// in lib.lua); none left deletes the key.
    pub(crate) fn keep_reservations(
        &mut self,
        key: &str,
        records: crate::algorithm::reservations::Reservations,
        now: Micros,
    ) {
        match records.last_end() {
            None => self.remove(key),
            Some(last) => {
                let expires_at = now + ttl_ms(last.saturating_sub(now)) * 1000;
                self.put(key, Value::Reservations(records), expires_at);
            }
        }
    }

    /// Puts a taken sorted set back, keeping the key's expiry; an emptied set deletes the key
    /// (as Redis deletes empty sorted sets).
    pub(crate) fn restore_sorted(&mut self, key: &str, set: ZSet) {
        if set.is_empty() {
            if matches!(self.map.get(key), Some(Stored { value: Value::Sorted(z), .. }) if z.is_empty())
            {
                self.remove(key);
            }
        } else if let Some(stored) = self.map.get_mut(key) {
            let bytes = ENTRY_OVERHEAD + key.len() + std::mem::size_of::<Value>() + set.bytes();
            self.bytes = self.bytes - stored.bytes + bytes;
            stored.bytes = bytes;
            stored.value = Value::Sorted(set);
        }
    }

    pub(crate) fn purge_expired(&mut self, now: Micros) {
        let mut freed = 0;
        self.map.retain(|_, s| {
            let keep = s.expires_at > now;
            if !keep {
                freed += s.bytes;
            }
            keep
        });
        self.bytes -= freed;
    }

    /// Evicts live keys until at most `target` bytes are held: from the rule holding the most
    /// bytes, the keys that expire soonest first (a token bucket closest to full again, a
    /// window closest to its end: the least state lost), then from the next rule if that was
    /// not enough. Keys starting with `spare` (the identity the caller is about to use) are
    /// never evicted. Returns the keys that went.
    pub(crate) fn evict_to(&mut self, target: usize, spare: &str) -> Vec<String> {
        let mut evicted = vec![];
        while self.bytes > target {
            let mut by_rule: HashMap<&str, usize> = HashMap::new();
            for (key, stored) in &self.map {
                if !key.starts_with(spare) {
                    *by_rule.entry(rule_of(key)).or_default() += stored.bytes;
                }
            }
            // Ties go to the greatest rule name, so the choice does not hang on map order.
            let Some((rule, _)) = by_rule
                .into_iter()
                .max_by_key(|&(rule, bytes)| (bytes, rule))
            else {
                break;
            };
            let rule = rule.to_owned();
            let mut victims: Vec<(Micros, String)> = self
                .map
                .iter()
                .filter(|(key, _)| !key.starts_with(spare) && rule_of(key) == rule)
                .map(|(key, stored)| (stored.expires_at, key.clone()))
                .collect();
            victims.sort_unstable();
            for (_, key) in victims {
                if self.bytes <= target {
                    break;
                }
                self.remove(&key);
                evicted.push(key);
            }
        }
        evicted
    }
}

/// A bucket's state at `now`.
#[derive(Debug, Clone)]
pub(crate) enum Bucket {
    TokenBucket(TokenBucket),
    Gcra(Gcra),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    SlidingWindow(SlidingWindow),
    Log(EntryLog),
    Slots(EntryLog),
}

impl Bucket {
    /// Loads the bucket stored at `key` (as given by [`state_key`]). State written by another
    /// algorithm (the rule changed) reads as no state.
    pub(crate) fn load(keys: &mut Keys, key: &str, limit: &Limit, now: Micros) -> Self {
        let stored = keys.get(key, now);
        match limit.kind() {
            Kind::TokenBucket {
                capacity,
                refill_per_second,
            } => {
                let s = match stored {
                    Some(Value::TokenBucket(s)) => Some(*s),
                    _ => None,
                };
                Bucket::TokenBucket(TokenBucket::load(s, capacity, refill_per_second, now))
            }
            Kind::Gcra { .. } => {
                let s = match stored {
                    Some(Value::Gcra(s)) => Some(*s),
                    _ => None,
                };
                Bucket::Gcra(Gcra::load(s, now))
            }
            Kind::LeakyBucket {
                leak_per_second, ..
            } => {
                let s = match stored {
                    Some(Value::LeakyBucket(s)) => Some(*s),
                    _ => None,
                };
                Bucket::LeakyBucket(LeakyBucket::load(s, leak_per_second, now))
            }
            Kind::FixedWindow { limit, window_us } => {
                let s = match stored {
                    Some(Value::FixedWindow(s)) => Some(*s),
                    _ => None,
                };
                Bucket::FixedWindow(FixedWindow::load(s, limit, window_us, now))
            }
            Kind::SlidingWindow { limit, window_us } => {
                let s = match stored {
                    Some(Value::SlidingWindow(s)) => Some(*s),
                    _ => None,
                };
                Bucket::SlidingWindow(SlidingWindow::load(s, limit, window_us, now))
            }
            Kind::SlidingWindowLog { window_us, .. } => Bucket::Log(EntryLog::load(
                keys.take_sorted(key, now),
                now.saturating_sub(window_us),
            )),
            Kind::Concurrency { .. } => {
                Bucket::Slots(EntryLog::load(keys.take_sorted(key, now), now))
            }
        }
    }

    pub(crate) fn admits(&self, limit: &Limit, now: Micros, cost: u64) -> bool {
        match (self, limit.kind()) {
            (Bucket::TokenBucket(b), _) => b.admits(cost),
            (
                Bucket::Gcra(b),
                Kind::Gcra {
                    burst,
                    rate_per_second,
                },
            ) => b.admits(burst, rate_per_second, cost),
            (Bucket::LeakyBucket(b), _) => b.admits(limit.capacity(), cost),
            (Bucket::FixedWindow(b), _) => b.admits(limit.capacity(), cost),
            (Bucket::SlidingWindow(b), Kind::SlidingWindow { limit, window_us }) => {
                b.admits(limit, window_us, now, cost)
            }
            (Bucket::Log(b) | Bucket::Slots(b), _) => b.admits(limit.capacity(), cost),
            _ => false,
        }
    }

    /// Whole units available now.
    pub(crate) fn available(&self, limit: &Limit, now: Micros) -> u64 {
        match (self, limit.kind()) {
            (Bucket::TokenBucket(b), _) => b.available(),
            (
                Bucket::Gcra(b),
                Kind::Gcra {
                    burst,
                    rate_per_second,
                },
            ) => b.available(burst, rate_per_second),
            (Bucket::LeakyBucket(b), _) => b.available(limit.capacity()),
            (Bucket::FixedWindow(b), _) => b.available(limit.capacity()),
            (Bucket::SlidingWindow(b), Kind::SlidingWindow { limit, window_us }) => {
                b.available(limit, window_us, now)
            }
            (Bucket::Log(b) | Bucket::Slots(b), _) => b.available(limit.capacity()),
            _ => 0,
        }
    }

    /// Consumes `units`; returns the new entry's member for the log and for slots.
    pub(crate) fn consume(
        &mut self,
        limit: &Limit,
        now: Micros,
        units: u64,
        nonce: &str,
    ) -> Option<String> {
        match (self, limit.kind()) {
            (Bucket::TokenBucket(b), _) => b.take(units),
            (
                Bucket::Gcra(b),
                Kind::Gcra {
                    rate_per_second, ..
                },
            ) => b.take(units, rate_per_second),
            (Bucket::Gcra(_), _) => {}
            (Bucket::LeakyBucket(b), _) => b.fill(units),
            (Bucket::FixedWindow(b), _) => b.count += units,
            (Bucket::SlidingWindow(b), _) => b.cur += units,
            (Bucket::Log(b), _) => return Some(b.add(now, now, units, "")),
            (Bucket::Slots(b), Kind::Concurrency { slot_ttl_us, .. }) => {
                return Some(b.add(now, now + slot_ttl_us, units, &format!(":{nonce}")));
            }
            (Bucket::Slots(_), _) => {}
        }
        None
    }

    pub(crate) fn retry_after(&self, limit: &Limit, now: Micros, cost: u64) -> u64 {
        match (self, limit.kind()) {
            (
                Bucket::TokenBucket(b),
                Kind::TokenBucket {
                    refill_per_second, ..
                },
            ) => b.retry_after(cost, refill_per_second),
            (
                Bucket::Gcra(b),
                Kind::Gcra {
                    burst,
                    rate_per_second,
                },
            ) => b.retry_after(burst, rate_per_second, cost),
            (
                Bucket::LeakyBucket(b),
                Kind::LeakyBucket {
                    burst,
                    leak_per_second,
                    ..
                },
            ) => b.retry_after(burst, leak_per_second, cost),
            (Bucket::FixedWindow(b), Kind::FixedWindow { limit, window_us }) => {
                b.retry_after(limit, window_us, now, cost)
            }
            (Bucket::SlidingWindow(b), Kind::SlidingWindow { limit, window_us }) => {
                b.retry_after(limit, window_us, now, cost)
            }
            (Bucket::Log(b), Kind::SlidingWindowLog { limit, window_us }) => {
                b.retry_after(limit, cost, window_us, now)
            }
            (Bucket::Slots(b), Kind::Concurrency { max_in_flight, .. }) => {
                b.retry_after(max_in_flight, cost, 0, now)
            }
            _ => 0,
        }
    }

    pub(crate) fn reset_after(&self, limit: &Limit, now: Micros) -> u64 {
        match (self, limit.kind()) {
            (
                Bucket::TokenBucket(b),
                Kind::TokenBucket {
                    capacity,
                    refill_per_second,
                },
            ) => b.reset_after(capacity, refill_per_second),
            (Bucket::Gcra(b), _) => b.reset_after(),
            (
                Bucket::LeakyBucket(b),
                Kind::LeakyBucket {
                    leak_per_second, ..
                },
            ) => b.reset_after(leak_per_second),
            (Bucket::FixedWindow(b), Kind::FixedWindow { limit, window_us }) => {
                b.reset_after(limit, window_us, now)
            }
            (Bucket::SlidingWindow(b), Kind::SlidingWindow { limit, window_us }) => {
                b.reset_after(limit, window_us, now)
            }
            (Bucket::Log(b), Kind::SlidingWindowLog { window_us, .. }) => {
                b.reset_after(window_us, now)
            }
            (Bucket::Slots(b), _) => b.reset_after(0, now),
            _ => 0,
        }
    }

    /// Writes the bucket back with the expiry the scripts give it.
    pub(crate) fn store(self, keys: &mut Keys, key: &str, limit: &Limit, now: Micros) {
        let neutral_in = self.neutral_in(limit, now);
        let value = match self {
            Bucket::TokenBucket(b) => Value::TokenBucket(b),
            Bucket::Gcra(b) => Value::Gcra(b),
            Bucket::LeakyBucket(b) => Value::LeakyBucket(b),
            Bucket::FixedWindow(b) => Value::FixedWindow(b),
            Bucket::SlidingWindow(b) => Value::SlidingWindow(b),
            Bucket::Log(b) | Bucket::Slots(b) => {
                if b.entries.is_empty() {
                    keys.remove(key);
                    return;
                }
                Value::Sorted(b.entries)
            }
        };
        keys.put(key, value, now + ttl_ms(neutral_in) * 1000);
    }

    /// Writes back a bucket that was read but not changed (only sorted sets were taken).
    pub(crate) fn restore(self, keys: &mut Keys, key: &str) {
        if let Bucket::Log(b) | Bucket::Slots(b) = self {
            keys.restore_sorted(key, b.entries);
        }
    }

    /// Microseconds until the state is indistinguishable from no state.
    fn neutral_in(&self, limit: &Limit, now: Micros) -> u64 {
        match (self, limit.kind()) {
            (Bucket::FixedWindow(b), Kind::FixedWindow { limit, window_us }) => {
                b.neutral_in(limit, window_us, now)
            }
            (Bucket::SlidingWindow(b), Kind::SlidingWindow { limit, window_us }) => {
                b.neutral_in(limit, window_us, now)
            }
            _ => self.reset_after(limit, now),
        }
    }
}
