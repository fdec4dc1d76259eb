//! The charts of lag and rates over time on the overview, topic and group pages: what
//! `history` kept, drawn with the window links and the polling that redraws them in place
//! (`chart_routes` answers the polls).

use askama::Template;
use serde::Deserialize;

use crate::chart::{line_chart, lines_chart, Line, Scale};
use crate::history::{History, SeriesKey, Window};

/// The `window` query of a page or chart: `1h` (default) or `24h`.
#[derive(Deserialize, Default)]
pub struct WindowQuery {
    #[serde(default)]
    window: Option<String>,
}

impl WindowQuery {
    pub fn window(&self) -> Window {
        Window::parse(self.window.as_deref())
    }
}

#[derive(Template)]
#[template(path = "over_time.html")]
struct OverTime<'a> {
    /// The element's id, also the chart's.
    id: &'a str,
    title: &'a str,
    /// The route that redraws it.
    source: String,
    window: &'static str,
    refresh_s: u64,
    svg: String,
    /// Why there is nothing to show yet, when sampling fails.
    note: Option<String>,
}

fn window_name(window: Window) -> &'static str {
    match window {
        Window::Recent => "1h",
        Window::Day => "24h",
    }
}

fn drawn(history: &History, id: &str, title: &str, source: String, window: Window, svg: String) -> String {
    let page = OverTime {
        id,
        title,
        source,
        window: window_name(window),
        refresh_s: history.interval.as_secs().max(1),
        svg,
        note: history.last_error().map(|why| format!("the last sample failed: {why}")),
    };
    page.render().unwrap_or_else(|error| format!("<p class=\"error\">chart: {error}</p>"))
}

/// The lag chart of group `id` (the caller has checked the user may describe it).
pub fn group_lag(history: &History, id: &str, window: Window) -> String {
    let points = history.points(&SeriesKey::GroupLag(id.to_string()), window);
    let svg = line_chart("lag-chart", &points, "messages behind");
    drawn(history, "lag-over-time", "Lag over time", format!("/groups/{id}/lag-chart"), window, svg)
}

/// The messages-per-second chart of `topic` (the caller has checked the user may describe it).
pub fn topic_rate(history: &History, topic: &str, window: Window) -> String {
    let points = history.rate(&[topic.to_string()], window);
    let svg = line_chart("rate-chart", &points, "messages per second");
    drawn(history, "rate-over-time", "Messages per second", format!("/topics/{topic}/rate-chart"), window, svg)
}

/// The messages-per-second chart of all of `topics` together (those the user may describe).
pub fn cluster_rate(history: &History, topics: &[String], window: Window) -> String {
    let points = history.rate(topics, window);
    let svg = line_chart("cluster-rate-chart", &points, "messages per second");
    drawn(history, "cluster-rate-over-time", "Messages per second, all topics", "/rate-chart".to_string(), window, svg)
}

/// This node's bytes in (produced) and out (fetched by consumers and followers) per second.
pub fn node_traffic(history: &History, window: Window) -> String {
    let (into, out) =
        (history.growth(&SeriesKey::NodeBytesIn, window), history.growth(&SeriesKey::NodeBytesOut, window));
    let lines = [Line { name: "in", points: &into }, Line { name: "out", points: &out }];
    let svg = lines_chart("node-traffic-chart", &lines, "bytes per second", Scale::BytesPerSecond);
    drawn(
        history,
        "node-traffic-over-time",
        "Bytes per second, this node",
        "/node-traffic-chart".to_string(),
        window,
        svg,
    )
}

/// This node's Produce and Fetch latency percentile over each interval (a Fetch's time
/// includes its wait for data, up to the consumer's `fetch.max.wait.ms`).
pub fn node_latency(history: &History, window: Window) -> String {
    let series = |api: &str| history.points(&SeriesKey::RequestLatency(api.to_string()), window);
    let (produce, fetch) = (series("Produce"), series("Fetch"));
    let lines = [Line { name: "Produce", points: &produce }, Line { name: "Fetch", points: &fetch }];
    let svg = lines_chart("node-latency-chart", &lines, "p99 request latency", Scale::Micros);
    let title = "Request latency p99, this node (Fetch includes its wait for data)";
    drawn(history, "node-latency-over-time", title, "/node-latency-chart".to_string(), window, svg)
}

/// The names of the topics a Metadata answer lists without an error.
pub fn visible_topics(metadata: &crate::cluster::ClusterMetadata) -> Vec<String> {
    metadata
        .topics
        .iter()
        .filter(|t| t.error_code == 0)
        .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
        .collect()
}
