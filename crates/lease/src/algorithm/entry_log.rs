//! Sorted-set algorithms: the exact sliding window log and the concurrency slot table.
//!
//! Both keep one member per admission, `<id>:<units>[:<nonce>]`, scored by the admission time
//! (log) or by the slot's expiry (slots). A member carries its unit count so a weighted
//! admission (cost > 1) is one entry, not `cost` entries.
//!
//! Mirrors `redis/scripts/lib.lua` (`log_*`, `slots_*`).

use crate::algorithm::unique_id;
use crate::algorithm::zset::ZSet;
use crate::clock::Micros;

/// The unit count a member carries: the number after its first `:`.
pub(crate) fn member_units(member: &str) -> u64 {
    member
        .split(':')
        .nth(1)
        .and_then(|u| u.parse().ok())
        .unwrap_or(0)
}

/// Live entries (pruned at load) and the units they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryLog {
    pub(crate) entries: ZSet,
    pub(crate) used: u64,
}

impl EntryLog {
    /// Entries scored at or before `cutoff` are gone.
    pub(crate) fn load(mut entries: ZSet, cutoff: Micros) -> Self {
        entries.remove_up_to(cutoff);
        let used = entries.iter().map(|(_, m)| member_units(m)).sum();
        Self { entries, used }
    }

    pub(crate) fn admits(&self, limit: u64, cost: u64) -> bool {
        self.used + cost <= limit
    }

    pub(crate) fn available(&self, limit: u64) -> u64 {
        limit.saturating_sub(self.used)
    }

    /// Adds an entry of `units` scored `score` and returns its member. `tail` follows the units
    /// (`:<nonce>` for slots, empty for log entries).
    ///
    /// The entry's id (`<base>`, else `<base>-1`, `<base>-2`, ...) is unique among the
    /// entries of the same score, whatever their units: a return that shrinks one entry must
    /// never land on another. (Log entries are scored by the time in their id, so their ids are
    /// unique in the whole set.)
    pub(crate) fn add(&mut self, base: Micros, score: Micros, units: u64, tail: &str) -> String {
        let taken: Vec<&str> = self
            .entries
            .iter()
            .filter(|(s, _)| *s == score)
            .map(|(_, m)| m.split(':').next().unwrap_or_default())
            .collect();
        let id = unique_id(base, |id| taken.contains(&id));
        let member = format!("{id}:{units}{tail}");
        self.entries.add(score, member.clone());
        self.used += units;
        member
    }

    /// Adds `units` a log owes for `at` (a settlement's excess, or what a node admitted while
    /// the store stalled): what fits under `limit` is an entry at `at`; what is past it is a
    /// debt, one entry dated a window after `at` for each limit's worth of all that is owed
    /// (this debt and any before it), so it counts until paid off, a limit's worth a window,
    /// as a fixed window's debt does. Without it, an excess counted one window: a client that
    /// settled 30 on a log of 20 got 30 a window.
    pub(crate) fn add_owed(&mut self, at: Micros, units: u64, limit: u64, window_us: u64) {
        let limit = limit.max(1);
        let over = (self.used + units).saturating_sub(limit);
        let debt = over.min(units);
        if units > debt {
            self.add(at, at, units - debt, "");
        }
        if debt > 0 {
            let later = at.saturating_add(over.div_ceil(limit).saturating_mul(window_us));
            self.add(later, later, debt, "");
        }
    }

    /// Removes `member`, returning its score and units if it was live.
    pub(crate) fn remove(&mut self, member: &str) -> Option<(Micros, u64)> {
        let score = self.entries.score(member)?;
        self.entries.remove(member);
        let units = member_units(member);
        self.used -= units;
        Some((score, units))
    }

    /// Microseconds until `cost` fits, if entries leave in score order and each frees its
    /// units at `score + hold_us`.
    pub(crate) fn retry_after(&self, limit: u64, cost: u64, hold_us: u64, now: Micros) -> u64 {
        let mut freed = 0;
        for (score, member) in self.entries.iter() {
            freed += member_units(member);
            if self.used - freed + cost <= limit {
                return (score + hold_us).saturating_sub(now).max(1);
            }
        }
        1
    }

    /// Microseconds until every entry is gone.
    pub(crate) fn reset_after(&self, hold_us: u64, now: Micros) -> u64 {
        self.entries
            .max_score()
            .map_or(0, |s| (s + hold_us).saturating_sub(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_ride_in_the_member() {
        assert_eq!(member_units("1700-2:5"), 5);
        assert_eq!(member_units("1700:3:abcdef"), 3);
        assert_eq!(member_units("garbage"), 0);
    }

    #[test]
    fn retry_after_waits_for_enough_entries_to_age_out() {
        let w = 10_000_000;
        let mut log = EntryLog::load(ZSet::default(), 0);
        log.add(1_000, 1_000, 2, "");
        log.add(2_000, 2_000, 1, "");
        log.add(3_000, 3_000, 2, "");
        assert_eq!(log.used, 5);
        // Limit 5, cost 3: the first two entries (3 units) must leave: at 2_000 + w.
        assert_eq!(log.retry_after(5, 3, w, 4_000), 2_000 + w - 4_000);
        let later = EntryLog::load(log.entries.clone(), 2_000 + w - w);
        assert_eq!(later.used, 2);
    }

    #[test]
    fn ids_are_unique_whatever_the_units() {
        let mut log = EntryLog::load(ZSet::default(), 0);
        let a = log.add(7, 7, 2, "");
        let b = log.add(7, 7, 1, "");
        assert_eq!((a.as_str(), b.as_str()), ("7:2", "7-1:1"));
    }

    #[test]
    fn same_microsecond_entries_get_distinct_members() {
        let mut log = EntryLog::load(ZSet::default(), 0);
        let a = log.add(7, 7, 1, "");
        let b = log.add(7, 7, 1, "");
        assert_ne!(a, b);
        assert_eq!(log.used, 2);
        assert_eq!(log.remove(&a), Some((7, 1)));
        assert_eq!(log.remove(&a), None);
        assert_eq!(log.used, 1);
    }

    #[test]
    fn a_debt_is_dated_a_window_on_for_each_limits_worth_owed() {
        let w = 1_000_000;
        let mut log = EntryLog::load(ZSet::default(), 0);
        log.add(10, 10, 4, "");
        // Limit 10: 6 fit at 500, 19 are owed: dated two windows on (all owed is 19).
        log.add_owed(500, 25, 10, w);
        assert_eq!(log.used, 29);
        let scores: Vec<_> = log.entries.iter().map(|(s, _)| s).collect();
        assert_eq!(scores, vec![10, 500, 500 + 2 * w]);
        // Another 5 owed stack after: 24 owed in all, three windows on.
        log.add_owed(600, 5, 10, w);
        assert_eq!(log.entries.max_score(), Some(600 + 3 * w));
        // One unit fits when all but the last debt have left.
        assert_eq!(log.retry_after(10, 1, w, 700), 500 + 3 * w - 700);
        assert_eq!(log.reset_after(w, 700), 600 + 4 * w - 700);
    }
}
