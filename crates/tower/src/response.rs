//! The answers the layer writes itself: 429 with `Retry-After`, the rate-limit headers,
//! `Cache-Control: no-store` and an `application/problem+json` body (RFC 9457) whose type,
//! title and detail are set per rule; 400 for a request the extractor cannot read; 503 when
//! the rate limiter cannot answer and the layer fails closed.

use std::collections::HashMap;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

use crate::decide::{DecidingRule, Decision, Denial};

/// How a rule's denials read. `detail` may name `{method}`, `{route}` (the template, else the
/// path), `{rule}` (its name), `{quota}`, `{window}` (`minute`, `hour`, `30 seconds`...),
/// `{retry_after}` (seconds), and for a token bucket `{burst}` and `{rate}` (per second).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The problem type URI.
    pub type_uri: String,
    /// A short summary, the same for every occurrence.
    pub title: String,
    /// The explanation for this occurrence (a template).
    pub detail: String,
}

impl Default for Problem {
    /// The seed's: `POST /orders: limit of 600 requests per minute exceeded.`
    fn default() -> Self {
        Self {
            type_uri: "https://api.example.com/problems/rate-limited".into(),
            title: "Too Many Requests".into(),
            detail: "{method} {route}: limit of {quota} requests per {window} exceeded.".into(),
        }
    }
}

/// Per-rule answers: the problem a denial reads as, and whether an admitted response shows
/// the rate-limit headers.
#[derive(Debug, Clone, Default)]
pub struct Answers {
    default: Problem,
    per_rule: HashMap<String, Problem>,
    hidden: Vec<String>,
}

impl Answers {
    /// The problem every rule's denials read as unless set per rule.
    pub fn default_problem(mut self, problem: Problem) -> Self {
        self.default = problem;
        self
    }

    /// The problem `rule`'s (by id) denials read as.
    pub fn problem(mut self, rule: impl Into<String>, problem: Problem) -> Self {
        self.per_rule.insert(rule.into(), problem);
        self
    }

    /// Admitted responses carry no rate-limit headers when `rule` (by id) is the one that
    /// decided (the rule closest to its limit). Denials always carry them: the client needs
    /// to know when to retry.
    pub fn hide_headers_on_allow(mut self, rule: impl Into<String>) -> Self {
        self.hidden.push(rule.into());
        self
    }

    /// Whether an admitted response shows its headers.
    pub fn shows_on_allow(&self, decision: &Decision) -> bool {
        decision
            .rule
            .as_ref()
            .is_none_or(|r| !self.hidden.contains(&r.id))
    }

    /// The problem a denial by `rule` reads as, and whether it was set for that rule.
    fn problem_for(&self, rule: Option<&DecidingRule>) -> (&Problem, bool) {
        match rule.and_then(|r| self.per_rule.get(&r.id)) {
            Some(problem) => (problem, true),
            None => (&self.default, false),
        }
    }
}

/// A window in words: `second`, `minute`, `hour`, `day`, else `N seconds`.
pub fn window_words(seconds: u64) -> String {
    match seconds {
        1 => "second".into(),
        60 => "minute".into(),
        3600 => "hour".into(),
        86_400 => "day".into(),
        s if s % 86_400 == 0 => format!("{} days", s / 86_400),
        s if s % 3600 == 0 => format!("{} hours", s / 3600),
        s if s % 60 == 0 => format!("{} minutes", s / 60),
        s => format!("{s} seconds"),
    }
}

/// What a denial's detail says about the request.
#[derive(Debug, Clone)]
pub struct RequestFacts {
    /// `POST`.
    pub method: String,
    /// The route template, else the path.
    pub route: String,
}

