//! Rate-limit response headers: the IETF draft's `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-10), the `X-RateLimit-Limit/Remaining/Reset` trio
//! existing clients read (Envoy's draft-03 form), and `Retry-After` on a denial.
//!
//! ```text
//! ratelimit-policy: "gold-orders";q=100;w=10
//! ratelimit: "gold-orders";r=0;t=2
//! retry-after: 2
//! ```

use std::fmt::Write as _;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_lease::{Algorithm, Limit};

use crate::rules::{CompiledRule, RuleKind};
use crate::runtime::outcome::Outcome;
use crate::runtime::verdict::{RuleStatus, Verdict};

/// A quota as the headers state it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy<'a> {
    /// The policy name.
    pub name: &'a str,
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

/// How a rule's limit reads as a quota policy, recognisably the rule as written: a token bucket
/// (or GCRA) is its size over the seconds it takes to fill from empty (`capacity: 50,
/// refillPerSecond: 5` reads `q=50;w=10`: 50 at once, 5 a second); a window is its limit per
/// window; a leaky bucket its limit per its duration.
pub fn policy(rule: &CompiledRule) -> Option<Policy<'_>> {
    policy_for(rule, rule.limit())
}

/// The quota policy of a decision: the rule's, stated with the limit that decided it (the
/// home region's whole limit for a forwarded decision, this region's share otherwise).
pub fn status_policy(status: &RuleStatus) -> Option<Policy<'_>> {
    policy_for(&status.rule, status.limit)
}

fn policy_for(rule: &CompiledRule, limit: Option<Limit>) -> Option<Policy<'_>> {
    let name = rule.name.as_str();
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
            // The bucket's size over the time it takes to fill from empty: `q` is the most
            // `r` (the tokens left) can ever say, and q / w is the sustained rate exactly
            // (docs/http-edge.md: why not the rate per minute).
            Algorithm::TokenBucket | Algorithm::Gcra => {
                let rate = limit.refill_per_second().unwrap_or(1.0);
                let fill = (limit.capacity() as f64 / rate).ceil().max(1.0) as u64;
                Policy {
                    name,
                    quota: limit.capacity(),
                    window: Some(fill),
                    unit: None,
                }
            }
            Algorithm::Concurrency => Policy {
                name,
                quota: limit.capacity(),
                window: None,
                unit: Some("concurrent-requests"),
            },
            Algorithm::LeakyBucket => {
                let (quota, duration) = limit.leak().unwrap_or((limit.capacity(), Duration::ZERO));
                Policy {
                    name,
                    quota,
                    window: Some(ceil_secs(duration).max(1)),
                    unit: None,
                }
            }
            _ => Policy {
                name,
                quota: limit.capacity(),
                window: Some(ceil_secs(limit.window().unwrap_or_default()).max(1)),
                unit: None,
            },
        }),
    }
}

/// Appends `s` as a Structured Field String: quotes and backslashes escaped, anything outside
/// printable ASCII replaced.
fn push_sf_string(out: &mut String, s: &str) {
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
}

#[cfg(test)]
fn sf_string(s: &str) -> String {
    let mut out = String::new();
    push_sf_string(&mut out, s);
    out
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

/// The parts of a limit's headers that depend only on the rule and its limit, written once
/// per rule (the decision path only adds what remains and when it resets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderText {
    /// The policy name as a Structured Field String.
    name: String,
    /// Its `RateLimit-Policy` item.
    policy: String,
    /// Its part of `X-RateLimit-Limit` after the first value: `, q;w=w;name="n"`.
    x_limit: String,
    quota: u64,
}

impl HeaderText {
    fn of(p: &Policy<'_>) -> Self {
        let mut name = String::with_capacity(p.name.len() + 2);
        push_sf_string(&mut name, p.name);
        let mut policy = format!("{name};q={}", p.quota);
        if let Some(unit) = p.unit {
            let _ = write!(policy, ";qu=\"{unit}\"");
        }
        if let Some(w) = p.window {
            let _ = write!(policy, ";w={w}");
        }
        let mut x_limit = format!(", {}", p.quota);
        if let Some(w) = p.window {
            let _ = write!(x_limit, ";w={w}");
        }
        let _ = write!(x_limit, ";name={name}");
        Self {
            name,
            policy,
            x_limit,
            quota: p.quota,
        }
    }

