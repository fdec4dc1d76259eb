//! Line charts as inline SVG, drawn on the server: no chart library and no script, so a
//! chart shows on any browser the console serves, under its Content-Security-Policy (SVG
//! presentation attributes are not styles). Only numbers and times reach the SVG text.

use std::fmt::Write;

use crate::display;
use crate::history::Point;

/// The drawing's size in SVG units (it scales to the page's width).
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 160.0;
/// Room for the value labels on the left and the times below.
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 18.0;
const TOP: f64 = 8.0;

/// A chart of `points` (oldest first) whose values are in `unit`; `id` names the element.
/// The last and largest values are also data attributes, for whoever reads the page.
pub fn line_chart(id: &str, points: &[Point], unit: &str) -> String {
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'), "a chart's id is a plain name");
    let last = points.last().map_or(0, |p| p.value);
    let max = points.iter().map(|p| p.value).max().unwrap_or(0);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" id="{id}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" data-points="{}" data-last="{last}" data-max="{max}" aria-label="{unit}: now {last}, at most {max}">"#,
        points.len()
    );
    let plot_bottom = HEIGHT - BOTTOM;
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{plot_bottom}" x2="{WIDTH}" y2="{plot_bottom}" stroke="#c9ced6"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{plot_bottom}" stroke="#c9ced6"/>"##
    );
    let _ = write!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="end" font-size="11" fill="#5f6b7a">{max}</text><text x="{}" y="{plot_bottom}" text-anchor="end" font-size="11" fill="#5f6b7a">0</text>"##,
        LEFT - 4.0,
        TOP + 10.0,
        LEFT - 4.0
    );
    match (points.first(), points.last()) {
        (Some(first), Some(end)) if points.len() >= 2 => {
            let _ = write!(
                svg,
                r##"<text x="{LEFT}" y="{HEIGHT}" font-size="11" fill="#5f6b7a">{}</text><text x="{WIDTH}" y="{HEIGHT}" text-anchor="end" font-size="11" fill="#5f6b7a">{}</text>"##,
                time_label(first.at_ms, end.at_ms - first.at_ms),
                time_label(end.at_ms, end.at_ms - first.at_ms)
            );
            let _ = write!(
                svg,
                r##"<polyline fill="none" stroke="#1f6feb" stroke-width="2" points="{}"/>"##,
                polyline(points, max)
            );
        }
        _ => {
            let _ = write!(
                svg,
                r##"<text x="{}" y="{}" text-anchor="middle" font-size="12" fill="#5f6b7a">collecting: a point every sample interval</text>"##,
                (LEFT + WIDTH) / 2.0,
                HEIGHT / 2.0
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// A time on the chart's axis (UTC): `HH:MM:SS` for a span under a day, else `MM-DD HH:MM`.
fn time_label(at_ms: i64, span_ms: i64) -> String {
    let text = display::timestamp(at_ms);
    let part = if span_ms < DAY_MS { text.get(11..19) } else { text.get(5..16) };
    part.unwrap_or(&text).to_string()
}

/// Milliseconds in a day.
const DAY_MS: i64 = 86_400_000;

/// The points' coordinates: time across (first to last), value up (0 to `max`).
fn polyline(points: &[Point], max: i64) -> String {
    let (start, end) = (points[0].at_ms, points[points.len() - 1].at_ms);
    let span = (end - start).max(1) as f64;
    let top = max.max(1) as f64;
    let (plot_width, plot_height) = (WIDTH - LEFT, HEIGHT - BOTTOM - TOP);
    let mut text = String::new();
    for point in points {
        let x = LEFT + (point.at_ms - start) as f64 / span * plot_width;
        let y = TOP + plot_height - point.value as f64 / top * plot_height;
        let _ = write!(text, "{x:.1},{y:.1} ");
    }
    text.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_spans_its_points_and_says_its_last_and_largest_values() {
        let points =
            [Point { at_ms: 0, value: 0 }, Point { at_ms: 5000, value: 40 }, Point { at_ms: 10_000, value: 10 }];
        let svg = line_chart("lag-chart", &points, "messages behind");
        assert!(svg.contains(r#"data-points="3" data-last="10" data-max="40""#), "{svg}");
        assert!(svg.contains(r#"points="56.0,142.0 328.0,8.0 600.0,108.5""#), "{svg}");
        assert!(svg.contains(">00:00:00</text>") && svg.contains(">00:00:10</text>"), "{svg}");
        assert_eq!(time_label(2 * DAY_MS + 3_600_000, 2 * DAY_MS), "01-03 01:00");
        let empty = line_chart("lag-chart", &[], "messages behind");
        assert!(empty.contains("collecting") && empty.contains(r#"data-points="0""#));
    }
}
