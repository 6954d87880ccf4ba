//! The picture of a run: per rule, admitted per second against what an exact limiter admitted
//! (and failed-open decisions), with fault windows shaded. SVG, drawn without system fonts.

use std::path::Path;

use plotters::prelude::*;

use crate::report::Report;

/// At most this many rules get a panel (the busiest by requests).
const MAX_PANELS: usize = 4;

/// Draws `report` to an SVG file at `path`.
pub fn svg(report: &Report, path: &Path) -> Result<(), String> {
    let mut rules: Vec<(&String, u64)> = report
        .rules
        .iter()
        .map(|(id, r)| (id, r.decided.admitted + r.decided.denied))
        .collect();
    rules.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    rules.truncate(MAX_PANELS);
    let panels = rules.len().max(1);
    let root = SVGBackend::new(path, (960, 280 * panels as u32)).into_drawing_area();
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
