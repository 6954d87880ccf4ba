//! The rules, one rule with its history, and the kill switch (a mode override set or lifted).

use askama::Template;
use axum::Extension;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{Frame, confirm, failure, incomplete_form, problem_page, render, spoken};
use crate::console::{Console, Viewer};
use crate::store::OverrideBody;
use tollgate_node::rules::{Mode, RuleKind};

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
pub(in crate::console) struct RulesQuery {
    #[serde(default)]
    find: String,
}

pub(in crate::console) async fn rules(
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
pub(in crate::console) struct DoneQuery {
    done: Option<String>,
}

pub(in crate::console) async fn rule(
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
pub(in crate::console) struct ModeForm {
    /// `override` (set `mode` with `reason`) or `lift`.
    action: String,
    #[serde(default)]
    mode: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    confirmed: String,
}

/// The kill switch and its undoing: a mode override set (DISABLED or SHADOW, with a reason)
/// or lifted, confirmed on a page of its own before it acts.
pub(in crate::console) async fn set_mode(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    form: Result<Form<ModeForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return incomplete_form();
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

#[cfg(test)]
mod tests {
    use super::urlencode_path;

    #[test]
    fn a_rule_id_is_one_path_segment_in_a_link() {
        assert_eq!(urlencode_path("a.b/c d"), "a.b%2Fc%20d");
    }
}
