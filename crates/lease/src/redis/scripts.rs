//! The Lua scripts, one reviewed `.lua` file per operation, each prefixed with `lib.lua`.
//!
//! A script is sent with `EVALSHA`; when Redis answers `NOSCRIPT` (after a restart, a failover
//! or `SCRIPT FLUSH`) the same call is sent once more as `EVAL`, which also caches the script
//! on that server, so the caller never sees it.
//!
//! Every script opens with a `#!lua` shebang (Redis 7): Redis then checks `maxmemory` before
//! the script runs, whatever its first write. Without it, Redis checks only before the first
//! write command flagged deny-oom, and a script whose first write is `ZREMRANGEBYSCORE` (not
//! flagged) kept writing past `maxmemory`. Scripts that can only give memory back (returns,
//! slot releases) say `flags=allow-oom`: a full Redis still takes back what nodes hold.
//!
//! The batch script (`batch.lua`) runs several checks and lease asks in one call: it holds the
//! bodies of `check.lua` and `lease_acquire.lua` as functions, so their arithmetic exists once,
//! and defines the library once and reads the clock once for all its requests (in a small
//! script, each `redis.call` and each closure the library defines costs as much as the
//! arithmetic).
//! It says `flags=allow-cross-slot-keys`: in a cluster its requests are of several slots, all
//! served by the node it is sent to.

use std::sync::LazyLock;

const LIB: &str = include_str!("scripts/lib.lua");
const CHECK: &str = include_str!("scripts/check.lua");
const LEASE_ACQUIRE: &str = include_str!("scripts/lease_acquire.lua");

/// One operation's script.
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) source: String,
    pub(crate) sha: String,
}

/// Whether a script may run while Redis is over its `maxmemory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Oom {
    /// Refused (a `full` store): it can add state.
    Refused,
    /// Allowed: it only gives state back.
    Allowed,
}

impl Script {
    fn new(name: &'static str, body: &str, oom: Oom) -> Self {
        let shebang = match oom {
            Oom::Refused => "#!lua",
            Oom::Allowed => "#!lua flags=allow-oom",
        };
        Self::from_source(name, format!("{shebang}\n{LIB}\n{body}"))
    }

    /// The batch script: the library once, one clock reading for the whole batch, and
    /// `operations` (each a script body, by its operation code) as functions of their own KEYS
    /// and ARGV, which `batch.lua` calls once per request.
    fn batch(operations: &[(u8, &str)]) -> Self {
        let mut source = format!(
            "#!lua flags=allow-cross-slot-keys\n{LIB}\n\
             local batch_now = now_us()\n\
             local function now_us() return batch_now end\n\
             local OPERATIONS = {{}}\n"
        );
        for (code, body) in operations {
            source.push_str(&format!(
                "OPERATIONS[{code}] = function(KEYS, ARGV)\n{body}\nend\n"
            ));
        }
        source.push_str(include_str!("scripts/batch.lua"));
        Self::from_source("batch", source)
    }

    fn from_source(name: &'static str, source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Self { name, source, sha }
    }
}

/// The operations a batch can carry, by the code `batch.lua` knows them by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchOp {
    Check = 1,
    LeaseAcquire = 2,
}

impl BatchOp {
    /// The script that runs this operation alone.
    pub(crate) fn script(self) -> &'static Script {
        match self {
            BatchOp::Check => &SCRIPTS.check,
            BatchOp::LeaseAcquire => &SCRIPTS.lease_acquire,
        }
    }
}

/// All of them, built once.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) check: Script,
    pub(crate) lease_acquire: Script,
    pub(crate) lease_return: Script,
    pub(crate) slot_release: Script,
    pub(crate) slot_renew: Script,
    pub(crate) debit: Script,
    pub(crate) demand_report: Script,
    pub(crate) held_leases: Script,
    pub(crate) reset: Script,
    pub(crate) note_denials: Script,
    pub(crate) penalty_lift: Script,
    pub(crate) settle: Script,
    pub(crate) batch: Script,
}

impl Scripts {
    /// Every script.
    pub(crate) fn all(&self) -> [&Script; 13] {
        [
            &self.check,
            &self.lease_acquire,
            &self.lease_return,
            &self.slot_release,
            &self.slot_renew,
            &self.debit,
            &self.demand_report,
            &self.held_leases,
            &self.reset,
            &self.note_denials,
            &self.penalty_lift,
            &self.settle,
            &self.batch,
        ]
    }
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    check: Script::new("check", CHECK, Oom::Refused),
    lease_acquire: Script::new("lease_acquire", LEASE_ACQUIRE, Oom::Refused),
    lease_return: Script::new(
        "lease_return",
        include_str!("scripts/lease_return.lua"),
        Oom::Allowed,
    ),
    slot_release: Script::new(
        "slot_release",
        include_str!("scripts/slot_release.lua"),
        Oom::Allowed,
    ),
    slot_renew: Script::new(
        "slot_renew",
        include_str!("scripts/slot_renew.lua"),
        Oom::Allowed,
    ),
    debit: Script::new("debit", include_str!("scripts/debit.lua"), Oom::Refused),
    demand_report: Script::new(
        "demand_report",
        include_str!("scripts/demand_report.lua"),
        Oom::Refused,
    ),
    held_leases: Script::new(
        "held_leases",
        include_str!("scripts/held_leases.lua"),
        Oom::Allowed,
    ),
    reset: Script::new("reset", include_str!("scripts/reset.lua"), Oom::Allowed),
    note_denials: Script::new(
        "note_denials",
        include_str!("scripts/note_denials.lua"),
        Oom::Refused,
    ),
    penalty_lift: Script::new(
        "penalty_lift",
        include_str!("scripts/penalty_lift.lua"),
        Oom::Allowed,
    ),
    settle: Script::new("settle", include_str!("scripts/settle.lua"), Oom::Refused),
    batch: Script::batch(&[
        (BatchOp::Check as u8, CHECK),
        (BatchOp::LeaseAcquire as u8, LEASE_ACQUIRE),
    ]),
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_has_a_distinct_sha_and_a_header() {
        let all = SCRIPTS.all();
        let shas: std::collections::HashSet<_> = all.iter().map(|s| &s.sha).collect();
        assert_eq!(shas.len(), all.len());
        for s in all {
            assert_eq!(s.sha.len(), 40, "{}", s.name);
            assert!(s.source.starts_with("#!lua"), "{} has no shebang", s.name);
            let body = &s.source[s.source.find(LIB).expect("lib") + LIB.len()..];
            for part in ["KEYS", "ARGV", "Reply", "Invariants"] {
                assert!(body.contains(part), "{} lacks a {part} header", s.name);
            }
        }
    }
}
