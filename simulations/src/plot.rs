//! The picture of a run, as SVG drawn without system fonts, or an HTML page holding it and
//! the report as tables (nothing loaded from elsewhere).
//!
//! - A panel per rule (the busiest four): a line per outcome each second (admitted, denied,
//!   failed open, failed closed, decided by the LOCAL fallback) against what an exact limiter
//!   admitted.
//! - Two regions: a panel per region (admitted each second, the worst sync lag on its own
//!   axis, and the seconds in which none of its nodes saw the peer region up).
//! - Faults: a window that lasts is a band, an instant one (a failover, a crash, a rule
//!   change) a line; each kind has its colour, named in the legend beside the panel, never
//!   over the data.
//!
//! [`sweep_html`] draws a sweep: its table and a small plot per run.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

mod html;
use html::{STYLE, escape, html, table};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{FaultWindow, Report, RuleSecond};
use crate::sweep::{Param, Row};

/// At most this many rules get a panel (the busiest by requests).
const MAX_PANELS: usize = 4;
/// The whole picture's width, of which the legend takes the right.
const WIDTH: u32 = 1100;
const LEGEND: u32 = 250;
const PANEL_HEIGHT: u32 = 260;

/// Draws `report` to `path`: an HTML page when the name ends in `.html`, else SVG.
pub fn write(report: &Report, path: &Path) -> Result<(), String> {
    let svg = svg(report)?;
    let text = if path.extension().is_some_and(|e| e == "html" || e == "htm") {
        html(report, &svg)
    } else {
        svg
    };
    std::fs::write(path, text).map_err(|e| e.to_string())
}

