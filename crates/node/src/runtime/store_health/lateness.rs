//! Telling a late store call apart: a store that is busy (it answers, after a queue), a node
//! that is busy (it cannot read the answers in time), a store that has stalled, and a store
//! that is down. Plain values that take `now`; the guarded store asks at every budget that a
//! call is still out.
//!
//! Why: a call past the store budget used to be a failure. A fresh node's first call (its
//! connection set up, its scripts compiled) and every call of a node saturated by its own load
//! then went to the fail modes: OPEN rules admitted everyone waiting, CLOSED rules denied real
//! users, and timeouts opened the breaker on a healthy store. A limiter that stops limiting
//! when traffic peaks is off when it matters most. So a call is judged by what the store and
//! the node do while it waits, not by how long it took:
//!
//! - **the store answers** other calls to the same shard (an answer within the last budget,
//!   plus a budget for every [`CALLS_PER_BUDGET`] calls that were out before this one): it is
//!   busy, not stalled; wait on, up to the patience. Redis runs the calls of one connection in
//!   order and writes their answers together once it has run a batch of them: a node with
//!   hundreds of calls out hears nothing for milliseconds at a time from a healthy store;
//! - **the node lags**: the budget's own timer woke late by more than half a budget, or the
//!   yield before the look took more than an eighth of one (other tasks queue before this
//!   one, and so before the connection's reader: each answer waits in that queue two or three
//!   times, for the write, the read and its caller). Its answers may be sitting unread; wait
//!   on;
//! - **nothing answered** within a budget while the call was out and the node kept up: the
//!   store has **stalled** (a hung Redis, a cut that left the connection open, or a machine so
//!   busy that Redis does not run). Callers that decide by a fail mode that does not wait
//!   (OPEN, LOCAL) stop waiting, so that no request waits long on a store that may be hung; the
//!   call goes on. A stall is not a failure: on an overloaded machine a store that does not
//!   run for 200 ms still answers every call;
//! - **the breaker is open** (the store failed most calls): the store is **down**; every
//!   caller stops waiting, CLOSED rules included;
//! - **the patience ends**: the call failed. Only failures count against the breaker: calls
//!   that could not reach the store, and calls it did not answer within the patience.

use tollgate_lease::Micros;

/// How many calls ahead of a call are given one more budget of silence before it is judged
/// stalled: a budget of 5 ms allows about 78 µs per call ahead, several times what one Lua
/// call costs Redis.
pub(crate) const CALLS_PER_BUDGET: u64 = 64;

/// What the guarded store knows of one shard when it judges a call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pulse {
    /// When the shard last answered a call (node clock, µs; 0: never).
    pub(crate) last_answer: Micros,
    /// Whether its breaker is open.
    pub(crate) breaker_open: bool,
}

/// The times of one call, node clock (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallTimes {
    /// When the call went out.
    pub(crate) started: Micros,
    /// When this look was due (the budget's timer).
    pub(crate) due: Micros,
    /// How long the yield before this look took (the node's queue of runnable tasks).
    pub(crate) yielded: Micros,
    /// Calls to the same shard that were out when this one went (the store's queue ahead of
    /// it).
    pub(crate) ahead: u64,
    /// Now.
    pub(crate) now: Micros,
}

/// How long to wait, µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// How long a store that answers nothing is waited for.
    pub(crate) budget: Micros,
    /// How long a call is waited for at most.
    pub(crate) patience: Micros,
}

/// What a late call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// The store or the node is busy: wait on.
    Busy,
    /// Nothing answered within a budget while the node kept up.
    Stalled,
    /// The shard's breaker is open.
    Down,
    /// Out of patience: the call failed.
    OutOfPatience,
}

/// Judges a call still out at `t.now` (see the module docs).
pub(crate) fn judge(pulse: Pulse, t: CallTimes, limits: Limits) -> Judgement {
    if t.now.saturating_sub(t.started) >= limits.patience {
        return Judgement::OutOfPatience;
    }
    if pulse.breaker_open {
        return Judgement::Down;
    }
    if t.now.saturating_sub(t.due) > limits.budget / 2 || t.yielded > limits.budget / 8 {
        return Judgement::Busy;
    }
    let silence = limits.budget + limits.budget * t.ahead / CALLS_PER_BUDGET;
    if pulse.last_answer > 0 && pulse.last_answer.saturating_add(silence) >= t.now {
        return Judgement::Busy;
    }
    Judgement::Stalled
}

/// Why a caller stopped waiting for a late call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// The store stalled: decided by fail modes that do not wait (OPEN, LOCAL); what they
    /// admit is owed to the store, and debited when it answers.
    Stalled,
    /// The store is down (its shard's breaker is open): decided by every fail mode; what is
    /// admitted is not owed.
    Down,
}

/// How long a caller waits for a late call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until the store stalls or is down (requests whose rules decide by OPEN or LOCAL, and
    /// calls nobody waits on).
    UntilStall,
    /// Until the store is down: a stall alone is not enough (requests under a CLOSED rule,
    /// which must not deny a real user because one call was late).
    UntilDown,
}

