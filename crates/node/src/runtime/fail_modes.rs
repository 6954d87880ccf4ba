//! What a rule does when the store cannot answer, as one pure policy for every caller (the
//! bucket, the key actor's waiters, store checks): [`waits_through`] says whether a request
//! waits on through a late call, and [`fallback`] what its rule does instead, by the rule's
//! fail mode, why the store did not answer ([`Cause`]) and whether this node has heard the
//! store on the key. `decision/without_store.rs` carries it out (a share of the last answer
//! taken, a LOCAL bucket's tokens, what is owed).

use tollgate_lease::StoreError;

use crate::rules::FailMode;
use crate::runtime::store_health::lateness::Late;

/// Why the store did not answer a request's call, as the fail policy decides by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The store stalled: it answered nothing for a budget while the node kept up, or not
    /// within the patience. It is late, not known to be down: what is admitted is owed to it.
    Stalled,
    /// The store is down: its shard's breaker is open, or the call failed (refused,
    /// unreachable, an error, the node shutting down). What is admitted is not owed.
    Down,
}

impl Cause {
    /// The cause of a store call that ended in `error`: a timeout is a stall, anything else
    /// the store being down.
    pub fn of(error: &StoreError) -> Self {
        match error {
            StoreError::Timeout { .. } => Self::Stalled,
            _ => Self::Down,
        }
    }
}

impl From<Late> for Cause {
    fn from(late: Late) -> Self {
        match late {
            Late::Stalled => Self::Stalled,
            Late::Down => Self::Down,
        }
    }
}

/// Whether a request under `mode` waits on through a call that is `late`, rather than being
/// decided now: when the store is down, none does; when it stalled, one under a CLOSED rule
/// does (one late call must not deny a real user: it waits for the answer, up to the
/// patience, or until the store is down). The share an OPEN rule decides by needs a last
/// answer too: a bucket the store never answered for waits as well (`keys/bucket.rs`).
pub(crate) fn waits_through(mode: FailMode, late: Late) -> bool {
    late == Late::Stalled && mode == FailMode::Closed
}

/// What a rule does when the store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// This node's share of the store's last answer decides (an OPEN rule, the store only
    /// late, the key's last answer held here).
    LastAnswer,
    /// Admitted (OPEN).
    Admit,
    /// Denied, with a retry when the store may answer again (CLOSED).
    Deny,
    /// This node's share of the limit, per key, decides (LOCAL).
    Local,
}

/// What a rule under `mode` does when its store call did not answer for `cause`; `heard`: this
/// node holds the key's bucket, and with it the store's last answer. Under an OPEN rule a store
/// that has stalled is not down: the node's share of its last answer decides, rather than
/// admitting everything.
pub(crate) fn fallback(mode: FailMode, cause: Cause, heard: bool) -> Fallback {
    match (mode, cause) {
        (FailMode::Open, Cause::Stalled) if heard => Fallback::LastAnswer,
        (FailMode::Open, _) => Fallback::Admit,
        (FailMode::Closed, _) => Fallback::Deny,
        (FailMode::Local, _) => Fallback::Local,
    }
}

/// Whether what a rule admits without the store is owed to it (debited when it answers): when
/// the store was late rather than down, on a key whose bucket this node holds.
pub(crate) fn owed(cause: Cause, heard: bool) -> bool {
    cause == Cause::Stalled && heard
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MODES: [FailMode; 3] = [FailMode::Open, FailMode::Closed, FailMode::Local];

    #[test]
    fn only_a_closed_rule_waits_through_a_stall_and_none_through_an_outage() {
        for mode in MODES {
            assert_eq!(
                waits_through(mode, Late::Stalled),
                mode == FailMode::Closed,
                "{mode:?}, stalled"
            );
            assert!(!waits_through(mode, Late::Down), "{mode:?}, down");
        }
    }

    #[test]
    fn a_timeout_is_a_stall_and_every_other_failure_the_store_down() {
        let budget = Duration::from_millis(5);
        assert_eq!(Cause::of(&StoreError::Timeout { budget }), Cause::Stalled);
        for error in [
            StoreError::Unavailable("gone".into()),
            StoreError::Refused("refused".into()),
            StoreError::Full("full".into()),
            StoreError::BadReply("what".into()),
            StoreError::Rejected("no".into()),
        ] {
            assert_eq!(Cause::of(&error), Cause::Down, "{error}");
        }
        assert_eq!(Cause::from(Late::Stalled), Cause::Stalled);
        assert_eq!(Cause::from(Late::Down), Cause::Down);
    }

    #[test]
    fn the_policy_table() {
        use Cause::{Down, Stalled};
        use FailMode::{Closed, Local as LocalMode, Open};
        use Fallback::{Admit, Deny, LastAnswer, Local};
        // (mode, cause, heard) → (what it does, whether what it admits is owed)
        let table = [
            (Open, Stalled, true, LastAnswer, true),
            (Open, Stalled, false, Admit, false),
            (Open, Down, true, Admit, false),
            (Open, Down, false, Admit, false),
            (Closed, Stalled, true, Deny, true),
            (Closed, Stalled, false, Deny, false),
            (Closed, Down, true, Deny, false),
            (Closed, Down, false, Deny, false),
            (LocalMode, Stalled, true, Local, true),
            (LocalMode, Stalled, false, Local, false),
            (LocalMode, Down, true, Local, false),
            (LocalMode, Down, false, Local, false),
        ];
        for (mode, cause, heard, does, is_owed) in table {
            let case = format!("{mode:?} × {cause:?}, heard: {heard}");
            assert_eq!(fallback(mode, cause, heard), does, "{case}");
            assert_eq!(owed(cause, heard), is_owed, "{case}");
        }
    }
}