    /// The text for `status`: its rule's, written once, unless the status is measured
    /// against another limit (a forwarded decision's whole limit).
    fn for_status(status: &RuleStatus) -> Option<std::borrow::Cow<'_, HeaderText>> {
        let rule = &status.rule;
        if status.limit == rule.limit() {
            rule.header_text
                .get_or_init(|| policy(rule).as_ref().map(HeaderText::of))
                .as_ref()
                .map(std::borrow::Cow::Borrowed)
        } else {
            status_policy(status).map(|p| std::borrow::Cow::Owned(HeaderText::of(&p)))
        }
    }
}

/// One limit as the headers show it.
struct Shown<'a> {
    key: &'a str,
    text: std::borrow::Cow<'a, HeaderText>,
    remaining: u64,
    t: u64,
    allowed: bool,
    /// Decided on what the store said (not admitted by an OPEN fail mode without it).
    known: bool,
}

/// Whether an answer carries `X-RateLimit-Limit`, `-Remaining` and `-Reset` (Envoy's
/// `DRAFT_VERSION_03` form) beside `RateLimit` and `RateLimit-Policy`. An Envoy that builds
/// them itself from the descriptor statuses (`enable_x_ratelimit_headers`) would otherwise
/// send each twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XRateLimitHeaders {
    /// Sent (the default).
    #[default]
    Send,
    /// Left out.
    Omit,
}

/// The headers for a decision. Only ENFORCE rules appear: SHADOW rules show in metrics and
/// logs, never to clients. What depends on the rule alone is written once per rule.
pub fn headers(verdict: &Verdict) -> Vec<(&'static str, String)> {
    let mut out = Vec::with_capacity(7);
    write_headers(verdict, XRateLimitHeaders::Send, |name, value| {
        out.push((name, value))
    });
    out
}

