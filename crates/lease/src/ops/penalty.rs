//! The penalty box: a rule may say that an identity denied `after` times within `within` is
//! blocked for `block`. The count and the block live in the store beside the bucket
//! (`<key>:penalty`), so every node counts towards one total and every node learns the block:
//!
//! - [`LeaseStore::note_denials`](crate::LeaseStore::note_denials) adds the denials a node
//!   handed out and starts the block when the count reaches `after`;
//! - a check or a lease whose item is marked penalized (`CheckItem::penalized`, `LeaseAsk::penalized`) is refused while the
//!   block lasts, before anything is judged, and consumes nothing;
//! - a lift ([`LeaseStore::lift_block`](crate::LeaseStore::lift_block)) or a reset starts a new
//!   *lift epoch* (`<key>:penalty:epoch`, the store's time of it): a flush of denials says
//!   the epoch they were handed out under, and one that is not the store's counts nothing, so
//!   denials handed out before a lift, by nodes that had not heard of it, never undo it.

use std::time::Duration;

use crate::error::InvalidInput;

/// The shortest counting window and block.
pub const MIN_PENALTY_DURATION: Duration = Duration::from_secs(1);
/// The longest counting window and block.
pub const MAX_PENALTY_DURATION: Duration = Duration::from_secs(7 * 86_400);
/// The most denials a penalty may wait for.
pub const MAX_PENALTY_AFTER: u64 = 1_000_000_000;

/// After `after` denials within `within`, block the identity for `block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Penalty {
    after: u64,
    within: Duration,
    block: Duration,
    shadow: bool,
}

impl Penalty {
    /// A penalty, validated: `after` in 1..=10⁹, `within` and `block` in 1 s..=7 d (whole
    /// milliseconds). The error names the field.
    pub fn new(after: u64, within: Duration, block: Duration) -> Result<Self, InvalidInput> {
        let bad = |field: &'static str, reason: String| InvalidInput::BadPenalty { field, reason };
        if !(1..=MAX_PENALTY_AFTER).contains(&after) {
            return Err(bad(
                "after",
                format!("{after} must be 1 to {MAX_PENALTY_AFTER} denials"),
            ));
        }
        for (field, d) in [("within", within), ("block", block)] {
            if !(MIN_PENALTY_DURATION..=MAX_PENALTY_DURATION).contains(&d) {
                return Err(bad(field, format!("{d:?} must be between 1s and 7d")));
            }
        }
        Ok(Self {
            after,
            within,
            block,
            shadow: false,
        })
    }

    /// The same penalty of a SHADOW rule: counted, and its blocks kept apart
    /// (`<key>:penalty:shadow`), so that no store call ever enforces them, even after the
    /// rule turns ENFORCE.
    pub fn shadowed(self) -> Self {
        Self {
            shadow: true,
            ..self
        }
    }

    /// Whether it is a SHADOW rule's.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// Denials that start a block.
    pub fn after(&self) -> u64 {
        self.after
    }

    /// The window the denials are counted in (it opens at the first denial counted).
    pub fn within(&self) -> Duration {
        self.within
    }

    /// How long a block lasts.
    pub fn block(&self) -> Duration {
        self.block
    }
}

/// An identity's standing in a rule's penalty box.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PenaltyState {
    /// The time left of the block (zero: not blocked).
    pub blocked_for: Duration,
    /// Denials counted in the current window (zero while blocked).
    pub denials: u64,
    /// Whether this call started the block.
    pub started: bool,
    /// The identity's lift epoch in the store: it changes with every lift or reset of its
    /// penalty (0: none for a day). Denials handed out before a lift are flushed with the
    /// epoch the node knew then, and the store counts a flush only under its current epoch.
    pub epoch: u64,
}

/// What [`LeaseStore::lift_block`](crate::LeaseStore::lift_block) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lift {
    /// Whether an enforced block was lifted.
    pub was_blocked: bool,
    /// The lift epoch it started: denials handed out before it count nothing.
    pub epoch: u64,
}

impl PenaltyState {
    /// Whether the identity is blocked.
    pub fn blocked(&self) -> bool {
        !self.blocked_for.is_zero()
    }
}
