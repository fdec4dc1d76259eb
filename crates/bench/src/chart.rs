//! Charts of one or several result files: SVG drawn with `plotters` (no system fonts
//! needed: SVG text is rendered by the viewer) and an `index.html` collecting them.
//!
//! Over time: publish rate, consume rate, publish latency p99 and average, end-to-end
//! latency p95 and average (OMB's set). By quantile, on a log axis from 50% to 99.999%:
//! publish latency, publish delay and end-to-end latency. Each result file is one series,
//! so several files in one call give a comparison.
//!
//! ```text
//! sluice bench chart kafka.json sluice.json --output-dir charts
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::prelude::*;

use crate::result::{Quantiles, TestResult};

/// Arguments of `sluice bench chart`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChartArgs {
    /// Result files (ours or OMB's); each becomes one series.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Folder for the SVG files and index.html.
    #[arg(long, default_value = "charts")]
    pub output_dir: PathBuf,
}

/// Runs `sluice bench chart`.
pub fn run(args: ChartArgs) -> anyhow::Result<()> {
    let mut results = Vec::new();
    for path in &args.results {
        results.push((crate::label_of(path), TestResult::load(path)?));
    }
    write_all(&results, &args.output_dir)?;
    println!("Wrote {}", args.output_dir.join("index.html").display());
    Ok(())
}

const WIDTH: u32 = 960;
const HEIGHT: u32 = 540;
/// Highest quantile drawn, as "nines" (5 = 99.999%).
const NINES_MAX: f64 = 5.0;

type Series = (String, Vec<(f64, f64)>);

/// A chart: a file name, a title, axis labels and series.
struct Chart {
    file: &'static str,
    title: &'static str,
    x_label: &'static str,
    y_label: &'static str,
    quantile_axis: bool,
    series: Vec<Series>,
}

/// Writes every chart and `index.html` for `results` (label, result) into `folder`.
pub fn write_all(results: &[(String, TestResult)], folder: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    let charts = charts_of(results);
    for chart in &charts {
        draw(chart, &folder.join(chart.file)).with_context(|| format!("drawing {}", chart.file))?;
    }
    std::fs::write(folder.join("index.html"), html(results, &charts))?;
    Ok(())
}

fn over_time(results: &[(String, TestResult)], pick: impl Fn(&TestResult) -> &Vec<f64>) -> Vec<Series> {
    results
        .iter()
        .map(|(label, result)| {
            let period_s =
                result.sluice.as_ref().map(|extras| extras.sample_period_seconds).filter(|s| *s > 0.0).unwrap_or(10.0);
            let points =
                pick(result).iter().enumerate().map(|(i, value)| ((i + 1) as f64 * period_s, *value)).collect();
            (label.clone(), points)
        })
        .collect()
}

fn by_quantile(results: &[(String, TestResult)], pick: impl Fn(&TestResult) -> &Quantiles) -> Vec<Series> {
    results
        .iter()
        .map(|(label, result)| {
            let points = pick(result)
                .0
                .iter()
                .filter(|(percentile, _)| *percentile >= 50.0 && *percentile < 100.0)
                .map(|(percentile, value)| (nines(*percentile), *value))
                .filter(|(x, _)| *x <= NINES_MAX)
                .collect();
            (label.clone(), points)
        })
        .collect()
}

/// Percentile to "nines": 90% -> 1, 99% -> 2, 99.9% -> 3.
fn nines(percentile: f64) -> f64 {
    -(1.0 - percentile / 100.0).log10()
}

fn nines_label(x: &f64) -> String {
    let percentile = 100.0 * (1.0 - 10f64.powf(-x));
    let text = format!("{percentile:.5}");
    format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
}

fn charts_of(results: &[(String, TestResult)]) -> Vec<Chart> {
    let time =
        |file, title, y_label, series| Chart { file, title, x_label: "seconds", y_label, quantile_axis: false, series };
    let quantile = |file, title, y_label, series| Chart {
        file,
        title,
        x_label: "percentile",
        y_label,
        quantile_axis: true,
        series,
    };
    vec![
        time("publish-rate.svg", "Publish rate", "msg/s", over_time(results, |r| &r.publish_rate)),
        time("consume-rate.svg", "Consume rate", "msg/s", over_time(results, |r| &r.consume_rate)),
        time("publish-latency-p99.svg", "Publish latency p99", "ms", over_time(results, |r| &r.publish_latency_99pct)),
        time(
            "publish-latency-avg.svg",
            "Publish latency average",
            "ms",
            over_time(results, |r| &r.publish_latency_avg),
        ),
        time(
            "end-to-end-latency-p95.svg",
            "End-to-end latency p95",
            "ms",
            over_time(results, |r| &r.end_to_end_latency_95pct),
        ),
        time(
            "end-to-end-latency-avg.svg",
            "End-to-end latency average",
            "ms",
            over_time(results, |r| &r.end_to_end_latency_avg),
        ),
        quantile(
            "publish-latency-quantiles.svg",
            "Publish latency by percentile",
            "ms (log)",
            by_quantile(results, |r| &r.aggregated_publish_latency_quantiles),
        ),
        quantile(
            "publish-delay-quantiles.svg",
            "Publish delay by percentile",
            "us (log)",
            by_quantile(results, |r| &r.aggregated_publish_delay_latency_quantiles),
        ),
        quantile(
            "end-to-end-latency-quantiles.svg",
            "End-to-end latency by percentile",
            "ms (log)",
            by_quantile(results, |r| &r.aggregated_end_to_end_latency_quantiles),
        ),
    ]
}