/// A rule's own detail is used as set; the default one, which speaks of a quota per window,
/// gives way to what fits a denial of another kind.
fn detail(problem: &Problem, own: bool, decision: &Decision, facts: &RequestFacts) -> String {
    let rule = decision.rule.as_ref();
    let retry = decision
        .retry_after
        .map(|d| d.as_micros().div_ceil(1_000_000).max(1).to_string())
        .unwrap_or_default();
    let template = match (decision.denial, rule) {
        _ if own => problem.detail.as_str(),
        // A limit of its own kind: say what it is rather than a quota it does not have.
        (Some(Denial::StoreUnavailable), _) => {
            "{method} {route}: the rate limiter cannot decide right now; retry after {retry_after} s."
        }
        (Some(Denial::CostExceedsLimit), _) => {
            "{method} {route}: this request costs more than the limit {rule} can ever admit."
        }
        (Some(Denial::Blocked), _) => "{method} {route}: blocked by {rule}.",
        (Some(Denial::Penalized), _) => {
            "{method} {route}: blocked by {rule} after repeated denials; retry after {retry_after} s."
        }
        (_, Some(r)) if r.window.is_none() => {
            "{method} {route}: {quota} requests in flight at most ({rule}); retry after {retry_after} s."
        }
        // A token bucket denies when its burst is spent, long before its sustained rate per
        // window: say what the client hit.
        (_, Some(r)) if r.token_bucket.is_some() => {
            "{method} {route}: burst of {burst} requests used up ({rule} refills {rate} per second); retry after {retry_after} s."
        }
        _ => problem.detail.as_str(),
    };
    template
        .replace("{method}", &facts.method)
        .replace("{route}", &facts.route)
        .replace("{rule}", rule.map_or("the limit", |r| r.name.as_str()))
        .replace("{quota}", &rule.map_or(0, |r| r.quota).to_string())
        .replace(
            "{window}",
            &rule
                .and_then(|r| r.window)
                .map_or_else(String::new, window_words),
        )
        .replace("{retry_after}", &retry)
        .replace(
            "{burst}",
            &rule
                .and_then(|r| r.token_bucket)
                .map_or_else(String::new, |(burst, _)| burst.to_string()),
        )
        .replace(
            "{rate}",
            &rule
                .and_then(|r| r.token_bucket)
                .map_or_else(String::new, |(_, rate)| rate_words(rate)),
        )
}

/// A rate in words: `5`, `0.5`, `2.25` (no trailing zeros).
fn rate_words(rate: f64) -> String {
    let text = format!("{rate:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn problem_json(status: StatusCode, problem: &Problem, detail: String) -> Bytes {
    let body = serde_json::json!({
        "type": problem.type_uri,
        "title": problem.title,
        "status": status.as_u16(),
        "detail": detail,
    });
    Bytes::from(body.to_string())
}

/// Appends the decision's rate-limit headers.
fn append_rate_headers(headers: &mut http::HeaderMap, decision: &Decision) {
    for (name, value) in &decision.headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            headers.append(name, value);
        }
    }
}

/// The 429 for a denial.
pub fn denied(
    answers: &Answers,
    decision: &Decision,
    facts: &RequestFacts,
) -> Response<Full<Bytes>> {
    let (problem, own) = answers.problem_for(decision.rule.as_ref());
    let status = StatusCode::TOO_MANY_REQUESTS;
    let body = problem_json(status, problem, detail(problem, own, decision, facts));
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    append_rate_headers(response.headers_mut(), decision);
    response
}

/// Adds the rate-limit headers of an admitted request to its response.
pub fn add_allowed_headers<B>(response: &mut Response<B>, answers: &Answers, decision: &Decision) {
    if answers.shows_on_allow(decision) {
        append_rate_headers(response.headers_mut(), decision);
    }
}

/// A problem+json answer of the layer's own (400, 503).
pub fn plain_problem(status: StatusCode, title: &str, detail: String) -> Response<Full<Bytes>> {
    let problem = Problem {
        type_uri: "about:blank".into(),
        title: title.into(),
        detail: String::new(),
    };
    let mut response = Response::new(Full::new(problem_json(status, &problem, detail)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_read_as_words() {
        assert_eq!(window_words(60), "minute");
        assert_eq!(window_words(1), "second");
        assert_eq!(window_words(7200), "2 hours");
        assert_eq!(window_words(90), "90 seconds");
    }
}