/// [`headers`], handed to `add` one by one (the gRPC answer builds its own header values from
/// them without an intermediate list), with or without the X-RateLimit trio.
pub fn write_headers(
    verdict: &Verdict,
    x_ratelimit: XRateLimitHeaders,
    mut add: impl FnMut(&'static str, String),
) {
    // A request rarely matches more than a few rules: those stay off the heap.
    let mut shown: SmallVec<[Shown<'_>; 4]> = SmallVec::new();
    for s in verdict.statuses.iter().filter(|s| s.shown()) {
        if shown.iter().any(|l| l.key == s.rule.key) {
            continue;
        }
        let Some(text) = HeaderText::for_status(s) else {
            continue;
        };
        shown.push(Shown {
            key: &s.rule.key,
            text,
            remaining: if s.allowed { s.remaining } else { 0 },
            t: t_of(s),
            allowed: s.allowed,
            known: s.outcome != Some(Outcome::FailedOpen),
        });
    }
    if let Some(denial) = verdict.denial() {
        add(REASON_HEADER, denial.as_str().to_owned());
        if denial.retryable() {
            add(
                "retry-after",
                ceil_secs(verdict.retry_after).max(1).to_string(),
            );
        }
    }
    if shown.is_empty() {
        return;
    }
    let (policies, mut limits) = if let [one] = &shown[..] {
        (
            one.text.policy.clone(),
            String::with_capacity(one.text.name.len() + 24),
        )
    } else {
        let mut policies =
            String::with_capacity(shown.iter().map(|l| l.text.policy.len() + 2).sum());
        for (i, l) in shown.iter().enumerate() {
            if i > 0 {
                policies.push_str(", ");
            }
            policies.push_str(&l.text.policy);
        }
        (policies, String::with_capacity(shown.len() * 40))
    };
    add("ratelimit-policy", policies);
    // A rule that admitted without the store knows nothing of what is left: its policy is
    // shown, never a remaining it does not know.
    shown.retain(|l| l.known);
    if shown.is_empty() {
        return;
    }
    for (i, l) in shown.iter().enumerate() {
        if i > 0 {
            limits.push_str(", ");
        }
        limits.push_str(&l.text.name);
        let _ = write!(limits, ";r={}", l.remaining);
        if l.t > 0 {
            let _ = write!(limits, ";t={}", l.t);
        }
    }
    add("ratelimit", limits);
    if x_ratelimit == XRateLimitHeaders::Omit {
        return;
    }
    // The X- trio describes the one limit that decides: a denying one, else the closest.
    let decisive = shown
        .iter()
        .filter(|l| !l.allowed)
        .max_by_key(|l| l.t)
        .or_else(|| shown.iter().min_by_key(|l| l.remaining))
        .expect("at least one limit");
    let x_len: usize = shown.iter().map(|l| l.text.x_limit.len()).sum();
    let mut limit_header = String::with_capacity(x_len + 20);
    let _ = write!(limit_header, "{}", decisive.text.quota);
    for l in &shown {
        limit_header.push_str(&l.text.x_limit);
    }
    add("x-ratelimit-limit", limit_header);
    add("x-ratelimit-remaining", decisive.remaining.to_string());
    add("x-ratelimit-reset", decisive.t.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::rules::set::RuleSet;
    use crate::rules::source::parse;
    use crate::runtime::outcome::Outcome;
    use std::sync::Arc;

    fn rule(yaml: &str) -> Arc<CompiledRule> {
        let loaded = parse(yaml, std::path::Path::new("t.yaml")).expect("rules");
        let set =
            RuleSet::compile(&loaded.native, &loaded.envoy, 1, &Metrics::new()).expect("compiles");
        set.rules()[0].clone()
    }

    #[test]
    fn gcra_reads_as_its_burst_over_its_fill_time_and_a_leaky_bucket_as_its_limit_per_duration() {
        let gcra =
            rule("domain: d\nrules:\n  - {id: g, algorithm: GCRA, burst: 20, ratePerSecond: 5}\n");
        let p = policy(&gcra).expect("policy");
        assert_eq!((p.quota, p.window), (20, Some(4)));
        // A fill time that is not whole is rounded up: the rate stated is never above the
        // rule's.
        let slow = rule(
            "domain: d\nrules:\n  - {id: t, algorithm: TOKEN_BUCKET, capacity: 100, refillPerSecond: 3}\n",
        );
        let p = policy(&slow).expect("policy");
        assert_eq!((p.quota, p.window), (100, Some(34)));
        let leaky = rule(
            "domain: d\nrules:\n  - {id: l, algorithm: LEAKY_BUCKET, limit: 30, duration: 1m, burst: 10}\n",
        );
        let p = policy(&leaky).expect("policy");
        assert_eq!((p.quota, p.window), (30, Some(60)));
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
            on_last_answer: false,
        };
        let verdict = Verdict {
            allowed: false,
            retry_after: Duration::from_millis(1500),
            statuses: vec![status],
            slots: vec![],
        };
        let h = headers(&verdict);
        let get = |name| h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
        // The seed's rule as written: 100 at once, 10 a second (the seed's example said
        // q=600;w=60, whose q the remaining r = 0..100 can never reach).
        assert_eq!(get("ratelimit-policy"), Some("\"gold-orders\";q=100;w=10"));
        assert_eq!(get("ratelimit"), Some("\"gold-orders\";r=0;t=2"));
        assert_eq!(get("retry-after"), Some("2"));
        assert_eq!(
            get("x-ratelimit-limit"),
            Some("100, 100;w=10;name=\"gold-orders\"")
        );
        assert_eq!(get("x-ratelimit-remaining"), Some("0"));
        assert_eq!(get("x-ratelimit-reset"), Some("2"));
    }

    #[test]
    fn an_admission_without_the_store_shows_no_remaining_it_does_not_know() {
        let r = rule(
            "domain: d\nrules:\n  - {id: w, algorithm: FIXED_WINDOW, limit: 10, window: 60s}\n",
        );
        let status = |outcome| RuleStatus {
            descriptor: 0,
            also: vec![],
            limit: r.limit(),
            rule: r.clone(),
            allowed: true,
            remaining: 0,
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
            denial: None,
            outcome: Some(outcome),
            on_last_answer: false,
        };
        let verdict = |outcome| Verdict {
            allowed: true,
            retry_after: Duration::ZERO,
            statuses: vec![status(outcome)],
            slots: vec![],
        };
        let failed_open = headers(&verdict(Outcome::FailedOpen));
        assert_eq!(
            failed_open,
            vec![("ratelimit-policy", "\"w\";q=10;w=60".to_owned())],
            "the policy, and nothing said of what is left"
        );
        let counted = headers(&verdict(Outcome::Allowed));
        assert!(
            counted
                .iter()
                .any(|(n, v)| *n == "ratelimit" && v == "\"w\";r=0"),
            "{counted:?}"
        );
    }

    #[test]
    fn names_cannot_break_the_structured_field() {
        assert_eq!(sf_string("a\"b\\c\u{7f}é"), "\"a\\\"b\\\\c??\"");
    }
}
