//! The console's pages: each handler gathers what its page shows into plain rows (text and
//! numbers, formatted here) and renders a template; the templates only lay them out, and
//! escape every value.

use std::time::Duration;

use askama::Template;
use axum::Extension;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::chart::{self, OUTCOMES};
use super::{Console, Viewer};
use crate::admin::{Clearing, clear, counter_problem, parse_descriptor, request_of};
use crate::problem::Problem;
use crate::store::OverrideBody;
use tollgate_node::rules::{Mode, RuleKind};
use tollgate_node::runtime::node::operator::Counter;

/// What every signed-in page shows around its content.
#[derive(Debug, Clone)]
pub(super) struct Frame {
    /// Who is signed in.
    who: String,
    /// Whether they may act (a write token).
    may_act: bool,
    /// The session's CSRF token, for the page's forms.
    csrf: String,
    /// The page, for the navigation.
    page: &'static str,
}

impl Frame {
    fn of(viewer: &Viewer, page: &'static str) -> Self {
        Self {
            who: viewer.session.name.clone(),
            may_act: viewer.session.may_act(),
            csrf: viewer.session.csrf.clone(),
            page,
        }
    }
}

fn render(template: &impl Template, status: StatusCode) -> Response {
    match template.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "a console page did not render");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page did not render").into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "console/failure.html")]
struct FailurePage<'a> {
    title: &'a str,
    detail: &'a str,
}

/// A page saying what went wrong, with `status`.
pub(super) fn failure(status: StatusCode, title: &str, detail: &str) -> Response {
    render(&FailurePage { title, detail }, status)
}

fn problem_page(problem: Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::BAD_REQUEST);
    failure(status, problem.title, &problem.detail)
}

/// A duration as a person reads it: `850 ms`, `4.2 s`, `3 min 5 s`, `2 h 10 min`.
fn spoken(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", d.as_secs_f64()),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{} h {} min", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

// ---------------------------------------------------------------------------------------
// Signing in and out

#[derive(Template)]
#[template(path = "console/sign_in.html")]
struct SignInPage<'a> {
    error: Option<&'a str>,
}

