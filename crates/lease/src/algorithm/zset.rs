//! A small sorted set with Redis ZSET ordering (by score, then by member bytes), so the
//! in-memory store walks entries in the same order as the scripts do.

use crate::clock::Micros;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ZSet {
    entries: Vec<(Micros, String)>,
}

impl ZSet {
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Micros, &str)> {
        self.entries.iter().map(|(s, m)| (*s, m.as_str()))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn score(&self, member: &str) -> Option<Micros> {
        self.entries
            .iter()
            .find(|(_, m)| m == member)
            .map(|(s, _)| *s)
    }

    pub(crate) fn max_score(&self) -> Option<Micros> {
        self.entries.last().map(|(s, _)| *s)
    }

    /// `ZADD key score member` (replacing the member's score if present).
    pub(crate) fn add(&mut self, score: Micros, member: String) {
        self.remove(&member);
        let at = self
            .entries
            .partition_point(|(s, m)| (*s, m.as_str()) < (score, member.as_str()));
        self.entries.insert(at, (score, member));
    }

    /// `ZREM key member`: whether it was there.
    pub(crate) fn remove(&mut self, member: &str) -> bool {
        match self.entries.iter().position(|(_, m)| m == member) {
            Some(i) => {
                self.entries.remove(i);
                true
            }
            None => false,
        }
    }

    /// `ZREMRANGEBYSCORE key -inf max`.
    pub(crate) fn remove_up_to(&mut self, max: Micros) {
        let end = self.entries.partition_point(|(s, _)| *s <= max);
        self.entries.drain(..end);
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
        let order: Vec<_> = z.iter().collect();
        assert_eq!(order, vec![(1, "z"), (5, "b"), (9, "a")]);
        z.remove_up_to(5);
        assert_eq!(z.iter().collect::<Vec<_>>(), vec![(9, "a")]);
        assert!(!z.remove("b"));
        assert!(z.remove("a"));
        assert!(z.is_empty());
    }
}