/// The plot as SVG text.
pub fn svg(report: &Report) -> Result<String, String> {
    let rules = busiest_rules(report, MAX_PANELS);
    let regions = regions(report);
    let panels = (rules.len() + regions.len()).max(1) as u32;
    let mut out = String::new();
    {
        let root =
            SVGBackend::with_string(&mut out, (WIDTH, PANEL_HEIGHT * panels)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let areas = root.split_evenly((panels as usize, 1));
        for (area, id) in areas.iter().zip(&rules) {
            rule_panel(report, id, area)?;
        }
        for (area, region) in areas[rules.len()..].iter().zip(&regions) {
            region_panel(report, region, area)?;
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn busiest_rules(report: &Report, n: usize) -> Vec<String> {
    let mut rules: Vec<(&String, u64)> = report
        .rules
        .iter()
        .map(|(id, r)| (id, r.decided.admitted + r.decided.denied))
        .collect();
    rules.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    rules
        .into_iter()
        .take(n)
        .map(|(id, _)| id.clone())
        .collect()
}

fn regions(report: &Report) -> Vec<String> {
    let names: BTreeSet<&String> = report
        .per_second
        .iter()
        .flat_map(|s| s.regions.keys())
        .collect();
    names.into_iter().cloned().collect()
}

/// What each outcome line looks like.
struct Line {
    label: &'static str,
    colour: RGBColor,
    width: u32,
    value: fn(&RuleSecond) -> u64,
}

const EXACT: RGBColor = RGBColor(0, 0, 0);

const OUTCOMES: [Line; 5] = [
    Line {
        label: "admitted",
        colour: RGBColor(31, 119, 180),
        width: 2,
        value: |r| r.decided.admitted,
    },
    Line {
        label: "denied",
        colour: RGBColor(150, 150, 150),
        width: 1,
        value: |r| r.decided.denied,
    },
    Line {
        label: "failed open",
        colour: RGBColor(214, 39, 40),
        width: 2,
        value: |r| r.decided.failed_open,
    },
    Line {
        label: "failed closed",
        colour: RGBColor(148, 103, 189),
        width: 2,
        value: |r| r.decided.failed_closed,
    },
    Line {
        label: "local fallback",
        colour: RGBColor(44, 160, 44),
        width: 2,
        value: |r| r.decided.local_fallback,
    },
];

/// Each kind of fault's colour ([`crate::scenario::FaultKind::class`]).
fn fault_colour(class: &str) -> RGBColor {
    match class {
        "store-down" => RGBColor(230, 85, 13),
        "store-stall" => RGBColor(253, 174, 107),
        "store-slow" => RGBColor(254, 217, 118),
        "store-failover" => RGBColor(166, 54, 3),
        "rules" => RGBColor(49, 130, 189),
        "crash" => RGBColor(122, 1, 119),
        "restart" => RGBColor(65, 171, 93),
        "partition" => RGBColor(158, 154, 200),
        _ => RGBColor(140, 140, 140),
    }
}

const PEER_DOWN: RGBColor = RGBColor(240, 120, 120);
const LAG: RGBColor = RGBColor(255, 127, 14);

/// One legend entry: a band, a vertical mark or a line.
enum Glyph {
    Band(RGBColor),
    Mark(RGBColor),
    Line(RGBColor, u32),
}

/// Draws the legend in the strip right of the data.
fn legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    entries: &[(Glyph, String)],
) -> Result<(), String> {
    let font = ("sans-serif", 13).into_font().color(&BLACK);
    for (i, (glyph, label)) in entries.iter().enumerate() {
        let y = 30 + 18 * i as i32;
        match glyph {
            Glyph::Band(c) => area
                .draw(&Rectangle::new(
                    [(8, y - 6), (26, y + 6)],
                    c.mix(0.45).filled(),
                ))
                .map_err(err)?,
            Glyph::Mark(c) => area
                .draw(&PathElement::new(
                    [(17, y - 7), (17, y + 7)],
                    c.stroke_width(2),
                ))
                .map_err(err)?,
            Glyph::Line(c, w) => area
                .draw(&PathElement::new([(8, y), (26, y)], c.stroke_width(*w)))
                .map_err(err)?,
        }
        area.draw(&Text::new(label.clone(), (32, y - 7), font.clone()))
            .map_err(err)?;
    }
    Ok(())
}

/// The fault windows' legend entries, one per kind and label.
fn fault_entries(faults: &[FaultWindow]) -> Vec<(Glyph, String)> {
    let mut seen = BTreeSet::new();
    let mut out = vec![];
    for f in faults {
        if !seen.insert((f.class.as_str(), f.label.as_str())) {
            continue;
        }
        let colour = fault_colour(&f.class);
        let glyph = if f.until > f.from {
            Glyph::Band(colour)
        } else {
            Glyph::Mark(colour)
        };
        out.push((glyph, f.label.clone()));
    }
    out
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Shades the windows that last and marks the instant faults.
fn draw_faults(chart: &mut Chart<'_, '_>, faults: &[FaultWindow], top: f64) -> Result<(), String> {
    for f in faults {
        let colour = fault_colour(&f.class);
        if f.until > f.from {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(f.from, 0.0), (f.until, top)],
                    colour.mix(0.3).filled(),
                )))
                .map_err(err)?;
        } else {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(f.from, 0.0), (f.from, top)],
                    colour.stroke_width(2),
                )))
                .map_err(err)?;
        }
    }
    Ok(())
}

fn rule_panel(
    report: &Report,
    id: &str,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
) -> Result<(), String> {
    let (plot, side) = area.split_horizontally(WIDTH - LEGEND);
    let seconds = report.per_second.len().max(1) as f64;
    let series = |f: fn(&RuleSecond) -> u64| -> Vec<(f64, f64)> {
        report
            .per_second
            .iter()
            .map(|s| (s.t as f64 + 0.5, s.rules.get(id).map_or(0, f) as f64))
            .collect()
    };
    let exact = series(|r| r.exact);
    let lines: Vec<(&Line, Vec<(f64, f64)>)> =
        OUTCOMES.iter().map(|l| (l, series(l.value))).collect();
    let top = lines
        .iter()
        .flat_map(|(_, s)| s.iter())
        .chain(&exact)
        .map(|p| p.1)
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            format!("{}: rule {id} (seed {})", report.scenario, report.seed),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("virtual seconds")
        .y_desc("requests / s")
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;
    draw_faults(&mut chart, &report.faults, top)?;
    chart
        .draw_series(LineSeries::new(exact, EXACT.stroke_width(2)))
        .map_err(err)?;
    for (line, points) in &lines {
        chart
            .draw_series(LineSeries::new(
                points.clone(),
                line.colour.stroke_width(line.width),
            ))
            .map_err(err)?;
    }
    let rule = &report.rules[id];
    let mut entries = vec![(Glyph::Line(EXACT, 2), "exact limiter".to_owned())];
    for (line, _) in &lines {
        let total = match line.label {
            "admitted" => rule.decided.admitted,
            "denied" => rule.decided.denied,
            "failed open" => rule.decided.failed_open,
            "failed closed" => rule.decided.failed_closed,
            _ => rule.decided.local_fallback,
        };
        entries.push((
            Glyph::Line(line.colour, line.width),
            format!("{} ({total})", line.label),
        ));
    }
    entries.extend(fault_entries(&report.faults));
    legend(&side, &entries)
}

