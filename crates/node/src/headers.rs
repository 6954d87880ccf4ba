//! Rate-limit response headers: the IETF draft's `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-10), the `X-RateLimit-Limit/Remaining/Reset` trio
//! existing clients read (Envoy's draft-03 form), and `Retry-After` on a denial.
//!
//! ```text
//! ratelimit-policy: "gold-orders";q=600;w=60
//! ratelimit: "gold-orders";r=0;t=2
//! retry-after: 2
//! ```

use std::time::Duration;

use tollgate_lease::{Algorithm, Limit};

use crate::rules::{CompiledRule, RuleKind};
use crate::runtime::{RuleStatus, Verdict};

/// A quota as the headers state it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The policy name.
    pub name: String,
    /// Quota units per window.
    pub quota: u64,
    /// Window, seconds (absent for concurrency).
    pub window: Option<u64>,
    /// Quota unit when not requests.
    pub unit: Option<&'static str>,
}

/// Seconds, rounded up (the headers carry whole seconds).
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_micros().div_ceil(1_000_000) as u64
}

/// How a rule's limit reads as a quota policy. A token bucket is stated as its sustained rate
/// per minute when that is a whole number (the seed's `q=600;w=60` for 10 per second), else
/// per second, else as its burst over its refill time.
pub fn policy(rule: &CompiledRule) -> Option<Policy> {
    policy_for(rule, rule.limit())
}

/// The quota policy of a decision: the rule's, stated with the limit that decided it (the
/// home region's whole limit for a forwarded decision, this region's share otherwise).
pub fn status_policy(status: &RuleStatus) -> Option<Policy> {
    policy_for(&status.rule, status.limit)
}

fn policy_for(rule: &CompiledRule, limit: Option<Limit>) -> Option<Policy> {
    let name = rule.name.clone();
    match (rule.kind, limit) {
        (RuleKind::Unlimited, _) => None,
        (RuleKind::Block(window), _) => Some(Policy {
            name,
            quota: 0,
            window: Some(ceil_secs(window).max(1)),
            unit: None,
        }),
        (RuleKind::Limited(_), None) => None,
        (RuleKind::Limited(_), Some(limit)) => Some(match limit.algorithm() {
            Algorithm::TokenBucket => {
                let rate = limit.refill_per_second().unwrap_or(1.0);
                let per_minute = rate * 60.0;
                if per_minute >= 1.0 && per_minute.fract() == 0.0 {
                    Policy {
                        name,
                        quota: per_minute as u64,
                        window: Some(60),
                        unit: None,
                    }
                } else if rate >= 1.0 && rate.fract() == 0.0 {
                    Policy {
                        name,
                        quota: rate as u64,
                        window: Some(1),
                        unit: None,
                    }
                } else {
                    let fill = (limit.capacity() as f64 / rate).ceil().max(1.0) as u64;
                    Policy {
                        name,
                        quota: limit.capacity(),
                        window: Some(fill),
                        unit: None,
                    }
                }
            }
            Algorithm::Concurrency => Policy {
                name,
                quota: limit.capacity(),
                window: None,
                unit: Some("concurrent-requests"),
            },
            _ => Policy {
                name,
                quota: limit.capacity(),
                window: Some(ceil_secs(limit.window().unwrap_or_default()).max(1)),
                unit: None,
            },
        }),
    }
}

/// A string as a Structured Field String: quotes and backslashes escaped, anything outside
/// printable ASCII replaced.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

fn policy_item(p: &Policy) -> String {
    let mut item = format!("{};q={}", sf_string(&p.name), p.quota);
    if let Some(unit) = p.unit {
        item.push_str(&format!(";qu=\"{unit}\""));
    }
    if let Some(w) = p.window {
        item.push_str(&format!(";w={w}"));
    }
    item
}

/// Seconds until more quota is available: the retry-after when denied, else the reset.
fn t_of(s: &RuleStatus) -> u64 {
    ceil_secs(if s.allowed {
        s.reset_after
    } else {
        s.retry_after
    })
}

/// The header saying why a request was denied (beside Retry-After, which is absent when no
/// wait can help): `over-limit`, `store-unavailable`, `cost-exceeds-limit`, `blocked`.
pub const REASON_HEADER: &str = "tollgate-reason";

