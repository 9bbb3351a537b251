//! Bar charts as inline SVG (no script: the page must render with everything blocked but its
//! own markup and style). Each bar carries its launch's sequence number and exact value, and a
//! `<title>` a reader sees on hover.

use maud::{html, Markup};

/// Most bars in one chart: the newest launches.
pub const MAX_BARS: usize = 400;

const WIDTH: f64 = 560.0;
const HEIGHT: f64 = 140.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 18.0;
const TOP: f64 = 8.0;

/// One chart's data: (sequence number, value) in launch order.
pub struct Series<'a> {
    /// The element id.
    pub id: &'a str,
    /// What is plotted.
    pub title: &'a str,
    /// The unit shown.
    pub unit: &'a str,
    /// The bars.
    pub points: Vec<(u64, f64)>,
}

/// The smallest 1, 2 or 5 × 10^k at or above `v`: the axis' top.
fn ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let scale = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0].iter().map(|m| m * scale).find(|c| *c >= v).unwrap_or(10.0 * scale)
}

fn figure(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The median of the values (0 for none).
pub fn median(points: &[(u64, f64)]) -> f64 {
    let mut v: Vec<f64> = points.iter().map(|p| p.1).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The chart of `s` (its newest [`MAX_BARS`] points).
pub fn bars(s: &Series) -> Markup {
    let points = &s.points[s.points.len().saturating_sub(MAX_BARS)..];
    let top = ceiling(points.iter().map(|p| p.1).fold(0.0, f64::max));
    let plot_w = WIDTH - LEFT - 4.0;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let step = plot_w / points.len().max(1) as f64;
    // A few launches get narrow bars, not a wall of colour.
    let bar_w = (step * 0.8).clamp(1.0, 18.0);
    let median = median(points);
    let median_y = TOP + plot_h - median / top * plot_h;
    html! {
        figure.chart {
            figcaption {
                (s.title) " (" (s.unit) "), "
                @if points.len() < s.points.len() { "the newest " (points.len()) " of " (s.points.len()) " launches" }
                @else { (points.len()) " launch(es)" }
                "; median " (figure(median)) " " (s.unit)
            }
            svg id=(s.id) xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(HEIGHT)
                viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(s.title) {
                line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(TOP + plot_h) {}
                line.axis x1=(LEFT) y1=(TOP + plot_h) x2=(WIDTH - 4.0) y2=(TOP + plot_h) {}
                text.label x=(LEFT - 6.0) y=(TOP + 10.0) text-anchor="end" { (figure(top)) }
                text.label x=(LEFT - 6.0) y=(TOP + plot_h) text-anchor="end" { "0" }
                @for (i, (seq, v)) in points.iter().enumerate() {
                    @let h = (v / top * plot_h).max(0.5);
                    rect.bar data-seq=(seq) data-value=(v) x=(format!("{:.2}", LEFT + 1.0 + i as f64 * step))
                        y=(format!("{:.2}", TOP + plot_h - h)) width=(format!("{bar_w:.2}")) height=(format!("{h:.2}")) {
                        title { "receipt " (seq) ": " (figure(*v)) " " (s.unit) }
                    }
                }
                @if !points.is_empty() {
                    line.median x1=(LEFT) y1=(format!("{median_y:.2}")) x2=(WIDTH - 4.0) y2=(format!("{median_y:.2}")) {}
                }
                text.label x=(WIDTH - 4.0) y=(HEIGHT - 4.0) text-anchor="end" { "receipt order →" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_axis_top_is_a_round_figure_at_or_above_the_largest_bar() {
        for (v, top) in [
            (0.0, 1.0),
            (0.3, 0.5),
            (1.0, 1.0),
            (1.2, 2.0),
            (7.0, 10.0),
            (70.0, 100.0),
            (430.0, 500.0),
            (2001.0, 5000.0),
        ] {
            assert!((ceiling(v) - top).abs() < 1e-9, "{v} → {} not {top}", ceiling(v));
        }
        assert_eq!(median(&[(1, 3.0), (2, 1.0), (3, 2.0)]), 2.0);
        assert_eq!(median(&[(1, 5.0), (2, 1.0), (3, 4.0), (4, 2.0), (5, 3.0)]), 3.0);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(
            (figure(0.5), figure(3.0), figure(99.5), figure(250.7)),
            ("0.50".into(), "3".into(), "99.50".into(), "251".into())
        );
        assert_eq!(median(&[(1, 4.0), (2, 1.0)]), 2.5);
    }

    #[test]
    fn only_the_newest_bars_are_drawn_each_with_its_receipt_and_value() {
        let points: Vec<(u64, f64)> = (1..=MAX_BARS as u64 + 5).map(|s| (s, s as f64)).collect();
        let svg = bars(&Series { id: "c", title: "t", unit: "ms", points }).into_string();
        assert_eq!(svg.matches("<rect").count(), MAX_BARS);
        assert!(!svg.contains(r#"data-seq="5""#) && svg.contains(r#"data-seq="6" data-value="6""#), "{svg}");
        assert!(svg.contains(&format!("the newest {MAX_BARS} of {} launches", MAX_BARS + 5)), "{svg}");
    }

    /// The value of `name="…"` in the first element of `svg` from `at`.
    fn attr(svg: &str, at: usize, name: &str) -> f64 {
        let from = &svg[at..];
        let start = from.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        from[start..start + from[start..].find('"').unwrap()].parse().unwrap()
    }

    #[test]
    fn each_bar_stands_on_the_axis_in_proportion_to_its_value() {
        let points = vec![(1, 1.0), (2, 2.0), (3, 4.0)];
        let svg = bars(&Series { id: "c", title: "t", unit: "ms", points }).into_string();
        // The axis' top is 5; the plot is 114 high from y=8, 500 wide from x=56.
        let (plot_h, step) = (HEIGHT - TOP - BOTTOM, (WIDTH - LEFT - 4.0) / 3.0);
        let rects: Vec<usize> = svg.match_indices("<rect").map(|(i, _)| i).collect();
        assert_eq!(rects.len(), 3);
        for (i, (at, v)) in rects.iter().zip([1.0, 2.0, 4.0]).enumerate() {
            let h = v / 5.0 * plot_h;
            let near = |a: f64, b: f64| (a - b).abs() < 0.01;
            assert!(near(attr(&svg, *at, "height"), h), "bar {i}: {svg}");
            assert!(near(attr(&svg, *at, "y") + h, TOP + plot_h), "bar {i} stands on the axis: {svg}");
            assert!(near(attr(&svg, *at, "x"), LEFT + 1.0 + i as f64 * step), "bar {i}: {svg}");
            assert!(near(attr(&svg, *at, "width"), 18.0), "a few bars are narrow: {svg}");
        }
        let median = svg.find("<line class=\"median\"").unwrap();
        assert!((attr(&svg, median, "y1") - (TOP + plot_h - 2.0 / 5.0 * plot_h)).abs() < 0.01, "{svg}");
        assert!(svg.contains(">5</text>") && svg.contains("median 2 ms"), "{svg}");
        // Many bars share the width: 100 bars of a 500-wide plot are 4 wide (80% of their step).
        let many: Vec<(u64, f64)> = (1..=100).map(|s| (s, 1.0)).collect();
        let svg = bars(&Series { id: "c", title: "t", unit: "ms", points: many }).into_string();
        let w = attr(&svg, svg.find("<rect").unwrap(), "width");
        assert!((w - (WIDTH - LEFT - 4.0) / 100.0 * 0.8).abs() < 0.01, "{w}");
    }
}
