//! The arithmetic of every algorithm, as plain state that takes `now` as an argument.
//!
//! This is the reference the in-memory store runs and the Lua scripts mirror line for line
//! (same formulas, same order of floating-point operations, so both stores give the same
//! answers bit for bit). The conformance suite holds the two to it.
//!
//! A bucket is *loaded* at `now` (refilled, rolled to the current window, expired entries
//! pruned), then asked whether it *admits* a cost, then *consumes*, *credits* or is *debited*.
//!
//! # Layout
//! - [`token_bucket`], [`gcra`], [`leaky_bucket`], [`fixed_window`], [`sliding_window`]:
//!   counters kept in a Redis hash.
//! - [`entry_log`]: the sliding log and the concurrency slots, kept in a Redis sorted set.
//! - [`zset`]: the in-memory twin of a Redis sorted set.
//! - [`once_marks`]: the records that make a debit idempotent.
//! - [`penalty_box`]: denials counted towards a rule's penalty, and its blocks.
//! - [`reservations`]: the records of reservations awaiting their settlement.

pub(crate) mod entry_log;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
pub(crate) mod once_marks;
pub(crate) mod penalty_box;
pub(crate) mod reservations;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;
pub(crate) mod zset;

use crate::clock::Micros;

/// Idle state outlives the moment it becomes neutral (full bucket, window over) by this much.
pub(crate) const EXPIRY_MARGIN_MS: u64 = 1000;

/// Milliseconds to keep a key for, given the microseconds until its state is neutral.
pub(crate) fn ttl_ms(neutral_in_us: u64) -> u64 {
    neutral_in_us.div_ceil(1000) + EXPIRY_MARGIN_MS
}

/// The start of the epoch-aligned window of length `window_us` that contains `now`.
pub(crate) fn window_start(now: Micros, window_us: u64) -> Micros {
    now - now % window_us
}

/// An id not `taken` yet: `<base>`, else `<base>-1`, `<base>-2`, ... (Two entries in the same
/// microsecond are rare but possible, e.g. after a failover moved the clock back.)
pub(crate) fn unique_id(base: Micros, taken: impl Fn(&str) -> bool) -> String {
    let mut id = base.to_string();
    let mut n = 0u32;
    while taken(&id) {
        n += 1;
        id = format!("{base}-{n}");
    }
    id
}
