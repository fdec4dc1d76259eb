//! `sluice bench`: OpenMessaging-Benchmark workloads against any Kafka-protocol broker.
//!
//! The bench reads OMB's workload and Kafka driver YAML files as they are
//! ([`workload`], [`driver`]), drives the broker with real librdkafka clients, one per
//! OMB producer and consumer ([`kafka`]), runs OMB's phases ([`runner`]) and writes
//! OMB's result JSON ([`result`]), so numbers can be set beside published ones. It also
//! draws charts ([`chart`]) and runs side-by-side comparisons with Apache Kafka
//! ([`compare`], [`brokers`]). Brokers it starts can be held to the same memory cap
//! ([`memcap`]), so that a catch-up read of a large backlog comes from disk.
//!
//! ```text
//! sluice bench --driver bench/drivers/kafka-latency.yaml bench/workloads/1-topic-100-partitions-1kb.yaml
//! sluice bench chart results/*.json --output-dir charts
//! sluice bench compare --workload bench/workloads-scaled/... --driver ... --against kafka
//! ```

#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
#![deny(unused_must_use)]

pub mod brokers;
pub mod chart;
pub mod compare;
pub mod console_viewer;
pub mod driver;
pub mod kafka;
pub mod memcap;
pub mod neighbour;
pub mod peak;
pub mod peer;
pub mod procstat;
pub mod rate;
pub mod result;
pub mod runner;
pub mod share;
pub mod stats;
pub mod tls;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::driver::Driver;
use crate::result::result_file_name;
use crate::runner::{ConsumerModeChoice, RunOptions};
use crate::workload::Workload;

/// Arguments of `sluice bench`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// `compare`, `chart` or `kafka`; without one, runs the given workloads.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Workload runs.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands of `sluice bench`.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Runs a workload against Sluice and a peer broker alternately and prints the ratios.
    Compare(Box<compare::CompareArgs>),
    /// Draws charts (SVG) and an HTML page from result files.
    Chart(chart::ChartArgs),
    /// Starts Apache Kafka (from Maven Central on first use), prints `ready <bootstrap>` and
    /// serves until standard input closes: a peer to compare Sluice's answers with.
    Kafka(peer::PeerArgs),
}

/// Arguments of a plain run (`sluice bench --driver D W.yaml...`).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Driver files, as OMB's `--drivers`; each workload runs once per driver.
    #[arg(short = 'd', long = "driver", alias = "drivers", value_delimiter = ',')]
    pub drivers: Vec<PathBuf>,
    /// Workload files.
    pub workloads: Vec<PathBuf>,
    /// Result file (one run only); default `<workload>-<driver>-<date>.json` in --output-dir.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// Folder for result files.
    #[arg(long, default_value = ".")]
    pub output_dir: PathBuf,
    /// Also draw charts and an HTML page beside each result.
    #[arg(long)]
    pub charts: bool,
    /// Start a fresh `sluice serve` for the run (on a free loopback port, temporary data dir).
    #[arg(long)]
    pub start_sluice: bool,
    /// The `sluice` binary for --start-sluice (default: this executable).
    #[arg(long, env = "SLUICE_BIN")]
    pub sluice_bin: Option<PathBuf>,
    /// Start a fresh Apache Kafka (single-node KRaft, installed from Maven Central on first use).
    #[arg(long, conflicts_with = "start_sluice")]
    pub start_kafka: bool,
    /// Kafka settings for --start-kafka.
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Nodes of the broker started with --start-sluice or --start-kafka (> 1 = a cluster
    /// of that many processes on loopback).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub nodes: u16,
    /// Broker process to measure (CPU seconds, peak RSS; repeat for a cluster's nodes);
    /// set automatically with --start-*.
    #[arg(long)]
    pub broker_pid: Vec<u32>,
    /// With --start-*: page cache each broker node may use (e.g. 512m, 1g); the node runs
    /// in a memory cgroup limited to this plus the broker's own resident need (see
    /// bench/README.md). Needs root and memory cgroups.
    #[arg(long, value_name = "SIZE")]
    pub broker_memory_limit: Option<memcap::MemoryCap>,
    /// Run overrides shared with `compare`.
    #[command(flatten)]
    pub overrides: Overrides,
}