impl Wait {
    /// Whether the caller stops waiting on `late`.
    pub fn stops_at(self, late: Late) -> bool {
        match (self, late) {
            (_, Late::Down) | (Wait::UntilStall, Late::Stalled) => true,
            (Wait::UntilDown, Late::Stalled) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;
    const T0: u64 = 1_000_000_000;
    const LIMITS: Limits = Limits {
        budget: 5 * MS,
        patience: 500 * MS,
    };

    fn at(started: u64, due: u64, now: u64) -> CallTimes {
        CallTimes {
            started,
            due,
            yielded: 20,
            ahead: 0,
            now,
        }
    }

    fn answered(last_answer: u64) -> Pulse {
        Pulse {
            last_answer,
            ..Pulse::default()
        }
    }

    #[test]
    fn a_store_that_answers_others_is_busy_not_stalled() {
        // Out 5 ms, the shard answered another call 1 ms ago: a queue, not a stall.
        let pulse = answered(T0 + 4 * MS);
        assert_eq!(
            judge(pulse, at(T0, T0 + 5 * MS, T0 + 5 * MS), LIMITS),
            Judgement::Busy
        );
        // Still answering 300 ms on.
        let pulse = answered(T0 + 299 * MS);
        assert_eq!(
            judge(pulse, at(T0, T0 + 300 * MS, T0 + 300 * MS), LIMITS),
            Judgement::Busy
        );
    }

    #[test]
    fn a_store_with_a_queue_ahead_of_the_call_is_given_longer() {
        // 256 calls were out before this one: a healthy Redis answers them in batches.
        let pulse = answered(T0 - 3 * MS);
        let queued = CallTimes {
            ahead: 256,
            ..at(T0, T0 + 10 * MS, T0 + 10 * MS)
        };
        assert_eq!(judge(pulse, queued, LIMITS), Judgement::Busy);
        // Silent for five budgets with 256 ahead: stalled.
        let queued = CallTimes {
            ahead: 256,
            ..at(T0, T0 + 30 * MS, T0 + 30 * MS)
        };
        assert_eq!(judge(pulse, queued, LIMITS), Judgement::Stalled);
    }

    #[test]
    fn a_store_silent_for_a_budget_has_stalled() {
        // The last answer came before the call went out, 5 ms ago.
        let pulse = answered(T0 - MS);
        assert_eq!(
            judge(pulse, at(T0, T0 + 5 * MS, T0 + 5 * MS), LIMITS),
            Judgement::Stalled
        );
        // An answer 6 ms ago does not count.
        let pulse = answered(T0 + 14 * MS);
        assert_eq!(
            judge(pulse, at(T0, T0 + 20 * MS, T0 + 20 * MS), LIMITS),
            Judgement::Stalled
        );
    }

    #[test]
    fn a_node_that_lags_is_not_judged() {
        // The budget's timer woke 4 ms late: the answers may be unread.
        let pulse = answered(T0 - MS);
        assert_eq!(
            judge(pulse, at(T0, T0 + 5 * MS, T0 + 9 * MS), LIMITS),
            Judgement::Busy
        );
        // 2 ms late is within half a budget: judged.
        assert_eq!(
            judge(pulse, at(T0, T0 + 5 * MS, T0 + 7 * MS), LIMITS),
            Judgement::Stalled
        );
        // On time, but other tasks kept this one waiting 1 ms after it yielded.
        let queued = CallTimes {
            yielded: MS,
            ..at(T0, T0 + 5 * MS, T0 + 5 * MS)
        };
        assert_eq!(judge(pulse, queued, LIMITS), Judgement::Busy);
    }

    #[test]
    fn a_shard_that_never_answered_stalls_like_any_other() {
        assert_eq!(
            judge(Pulse::default(), at(T0, T0 + 5 * MS, T0 + 5 * MS), LIMITS),
            Judgement::Stalled
        );
    }

    #[test]
    fn an_open_breaker_is_down_and_the_patience_ends_every_wait() {
        let open = Pulse {
            last_answer: T0 + 4 * MS,
            breaker_open: true,
        };
        assert_eq!(
            judge(open, at(T0, T0 + 5 * MS, T0 + 5 * MS), LIMITS),
            Judgement::Down
        );
        let busy = answered(T0 + 499 * MS);
        assert_eq!(
            judge(busy, at(T0, T0 + 500 * MS, T0 + 500 * MS), LIMITS),
            Judgement::OutOfPatience
        );
    }

    #[test]
    fn closed_rules_wait_through_a_stall_but_not_an_outage() {
        assert!(Wait::UntilStall.stops_at(Late::Stalled));
        assert!(Wait::UntilStall.stops_at(Late::Down));
        assert!(!Wait::UntilDown.stops_at(Late::Stalled));
        assert!(Wait::UntilDown.stops_at(Late::Down));
    }
}
