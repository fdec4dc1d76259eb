//! The benchmarks pages: the `sluice bench` runs in the folder the operator named, and one
//! run's summary table with each round's publish rate and p99 latency over time.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::bench_runs::{list_runs, rounds, run_dir, summary, RunEntry, Summary};
use crate::chart::line_chart;
use crate::history::Point;
use crate::pages::{failure, render, session_of, Chrome};
use crate::Console;

#[derive(Template)]
#[template(path = "benchmarks.html")]
struct BenchmarksPage {
    chrome: Chrome,
    /// The folder, when one is configured.
    folder: Option<String>,
    runs: Vec<RunEntry>,
    error: Option<String>,
}

pub async fn benchmarks(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&session);
    let Some(folder) = console.bench_dir.clone() else {
        return render(BenchmarksPage { chrome, folder: None, runs: Vec::new(), error: None });
    };
    let listed = tokio::task::spawn_blocking({
        let folder = folder.clone();
        move || list_runs(&folder)
    })
    .await;
    let (runs, error) = match listed {
        Ok(Ok(runs)) => (runs, None),
        Ok(Err(error)) => (Vec::new(), Some(format!("{}: {error}", folder.display()))),
        Err(error) => (Vec::new(), Some(error.to_string())),
    };
    render(BenchmarksPage { chrome, folder: Some(folder.display().to_string()), runs, error })
}

/// One round's charts as the run page shows them.
pub struct RoundCharts {
    pub file: String,
    pub rate_chart: String,
    pub latency_chart: String,
}

#[derive(Template)]
#[template(path = "bench_run.html")]
struct RunPage {
    chrome: Chrome,
    path: String,
    summary: Summary,
    rounds: Vec<RoundCharts>,
}

#[derive(Deserialize)]
pub struct RunQuery {
    path: String,
}

pub async fn bench_run(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<RunQuery>,
) -> Response {
    let session = match session_of(&console, &headers).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let not_found = || (StatusCode::NOT_FOUND, failure(&format!("no benchmark run {:?}", query.path))).into_response();
    let Some(dir) = console.bench_dir.as_deref().and_then(|base| run_dir(base, &query.path)) else {
        return not_found();
    };
    let read = tokio::task::spawn_blocking(move || Ok::<_, std::io::Error>((summary(&dir)?, rounds(&dir)?))).await;
    let (summary, rounds) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(error)) => return failure(&format!("{}: {error}", query.path)),
        Err(error) => return failure(&error.to_string()),
    };
    let rounds = rounds
        .into_iter()
        .enumerate()
        .map(|(index, round)| {
            let at = |i: usize| (i as f64 * round.sample_seconds * 1000.0) as i64;
            let points = |values: &[f64], scale: f64| -> Vec<Point> {
                values.iter().enumerate().map(|(i, v)| Point { at_ms: at(i), value: (v * scale) as i64 }).collect()
            };
            RoundCharts {
                rate_chart: line_chart(
                    &format!("rate-{index}"),
                    &points(&round.publish_rate, 1.0),
                    "messages per second",
                ),
                latency_chart: line_chart(
                    &format!("p99-{index}"),
                    &points(&round.publish_p99_ms, 1000.0),
                    "publish p99 in microseconds",
                ),
                file: round.file,
            }
        })
        .collect();
    render(RunPage { chrome: Chrome::of(&session), path: query.path, summary, rounds })
}
