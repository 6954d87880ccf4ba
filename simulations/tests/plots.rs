//! The plots a person reads: a line per outcome, fault windows coloured by kind with their
//! legend beside the data, failovers marked, a panel per region, and HTML pages with real
//! tables. Each picture is rendered to PNG with `rsvg-convert`, as someone looking at it
//! would, and must come out as a real image.

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate_simulations::{Report, Scenario, plot, run, sweep};

fn library() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// The library's scenario `name`, shortened to `seconds` when given, run with seed 1.
fn report_of(name: &str, seconds: Option<u64>) -> Report {
    let path = library().join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).expect("scenario");
    let scenario = match seconds {
        Some(s) => sweep::variant(&text, name, "duration", &format!("{s}s")).expect("variant"),
        None => Scenario::parse(&text, name).expect("scenario"),
    };
    run(&scenario, 1, &mut |_| {}).expect("runs")
}

/// Renders `svg` to PNG with rsvg-convert: the image's bytes.
fn png(svg: &Path) -> Vec<u8> {
    let out = svg.with_extension("png");
    let status = Command::new("rsvg-convert")
        .arg(svg)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("rsvg-convert runs (scripts/test installs librsvg2-bin)");
    assert!(status.success(), "rsvg-convert {}: {status}", svg.display());
    let bytes = std::fs::read(&out).expect("png");
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is a PNG",
        out.display()
    );
    assert!(
        bytes.len() > 10_000,
        "{} has a picture in it",
        out.display()
    );
    bytes
}

#[test]
fn each_rule_has_a_line_per_outcome_and_its_faults_coloured_by_kind() {
    let report = report_of("redis-stall-fail-modes", None);
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("stall.svg");
    plot::write(&report, &path).expect("draws");
    let svg = std::fs::read_to_string(&path).expect("svg");
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    // Three rules (OPEN, CLOSED, LOCAL): the exact limiter and five outcomes each.
    assert_eq!(report.rules.len(), 3);
    assert!(
        svg.matches("<polyline").count() >= 3 * 6,
        "a line per outcome and the exact limiter, per rule"
    );
    for label in [
        "exact limiter",
        "admitted (",
        "denied (",
        "failed open (",
        "failed closed (",
        "local fallback (",
    ] {
        assert_eq!(
            svg.matches(label).count(),
            3,
            "{label} in each panel's legend"
        );
    }
    // Each outcome's total is in its legend: the CLOSED rule's fail-closed count.
    let closed = report.rules["closed"].decided.failed_closed;
    assert!(closed > 0);
    assert!(svg.contains(&format!("failed closed ({closed})")));
    // The stall is shaded in its kind's colour, and named in the legend.
    assert!(svg.contains("store stalled (eu)"));
    assert!(svg.contains("fill=\"#FDAE6B\""), "the stall's colour");
    png(&path);
}

#[test]
fn a_failover_is_marked_as_an_instant_and_the_legend_stays_beside_the_data() {
    let report = report_of("redis-failover", Some(14));
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("failover.svg");
    plot::write(&report, &path).expect("draws");
    let svg = std::fs::read_to_string(&path).expect("svg");
    assert!(svg.contains("store failover (eu)"), "named in the legend");
    assert!(
        svg.contains("stroke=\"#A63603\""),
        "a line in the failover's colour marks the instant"
    );
    // Legend text starts right of the data area (the plot's right 250 px).
    let legend_x: Vec<u32> = svg
        .split("<text")
        .filter(|t| t.contains("exact limiter"))
        .filter_map(|t| {
            let x = t.split("x=\"").nth(1)?;
            x[..x.find('"')?].parse().ok()
        })
        .collect();
    assert!(!legend_x.is_empty(), "the legend has text");
    assert!(
        legend_x.iter().all(|&x| x >= 1100 - 250),
        "legend outside the data: {legend_x:?}"
    );
    png(&path);
}

#[test]
fn two_regions_get_a_panel_each_with_sync_lag_and_peer_state() {
    let report = report_of("region-partition-async", Some(40));
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("regions.svg");
    plot::write(&report, &path).expect("draws");
    let svg = std::fs::read_to_string(&path).expect("svg");
    for text in [
        "region eu",
        "region us",
        "sync lag (right axis)",
        "no node sees the peer up",
        "regions partitioned",
    ] {
        assert!(svg.contains(text), "{text}");
    }
    // The partition lasts long enough for the failure detector: peer-down seconds are shaded.
    let down = report
        .per_second
        .iter()
        .filter(|s| s.regions.values().any(|r| r.peer_up == 0))
        .count();
    assert!(down > 0, "the peer was seen down in some second");
    png(&path);
}

#[test]
fn the_html_page_has_the_plot_and_real_tables() {
    let report = report_of("redis-down", None);
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("page.html");
    plot::write(&report, &path).expect("draws");
    let page = std::fs::read_to_string(&path).expect("html");
    assert!(page.starts_with("<!doctype html>"));
    assert!(!page.contains("<pre>"), "no Markdown in a <pre>");
    assert!(page.contains("<svg"));
    assert!(page.contains("<th>rule</th>") && page.contains("<th>false denials</th>"));
    for id in report.rules.keys() {
        assert!(page.contains(&format!("<td>{id}</td>")), "a row for {id}");
    }
    assert!(page.contains("<h2>Invariants</h2>"));
    assert!(
        !page.contains("src=") && !page.contains("href=") && !page.contains("@import"),
        "nothing loaded from elsewhere"
    );
}

#[test]
fn a_sweep_page_has_its_table_and_a_small_plot_per_run() {
    let path = library().join("redis-stall-fail-modes.yaml");
    let text = std::fs::read_to_string(&path).expect("scenario");
    let params = [sweep::parse_param("rule.open.failMode=OPEN,CLOSED").expect("param")];
    let rows: Vec<sweep::Row> = sweep::grid(&params)
        .into_iter()
        .map(|values| {
            let settings = [
                ("duration", "8s"),
                (params[0].path.as_str(), values[0].as_str()),
            ];
            let s = sweep::variants(&text, "stall", &settings).expect("variant");
            sweep::Row {
                values,
                report: run(&s, 1, &mut |_| {}).expect("runs"),
            }
        })
        .collect();
    let page = plot::sweep_html("redis-stall-fail-modes", &params, &rows).expect("page");
    assert!(page.contains("<th>rule.open.failMode</th>"));
    assert_eq!(page.matches("class=\"cell\"").count(), 2, "a plot per run");
    assert_eq!(page.matches("<svg").count(), 2);
    assert!(page.contains("rule.open.failMode=OPEN seed 1"));
    assert!(page.contains("rule.open.failMode=CLOSED seed 1"));
    // A line per combination, seed and rule (three rules).
    assert_eq!(page.matches("<tr>").count(), 1 + 2 * 3);
    // The small plots render as images too.
    let dir = tempfile::tempdir().expect("dir");
    let small = dir.path().join("small.svg");
    std::fs::write(&small, plot::small_svg(&rows[0].report).expect("small")).expect("write");
    let status = Command::new("rsvg-convert")
        .arg(&small)
        .arg("-o")
        .arg(dir.path().join("small.png"))
        .status()
        .expect("rsvg-convert");
    assert!(status.success());
}