fn region_panel(
    report: &Report,
    region: &str,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
) -> Result<(), String> {
    let (plot, side) = area.split_horizontally(WIDTH - LEGEND);
    let seconds = report.per_second.len().max(1) as f64;
    let admitted: Vec<(f64, f64)> = report
        .per_second
        .iter()
        .map(|s| {
            (
                s.t as f64 + 0.5,
                s.regions.get(region).map_or(0, |r| r.admitted) as f64,
            )
        })
        .collect();
    let lag: Vec<(f64, f64)> = report
        .per_second
        .iter()
        .filter_map(|s| Some((s.t as f64 + 0.5, s.regions.get(region)?.lag_ms? as f64)))
        .collect();
    let down: Vec<f64> = report
        .per_second
        .iter()
        .filter(|s| s.regions.get(region).is_some_and(|r| r.peer_up == 0))
        .map(|s| s.t as f64)
        .collect();
    let top = admitted.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let lag_top = lag.iter().map(|p| p.1).fold(100.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            format!(
                "{}: region {region} (seed {})",
                report.scenario, report.seed
            ),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..top)
        .map_err(err)?
        .set_secondary_coord(0.0..seconds, 0.0..lag_top);
    chart
        .configure_mesh()
        .x_desc("virtual seconds")
        .y_desc("admitted / s")
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .y_desc("sync lag, ms")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            down.iter()
                .map(|&t| Rectangle::new([(t, 0.0), (t + 1.0, top)], PEER_DOWN.mix(0.25).filled())),
        )
        .map_err(err)?;
    draw_faults(&mut chart, &report.faults, top)?;
    chart
        .draw_series(LineSeries::new(
            admitted,
            OUTCOMES[0].colour.stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_secondary_series(LineSeries::new(lag, LAG.stroke_width(2)))
        .map_err(err)?;
    let mut entries = vec![
        (
            Glyph::Line(OUTCOMES[0].colour, 2),
            format!("admitted in {region}"),
        ),
        (Glyph::Line(LAG, 2), "sync lag (right axis)".to_owned()),
        (
            Glyph::Band(PEER_DOWN),
            "no node sees the peer up".to_owned(),
        ),
    ];
    entries.extend(fault_entries(&report.faults));
    legend(&side, &entries)
}

/// A small plot of one run for a sweep's page: admitted against exact for its busiest rules,
/// the fail-mode outcomes, the fault windows.
pub fn small_svg(report: &Report) -> Result<String, String> {
    let rules = busiest_rules(report, 3);
    let mut out = String::new();
    {
        let height = 130 * rules.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut out, (420, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let seconds = report.per_second.len().max(1) as f64;
        for (area, id) in root
            .split_evenly((rules.len().max(1), 1))
            .iter()
            .zip(&rules)
        {
            let series = |f: fn(&RuleSecond) -> u64| -> Vec<(f64, f64)> {
                report
                    .per_second
                    .iter()
                    .map(|s| (s.t as f64 + 0.5, s.rules.get(id).map_or(0, f) as f64))
                    .collect()
            };
            let exact = series(|r| r.exact);
            let lines: Vec<(&Line, Vec<(f64, f64)>)> = OUTCOMES
                .iter()
                .filter(|l| l.label != "denied")
                .map(|l| (l, series(l.value)))
                .collect();
            let top = lines
                .iter()
                .flat_map(|(_, s)| s.iter())
                .chain(&exact)
                .map(|p| p.1)
                .fold(1.0, f64::max)
                * 1.1;
            let mut chart = ChartBuilder::on(area)
                .caption(id.clone(), ("sans-serif", 12))
                .margin(4)
                .x_label_area_size(18)
                .y_label_area_size(40)
                .build_cartesian_2d(0.0..seconds, 0.0..top)
                .map_err(err)?;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .label_style(("sans-serif", 10))
                .x_labels(5)
                .y_labels(4)
                .draw()
                .map_err(err)?;
            draw_faults(&mut chart, &report.faults, top)?;
            chart
                .draw_series(LineSeries::new(exact, EXACT.stroke_width(1)))
                .map_err(err)?;
            for (line, points) in lines {
                chart
                    .draw_series(LineSeries::new(points, line.colour.stroke_width(1)))
                    .map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// A sweep as a page: the table (a line per combination, seed and rule), then a small plot
/// per run with its settings, and one legend for them all.
pub fn sweep_html(scenario: &str, params: &[Param], rows: &[Row]) -> Result<String, String> {
    let title = escape(&format!("sweep of {scenario}"));
    let mut out = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title><style>{STYLE}.cells{{display:flex;flex-wrap:wrap;gap:12px}}.cell{{border:1px solid #ddd;padding:4px}}.key span{{display:inline-block;width:14px;height:3px;margin:0 4px 3px 12px;vertical-align:middle}}</style></head>\n<body>\n<h1>{title}</h1>\n"
    );
    let mut head: Vec<&str> = params.iter().map(|p| p.path.as_str()).collect();
    head.extend([
        "seed",
        "invariants",
        "rule",
        "admitted",
        "exact",
        "overshoot",
        "false denials",
        "failed open",
        "failed closed",
        "local",
        "worst sync lag ms",
        "store calls/decision",
        "p99 µs",
    ]);
    let mut lines = vec![];
    for row in rows {
        let r = &row.report;
        let lag = r
            .per_second
            .iter()
            .flat_map(|s| s.regions.values().filter_map(|region| region.lag_ms))
            .max()
            .map_or_else(|| "-".to_owned(), |ms| ms.to_string());
        for (rule, x) in &r.rules {
            let mut cells = row.values.clone();
            cells.extend([
                r.seed.to_string(),
                if r.passed() { "ok" } else { "BROKEN" }.to_owned(),
                rule.clone(),
                x.decided.admitted.to_string(),
                x.exact.to_string(),
                x.overshoot.to_string(),
                x.false_denials.to_string(),
                x.decided.failed_open.to_string(),
                x.decided.failed_closed.to_string(),
                x.decided.local_fallback.to_string(),
                lag.clone(),
                format!("{:.4}", r.store_calls_per_decision),
                r.latency_us.p99.to_string(),
            ]);
            lines.push(cells);
        }
    }
    table(&mut out, &head, &lines);
    out.push_str("<h2>Each run</h2>\n<p class=\"key\">");
    let _ = write!(out, "<span style=\"background:#000\"></span>exact limiter");
    for l in OUTCOMES.iter().filter(|l| l.label != "denied") {
        let RGBColor(r, g, b) = l.colour;
        let _ = write!(
            out,
            "<span style=\"background:rgb({r},{g},{b})\"></span>{}",
            l.label
        );
    }
    out.push_str("; fault windows shaded by kind.</p>\n<div class=\"cells\">\n");
    for row in rows {
        let settings: Vec<String> = params
            .iter()
            .zip(&row.values)
            .map(|(p, v)| format!("{}={v}", p.path))
            .collect();
        let _ = writeln!(
            out,
            "<div class=\"cell\"><div>{} seed {} <span class=\"{}\">{}</span></div>{}</div>",
            escape(&settings.join(" ")),
            row.report.seed,
            if row.report.passed() { "ok" } else { "broken" },
            if row.report.passed() { "ok" } else { "BROKEN" },
            small_svg(&row.report)?
        );
    }
    out.push_str("</div>\n</body></html>\n");
    Ok(out)
}
