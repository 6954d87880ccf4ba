//! The penalty record of one identity under one rule: denials counted in a window, or a block.
//!
//! Mirrors `redis/scripts/note_denials.lua`, and `blocked_for`, `lift_epoch` and `next_epoch`
//! in `lib.lua`.

use crate::algorithm::ttl_ms;
use crate::clock::Micros;
use crate::ops::penalty::PenaltyState;
use std::time::Duration;

/// What `<key>:penalty` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PenaltyRecord {
    /// `n` denials counted in the window that opened at `ws`.
    Counting { ws: Micros, n: u64 },
    /// Blocked until `until`.
    Blocked { until: Micros },
}

/// The penalty's parameters, in microseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PenaltyParams {
    pub(crate) after: u64,
    pub(crate) within_us: u64,
    pub(crate) block_us: u64,
}

/// How long a lift epoch is kept (`EPOCH_TTL_MS` in `lib.lua`): far longer than any flush of
/// denials can be on its way.
pub(crate) const EPOCH_TTL: Duration = Duration::from_secs(86_400);

/// The lift epoch after `current`, started at `now`: the store's time, or one past `current`
/// if the clock stepped back, so that an epoch never comes back.
pub(crate) fn next_epoch(current: u64, now: Micros) -> u64 {
    (current + 1).max(now)
}

/// Microseconds left of a block (0: not blocked).
pub(crate) fn blocked_for(record: Option<&PenaltyRecord>, now: Micros) -> u64 {
    match record {
        Some(PenaltyRecord::Blocked { until }) => until.saturating_sub(now),
        _ => 0,
    }
}

/// What a call to `note_denials` writes: the new record and its TTL in ms.
pub(crate) type Write = Option<(PenaltyRecord, u64)>;

/// Denials to add to a penalty record, and the lift epochs they meet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adding {
    /// Denials to add (0: a read).
    pub(crate) denials: u64,
    /// The lift epoch they were handed out under (None: counted whatever the store's is).
    pub(crate) under: Option<u64>,
    /// The store's lift epoch.
    pub(crate) epoch: u64,
}

/// Adds denials to `record` at `now`: the identity's standing after, and what to write.
pub(crate) fn note(
    record: Option<PenaltyRecord>,
    adding: Adding,
    p: PenaltyParams,
    now: Micros,
) -> (PenaltyState, Write) {
    let us = Duration::from_micros;
    let epoch = adding.epoch;
    let (mut ws, mut n) = match record {
        Some(PenaltyRecord::Blocked { until }) if until > now => {
            let state = PenaltyState {
                blocked_for: us(until - now),
                epoch,
                ..PenaltyState::default()
            };
            return (state, None);
        }
        Some(PenaltyRecord::Counting { ws, n }) => (Some(ws), n),
        _ => (None, 0),
    };
    if ws.is_none_or(|ws| ws + p.within_us <= now) {
        (ws, n) = (Some(now), 0);
    }
    let ws = ws.unwrap_or(now);
    let stale = adding.under.is_some_and(|under| under != epoch);
    if adding.denials == 0 || stale {
        let state = PenaltyState {
            denials: n,
            epoch,
            ..PenaltyState::default()
        };
        return (state, None);
    }
    n += adding.denials;
    if n >= p.after {
        let state = PenaltyState {
            blocked_for: us(p.block_us),
            denials: 0,
            started: true,
            epoch,
        };
        let until = now + p.block_us;
        return (
            state,
            Some((PenaltyRecord::Blocked { until }, ttl_ms(p.block_us))),
        );
    }
    let state = PenaltyState {
        denials: n,
        epoch,
        ..PenaltyState::default()
    };
    (
        state,
        Some((
            PenaltyRecord::Counting { ws, n },
            ttl_ms(ws + p.within_us - now),
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PenaltyParams = PenaltyParams {
        after: 3,
        within_us: 10_000_000,
        block_us: 60_000_000,
    };

    fn adding(denials: u64) -> Adding {
        Adding {
            denials,
            under: Some(0),
            epoch: 0,
        }
    }

    #[test]
    fn the_count_reaching_after_blocks_for_exactly_block() {
        let (s, w) = note(None, adding(2), P, 1_000);
        assert_eq!((s.denials, s.blocked()), (2, false));
        let record = w.map(|(r, _)| r);
        let (s, w) = note(record, adding(1), P, 2_000);
        assert!(s.started && s.blocked_for == Duration::from_secs(60));
        let record = w.map(|(r, _)| r);
        assert_eq!(blocked_for(record.as_ref(), 2_000 + 59_999_999), 1);
        assert_eq!(blocked_for(record.as_ref(), 62_000), 59_940_000);
        assert_eq!(blocked_for(record.as_ref(), 2_000 + 60_000_000), 0);
        let (s, w) = note(record, adding(5), P, 3_000);
        assert!(
            !s.started && s.blocked() && w.is_none(),
            "denials while blocked count nothing"
        );
    }

    #[test]
    fn a_window_that_ended_counts_from_zero() {
        let (_, w) = note(None, adding(2), P, 0);
        let (s, _) = note(w.map(|(r, _)| r), adding(1), P, 10_000_000);
        assert_eq!((s.denials, s.blocked()), (1, false));
    }

    #[test]
    fn denials_under_another_lift_epoch_count_nothing_and_learn_the_epoch() {
        let lifted = next_epoch(0, 5_000);
        let (s, w) = note(
            None,
            Adding {
                denials: 9,
                under: Some(0),
                epoch: lifted,
            },
            P,
            6_000,
        );
        assert_eq!((s.denials, s.epoch, w), (0, lifted, None));
        let (s, _) = note(
            None,
            Adding {
                denials: 2,
                under: Some(lifted),
                epoch: lifted,
            },
            P,
            7_000,
        );
        assert_eq!(s.denials, 2, "counted under the store's epoch");
        let (s, _) = note(
            None,
            Adding {
                denials: 2,
                under: None,
                epoch: lifted,
            },
            P,
            7_000,
        );
        assert_eq!(s.denials, 2, "counted whatever the epoch");
        assert!(next_epoch(lifted, lifted - 1) > lifted, "never comes back");
    }
}