fn bounds(series: &[Series]) -> (f64, f64, f64, f64) {
    let points = series.iter().flat_map(|(_, points)| points.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points {
        x_min = x_min.min(*x);
        x_max = x_max.max(*x);
        y_min = y_min.min(*y);
        y_max = y_max.max(*y);
    }
    if x_min > x_max {
        return (0.0, 1.0, 0.0, 1.0);
    }
    (x_min, x_max.max(x_min + 1e-9), y_min, y_max.max(y_min + 1e-9))
}

fn draw(chart: &Chart, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (x_min, x_max, y_min, y_max) = bounds(&chart.series);
    let mut builder = ChartBuilder::on(&root);
    builder.caption(chart.title, ("sans-serif", 24)).margin(16).x_label_area_size(44).y_label_area_size(72);
    if chart.quantile_axis {
        let y_low = y_min.max(1e-3) * 0.8;
        let y_high = y_max.max(y_low * 10.0) * 1.25;
        let mut context =
            builder.build_cartesian_2d(0.0..NINES_MAX, (y_low..y_high).log_scale()).map_err(plot_error)?;
        context
            .configure_mesh()
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .x_labels(NINES_MAX as usize + 1)
            .x_label_formatter(&nines_label)
            .draw()
            .map_err(plot_error)?;
        draw_series(&mut context, &chart.series)?;
        legend(&mut context, SeriesLabelPosition::LowerRight)?;
    } else {
        let y_high = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
        let mut context = builder.build_cartesian_2d(x_min.min(0.0)..x_max, 0.0..y_high).map_err(plot_error)?;
        context.configure_mesh().x_desc(chart.x_label).y_desc(chart.y_label).draw().map_err(plot_error)?;
        draw_series(&mut context, &chart.series)?;
        legend(&mut context, SeriesLabelPosition::UpperRight)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

fn draw_series<'a, DB, X, Y>(
    context: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    series: &[Series],
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for (index, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        context
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    Ok(())
}

fn legend<'a, DB, X, Y>(
    context: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    context
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

fn plot_error<E: std::fmt::Debug>(error: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {error:?}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn html(results: &[(String, TestResult)], charts: &[Chart]) -> String {
    let mut page = String::from(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>sluice bench results</title>\n\
         <style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#eee}\
         td:first-child{text-align:left}img{max-width:100%}</style></head><body>\n\
         <h1>sluice bench results</h1>\n<table><tr><th>result</th><th>workload</th><th>driver</th>\
         <th>pub msg/s</th><th>cons msg/s</th><th>pub p50 ms</th><th>pub p99 ms</th><th>pub p99.9 ms</th>\
         <th>e2e p50 ms</th><th>e2e p99 ms</th><th>e2e p99.9 ms</th><th>broker CPU s/GiB</th><th>broker peak RSS MiB</th></tr>\n",
    );
    for (label, result) in results {
        let extras = result.sluice.clone().unwrap_or_default();
        let optional = |value: Option<f64>| value.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.2}</td><td>{:.2}</td>\
             <td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td><td>{}</td></tr>",
            escape(label),
            escape(&result.workload),
            escape(&result.driver),
            result.publish_rate_mean(),
            result.consume_rate_mean(),
            result.aggregated_publish_latency_50pct,
            result.aggregated_publish_latency_99pct,
            result.aggregated_publish_latency_999pct,
            result.aggregated_end_to_end_latency_50pct,
            result.aggregated_end_to_end_latency_99pct,
            result.aggregated_end_to_end_latency_999pct,
            optional(extras.broker_cpu_seconds_per_gb),
            optional(extras.broker_peak_rss_bytes.map(|b| b as f64 / (1024.0 * 1024.0))),
        );
    }
    page.push_str("</table>\n");
    if let Some(clock) = results.iter().find_map(|(_, r)| r.sluice.as_ref().map(|e| e.end_to_end_clock.clone())) {
        let _ = writeln!(page, "<p>End-to-end latency clock: {}</p>", escape(&clock));
    }
    for chart in charts {
        let _ = writeln!(page, "<h2>{}</h2>\n<img src=\"{}\" alt=\"{}\">", chart.title, chart.file, chart.title);
    }
    page.push_str("</body></html>\n");
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_axis() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines_label(&2.0), "99%");
        assert_eq!(nines_label(&5.0), "99.999%");
    }

    #[test]
    fn charts_for_two_results() {
        let mut a = TestResult { workload: "w".into(), driver: "d".into(), ..TestResult::default() };
        a.publish_rate = vec![10.0, 20.0, 15.0];
        a.publish_latency_99pct = vec![1.0, 2.0, 1.5];
        a.aggregated_publish_latency_quantiles =
            Quantiles(vec![(50.0, 1.0), (90.0, 2.0), (99.0, 3.0), (99.99, 9.0), (100.0, 10.0)]);
        let b = a.clone();
        let dir = tempfile::tempdir().unwrap();
        write_all(&[("a".into(), a), ("b".into(), b)], dir.path()).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("publish-latency-quantiles.svg")).unwrap();
        assert!(svg.contains("<svg"));
        assert!(svg.contains("99.99%") || svg.contains("99.9%"), "quantile axis labels");
        let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
        assert!(html.contains("publish-rate.svg"));
    }
}
