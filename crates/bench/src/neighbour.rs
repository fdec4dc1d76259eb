//! A noisy neighbour for a run: the broker's publish p99 should stay within
//! 1.5x of a quiet run's (a) with gigabytes of unrelated clean file data in the page cache
//! and (b) while another process writes gigabytes into the page cache of the broker's
//! filesystem. A production machine's page cache is never empty, and a `compare` that
//! drops the cache before each run hides what a full one costs.
//!
//! (a) `--neighbour-cached SIZE`: before the warm-up, a file of SIZE is written and
//! fsynced, so its pages sit in the page cache, clean, as another program's data would.
//! (b) `--neighbour-writes SIZE`: `--neighbour-writes-at` seconds into the measured phase,
//! a `dd` process writes SIZE into a file at full speed, through the page cache and without
//! fsync, as a log shipper or a build would. The kernel writes it back by its own rules:
//! with the default thresholds much of it stays dirty until it expires (30 s) and then goes
//! to the disk at once, and the broker's next fsync waits for it (README, "Durability").
//! Both files go to `--neighbour-dir` (default: the system's temporary folder,
//! where the brokers the bench starts keep their data, so the same filesystem and disk)
//! and are removed when the run ends. The result records what was done and when
//! ([`NeighbourFigures`]); its per-sample latencies show the windows the writer touched.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Bytes per write of the cache fill and of the writer (`dd bs=`).
const WRITE_BLOCK_BYTES: usize = 1 << 20;

/// What the neighbour does in a run (from the command line).
#[derive(Debug, Clone, PartialEq)]
pub struct NeighbourPlan {
    /// Folder of the neighbour's files (on the broker's filesystem).
    pub dir: PathBuf,
    /// Clean file data put in the page cache before the warm-up, bytes (0: none).
    pub cached_bytes: u64,
    /// Bytes the writer writes during the measured phase (0: no writer).
    pub write_bytes: u64,
    /// When the writer starts, from the start of the measured phase.
    pub write_at: Duration,
}

/// What the neighbour did, for the result file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct NeighbourFigures {
    /// Folder of the neighbour's files.
    pub dir: String,
    /// Clean file data put in the page cache before the warm-up, bytes.
    pub cached_bytes: u64,
    /// Seconds the fill took (write and fsync).
    pub cache_fill_seconds: f64,
    /// Bytes the writer wrote (all of `write_bytes` when it finished).
    pub written_bytes: u64,
    /// When the writer started, seconds into the measured phase.
    pub write_start_seconds: Option<f64>,
    /// Seconds the writer ran (until `dd` exited: its data in the page cache, not yet on
    /// the disk); `None` if it had not finished when the measured phase ended.
    pub write_seconds: Option<f64>,
}

/// The neighbour during a run; removes its files when dropped.
pub struct Neighbour {
    plan: NeighbourPlan,
    cached_file: PathBuf,
    written_file: PathBuf,
    writer: Option<(Child, Instant)>,
    figures: NeighbourFigures,
}

impl Neighbour {
    /// Checks the plan and fills the page cache (a), before the warm-up.
    pub fn prepare(plan: NeighbourPlan) -> anyhow::Result<Neighbour> {
        if !plan.dir.is_dir() {
            bail!("--neighbour-dir {}: not a folder", plan.dir.display());
        }
        let name = |kind: &str| plan.dir.join(format!("sluice-bench-neighbour-{kind}-{}", std::process::id()));
        let mut neighbour = Neighbour {
            cached_file: name("cached"),
            written_file: name("written"),
            writer: None,
            figures: NeighbourFigures { dir: plan.dir.display().to_string(), ..NeighbourFigures::default() },
            plan,
        };
        if neighbour.plan.cached_bytes > 0 {
            let started = Instant::now();
            println!(
                "Neighbour: putting {} MiB of clean file data in the page cache ({})",
                neighbour.plan.cached_bytes >> 20,
                neighbour.cached_file.display()
            );
            fill(&neighbour.cached_file, neighbour.plan.cached_bytes)
                .with_context(|| format!("writing {}", neighbour.cached_file.display()))?;
            neighbour.figures.cached_bytes = neighbour.plan.cached_bytes;
            neighbour.figures.cache_fill_seconds = started.elapsed().as_secs_f64();
        }
        Ok(neighbour)
    }

    /// Called every tick of the measured phase with the time since it started: starts the
    /// writer when its time has come and notes when it finished.
    pub fn tick(&mut self, since_start: Duration) -> anyhow::Result<()> {
        if self.plan.write_bytes == 0 {
            return Ok(());
        }
        match &mut self.writer {
            None if since_start >= self.plan.write_at => {
                let blocks = self.plan.write_bytes.div_ceil(WRITE_BLOCK_BYTES as u64);
                println!(
                    "Neighbour: dd writes {} MiB into {} at {:.1}s",
                    (blocks * WRITE_BLOCK_BYTES as u64) >> 20,
                    self.written_file.display(),
                    since_start.as_secs_f64()
                );
                let child = Command::new("dd")
                    .arg("if=/dev/zero")
                    .arg(format!("of={}", self.written_file.display()))
                    .arg(format!("bs={WRITE_BLOCK_BYTES}"))
                    .arg(format!("count={blocks}"))
                    .arg("status=none")
                    .stdin(Stdio::null())
                    .spawn()
                    .context("starting the neighbour's writer (dd)")?;
                self.writer = Some((child, Instant::now()));
                self.figures.write_start_seconds = Some(since_start.as_secs_f64());
            }
            Some((child, started)) if self.figures.write_seconds.is_none() => {
                if let Some(status) = child.try_wait()? {
                    if !status.success() {
                        bail!("the neighbour's writer (dd) failed: {status}");
                    }
                    self.figures.write_seconds = Some(started.elapsed().as_secs_f64());
                    self.figures.written_bytes = std::fs::metadata(&self.written_file)?.len();
                    println!(
                        "Neighbour: wrote {} MiB in {:.1}s",
                        self.figures.written_bytes >> 20,
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// What the neighbour did so far.
    pub fn figures(&self) -> NeighbourFigures {
        self.figures.clone()
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        if let Some((child, _)) = &mut self.writer {
            let _ = child.kill();
            let _ = child.wait();
        }
        for file in [&self.cached_file, &self.written_file] {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// Writes `bytes` (non-zero data) to `path` and fsyncs it: clean pages in the page cache.
fn fill(path: &Path, bytes: u64) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    let block = vec![0x5a_u8; WRITE_BLOCK_BYTES];
    let mut left = bytes;
    while left > 0 {
        let take = left.min(block.len() as u64) as usize;
        file.write_all(&block[..take])?;
        left -= take as u64;
    }
    file.sync_all()
}
