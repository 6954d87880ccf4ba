//! The console's pages: each handler gathers what its page shows into plain rows (text and
//! numbers, formatted here) and renders a template; the templates only lay them out, and
//! escape every value. One module a page: [`sign_in`], [`overview`], [`rules`] (the kill
//! switch too) and [`customer`]; what they share is here.

mod customer;
mod overview;
mod rules;
mod sign_in;

pub(super) use customer::{clear_counters, customer};
pub(super) use overview::{chart, overview};
pub(super) use rules::{rule, rules, set_mode};
pub(super) use sign_in::{sign_in, sign_in_page, sign_out};

use std::time::Duration;

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use super::Viewer;
use crate::problem::Problem;

/// What every signed-in page shows around its content.
#[derive(Debug, Clone)]
struct Frame {
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

/// A page that asks before an action: what it asks, what will happen, and a form that posts
/// `fields` to `action_url` with `confirmed=yes` (and a way `back`).
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

/// A form that did not parse.
fn incomplete_form() -> Response {
    failure(
        StatusCode::BAD_REQUEST,
        "Incomplete form",
        "the form did not arrive whole",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(spoken(Duration::from_millis(850)), "850 ms");
        assert_eq!(spoken(Duration::from_millis(4_200)), "4.2 s");
        assert_eq!(spoken(Duration::from_secs(185)), "3 min 5 s");
        assert_eq!(spoken(Duration::from_secs(7_800)), "2 h 10 min");
    }
}
