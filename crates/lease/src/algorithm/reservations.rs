//! The reservation records of one bucket: nonce → record, and when each record may go.
//!
//! Mirrors `redis/scripts/lib.lua` (`record_reservation`, `prune_reservations`,
//! `keep_reservations`): a hash of records and a sorted set of their ends.

use std::collections::{BTreeSet, HashMap};

use crate::clock::Micros;

/// How long a record is kept after its reservation's TTL (lib.lua `SETTLED_KEPT_US`;
/// [`crate::ops::reservation::SETTLED_KEPT`]).
pub(crate) const SETTLED_KEPT_US: u64 = 600_000_000;

/// The most records one call forgets (lib.lua `PRUNE_AT_ONCE`).
const PRUNE_AT_ONCE: usize = 1000;

/// One reservation's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// Not settled yet.
    Open {
        /// The estimate consumed.
        units: u64,
        /// When it was reserved.
        at: Micros,
        /// The algorithm code of the bucket it was taken from.
        alg: u8,
        /// When it stops being live.
        expires: Micros,
        /// The sliding log's entry id it made ("" for other algorithms).
        entry: String,
    },
    /// Settled.
    Settled,
}

/// A bucket's records.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reservations {
    records: HashMap<String, (Record, Micros)>,
    ends: BTreeSet<(Micros, String)>,
}

impl Reservations {
    /// Forgets records whose end is at or before `now` (at most [`PRUNE_AT_ONCE`]).
    pub(crate) fn prune(&mut self, now: Micros) {
        let gone: Vec<(Micros, String)> = self
            .ends
            .iter()
            .take_while(|(end, _)| *end <= now)
            .take(PRUNE_AT_ONCE)
            .cloned()
            .collect();
        for entry in gone {
            self.records.remove(&entry.1);
            self.ends.remove(&entry);
        }
    }

    /// Records an open reservation of `units` under `nonce` (replacing any record of it).
    pub(crate) fn record(
        &mut self,
        nonce: &str,
        units: u64,
        alg: u8,
        ttl_us: u64,
        entry: String,
        now: Micros,
    ) {
        self.prune(now);
        let expires = now + ttl_us;
        let end = expires + SETTLED_KEPT_US;
        if let Some((_, old_end)) = self.records.get(nonce) {
            self.ends.remove(&(*old_end, nonce.to_owned()));
        }
        let record = Record::Open {
            units,
            at: now,
            alg,
            expires,
            entry,
        };
        self.records.insert(nonce.to_owned(), (record, end));
        self.ends.insert((end, nonce.to_owned()));
    }

    pub(crate) fn get(&self, nonce: &str) -> Option<&Record> {
        self.records.get(nonce).map(|(r, _)| r)
    }

    /// Marks `nonce` settled, keeping its end.
    pub(crate) fn settle(&mut self, nonce: &str) {
        if let Some((record, _)) = self.records.get_mut(nonce) {
            *record = Record::Settled;
        }
    }

    /// The latest end of any record: the key lives until then.
    pub(crate) fn last_end(&self) -> Option<Micros> {
        self.ends.iter().next_back().map(|(end, _)| *end)
    }

    /// About how many bytes the records hold.
    pub(crate) fn bytes(&self) -> usize {
        self.records.keys().map(|k| 2 * k.len() + 96).sum()
    }
}
