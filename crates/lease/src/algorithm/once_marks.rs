//! Debit-once records: per bucket, the largest running total applied for each origin's epoch,
//! kept in a hash (`<key>:remote`) beside the bucket. Mirrored in `redis/scripts/debit.lua`.
//!
//! A field is `<origin>|<until>`; its value the total applied. A new total debits only what
//! exceeds the recorded one, so applying totals is a `max`: duplicates and reorderings change
//! nothing. Fields whose epoch has ended are pruned whenever a new field is written, and the
//! hash expires with its last epoch.

use std::collections::HashMap;

use crate::clock::Micros;

/// The field of one origin's epoch.
pub(crate) fn field(origin: &str, until: Micros) -> String {
    format!("{origin}|{until}")
}

/// The epoch end a field names.
fn until_of(field: &str) -> Option<Micros> {
    field.rsplit_once('|').and_then(|(_, u)| u.parse().ok())
}

/// What one debit-once does to the records: the units to debit now (0 when the total is not
/// above what was applied, or the epoch has ended).
pub(crate) fn apply(
    marks: &mut HashMap<String, u64>,
    origin: &str,
    until: Micros,
    total: u64,
    now: Micros,
) -> u64 {
    if until <= now {
        return 0;
    }
    let field = field(origin, until);
    let seen = marks.get(&field).copied();
    let excess = total.saturating_sub(seen.unwrap_or(0));
    if excess == 0 {
        return 0;
    }
    if seen.is_none() {
        marks.retain(|f, _| until_of(f).is_some_and(|u| u > now));
    }
    marks.insert(field, total);
    excess
}

/// When the records may be forgotten: the latest epoch end among them.
pub(crate) fn last_until(marks: &HashMap<String, u64>) -> Micros {
    marks.keys().filter_map(|f| until_of(f)).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_apply_as_a_max_and_ended_epochs_are_pruned() {
        let mut marks = HashMap::new();
        assert_eq!(apply(&mut marks, "us/1", 100, 5, 10), 5);
        assert_eq!(apply(&mut marks, "us/1", 100, 5, 11), 0, "a duplicate");
        assert_eq!(apply(&mut marks, "us/1", 100, 3, 12), 0, "an older total");
        assert_eq!(apply(&mut marks, "us/1", 100, 9, 13), 4, "only the excess");
        assert_eq!(apply(&mut marks, "us/2", 100, 2, 14), 2, "another origin");
        assert_eq!(
            apply(&mut marks, "us/1", 100, 20, 100),
            0,
            "the epoch has ended"
        );
        assert_eq!(apply(&mut marks, "us/1", 200, 1, 150), 1);
        assert_eq!(marks.len(), 1, "ended epochs pruned: {marks:?}");
        assert_eq!(last_until(&marks), 200);
    }
}
