//! The picture of a run: per rule, admitted per second against what an exact limiter admitted
//! (and failed-open decisions), with fault windows shaded. SVG, drawn without system fonts; or
//! an HTML page holding the SVG and the report's table (nothing loaded from elsewhere).

use std::path::Path;

use plotters::prelude::*;

use crate::report::Report;

/// At most this many rules get a panel (the busiest by requests).
const MAX_PANELS: usize = 4;

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

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A page with the plot and the report's table.
fn html(report: &Report, svg: &str) -> String {
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\n<body style=\"font-family: sans-serif\">\n<h1>{title}</h1>\n{svg}\n<pre>{table}</pre>\n</body></html>\n",
        title = escape(&format!("{} (seed {})", report.scenario, report.seed)),
        table = escape(&report.table()),
    )
}

/// The plot as SVG text.
pub fn svg(report: &Report) -> Result<String, String> {
    let mut out = String::new();
    draw(report, &mut out)?;
    Ok(out)
}

fn draw(report: &Report, out: &mut String) -> Result<(), String> {
    let mut rules: Vec<(&String, u64)> = report
        .rules
        .iter()
        .map(|(id, r)| (id, r.decided.admitted + r.decided.denied))
        .collect();
    rules.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    rules.truncate(MAX_PANELS);
    let panels = rules.len().max(1);
    let root = SVGBackend::with_string(out, (960, 280 * panels as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((panels, 1));
    let seconds = report.per_second.len().max(1) as f64;
    for (area, (id, _)) in areas.iter().zip(&rules) {
        let series = |f: fn(&crate::report::RuleSecond) -> u64| -> Vec<(f64, f64)> {
            report
                .per_second
                .iter()
                .map(|s| (s.t as f64 + 0.5, s.rules.get(*id).map_or(0, f) as f64))
                .collect()
        };
        let admitted = series(|r| r.decided.admitted);
        let exact = series(|r| r.exact);
        let failed_open = series(|r| r.decided.failed_open);
        let top = admitted
            .iter()
            .chain(&exact)
            .map(|p| p.1)
            .fold(1.0, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{}: rule {id} (seed {})", report.scenario, report.seed),
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..seconds, 0.0..top)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("virtual seconds")
            .y_desc("requests / s")
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| e.to_string())?;
        for f in &report.faults {
            let until = if f.until > f.from {
                f.until
            } else {
                f.from + 0.2
            };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(f.from, 0.0), (until, top)],
                    RGBColor(255, 200, 120).mix(0.35).filled(),
                )))
                .map_err(|e| e.to_string())?
                .label(f.label.clone())
                .legend(|(x, y)| {
                    Rectangle::new(
                        [(x, y - 5), (x + 15, y + 5)],
                        RGBColor(255, 200, 120).filled(),
                    )
                });
        }
        chart
            .draw_series(LineSeries::new(exact, BLACK.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label("exact limiter")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], BLACK.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(admitted, BLUE.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label("admitted")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(failed_open, RED.stroke_width(1)))
            .map_err(|e| e.to_string())?
            .label("failed open")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 15, y)], RED));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