/// The headers for a decision. Only ENFORCE rules appear: SHADOW rules show in metrics and
/// logs, never to clients.
pub fn headers(verdict: &Verdict) -> Vec<(&'static str, String)> {
    let mut seen = vec![];
    let mut policies = vec![];
    let mut limits = vec![];
    for s in verdict.statuses.iter().filter(|s| s.shown()) {
        let Some(p) = status_policy(s) else { continue };
        if seen.contains(&&s.rule.key) {
            continue;
        }
        seen.push(&s.rule.key);
        let remaining = if s.allowed { s.remaining } else { 0 };
        let t = t_of(s);
        let mut item = format!("{};r={remaining}", sf_string(&p.name));
        if t > 0 {
            item.push_str(&format!(";t={t}"));
        }
        limits.push((item, p.clone(), remaining, t, s.allowed));
        policies.push(policy_item(&p));
    }
    let mut out = vec![];
    if let Some(denial) = verdict.denial() {
        out.push((REASON_HEADER, denial.as_str().to_owned()));
        if denial.retryable() {
            out.push((
                "retry-after",
                ceil_secs(verdict.retry_after).max(1).to_string(),
            ));
        }
    }
    if policies.is_empty() {
        return out;
    }
    out.push(("ratelimit-policy", policies.join(", ")));
    out.push((
        "ratelimit",
        limits
            .iter()
            .map(|l| l.0.clone())
            .collect::<Vec<_>>()
            .join(", "),
    ));
    // The X- trio describes the one limit that decides: a denying one, else the closest.
    let decisive = limits
        .iter()
        .filter(|l| !l.4)
        .max_by_key(|l| l.3)
        .or_else(|| limits.iter().min_by_key(|l| l.2))
        .expect("at least one limit");
    let mut limit_header = decisive.1.quota.to_string();
    for (_, p, _, _, _) in &limits {
        limit_header.push_str(&format!(", {}", p.quota));
        if let Some(w) = p.window {
            limit_header.push_str(&format!(";w={w}"));
        }
        limit_header.push_str(&format!(";name={}", sf_string(&p.name)));
    }
    out.push(("x-ratelimit-limit", limit_header));
    out.push(("x-ratelimit-remaining", decisive.2.to_string()));
    out.push(("x-ratelimit-reset", decisive.3.to_string()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metrics, Outcome};
    use crate::rules::set::RuleSet;
    use crate::rules::source::parse;
    use std::sync::Arc;

    fn rule(yaml: &str) -> Arc<CompiledRule> {
        let loaded = parse(yaml, std::path::Path::new("t.yaml")).expect("rules");
        let set =
            RuleSet::compile(&loaded.native, &loaded.envoy, 1, &Metrics::new()).expect("compiles");
        set.rules()[0].clone()
    }

    #[test]
    fn the_seed_example_headers() {
        let r = rule(
            "domain: d\nrules:\n  - {id: gold-orders-create, name: gold-orders, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 10}\n",
        );
        let status = RuleStatus {
            descriptor: 0,
            also: vec![],
            limit: r.limit(),
            rule: r,
            allowed: false,
            remaining: 0,
            retry_after: Duration::from_millis(1500),
            reset_after: Duration::from_secs(10),
            denial: Some(crate::runtime::verdict::Denial::OverLimit),
            outcome: Some(Outcome::Denied),
        };
        let verdict = Verdict {
            allowed: false,
            retry_after: Duration::from_millis(1500),
            statuses: vec![status],
            slots: vec![],
        };
        let h = headers(&verdict);
        let get = |name| h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("ratelimit-policy"), Some("\"gold-orders\";q=600;w=60"));
        assert_eq!(get("ratelimit"), Some("\"gold-orders\";r=0;t=2"));
        assert_eq!(get("retry-after"), Some("2"));
        assert_eq!(
            get("x-ratelimit-limit"),
            Some("600, 600;w=60;name=\"gold-orders\"")
        );
        assert_eq!(get("x-ratelimit-remaining"), Some("0"));
        assert_eq!(get("x-ratelimit-reset"), Some("2"));
    }

    #[test]
    fn names_cannot_break_the_structured_field() {
        assert_eq!(sf_string("a\"b\\c\u{7f}é"), "\"a\\\"b\\\\c??\"");
    }
}
