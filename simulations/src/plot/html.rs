//! A report as an HTML page: its tables, and the plot beside them.

use std::fmt::Write as _;

use super::*;

pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(super) const STYLE: &str = "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 8px}td.n{text-align:right}th{background:#f3f3f3}.ok{color:#1a7f37}.broken{color:#cf222e;font-weight:bold}figure{margin:0}";

/// An HTML table: `head`, then `rows` of cells (numbers right-aligned).
pub(super) fn table(out: &mut String, head: &[&str], rows: &[Vec<String>]) {
    out.push_str("<table>\n<tr>");
    for h in head {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let numeric = cell.parse::<f64>().is_ok();
            let _ = write!(
                out,
                "<td{}>{}</td>",
                if numeric { " class=\"n\"" } else { "" },
                escape(cell)
            );
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}

/// The report's body: its figures, rules, faults, invariants and notes, as HTML.
fn report_tables(out: &mut String, report: &Report) {
    let _ = writeln!(
        out,
        "<p>{} nodes, {} s virtual; {} decisions, {} admitted; {} store calls ({:.4} per decision, {} refused); {} store keys evicted; latency p50 {} µs, p99 {} µs, p999 {} µs, max {} µs.</p>",
        report.nodes,
        report.seconds,
        report.decisions,
        report.admitted,
        report.store_calls,
        report.store_calls_per_decision,
        report.store_refused,
        report.store_evictions,
        report.latency_us.p50,
        report.latency_us.p99,
        report.latency_us.p999,
        report.latency_us.max
    );
    let rows: Vec<Vec<String>> = report
        .rules
        .iter()
        .map(|(id, r)| {
            vec![
                id.clone(),
                r.decided.admitted.to_string(),
                r.exact.to_string(),
                r.overshoot.to_string(),
                r.decided.denied.to_string(),
                r.false_denials.to_string(),
                r.shadow_denied.to_string(),
                r.decided.failed_open.to_string(),
                r.decided.failed_closed.to_string(),
                r.decided.local_fallback.to_string(),
                r.on_last_answer.to_string(),
                r.identities.to_string(),
                format!("{:.3}", r.worst_bound_use),
            ]
        })
        .collect();
    out.push_str("<h2>Rules</h2>\n");
    table(
        out,
        &[
            "rule",
            "admitted",
            "exact",
            "overshoot",
            "denied",
            "false denials",
            "shadow denied",
            "failed open",
            "failed closed",
            "local",
            "on last answer",
            "identities",
            "worst bound use",
        ],
        &rows,
    );
    if !report.faults.is_empty() {
        out.push_str("<h2>Faults</h2>\n");
        let rows: Vec<Vec<String>> = report
            .faults
            .iter()
            .map(|f| {
                vec![
                    format!("{:.3}", f.from),
                    if f.until > f.from {
                        format!("{:.3}", f.until)
                    } else {
                        "(instant)".into()
                    },
                    f.label.clone(),
                ]
            })
            .collect();
        table(out, &["from, s", "until, s", "fault"], &rows);
    }
    out.push_str("<h2>Invariants</h2>\n<ul>\n");
    for i in &report.invariants {
        let _ = writeln!(
            out,
            "<li><span class=\"{}\">{}</span> {}: {}</li>",
            if i.held { "ok" } else { "broken" },
            if i.held { "ok" } else { "BROKEN" },
            escape(&i.name),
            escape(&i.detail)
        );
    }
    out.push_str("</ul>\n");
    if !report.findings.is_empty() {
        out.push_str("<h2>Scenario notes</h2>\n<ul>\n");
        for f in &report.findings {
            let what = if f.is_warning() { "warning" } else { "note" };
            let _ = writeln!(out, "<li>{what}: {}</li>", escape(&f.to_string()));
        }
        out.push_str("</ul>\n");
    }
}

/// A page with the plot and the report's tables.
pub(super) fn html(report: &Report, svg: &str) -> String {
    let title = escape(&format!("{} (seed {})", report.scenario, report.seed));
    let mut out = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title><style>{STYLE}</style></head>\n<body>\n<h1>{title}</h1>\n<figure>{svg}</figure>\n"
    );
    report_tables(&mut out, report);
    out.push_str("</body></html>\n");
    out
}
