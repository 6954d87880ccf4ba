//! The penalty record of one identity under one rule: denials counted in a window, or a block.
//!
//! Mirrors `redis/scripts/note_denials.lua` and `blocked_for` in `lib.lua`.

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

/// Microseconds left of a block (0: not blocked).
pub(crate) fn blocked_for(record: Option<&PenaltyRecord>, now: Micros) -> u64 {
    match record {
        Some(PenaltyRecord::Blocked { until }) => until.saturating_sub(now),
        _ => 0,
    }
}

/// What a call to `note_denials` writes: the new record and its TTL in ms.
pub(crate) type Write = Option<(PenaltyRecord, u64)>;

/// Adds `add` denials to `record` at `now`: the identity's standing after, and what to write.
pub(crate) fn note(
    record: Option<PenaltyRecord>,
    add: u64,
    p: PenaltyParams,
    now: Micros,
) -> (PenaltyState, Write) {
    let us = Duration::from_micros;
    let (mut ws, mut n) = match record {
        Some(PenaltyRecord::Blocked { until }) if until > now => {
            let state = PenaltyState {
                blocked_for: us(until - now),
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
    if add == 0 {
        let state = PenaltyState {
            denials: n,
            ..PenaltyState::default()
        };
        return (state, None);
    }
    n += add;
    if n >= p.after {
        let state = PenaltyState {
            blocked_for: us(p.block_us),
            denials: 0,
            started: true,
        };
        let until = now + p.block_us;
        return (
            state,
            Some((PenaltyRecord::Blocked { until }, ttl_ms(p.block_us))),
        );
    }
    let state = PenaltyState {
        denials: n,
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

    #[test]
    fn the_count_reaching_after_blocks_for_exactly_block() {
        let (s, w) = note(None, 2, P, 1_000);
        assert_eq!((s.denials, s.blocked()), (2, false));
        let record = w.map(|(r, _)| r);
        let (s, w) = note(record, 1, P, 2_000);
        assert!(s.started && s.blocked_for == Duration::from_secs(60));
        let record = w.map(|(r, _)| r);
        assert_eq!(blocked_for(record.as_ref(), 2_000 + 59_999_999), 1);
        assert_eq!(blocked_for(record.as_ref(), 62_000), 59_940_000);
        assert_eq!(blocked_for(record.as_ref(), 2_000 + 60_000_000), 0);
        let (s, w) = note(record, 5, P, 3_000);
        assert!(
            !s.started && s.blocked() && w.is_none(),
            "denials while blocked count nothing"
        );
    }

    #[test]
    fn a_window_that_ended_counts_from_zero() {
        let (_, w) = note(None, 2, P, 0);
        let (s, _) = note(w.map(|(r, _)| r), 1, P, 10_000_000);
        assert_eq!((s.denials, s.blocked()), (1, false));
    }
}
