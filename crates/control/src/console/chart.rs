//! The overview's chart: decisions per outcome, each second of the last ten minutes, from the
//! node's own per-rule counters (the ones `/metrics` exports as `tollgate_decisions_total`),
//! sampled once a second into a ring, and drawn as an SVG by the server (no script draws it,
//! so the CSP needs none; the page's script only reloads the image). Reading the counters the
//! decision path already keeps costs that path nothing.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tollgate_node::metrics::RuleCounters;
use tollgate_node::runtime::Node;

/// How many seconds the chart shows.
pub const SECONDS: usize = 600;

/// The outcomes charted, in the order of [`Sample`]: name and colour.
pub const OUTCOMES: [(&str, &str); 5] = [
    ("admitted", "#2e7d32"),
    ("denied", "#c62828"),
    ("failed open", "#ef6c00"),
    ("failed closed", "#6a1b9a"),
    ("local fallback", "#1565c0"),
];

/// Decisions in one second, per outcome (in [`OUTCOMES`]' order).
pub type Sample = [u64; 5];

fn totals(counters: &RuleCounters) -> Sample {
    [
        counters.allowed.get(),
        counters.denied.get(),
        counters.failed_open.get(),
        counters.failed_closed.get(),
        counters.local_fallback.get(),
    ]
}

/// Each enforced rule's totals, by its store key (the same rule across reloads).
fn rule_totals(node: &Node) -> HashMap<String, Sample> {
    node.rules()
        .load()
        .rules()
        .iter()
        .map(|r| (r.key.clone(), totals(&r.counters)))
        .collect()
}

/// What the rules decided since `before`: a rule new since then counts from now (a rule
/// enforced again after a pause brings its old totals back, which are not this second's).
fn since(before: &HashMap<String, Sample>, now: &HashMap<String, Sample>) -> Sample {
    let mut second = [0; 5];
    for (key, totals) in now {
        if let Some(earlier) = before.get(key) {
            for ((d, n), b) in second.iter_mut().zip(totals).zip(earlier) {
                *d += n.saturating_sub(*b);
            }
        }
    }
    second
}

/// The last [`SECONDS`] seconds of decisions.
#[derive(Debug, Default)]
pub struct Outcomes {
    seconds: Mutex<VecDeque<Sample>>,
}

impl Outcomes {
    /// Starts sampling `node`'s decisions every second, for as long as the returned ring is
    /// held.
    pub fn sample(node: Node) -> Arc<Self> {
        let outcomes = Arc::new(Self::default());
        let ring = Arc::downgrade(&outcomes);
        tokio::spawn(sample_every_second(node, ring));
        outcomes
    }

    /// Records one second's decisions (the newest last).
    pub fn push(&self, sample: Sample) {
        let mut seconds = self.seconds.lock();
        if seconds.len() == SECONDS {
            seconds.pop_front();
        }
        seconds.push_back(sample);
    }

    /// The seconds recorded, oldest first.
    pub fn seconds(&self) -> Vec<Sample> {
        self.seconds.lock().iter().copied().collect()
    }

    /// Decisions per outcome over the last `n` seconds.
    pub fn last(&self, n: usize) -> Sample {
        let seconds = self.seconds.lock();
        let mut sum = [0; 5];
        for s in seconds.iter().rev().take(n) {
            for (total, v) in sum.iter_mut().zip(s) {
                *total += v;
            }
        }
        sum
    }
}

async fn sample_every_second(node: Node, ring: Weak<Outcomes>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut before = rule_totals(&node);
    loop {
        tick.tick().await;
        let Some(ring) = ring.upgrade() else {
            return;
        };
        let now = rule_totals(&node);
        ring.push(since(&before, &now));
        before = now;
    }
}

/// The chart as an SVG document: a polyline per outcome over the last ten minutes (one pixel a
/// second, the newest on the right), the scale's top, and a legend. Only numbers and the
/// fixed names above go in it.
pub fn svg(seconds: &[Sample]) -> String {
    const WIDTH: usize = SECONDS;
    const HEIGHT: usize = 160;
    const TOP: usize = 18;
    let peak = seconds
        .iter()
        .flat_map(|s| s.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="decisions per second by outcome, last ten minutes"><rect width="{w}" height="{h}" fill="#fff"/><line x1="0" y1="{base}" x2="{w}" y2="{base}" stroke="#999"/><text x="4" y="12" font-size="11" font-family="sans-serif" fill="#444">{peak}/s</text>"##,
        w = WIDTH,
        h = HEIGHT + TOP + 4,
        base = HEIGHT + TOP,
    );
    let start = WIDTH - seconds.len().min(WIDTH);
    for (i, (_, colour)) in OUTCOMES.iter().enumerate() {
        if seconds.iter().all(|s| s[i] == 0) {
            continue;
        }
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points=""#
        );
        for (x, s) in seconds.iter().rev().take(WIDTH).rev().enumerate() {
            let y = TOP + HEIGHT - (s[i] as usize * HEIGHT) / peak as usize;
            let _ = write!(out, "{},{} ", start + x, y);
        }
        out.push_str(r#""/>"#);
    }
    let mut x = 60;
    for (name, colour) in OUTCOMES {
        let _ = write!(
            out,
            r##"<rect x="{x}" y="4" width="10" height="10" fill="{colour}"/><text x="{}" y="13" font-size="11" font-family="sans-serif" fill="#222">{name}</text>"##,
            x + 14
        );
        x += 24 + name.len() * 7;
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring keeps the last ten minutes; the chart draws a line for each outcome that had
    /// decisions, scaled to the busiest second, and none for an outcome that had none.
    #[test]
    fn the_chart_draws_the_seconds_it_holds() {
        let outcomes = Outcomes::default();
        for second in 0..SECONDS as u64 + 10 {
            outcomes.push([second % 7, if second == 605 { 40 } else { 0 }, 0, 0, 0]);
        }
        let seconds = outcomes.seconds();
        assert_eq!(seconds.len(), SECONDS);
        assert_eq!(seconds[0][0], 10 % 7, "the oldest ten seconds fell off");
        assert_eq!(outcomes.last(10)[1], 40);
        let svg = svg(&seconds);
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.contains(">40/s<"), "scaled to the busiest second");
        // The denial spike reaches the top: y = 18 at x = 595 (second 605 of 610).
        assert!(svg.contains("595,18 "), "{svg}");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }

    /// A second counts what each rule decided in it; a rule that appears (or is enforced
    /// again) counts from then, not its totals from before.
    #[test]
    fn a_second_counts_only_what_was_decided_in_it() {
        let before = HashMap::from([("a".to_owned(), [10, 2, 0, 0, 0])]);
        let now = HashMap::from([
            ("a".to_owned(), [15, 3, 0, 0, 0]),
            ("b".to_owned(), [900, 900, 0, 0, 0]),
        ]);
        assert_eq!(since(&before, &now), [5, 1, 0, 0, 0]);
    }
}
