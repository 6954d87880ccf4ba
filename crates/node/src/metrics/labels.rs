//! The label sets of the node's metrics, and their values in snake_case, as Prometheus
//! conventions have them.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::runtime::outcome::Outcome;

/// A rule's labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    /// The rule's domain.
    pub domain: String,
    /// The rule's id.
    pub rule: String,
}

/// A settlement's labels: the rule, and what the store did (`settled`, `expired`,
/// `already-settled`, `unknown`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettlementLabels {
    /// The rule's id.
    pub rule: String,
    /// What the store did.
    pub result: String,
}

/// Units a settlement moved: the rule, and `refunded` or `charged`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettledUnitsLabels {
    /// The rule's id.
    pub rule: String,
    /// `refunded` (the estimate exceeded the actual) or `charged` (the excess).
    pub direction: String,
}

/// A penalty's labels: the rule, and `blocked` or `shadow`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PenaltyLabels {
    /// The rule's domain.
    pub domain: String,
    /// The rule's id.
    pub rule: String,
    /// `blocked`, or `shadow` for a SHADOW rule (it blocks nobody).
    pub outcome: String,
}

/// Denials a rule's penalty did not count: the rule, and why (`lifted`: handed out before a
/// lift or reset the node had not heard of, and refused by the store; `store_failed`: the
/// store did not answer their flush; `pending_full`: the node's denials waiting to be counted
/// were at their memory bound).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UncountedDenialsLabels {
    /// The rule's domain.
    pub domain: String,
    /// The rule's id.
    pub rule: String,
    /// Why they were not counted.
    pub reason: String,
}

/// Label values in snake_case, as Prometheus conventions have them.
macro_rules! snake_label {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl EncodeLabelValue for $ty {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                use std::fmt::Write;
                encoder.write_str(match self { $($ty::$variant => $name),+ })
            }
        }
    };
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DecisionLabels {
    pub(super) domain: String,
    pub(super) rule: String,
    pub(super) outcome: Outcome,
}

snake_label!(Outcome {
    Allowed => "allowed",
    Denied => "denied",
    ShadowDenied => "shadow_denied",
    FailedOpen => "failed_open",
    FailedClosed => "failed_closed",
    LocalFallback => "local_fallback",
});

/// A store operation, for latency and error labels.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum StoreOp {
    /// `check`.
    Check,
    /// `lease acquire`.
    LeaseAcquire,
    /// `lease return`.
    LeaseReturn,
    /// `slot release`.
    SlotRelease,
    /// `slot renew`.
    SlotRenew,
    /// `debit` (what was admitted while the store was late).
    Debit,
    /// `probe`: the breaker's own call that asks whether a stalled store answers again.
    Probe,
    /// `settle`: a reservation settled at its actual cost.
    Settle,
    /// `note_denials`: denials counted towards a penalty (or a penalty read).
    NoteDenials,
    /// `reset`: an operator's reset of a bucket.
    Reset,
    /// `penalty_lift`: an operator's lift of a penalty block.
    PenaltyLift,
    /// `read`: an operator's read of what a bucket's leases hold.
    Read,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OpLabels {
    pub(super) op: StoreOp,
}

impl EncodeLabelValue for StoreOp {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(self.as_str())
    }
}

impl StoreOp {
    /// Every operation, in the order of [`StoreOp::index`].
    pub const ALL: [StoreOp; 12] = [
        StoreOp::Check,
        StoreOp::LeaseAcquire,
        StoreOp::LeaseReturn,
        StoreOp::SlotRelease,
        StoreOp::SlotRenew,
        StoreOp::Debit,
        StoreOp::Probe,
        StoreOp::Settle,
        StoreOp::NoteDenials,
        StoreOp::Reset,
        StoreOp::PenaltyLift,
        StoreOp::Read,
    ];

    /// Its place in [`StoreOp::ALL`].
    pub fn index(self) -> usize {
        match self {
            StoreOp::Check => 0,
            StoreOp::LeaseAcquire => 1,
            StoreOp::LeaseReturn => 2,
            StoreOp::SlotRelease => 3,
            StoreOp::SlotRenew => 4,
            StoreOp::Debit => 5,
            StoreOp::Probe => 6,
            StoreOp::Settle => 7,
            StoreOp::NoteDenials => 8,
            StoreOp::Reset => 9,
            StoreOp::PenaltyLift => 10,
            StoreOp::Read => 11,
        }
    }

    /// Its name in labels and spans.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Check => "check",
            StoreOp::LeaseAcquire => "lease_acquire",
            StoreOp::LeaseReturn => "lease_return",
            StoreOp::SlotRelease => "slot_release",
            StoreOp::SlotRenew => "slot_renew",
            StoreOp::Debit => "debit",
            StoreOp::Probe => "probe",
            StoreOp::Settle => "settle",
            StoreOp::NoteDenials => "note_denials",
            StoreOp::Reset => "reset",
            StoreOp::PenaltyLift => "penalty_lift",
            StoreOp::Read => "read",
        }
    }
}

/// Why a store call failed.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum StoreFailure {
    /// It ran out of time.
    Timeout,
    /// The store could not be reached, or is failing over.
    Unavailable,
    /// The circuit breaker was open: the store was not called.
    BreakerOpen,
    /// The store is full: it refused a new key (the store itself is up).
    Full,
    /// Anything else (bad reply, rejected command).
    Other,
}

impl StoreFailure {
    /// Every cause.
    pub const ALL: [StoreFailure; 5] = [
        StoreFailure::Timeout,
        StoreFailure::Unavailable,
        StoreFailure::BreakerOpen,
        StoreFailure::Full,
        StoreFailure::Other,
    ];
}

snake_label!(StoreFailure {
    Timeout => "timeout",
    Unavailable => "unavailable",
    BreakerOpen => "breaker_open",
    Full => "full",
    Other => "other",
});

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailureLabels {
    pub(super) op: StoreOp,
    pub(super) failure: StoreFailure,
}

/// The API a request came in by.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Api {
    /// Envoy's rate limit service (`ShouldRateLimit`).
    Rls,
    /// Tollgate's `CheckRateLimit`.
    Check,
}

snake_label!(Api {
    Rls => "rls",
    Check => "check",
});

/// A request's result as the API answered it.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum ApiResult {
    /// Admitted.
    Ok,
    /// Denied (over a limit, or failed closed).
    OverLimit,
    /// Refused as unreadable (INVALID_ARGUMENT).
    Invalid,
}

snake_label!(ApiResult {
    Ok => "ok",
    OverLimit => "over_limit",
    Invalid => "invalid",
});

impl ApiResult {
    /// The result of a decision that admitted (or not).
    pub fn of(allowed: bool) -> Self {
        if allowed {
            ApiResult::Ok
        } else {
            ApiResult::OverLimit
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ApiLabels {
    pub(super) api: Api,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ApiResultLabels {
    pub(super) api: Api,
    pub(super) result: ApiResult,
}
