//! `sluice bench` runs kept in a folder the operator names (`console_bench_dir`): each run
//! is a directory with the comparison's `summary.md` and one OpenMessaging-Benchmark result
//! file per round and broker (`round-N-kafka.json`, `round-N-sluice.json`).
//!
//! Why the console reads them: a benchmark's figures belong next to the cluster they were
//! measured on, and a chart of a round's rate and tail latency over time says more than its
//! median. Only files under the folder are read (a run is named by its path relative to it,
//! checked after symlinks are resolved), at most [`RUNS_MAX`] runs and [`FILE_BYTES_MAX`]
//! per file.

use std::path::{Component, Path, PathBuf};

/// Runs listed at most.
pub const RUNS_MAX: usize = 500;
/// Folder levels searched below the bench folder for runs.
const DEPTH_MAX: usize = 3;
/// The largest summary or result file read.
pub const FILE_BYTES_MAX: u64 = 32 * 1024 * 1024;
/// OpenMessaging-Benchmark's sample period when a result does not say.
const SAMPLE_SECONDS_DEFAULT: f64 = 10.0;

/// One run as the list shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEntry {
    /// Its path relative to the bench folder, `/`-separated.
    pub path: String,
    /// The summary's first line (the workload).
    pub headline: String,
}

/// A run's summary, split into its lines of text and its table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub lines: Vec<String>,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// One round's series over time.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The result file's name, e.g. `round-1-sluice.json`.
    pub file: String,
    pub sample_seconds: f64,
    /// Messages per second sent, per sample.
    pub publish_rate: Vec<f64>,
    /// The 99th percentile of publish latency (ms), per sample.
    pub publish_p99_ms: Vec<f64>,
}

/// Every run under `base` (newest path first), at most [`RUNS_MAX`].
pub fn list_runs(base: &Path) -> std::io::Result<Vec<RunEntry>> {
    let mut found = Vec::new();
    collect(base, base, 0, &mut found)?;
    found.sort_by(|a: &RunEntry, b| b.path.cmp(&a.path));
    found.truncate(RUNS_MAX);
    Ok(found)
}

fn collect(base: &Path, dir: &Path, depth: usize, found: &mut Vec<RunEntry>) -> std::io::Result<()> {
    if found.len() >= RUNS_MAX {
        return Ok(());
    }
    let summary = dir.join("summary.md");
    if summary.is_file() {
        let text = read_bounded(&summary)?;
        let path = dir.strip_prefix(base).unwrap_or(dir).to_string_lossy().replace('\\', "/");
        found.push(RunEntry { path, headline: text.lines().next().unwrap_or("").to_string() });
        return Ok(());
    }
    if depth == DEPTH_MAX {
        return Ok(());
    }
    let mut children: Vec<PathBuf> =
        std::fs::read_dir(dir)?.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    children.sort();
    for child in children {
        collect(base, &child, depth + 1, found)?;
    }
    Ok(())
}

/// The run directory `relative` names under `base`, or `None` when it is not one (outside
/// the folder, through `..` or a symlink, or without a summary).
pub fn run_dir(base: &Path, relative: &str) -> Option<PathBuf> {
    let relative = Path::new(relative);
    if relative.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    let base = base.canonicalize().ok()?;
    let dir = base.join(relative).canonicalize().ok()?;
    (dir.starts_with(&base) && dir.join("summary.md").is_file()).then_some(dir)
}

fn read_bounded(path: &Path) -> std::io::Result<String> {
    let size = std::fs::metadata(path)?.len();
    if size > FILE_BYTES_MAX {
        return Err(std::io::Error::other(format!("{} is larger than {FILE_BYTES_MAX} bytes", path.display())));
    }
    Ok(String::from_utf8_lossy(&std::fs::read(path)?).into_owned())
}

/// The summary of the run in `dir`.
pub fn summary(dir: &Path) -> std::io::Result<Summary> {
    Ok(parse_summary(&read_bounded(&dir.join("summary.md"))?))
}

/// Splits a summary into its text lines and its first table (`| a | b |` rows; the
/// `|---|` line under the header row is dropped).
pub fn parse_summary(text: &str) -> Summary {
    let mut summary = Summary::default();
    for line in text.lines().map(str::trim) {
        if let Some(inner) = line.strip_prefix('|') {
            let cells: Vec<String> = inner.trim_end_matches('|').split('|').map(|c| c.trim().to_string()).collect();
            if cells.iter().all(|c| !c.is_empty() && c.chars().all(|ch| ch == '-' || ch == ':')) {
                continue;
            }
            match summary.header.is_empty() {
                true => summary.header = cells,
                false => summary.rows.push(cells),
            }
        } else if !line.is_empty() {
            summary.lines.push(line.to_string());
        }
    }
    summary
}

/// Each round's result file in `dir`, in name order.
pub fn rounds(dir: &Path) -> std::io::Result<Vec<Round>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut rounds = Vec::new();
    for file in files {
        let Ok(result) = serde_json::from_str::<serde_json::Value>(&read_bounded(&file)?) else { continue };
        let series = |name: &str| -> Vec<f64> {
            result
                .get(name)
                .and_then(|v| v.as_array())
                .map_or_else(Vec::new, |values| values.iter().filter_map(serde_json::Value::as_f64).collect())
        };
        let sample_seconds = result
            .pointer("/sluice/samplePeriodSeconds")
            .and_then(serde_json::Value::as_f64)
            .filter(|s| *s > 0.0)
            .unwrap_or(SAMPLE_SECONDS_DEFAULT);
        rounds.push(Round {
            file: file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            sample_seconds,
            publish_rate: series("publishRate"),
            publish_p99_ms: series("publishLatency99pct"),
        });
    }
    Ok(rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_splits_into_text_and_its_table() {
        let text = "Workload: w\n\n| figure | Kafka | Sluice |\n|---|---|---|\n| rate | 1 | 2 |\nCPU criterion: met\n";
        let summary = parse_summary(text);
        assert_eq!(summary.lines, vec!["Workload: w", "CPU criterion: met"]);
        assert_eq!(summary.header, vec!["figure", "Kafka", "Sluice"]);
        assert_eq!(summary.rows, vec![vec!["rate", "1", "2"]]);
    }

    #[test]
    fn runs_are_found_below_the_folder_and_nothing_outside_it_is_read() {
        let base = std::env::temp_dir().join(format!("sluice-bench-runs-{}", std::process::id()));
        let run = base.join("2026-01-01/latency");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("summary.md"), "Workload: w\n").unwrap();
        std::fs::write(run.join("round-1-sluice.json"), r#"{"publishRate": [1.5, 2], "publishLatency99pct": [3]}"#)
            .unwrap();
        let runs = list_runs(&base).unwrap();
        assert_eq!(runs, vec![RunEntry { path: "2026-01-01/latency".into(), headline: "Workload: w".into() }]);
        assert!(run_dir(&base, "2026-01-01/latency").is_some());
        assert!(run_dir(&base, "../..").is_none());
        assert!(run_dir(&base, "/etc").is_none());
        assert!(run_dir(&base, "2026-01-01").is_none(), "a folder without a summary is no run");
        let rounds = rounds(&run).unwrap();
        assert_eq!(rounds[0].publish_rate, vec![1.5, 2.0]);
        assert_eq!(rounds[0].sample_seconds, SAMPLE_SECONDS_DEFAULT);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
