//! A small sorted set with Redis ZSET ordering (by score, then by member bytes), so the
//! in-memory store walks entries in the same order as the scripts do.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::clock::Micros;

/// Members ordered by (score, member) for range operations, and indexed by member for
/// lookups: every operation is O(log n) or better, as in Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ZSet {
    ordered: BTreeSet<(Micros, Arc<str>)>,
    scores: HashMap<Arc<str>, Micros>,
    /// The members' bytes, all together (what the set holds is bounded by the store).
    member_bytes: usize,
}

/// What one member costs beyond its own bytes: its shared string's header, a tree entry and a
/// map entry (an estimate).
const MEMBER_OVERHEAD: usize = 80;

impl ZSet {
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Micros, &str)> {
        self.ordered.iter().map(|(s, m)| (*s, &**m))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }

    /// `ZCARD key`.
    pub(crate) fn len(&self) -> usize {
        self.ordered.len()
    }

    pub(crate) fn score(&self, member: &str) -> Option<Micros> {
        self.scores.get(member).copied()
    }

    /// About how many bytes the set holds.
    pub(crate) fn bytes(&self) -> usize {
        self.member_bytes + self.len() * MEMBER_OVERHEAD
    }

    pub(crate) fn max_score(&self) -> Option<Micros> {
        self.ordered.last().map(|(s, _)| *s)
    }

    /// `ZADD key score member` (replacing the member's score if present).
    pub(crate) fn add(&mut self, score: Micros, member: String) {
        self.remove(&member);
        let member: Arc<str> = member.into();
        self.member_bytes += member.len();
        self.scores.insert(member.clone(), score);
        self.ordered.insert((score, member));
    }

    /// `ZREM key member`: whether it was there.
    pub(crate) fn remove(&mut self, member: &str) -> bool {
        match self.scores.remove_entry(member) {
            Some((m, score)) => {
                self.member_bytes -= m.len();
                self.ordered.remove(&(score, m));
                true
            }
            None => false,
        }
    }

    /// `ZREMRANGEBYSCORE key -inf max`.
    pub(crate) fn remove_up_to(&mut self, max: Micros) {
        while let Some((score, _)) = self.ordered.first() {
            if *score > max {
                break;
            }
            if let Some((_, member)) = self.ordered.pop_first() {
                self.member_bytes -= member.len();
                self.scores.remove(&member);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_score_then_member_like_redis() {
        let mut z = ZSet::default();
        z.add(5, "b".into());
        z.add(5, "a".into());
        z.add(1, "z".into());
        z.add(9, "a".into()); // moves "a"
        assert_eq!(z.bytes(), 3 + 3 * MEMBER_OVERHEAD);
        let order: Vec<_> = z.iter().collect();
        assert_eq!(order, vec![(1, "z"), (5, "b"), (9, "a")]);
        z.remove_up_to(5);
        assert_eq!(z.iter().collect::<Vec<_>>(), vec![(9, "a")]);
        assert!(!z.remove("b"));
        assert!(z.remove("a"));
        assert!(z.is_empty());
        assert_eq!(z.bytes(), 0);
    }
}