/// Where and which Apache Kafka to run.
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaArgs {
    /// Kafka version from Maven Central.
    #[arg(long, default_value = brokers::KAFKA_VERSION_DEFAULT)]
    pub kafka_version: String,
    /// Cache folder for the Kafka install (default ~/.cache/sluice-bench or $SLUICE_BENCH_CACHE).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Kafka JVM heap (-Xms and -Xmx).
    #[arg(long, default_value = "1g")]
    pub kafka_heap: String,
}

impl KafkaArgs {
    /// Installs (if needed) and starts a fresh Kafka of `nodes` nodes, each in a memory
    /// cgroup when `memory` is given.
    pub fn start(
        &self,
        nodes: usize,
        tls: Option<&tls::BenchTls>,
        memory: Option<memcap::MemoryCap>,
    ) -> anyhow::Result<brokers::BrokerSet> {
        let cache = self.cache_dir.clone().unwrap_or_else(brokers::cache_dir_default);
        let install = brokers::KafkaInstall::ensure(&cache, &self.kafka_version)?;
        install.start_cluster(&self.kafka_heap, nodes, tls, memory)
    }
}

/// Overrides of the OMB files, for short runs and one-machine scale.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// Overrides `bootstrap.servers` of the driver.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// How consumers get partitions: `auto` uses consumer groups when the broker has them.
    #[arg(long, value_enum, default_value_t = ConsumerModeChoice::Auto)]
    pub consumer_mode: ConsumerModeChoice,
    /// Overrides `testDurationMinutes`, in seconds.
    #[arg(long)]
    pub test_duration_seconds: Option<f64>,
    /// Overrides `warmupDurationMinutes`, in seconds.
    #[arg(long)]
    pub warmup_duration_seconds: Option<f64>,
    /// Overrides the sample period (default 10 s, or the workload's `sampleRateMillis`).
    #[arg(long)]
    pub sample_period_seconds: Option<f64>,
    /// Overrides `producerRate` (msg/s; 0 = discover the sustainable rate).
    #[arg(long)]
    pub producer_rate: Option<f64>,
    /// Search the peak stable throughput with fixed-rate trials (doubling from
    /// --producer-rate or 10,000 msg/s, then bisecting) instead of one run; trials last
    /// 10 s warm-up + 20 s unless the durations are overridden.
    #[arg(long)]
    pub find_peak: bool,
    /// Noisy neighbour (a): put this much clean, unrelated file data in the page cache
    /// before the warm-up (e.g. 6g), as other programs' files on a production machine.
    #[arg(long, value_name = "SIZE", value_parser = memcap::parse_size)]
    pub neighbour_cached: Option<u64>,
    /// Noisy neighbour (b): another process (`dd`) writes this much (e.g. 3g) into the page
    /// cache of the neighbour folder's filesystem during the measured phase.
    #[arg(long, value_name = "SIZE", value_parser = memcap::parse_size)]
    pub neighbour_writes: Option<u64>,
    /// When the neighbour's writer starts, seconds into the measured phase.
    #[arg(long, default_value_t = 25.0, value_name = "SECONDS")]
    pub neighbour_writes_at: f64,
    /// Folder of the neighbour's files: the broker's filesystem (default: the system's
    /// temporary folder, where brokers the bench starts keep their data).
    #[arg(long, value_name = "DIR")]
    pub neighbour_dir: Option<PathBuf>,
}

impl Overrides {
    /// The noisy neighbour asked for, if any.
    pub fn neighbour_plan(&self) -> Option<neighbour::NeighbourPlan> {
        let cached_bytes = self.neighbour_cached.unwrap_or(0);
        let write_bytes = self.neighbour_writes.unwrap_or(0);
        (cached_bytes > 0 || write_bytes > 0).then(|| neighbour::NeighbourPlan {
            dir: self.neighbour_dir.clone().unwrap_or_else(std::env::temp_dir),
            cached_bytes,
            write_bytes,
            write_at: Duration::from_secs_f64(self.neighbour_writes_at.max(0.0)),
        })
    }

