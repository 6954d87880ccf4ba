//! What happened to a request at one rule, and why a rule denied it: the words every answer
//! and every metric label use.

/// What happened to a request at one rule.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted by the rule.
    Allowed,
    /// Denied by the rule.
    Denied,
    /// A SHADOW rule would have denied.
    ShadowDenied,
    /// The store failed and the rule's OPEN fail mode admitted.
    FailedOpen,
    /// The store failed and the rule's CLOSED fail mode denied.
    FailedClosed,
    /// The store failed and the rule's LOCAL fallback bucket decided.
    LocalFallback,
}

/// Why a rule denied a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// Over the limit: the request fits again after `retry_after`.
    OverLimit,
    /// The store could not answer and the rule fails closed. `retry_after` is when the node
    /// next tries the store.
    StoreUnavailable,
    /// The request's cost is more than the limit can ever admit: retrying cannot help.
    CostExceedsLimit,
    /// The rule admits nothing (envoyproxy/ratelimit `requests_per_unit: 0`): retrying
    /// cannot help.
    Blocked,
    /// The identity is in the rule's penalty box (denied too often): it is admitted again
    /// when the block ends, `retry_after` from now.
    Penalized,
}

impl Denial {
    /// Whether waiting can ever make the request fit.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Denial::OverLimit | Denial::StoreUnavailable | Denial::Penalized
        )
    }

    /// The name APIs use (`tollgate-reason` header, `CheckRateLimit`'s `reason`).
    pub fn as_str(self) -> &'static str {
        match self {
            Denial::OverLimit => "over-limit",
            Denial::StoreUnavailable => "store-unavailable",
            Denial::CostExceedsLimit => "cost-exceeds-limit",
            Denial::Blocked => "blocked",
            Denial::Penalized => "penalized",
        }
    }
}
