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

/// How a chart's values read on its axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Whole numbers as they are (messages, messages per second).
    Count,
    /// Bytes per second, in binary units.
    BytesPerSecond,
    /// Microseconds, read as milliseconds.
    Micros,
}

impl Scale {
    fn label(self, value: i64) -> String {
        match self {
            Scale::Count => value.to_string(),
            Scale::BytesPerSecond => format!("{}/s", display::size(value)),
            Scale::Micros => format!("{:.1} ms", value as f64 / 1000.0),
        }
    }
}

/// One line of a chart: its name (the legend) and its points, oldest first.
pub struct Line<'a> {
    pub name: &'a str,
    pub points: &'a [Point],
}

/// The colours of a chart's lines, in order.
const LINE_COLOURS: [&str; 3] = ["#1f6feb", "#d9480f", "#2b8a3e"];

/// A chart of `points` (oldest first) whose values are in `unit`; `id` names the element.
/// The last and largest values are also data attributes, for whoever reads the page.
pub fn line_chart(id: &str, points: &[Point], unit: &str) -> String {
    lines_chart(id, &[Line { name: unit, points }], unit, Scale::Count)
}

/// A chart of up to [`LINE_COLOURS`]' count of lines sharing one time and value axis, each
/// line a `<polyline>` carrying its name and last value (and a dot when it has one point);
/// with more than one line, a legend. The element's data attributes describe the first line.
pub fn lines_chart(id: &str, lines: &[Line], unit: &str, scale: Scale) -> String {
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'), "a chart's id is a plain name");
    assert!(!lines.is_empty() && lines.len() <= LINE_COLOURS.len(), "a chart has 1 to {} lines", LINE_COLOURS.len());
    let first = lines[0].points;
    let last = first.last().map_or(0, |p| p.value);
    let max = first.iter().map(|p| p.value).max().unwrap_or(0);
    let all = || lines.iter().flat_map(|line| line.points.iter());
    let top = all().map(|p| p.value).max().unwrap_or(0);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg class="chart" id="{id}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" data-points="{}" data-last="{last}" data-max="{max}" aria-label="{unit}: now {}, at most {}">"#,
        first.len(),
        scale.label(last),
        scale.label(max)
    );
    let plot_bottom = HEIGHT - BOTTOM;
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{plot_bottom}" x2="{WIDTH}" y2="{plot_bottom}" stroke="#c9ced6"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{plot_bottom}" stroke="#c9ced6"/>"##
    );
    let _ = write!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="end" font-size="11" fill="#5f6b7a">{}</text><text x="{}" y="{plot_bottom}" text-anchor="end" font-size="11" fill="#5f6b7a">0</text>"##,
        LEFT - 4.0,
        TOP + 10.0,
        scale.label(top),
        LEFT - 4.0
    );
    let start = all().map(|p| p.at_ms).min();
    let end = all().map(|p| p.at_ms).max();
    match (start, end) {
        (Some(start), Some(end)) => {
            let span = end - start;
            let _ = write!(
                svg,
                r##"<text x="{LEFT}" y="{HEIGHT}" font-size="11" fill="#5f6b7a">{}</text><text x="{WIDTH}" y="{HEIGHT}" text-anchor="end" font-size="11" fill="#5f6b7a">{}</text>"##,
                time_label(start, span),
                time_label(end, span)
            );
            for (line, colour) in lines.iter().zip(LINE_COLOURS) {
                let coordinates = polyline(line.points, (start, end), top);
                let _ = write!(
                    svg,
                    r##"<polyline fill="none" stroke="{colour}" stroke-width="2" data-name="{}" data-last="{}" points="{coordinates}"/>"##,
                    line.name,
                    line.points.last().map_or(0, |p| p.value),
                );
                // A line of one point is a dot.
                if let ([_], Some((x, y))) = (line.points, coordinates.split_once(',')) {
                    let _ = write!(svg, r##"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"##);
                }
            }
            if lines.len() > 1 {
                legend(&mut svg, lines);
            }
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

/// The lines' names in their colours, along the top right.
fn legend(svg: &mut String, lines: &[Line]) {
    let mut x = WIDTH - 4.0;
    for (line, colour) in lines.iter().zip(LINE_COLOURS).rev() {
        let _ = write!(
            svg,
            r##"<text x="{x:.1}" y="{}" text-anchor="end" font-size="11" fill="{colour}">{}</text>"##,
            TOP + 10.0,
            line.name
        );
        x -= 7.0 * line.name.len() as f64 + 12.0;
    }
}

/// A time on the chart's axis (UTC): `HH:MM:SS` for a span under a day, else `MM-DD HH:MM`.
fn time_label(at_ms: i64, span_ms: i64) -> String {
    let text = display::timestamp(at_ms);
    let part = if span_ms < DAY_MS { text.get(11..19) } else { text.get(5..16) };
    part.unwrap_or(&text).to_string()
}

/// Milliseconds in a day.
const DAY_MS: i64 = 86_400_000;

/// The points' coordinates: time across (`span`, first to last), value up (0 to `max`).
fn polyline(points: &[Point], (start, end): (i64, i64), max: i64) -> String {
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

    #[test]
    fn lines_share_the_axes_and_name_themselves() {
        let produce = [Point { at_ms: 0, value: 1000 }, Point { at_ms: 10_000, value: 2000 }];
        let fetch = [Point { at_ms: 5000, value: 4000 }, Point { at_ms: 10_000, value: 500 }];
        let lines = [Line { name: "Produce", points: &produce }, Line { name: "Fetch", points: &fetch }];
        let svg = lines_chart("latency-chart", &lines, "p99 latency", Scale::Micros);
        // The value axis reaches the largest value of any line; time spans both lines.
        assert!(svg.contains(">4.0 ms</text>"), "{svg}");
        assert!(svg.contains(r#"data-name="Produce" data-last="2000" points="56.0,108.5 600.0,75.0""#), "{svg}");
        assert!(svg.contains(r#"data-name="Fetch" data-last="500" points="328.0,8.0 600.0,125.2""#), "{svg}");
        assert!(svg.contains(">Fetch</text>"), "no legend: {svg}");
        let lonely = [Point { at_ms: 5000, value: 300 }];
        let svg = lines_chart("latency-chart", &[Line { name: "Produce", points: &lonely }], "p99", Scale::Micros);
        assert!(
            svg.contains(r##"<circle cx="56.0" cy="8.0" r="3" fill="#1f6feb"/>"##),
            "a point alone is not drawn: {svg}"
        );
        assert_eq!(Scale::BytesPerSecond.label(2048), format!("{}/s", display::size(2048)));
    }
}