    /// Run options from these overrides.
    pub fn run_options(&self) -> RunOptions {
        let seconds = |value: Option<f64>| value.map(|s| Duration::from_secs_f64(s.max(0.0)));
        RunOptions {
            bootstrap: self.bootstrap.clone(),
            consumer_mode: self.consumer_mode,
            test_duration: seconds(self.test_duration_seconds),
            warmup_duration: seconds(self.warmup_duration_seconds),
            sample_period: seconds(self.sample_period_seconds).map(|d| d.max(Duration::from_millis(100))),
            producer_rate: self.producer_rate,
            neighbour: self.neighbour_plan(),
            ..RunOptions::default()
        }
    }
}

/// Runs `sluice bench` with parsed arguments.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        Some(BenchCommand::Compare(compare_args)) => compare::run(*compare_args),
        Some(BenchCommand::Chart(chart_args)) => chart::run(chart_args),
        Some(BenchCommand::Kafka(peer_args)) => peer::run(peer_args),
        None => run_workloads(args.run).map(|_| ()),
    }
}

/// Runs every workload once per driver and writes one result file per run.
pub fn run_workloads(args: RunArgs) -> anyhow::Result<Vec<PathBuf>> {
    if args.workloads.is_empty() {
        bail!("no workload file given (usage: sluice bench --driver DRIVER.yaml WORKLOAD.yaml...)");
    }
    if args.drivers.is_empty() {
        bail!("no driver file given (--driver DRIVER.yaml)");
    }
    if args.broker_memory_limit.is_some() && !args.start_sluice && !args.start_kafka {
        bail!("--broker-memory-limit caps a broker the bench starts: add --start-sluice or --start-kafka");
    }
    let runs_count = args.workloads.len() * args.drivers.len();
    if args.output.is_some() && runs_count > 1 {
        bail!("--output names one file but {runs_count} runs were asked for: use --output-dir");
    }
    let workloads = args.workloads.iter().map(Workload::load).collect::<anyhow::Result<Vec<_>>>()?;
    let drivers = args.drivers.iter().map(Driver::load).collect::<anyhow::Result<Vec<_>>>()?;
    std::fs::create_dir_all(&args.output_dir).with_context(|| format!("creating {}", args.output_dir.display()))?;

    let mut written = Vec::new();
    for driver in &drivers {
        for workload in &workloads {
            let mut options = args.overrides.run_options();
            options.broker_pids = args.broker_pid.clone();
            let mut broker = None;
            if args.start_sluice {
                let bin = match &args.sluice_bin {
                    Some(bin) => bin.clone(),
                    None => std::env::current_exe()?,
                };
                let started = brokers::SluiceBroker::start_cluster(
                    &bin,
                    usize::from(args.nodes),
                    &[],
                    None,
                    args.broker_memory_limit,
                )?;
                options.bootstrap = Some(started.bootstrap());
                options.broker_pids = started.pids();
                options.broker_label = Some("sluice".into());
                broker = Some(started);
            } else if args.start_kafka {
                let started = args.kafka.start(usize::from(args.nodes), None, args.broker_memory_limit)?;
                options.bootstrap = Some(started.bootstrap());
                options.broker_pids = started.pids();
                options.broker_label = Some("kafka".into());
                broker = Some(started);
            }
            let outcome = if args.overrides.find_peak {
                peak::find_peak(workload, driver, &options)
            } else {
                runner::run_workload(workload, driver, &options)
            };
            let memory = broker.as_ref().and_then(brokers::BrokerSet::memory_figures);
            if let Some(started) = broker.as_mut() {
                let label = options.broker_label.as_deref().unwrap_or("broker");
                let stem = format!("{label}-{}", unix_seconds());
                started.keep_logs_in(&args.output_dir, &stem);
            }
            drop(broker);
            let mut result = outcome?;
            if let (Some(extras), Some(memory)) = (result.sluice.as_mut(), memory) {
                extras.broker_memory = Some(memory);
            }
            let path = match &args.output {
                Some(path) => path.clone(),
                None => args.output_dir.join(result_file_name(&result.workload, &result.driver, unix_seconds())),
            };
            result.write(&path)?;
            println!("Wrote {}", path.display());
            if args.charts {
                let folder = path.with_extension("charts");
                chart::write_all(&[(label_of(&path), result.clone())], &folder)?;
                println!("Charts in {}", folder.display());
            }
            written.push(path);
        }
    }
    Ok(written)
}

/// A short label for a result file (its name without extension).
pub fn label_of(path: &std::path::Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

/// Seconds since the Unix epoch.
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
