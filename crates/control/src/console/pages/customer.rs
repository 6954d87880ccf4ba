//! A customer: a descriptor's live counters, and their reset or a penalty block's lift.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::{Frame, confirm, failure, incomplete_form, problem_page, render, spoken};
use crate::admin::{Clearing, clear, counter_problem, parse_descriptor, request_of};
use crate::console::{Console, Viewer};
use crate::problem::Problem;
use tollgate_node::runtime::node::operator::Counter;

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
pub(in crate::console) struct CustomerQuery {
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

pub(in crate::console) async fn customer(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    query: Result<Query<CustomerQuery>, QueryRejection>,
) -> Response {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    customer_page(&console, &viewer, query, None, vec![]).await
}

#[derive(Debug, Deserialize)]
pub(in crate::console) struct ClearForm {
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
pub(in crate::console) async fn clear_counters(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    form: Result<Form<ClearForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return incomplete_form();
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