pub(super) async fn sign_in_page() -> Response {
    render(&SignInPage { error: None }, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub(super) struct SignInForm {
    token: String,
}

pub(super) async fn sign_in(
    State(console): State<Console>,
    headers: axum::http::HeaderMap,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Response {
    if !super::same_origin(&headers, console.admin.tls) {
        return failure(
            StatusCode::FORBIDDEN,
            "Refused",
            "this form was not sent from this console's own pages",
        );
    }
    let Ok(Form(form)) = form else {
        return render(
            &SignInPage {
                error: Some("the form did not arrive whole; sign in again"),
            },
            StatusCode::BAD_REQUEST,
        );
    };
    let presented = format!("Bearer {}", form.token.trim());
    let found = if console.admin.tokens.any() {
        console.admin.tokens.check(Some(&presented))
    } else {
        Some(("local".to_owned(), crate::auth::Access::Write))
    };
    let Some((name, access)) = found else {
        return render(
            &SignInPage {
                error: Some("that is not one of this node's admin tokens"),
            },
            StatusCode::UNAUTHORIZED,
        );
    };
    tracing::info!(token = %name, "console sign-in");
    let (_, cookie, _) = console.sessions.start(name, access);
    let mut response = Redirect::to("/console").into_response();
    response.headers_mut().append(header::SET_COOKIE, cookie);
    response
}

/// Signing out is a link: the session cookie is `SameSite=Strict`, so another site can
/// neither send it here nor end the session.
pub(super) async fn sign_out(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let cookie = console.sessions.end(&viewer.id);
    let mut response = Redirect::to("/console/sign-in").into_response();
    response.headers_mut().append(header::SET_COOKIE, cookie);
    response
}

// ---------------------------------------------------------------------------------------
// Overview

struct ShardRow {
    shard: u16,
    breaker: &'static str,
    answering: bool,
    last_answer: String,
    failed_calls: u64,
    last_error: String,
}

struct RegionRow {
    region: String,
    peer: String,
    peer_state: &'static str,
    since_contact: String,
    lag: String,
    allowances: &'static str,
}

struct DeniedRow {
    rule: String,
    identity: String,
    denied: u64,
}

#[derive(Template)]
#[template(path = "console/overview.html")]
struct OverviewPage {
    frame: Frame,
    store_answering: bool,
    store_last_answer: String,
    breaker: &'static str,
    cluster_warning: Option<String>,
    shards: Vec<ShardRow>,
    region: Option<RegionRow>,
    rules_version: u64,
    rules_count: usize,
    rules_source: &'static str,
    rules_staleness: String,
    rules_problem: Option<String>,
    last_minute: Vec<(&'static str, u64)>,
    denials: u64,
    denied: Vec<DeniedRow>,
}

pub(super) async fn overview(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let Some(node) = &console.admin.node else {
        return failure(
            StatusCode::NOT_FOUND,
            "No node",
            "this admin port serves no node",
        );
    };
    let now = node.now_micros();
    let store = node.store();
    let shards: Vec<ShardRow> = store
        .shards()
        .iter()
        .map(|s| ShardRow {
            shard: s.shard,
            breaker: s.breaker.as_str(),
            answering: s.answering(),
            last_answer: if s.last_answer == 0 {
                "never".into()
            } else {
                format!(
                    "{} ago",
                    spoken(Duration::from_micros(now.saturating_sub(s.last_answer)))
                )
            },
            failed_calls: s.health.failed,
            last_error: s.health.last_error.clone(),
        })
        .collect();
    let region = node.region().link().map(|link| {
        let status = link.status();
        RegionRow {
            region: status.region,
            peer: status.peer,
            peer_state: status.peer_state,
            since_contact: spoken(Duration::from_millis(status.since_contact_ms)),
            lag: status.lag_ms.map_or("no batch yet".into(), |ms| {
                spoken(Duration::from_millis(ms))
            }),
            allowances: status.allowances.as_str(),
        }
    });
    let rules = node.rules();
    let set = rules.load();
    let staleness = node.metrics().rules_staleness_seconds.get();
    let report = node.operator().top_denied(20);
    let last_minute = console
        .outcomes
        .as_ref()
        .map(|o| o.last(60))
        .unwrap_or_default();
    let page = OverviewPage {
        frame: Frame::of(&viewer, "overview"),
        store_answering: shards.iter().all(|s| s.answering),
        store_last_answer: store
            .last_answer_age()
            .map_or("never".into(), |age| format!("{} ago", spoken(age))),
        breaker: store.breaker_state().as_str(),
        cluster_warning: store.cluster_settings().and_then(|s| s.warning()),
        shards,
        region,
        rules_version: set.version(),
        rules_count: set.rules().len(),
        rules_source: rules.source(),
        rules_staleness: if staleness <= 0 {
            "current".into()
        } else {
            format!("{} behind", spoken(Duration::from_secs(staleness as u64)))
        },
        rules_problem: rules.problem(),
        last_minute: OUTCOMES
            .iter()
            .zip(last_minute)
            .map(|((name, _), n)| (*name, n))
            .collect(),
        denials: report.denials,
        denied: report
            .overall
            .into_iter()
            .map(|d| DeniedRow {
                rule: d.rule,
                identity: d.identity,
                denied: d.denied,
            })
            .collect(),
    };
    render(&page, StatusCode::OK)
}

/// The chart of the last ten minutes' decisions, as an SVG image.
pub(super) async fn chart(State(console): State<Console>) -> Response {
    let seconds = console
        .outcomes
        .as_ref()
        .map(|o| o.seconds())
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("image/svg+xml"),
        )],
        chart::svg(&seconds),
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------
// Rules

struct RuleRow {
    id: String,
    domain: String,
    origin: String,
    mode: &'static str,
    limit: String,
    fail_mode: &'static str,
    overridden: Option<String>,
}

fn limit_text(kind: &RuleKind) -> String {
    match kind {
        RuleKind::Unlimited => "unlimited".into(),
        RuleKind::Block(window) => format!("always denied, per {}", spoken(*window)),
        RuleKind::Limited(l) => {
            let mut text = format!("{} {}", l.algorithm().as_str(), l.capacity());
            if let Some(w) = l.window() {
                text.push_str(&format!(" per {}", spoken(w)));
            }
            if let Some(rate) = l.refill_per_second() {
                text.push_str(&format!(", refill {rate}/s"));
            }
            if let Some(ttl) = l.slot_ttl() {
                text.push_str(&format!(", slots held up to {}", spoken(ttl)));
            }
            text
        }
    }
}

/// The rules this node knows: those it enforces (ENFORCE or SHADOW), and those a mode override
/// names (a DISABLED rule is compiled out, but its override remembers it).
fn rule_rows(console: &Console) -> Vec<RuleRow> {
    let Some(node) = &console.admin.node else {
        return vec![];
    };
    let active = node.rules();
    let set = active.load();
    let overrides = active.overrides();
    let override_of = |id: &str| {
        overrides.iter().find(|o| o.by.id == id).map(|o| {
            format!(
                "{}{}",
                o.by.mode.as_str(),
                o.by.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            )
        })
    };
    let mut rows: Vec<RuleRow> = set
        .rules()
        .iter()
        .map(|r| RuleRow {
            id: r.id.clone(),
            domain: r.domain.clone(),
            origin: r.origin.clone(),
            mode: r.mode.as_str(),
            limit: limit_text(&r.kind),
            fail_mode: r.fail_mode.as_str(),
            overridden: override_of(&r.id),
        })
        .collect();
    for o in &overrides {
        if o.by.mode == Mode::Disabled
            && let Some(origin) = &o.rule_origin
            && !rows.iter().any(|r| r.id == o.by.id)
        {
            rows.push(RuleRow {
                id: o.by.id.clone(),
                domain: active.rule_domain(&o.by.id).unwrap_or_else(|| "–".into()),
                origin: origin.clone(),
                mode: Mode::Disabled.as_str(),
                limit: "none while DISABLED (a disabled rule is not compiled)".into(),
                fail_mode: "–",
                overridden: override_of(&o.by.id),
            });
        }
    }
    rows.sort_by(|a, b| a.domain.cmp(&b.domain).then_with(|| a.id.cmp(&b.id)));
    rows
}

#[derive(Template)]
#[template(path = "console/rules.html")]
struct RulesPage {
    frame: Frame,
    find: String,
    version: u64,
    rows: Vec<RuleRow>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RulesQuery {
    #[serde(default)]
    find: String,
}

pub(super) async fn rules(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    query: Result<Query<RulesQuery>, QueryRejection>,
) -> Response {
    let find = query.map(|Query(q)| q.find).unwrap_or_default();
    let needle = find.trim().to_lowercase();
    let rows = rule_rows(&console)
        .into_iter()
        .filter(|r| {
            needle.is_empty()
                || r.id.to_lowercase().contains(&needle)
                || r.domain.to_lowercase().contains(&needle)
                || r.origin.to_lowercase().contains(&needle)
        })
        .collect();
    let version = console
        .admin
        .node
        .as_ref()
        .map_or(0, |n| n.rules().load().version());
    let page = RulesPage {
        frame: Frame::of(&viewer, "rules"),
        find,
        version,
        rows,
    };
    render(&page, StatusCode::OK)
}

struct HistoryRow {
    at: String,
    change: String,
    by: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "console/rule.html")]
struct RulePage {
    frame: Frame,
    rule: RuleRow,
    override_reason: Option<String>,
    override_mode: Option<&'static str>,
    override_origin: Option<String>,
    done: Option<&'static str>,
    history: Vec<HistoryRow>,
    history_error: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct DoneQuery {
    done: Option<String>,
}

pub(super) async fn rule(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    query: Result<Query<DoneQuery>, QueryRejection>,
) -> Response {
    let Some(rule) = rule_rows(&console).into_iter().find(|r| r.id == id) else {
        return failure(
            StatusCode::NOT_FOUND,
            "No such rule",
            &format!("this node has no rule {id:?}"),
        );
    };
    let applied = console
        .admin
        .node
        .as_ref()
        .and_then(|n| n.rules().overrides().into_iter().find(|o| o.by.id == id));
    let (history, history_error) = match console.admin.store.history(&id, 20).await {
        Ok(entries) => (
            entries
                .into_iter()
                .map(|e| HistoryRow {
                    at: e.changed_at,
                    change: e.change,
                    by: e.changed_by,
                    detail: e
                        .new_rule
                        .or(e.old_rule)
                        .map(|v| {
                            // A rule's change has its mode; an override's, `modeOverride`.
                            let mode = v["mode"]
                                .as_str()
                                .or(v["modeOverride"].as_str())
                                .unwrap_or_default()
                                .to_owned();
                            match v["reason"].as_str() {
                                Some(reason) => format!("{mode} ({reason})"),
                                None => mode,
                            }
                        })
                        .unwrap_or_default(),
                })
                .collect(),
            None,
        ),
        Err(e) => (vec![], Some(e.to_string())),
    };
    let done = match query.ok().and_then(|Query(q)| q.done).as_deref() {
        Some("overridden") => Some(
            "The override is stored. Every node applies it within a second, with no deploy; \
             the rule's history records who set it and why.",
        ),
        Some("lifted") => Some(
            "The override is lifted. Every node runs the rule in its own mode again within a \
             second.",
        ),
        _ => None,
    };
    let page = RulePage {
        frame: Frame::of(&viewer, "rules"),
        override_reason: applied.as_ref().and_then(|o| o.by.reason.clone()),
        override_mode: applied.as_ref().map(|o| o.by.mode.as_str()),
        override_origin: applied.as_ref().map(|o| o.by.origin.clone()),
        rule,
        done,
        history,
        history_error,
    };
    render(&page, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub(super) struct ModeForm {
    /// `override` (set `mode` with `reason`) or `lift`.
    action: String,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    confirmed: String,
}

#[derive(Template)]
#[template(path = "console/confirm.html")]
struct ConfirmPage {
    frame: Frame,
    question: String,
    consequence: String,
    action_url: String,
    fields: Vec<(&'static str, String)>,
    back: String,
}

/// The kill switch and its undoing: a mode override set (DISABLED or SHADOW, with a reason)
/// or lifted, confirmed on a page of its own before it acts.
pub(super) async fn set_mode(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    form: Result<Form<ModeForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return failure(
            StatusCode::BAD_REQUEST,
            "Incomplete form",
            "the form did not arrive whole",
        );
    };
    if let Err(e) = tollgate_node::rules::overrides::check_id(&id) {
        return failure(StatusCode::BAD_REQUEST, "Invalid rule id", e);
    }
    let back = format!("/console/rules/{}", urlencode_path(&id));
    let caller = viewer.session.name.clone();
    match form.action.as_str() {
        "override" => {
            let mode = match form.mode.parse::<Mode>() {
                Ok(m @ (Mode::Disabled | Mode::Shadow)) => m,
                _ => {
                    return failure(
                        StatusCode::BAD_REQUEST,
                        "Invalid mode",
                        "the kill switch sets DISABLED or SHADOW",
                    );
                }
            };
            let reason = form.reason.trim();
            if reason.is_empty() || reason.chars().count() > 500 {
                return failure(
                    StatusCode::BAD_REQUEST,
                    "A reason is required",
                    "say why (up to 500 characters): the rule's history keeps it",
                );
            }
            if form.confirmed != "yes" {
                let consequence = if mode == Mode::Disabled {
                    "Every node stops enforcing it within a second: what it limited passes \
                     unlimited until the override is lifted."
                } else {
                    "Every node keeps counting it but admits what it would deny (SHADOW) \
                     until the override is lifted."
                };
                return confirm(
                    &viewer,
                    format!("Set rule {id} to {} on every node?", mode.as_str()),
                    format!("{consequence} Reason recorded: {reason}"),
                    format!("{back}/mode"),
                    vec![
                        ("action", "override".into()),
                        ("mode", mode.as_str().into()),
                        ("reason", reason.into()),
                    ],
                    back,
                );
            }
            let body = OverrideBody {
                mode: mode.as_str().into(),
                reason: Some(reason.into()),
            };
            match console
                .admin
                .store
                .set_override(&id, body, None, &caller)
                .await
            {
                Ok(_) => {
                    tracing::warn!(rule = %id, mode = mode.as_str(), by = %caller, %reason, "mode override set from the console");
                    Redirect::to(&format!("{back}?done=overridden")).into_response()
                }
                Err(e) => problem_page(e.into()),
            }
        }
        "lift" => {
            if form.confirmed != "yes" {
                return confirm(
                    &viewer,
                    format!("Lift the override of rule {id}?"),
                    "Every node runs the rule in its own mode again within a second.".into(),
                    format!("{back}/mode"),
                    vec![("action", "lift".into())],
                    back,
                );
            }
            match console.admin.store.lift_override(&id, None, &caller).await {
                Ok(_) => {
                    tracing::warn!(rule = %id, by = %caller, "mode override lifted from the console");
                    Redirect::to(&format!("{back}?done=lifted")).into_response()
                }
                Err(e) => problem_page(e.into()),
            }
        }
        other => failure(
            StatusCode::BAD_REQUEST,
            "Unknown action",
            &format!("{other:?} is not override or lift"),
        ),
    }
}

fn confirm(
    viewer: &Viewer,
    question: String,
    consequence: String,
    action_url: String,
    fields: Vec<(&'static str, String)>,
    back: String,
) -> Response {
    let page = ConfirmPage {
        frame: Frame::of(viewer, "confirm"),
        question,
        consequence,
        action_url,
        fields,
        back,
    };
    render(&page, StatusCode::OK)
}

/// A path segment percent-encoded (rule ids of envoyproxy/ratelimit rules hold `.`, `_` and
/// may hold more).
fn urlencode_path(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// A customer

struct CounterRow {
    rule: String,
    identity: String,
    mode: &'static str,
    algorithm: String,
    limit: String,
    remaining: String,
    reset_in: String,
    leases: String,
    held_here: u64,
    penalty: String,
    blocked: bool,
}

fn counter_row(c: &Counter) -> CounterRow {
    let or_dash = |v: Option<u64>| v.map_or("–".into(), |v| v.to_string());
    CounterRow {
        rule: c.rule.clone(),
        identity: String::from_utf8_lossy(&c.identity).into_owned(),
        mode: c.mode.as_str(),
        algorithm: c.algorithm.map_or("–".into(), |a| a.as_str().to_owned()),
        limit: or_dash(c.limit),
        remaining: or_dash(c.remaining),
        reset_in: spoken(c.reset_after),
        leases: format!(
            "{} ({} unit{})",
            c.held.leases,
            c.held.units,
            if c.held.units == 1 { "" } else { "s" }
        ),
        held_here: c.held_here,
        penalty: match &c.penalty {
            None => "no penalty box".into(),
            Some(p) if p.blocked() => format!(
                "blocked for {} ({} denials counted)",
                spoken(p.blocked_for),
                p.denials
            ),
            Some(p) => format!("not blocked ({} denials counted)", p.denials),
        },
        blocked: c.penalty.as_ref().is_some_and(|p| p.blocked()),
    }
}

struct ChangeRow {
    rule: String,
    identity: String,
    existed: bool,
}

#[derive(Template)]
#[template(path = "console/customer.html")]
struct CustomerPage {
    frame: Frame,
    domain: String,
    descriptor: String,
    entries: Vec<(String, String)>,
    counters: Vec<CounterRow>,
    error: Option<String>,
    /// Whether the page answers a reset or a lift (`changes` says what it changed).
    done: bool,
    /// A reset (else a lift).
    was_reset: bool,
    changes: Vec<ChangeRow>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct CustomerQuery {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptor: String,
}

async fn customer_page(
    console: &Console,
    viewer: &Viewer,
    query: CustomerQuery,
    done: Option<Clearing>,
    changes: Vec<ChangeRow>,
) -> Response {
    let mut page = CustomerPage {
        frame: Frame::of(viewer, "customer"),
        domain: query.domain.trim().to_owned(),
        descriptor: query.descriptor.trim().to_owned(),
        entries: vec![],
        counters: vec![],
        error: None,
        done: done.is_some(),
        was_reset: done == Some(Clearing::Counters),
        changes,
    };
    if page.domain.is_empty() && page.descriptor.is_empty() {
        return render(&page, StatusCode::OK);
    }
    let looked_up = async {
        let node = console
            .admin
            .node
            .as_ref()
            .ok_or_else(|| Problem::not_found("this admin port serves no node"))?;
        if page.domain.is_empty() {
            return Err(Problem::invalid("domain", "is required"));
        }
        let entries = parse_descriptor(&page.descriptor)?;
        let request = request_of(&page.domain, entries.clone())?;
        let counters = node
            .operator()
            .counters(&request)
            .await
            .map_err(counter_problem)?;
        Ok((entries, counters))
    };
    let status = match looked_up.await {
        Ok((entries, counters)) => {
            page.entries = entries;
            page.counters = counters.iter().map(counter_row).collect();
            StatusCode::OK
        }
        Err(problem) => {
            page.error = Some(problem.detail);
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::BAD_REQUEST)
        }
    };
    render(&page, status)
}

pub(super) async fn customer(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    query: Result<Query<CustomerQuery>, QueryRejection>,
) -> Response {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    customer_page(&console, &viewer, query, None, vec![]).await
}

#[derive(Debug, Deserialize)]
pub(super) struct ClearForm {
    domain: String,
    descriptor: String,
    /// `reset` (the counters, a block included) or `lift` (only penalty blocks).
    what: String,
    /// One rule's id; empty: every matched rule.
    #[serde(default)]
    rule: String,
    #[serde(default)]
    confirmed: String,
}

/// Reset a customer's counters or lift their penalty blocks, confirmed on a page of its own,
/// then shown with what it changed and the counters as they are after it.
pub(super) async fn clear_counters(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    form: Result<Form<ClearForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return failure(
            StatusCode::BAD_REQUEST,
            "Incomplete form",
            "the form did not arrive whole",
        );
    };
    let clearing = match form.what.as_str() {
        "reset" => Clearing::Counters,
        "lift" => Clearing::Penalties,
        other => {
            return failure(
                StatusCode::BAD_REQUEST,
                "Unknown action",
                &format!("{other:?} is not reset or lift"),
            );
        }
    };
    let entries = match parse_descriptor(&form.descriptor) {
        Ok(entries) => entries,
        Err(problem) => return problem_page(problem),
    };
    let rule = Some(form.rule.trim()).filter(|r| !r.is_empty());
    let scope = rule.map_or("every rule that matches it".to_owned(), |r| {
        format!("rule {r}")
    });
    let described: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if form.confirmed != "yes" {
        let (question, consequence) = match clearing {
            Clearing::Counters => (
                format!(
                    "Reset the counters of {} in {} for {scope}?",
                    described.join(", "),
                    form.domain
                ),
                "The store forgets the buckets (a penalty block included) and every node drops \
                 what it holds of them: the customer starts again with full limits. Each \
                 rule's history records it.",
            ),
            Clearing::Penalties => (
                format!(
                    "Lift the penalty blocks of {} in {} for {scope}?",
                    described.join(", "),
                    form.domain
                ),
                "The blocks end on every node; the counters stay as they are.",
            ),
        };
        let back = format!(
            "/console/customer?{}",
            serde_urlencoded::to_string([
                ("domain", form.domain.as_str()),
                ("descriptor", form.descriptor.as_str()),
            ])
            .unwrap_or_default()
        );
        return confirm(
            &viewer,
            question,
            consequence.into(),
            "/console/customer/clear".into(),
            vec![
                ("domain", form.domain.clone()),
                ("descriptor", form.descriptor.clone()),
                ("what", form.what.clone()),
                ("rule", form.rule.clone()),
            ],
            back,
        );
    }
    let cleared = clear(
        &console.admin,
        &viewer.session.name,
        form.domain.trim(),
        entries,
        rule,
        clearing,
    )
    .await;
    match cleared {
        Ok(resets) => {
            let changes = resets
                .iter()
                .map(|r| ChangeRow {
                    rule: r.rule.clone(),
                    identity: String::from_utf8_lossy(&r.identity).into_owned(),
                    existed: r.existed,
                })
                .collect();
            let query = CustomerQuery {
                domain: form.domain,
                descriptor: form.descriptor,
            };
            customer_page(&console, &viewer, query, Some(clearing), changes).await
        }
        Err(problem) => problem_page(problem),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The overview of a node in two regions with a shard down: the region card and the
    /// shard's error are shown, and markup in any value (an error text here) is escaped.
    #[test]
    fn the_overview_shows_a_region_link_and_a_failing_shard_escaped() {
        let frame = Frame {
            who: "dash".into(),
            may_act: false,
            csrf: "c".into(),
            page: "overview",
        };
        let page = OverviewPage {
            frame,
            store_answering: false,
            store_last_answer: "4.0 s ago".into(),
            breaker: "open",
            cluster_warning: None,
            shards: vec![ShardRow {
                shard: 5461,
                breaker: "open",
                answering: false,
                last_answer: "4.0 s ago".into(),
                failed_calls: 12,
                last_error: "<b>connection refused</b>".into(),
            }],
            region: Some(RegionRow {
                region: "us".into(),
                peer: "eu".into(),
                peer_state: "down",
                since_contact: "9.5 s".into(),
                lag: "no batch yet".into(),
                allowances: "held",
            }),
            rules_version: 7,
            rules_count: 3,
            rules_source: "postgres",
            rules_staleness: "current".into(),
            rules_problem: None,
            last_minute: vec![("admitted", 10), ("denied", 2)],
            denials: 2,
            denied: vec![],
        };
        let html = page.render().expect("renders");
        assert!(html.contains("not answering"), "{html}");
        assert!(html.contains("<td>5461</td>"));
        assert!(
            html.contains("&#60;b&#62;connection refused&#60;/b&#62;"),
            "{html}"
        );
        assert!(!html.contains("<b>connection"));
        assert!(html.contains("<dd>eu (down)</dd>") && html.contains("<dd>no batch yet</dd>"));
        assert!(
            !html.contains("<form"),
            "a read session's overview has no form"
        );
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(spoken(Duration::from_millis(850)), "850 ms");
        assert_eq!(spoken(Duration::from_millis(4_200)), "4.2 s");
        assert_eq!(spoken(Duration::from_secs(185)), "3 min 5 s");
        assert_eq!(spoken(Duration::from_secs(7_800)), "2 h 10 min");
        assert_eq!(urlencode_path("a.b/c d"), "a.b%2Fc%20d");
    }
}
