//! The overview: the store, the region link, the rules, the chart and the most-denied keys.

use std::time::Duration;

use askama::Template;
use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{Frame, failure, render, spoken};
use crate::console::chart::{self, OUTCOMES};
use crate::console::{Console, Viewer};

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

pub(in crate::console) async fn overview(
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
pub(in crate::console) async fn chart(State(console): State<Console>) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use askama::Template;

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
}
