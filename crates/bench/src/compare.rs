//! `sluice bench compare`: the same workload against Apache Kafka and Sluice, alternately.
//!
//! Each round starts each broker fresh (new data dir, page cache dropped when we may),
//! runs the workload with the same clients and settings, and stops the broker: Kafka,
//! then Sluice, N rounds (A B A B). The table gives each figure's median with min and
//! max across rounds for both brokers and the ratio of the medians (Sluice / Kafka).
//! Broker CPU seconds and peak RSS come from `/proc`, so CPU per GiB is a figure for both,
//! with its kernel (system time) part beside it, and the summary states the CPU
//! criterion (at most a third of Kafka's per GiB) with Sluice's kernel time alone as a share
//! of Kafka's whole: a floor under Sluice's figure that no user-space work of its own lowers.
//!
//! Durability: the driver's `topicConfig` goes to both brokers' CreateTopics. With
//! `flush.messages=1` Kafka fsyncs every message (level 1 of REFERENCE.md on one node);
//! without it Kafka runs at its default (page cache, no fsync). The table says which.
//!
//! A transactional driver (`requestsPerTransaction`) adds rows for committed
//! transactions per second, commit latency and aborts, and a line saying the transaction
//! size; plain runs get no such rows. A queue workload (share groups, see
//! [`crate::share`]) adds the acknowledged rate, redeliveries and acknowledgement errors; on
//! Kafka its share groups need the `share.version` feature, on by default from 4.2 (the
//! bench checks ApiVersions and says so otherwise).
//!
//! A catch-up workload (`consumerBacklogSizeGB`) adds the producers' publish latency
//! before the drain (consumers paused while the backlog builds) and during it, their
//! ratio, the catch-up MiB/s and the broker's disk reads during the drain, and the
//! summary states the catch-up criterion (p99 during / before at most
//! [`CATCH_UP_P99_RATIO_MAX`], catch-up MiB/s at least Kafka's). `--broker-memory-limit`
//! runs each broker node in a memory cgroup by the same rule ([`crate::memcap`]) so the
//! backlog is cold; the summary says the limits and adds the cgroups' peak usage.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::brokers::{self, SluiceBroker};
use crate::console_viewer::{self, ConsoleViewer};
use crate::driver::Driver;
use crate::memcap::MemoryCap;
use crate::result::{BacklogPhases, PhaseFigures, SluiceExtras, TestResult};
use crate::workload::Workload;
use crate::{chart, peak, runner, KafkaArgs, Overrides};

/// The peer to compare against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// Apache Kafka, single-node KRaft, from Maven Central.
    Kafka,
}

/// Arguments of `sluice bench compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Workload file.
    #[arg(long)]
    pub workload: PathBuf,
    /// Driver file.
    #[arg(long)]
    pub driver: PathBuf,
    /// Peer broker.
    #[arg(long, value_enum, default_value_t = Peer::Kafka)]
    pub against: Peer,
    /// Rounds (each round runs the peer, then Sluice).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Nodes of each broker (> 1 = a cluster of that many processes on loopback, for
    /// both Sluice and the peer; use a driver with the replication factor wanted).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub nodes: u16,
    /// The `sluice` binary (default: this executable).
    #[arg(long, env = "SLUICE_BIN")]
    pub sluice_bin: Option<PathBuf>,
    /// Extra `sluice serve` argument (repeatable), e.g. --sluice-arg=--flush-messages=1000000.
    #[arg(long, allow_hyphen_values = true)]
    pub sluice_arg: Vec<String>,
    /// Folder for result files, charts and the summary.
    #[arg(long, default_value = "compare-results")]
    pub output_dir: PathBuf,
    /// Do not drop the page cache between runs (it needs root; skipped silently otherwise).
    #[arg(long)]
    pub no_drop_caches: bool,
    /// Clients connect over TLS: both brokers get an SSL listener with the same generated
    /// certificate (PEM, in OUTPUT_DIR/tls), clients trust its CA.
    #[arg(long)]
    pub tls: bool,
    /// Page cache each broker node may use (e.g. 512m, 1g): each node runs in a memory
    /// cgroup limited to this plus the broker's own resident need (Sluice: a fixed
    /// allowance; Kafka: its heap plus the JVM's non-heap allowance). Needs root and
    /// memory cgroups.
    #[arg(long, value_name = "SIZE")]
    pub broker_memory_limit: Option<MemoryCap>,
    /// Serve Sluice's web console and keep a headless Chromium (Debian's `chromium`) on its
    /// overview throughout each Sluice run: what the console costs while someone watches.
    /// One node only.
    #[arg(long)]
    pub console_viewer: bool,
    /// Kafka settings.
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Run overrides.
    #[command(flatten)]
    pub overrides: Overrides,
}

/// The catch-up criterion: the producers' p99 during the drain is at most this
/// many times their p99 before it.
pub const CATCH_UP_P99_RATIO_MAX: f64 = 1.5;

/// One run's figures.
#[derive(Debug, Clone, Default)]
struct Figures {
    values: Vec<Option<f64>>,
}

/// The figures of the table, in order: (name, from a result).
type Metric = (&'static str, fn(&TestResult) -> Option<f64>);

const METRICS: &[Metric] = &[
    ("peak stable rate (msg/s)", |r| r.sluice.as_ref().and_then(|e| e.peak_stable_rate)),
    ("publish rate (msg/s)", |r| Some(r.publish_rate_mean())),
    ("publish MiB/s", |r| r.sluice.as_ref().map(|e| mean(&e.publish_throughput_mb))),
    ("consume rate (msg/s)", |r| Some(r.consume_rate_mean())),
    ("publish p50 (ms)", |r| Some(r.aggregated_publish_latency_50pct)),
    ("publish p99 (ms)", |r| Some(r.aggregated_publish_latency_99pct)),
    ("publish p99.9 (ms)", |r| Some(r.aggregated_publish_latency_999pct)),
    ("e2e p50 (ms)", |r| Some(r.aggregated_end_to_end_latency_50pct)),
    ("e2e p99 (ms)", |r| Some(r.aggregated_end_to_end_latency_99pct)),
    ("e2e p99.9 (ms)", |r| Some(r.aggregated_end_to_end_latency_999pct)),
    ("publish delay p99 (us)", |r| Some(r.aggregated_publish_delay_latency_99pct as f64)),
    ("transactions/s", |r| transactions(r).map(|t| t.aggregated_transaction_rate)),
    ("commit p50 (ms)", |r| transactions(r).map(|t| t.aggregated_commit_latency_50pct)),
    ("commit p99 (ms)", |r| transactions(r).map(|t| t.aggregated_commit_latency_99pct)),
    ("aborted transactions", |r| transactions(r).map(|t| t.measured_aborts as f64)),
    ("acknowledged msg/s", |r| queue(r).map(|q| q.aggregated_acknowledge_rate)),
    ("redelivered records", |r| queue(r).map(|q| q.measured_redelivered as f64)),
    ("acknowledgement errors", |r| queue(r).map(|q| q.measured_acknowledge_errors as f64)),
    ("backlog build (s)", |r| r.sluice.as_ref().and_then(|e| e.backlog_build_seconds)),
    ("publish p50 before drain (ms)", |r| build(r).map(|p| p.publish_latency_50pct)),
    ("publish p99 before drain (ms)", |r| build(r).map(|p| p.publish_latency_99pct)),
    ("publish p99.9 before drain (ms)", |r| build(r).map(|p| p.publish_latency_999pct)),
    ("publish p50 during drain (ms)", |r| drain(r).map(|p| p.publish_latency_50pct)),
    ("publish p99 during drain (ms)", |r| drain(r).map(|p| p.publish_latency_99pct)),
    ("publish p99.9 during drain (ms)", |r| drain(r).map(|p| p.publish_latency_999pct)),
    (P99_RATIO_ROW, |r| backlog_phases(r).and_then(|p| p.drain_to_build_publish_p99)),
    ("publish delay p99 during drain (us)", |r| drain(r).map(|p| p.publish_delay_latency_99pct as f64)),
    ("backlog drain (s)", |r| r.sluice.as_ref().and_then(|e| e.backlog_drain_seconds)),
    (CATCH_UP_ROW, |r| r.sluice.as_ref().and_then(|e| e.backlog_drain_mb_per_second)),
    ("broker disk reads during drain (MiB)", |r| drain(r).and_then(|p| p.broker_disk_read_bytes).map(mib)),
    ("broker disk reads before drain (MiB)", |r| build(r).and_then(|p| p.broker_disk_read_bytes).map(mib)),
    ("broker CPU (s)", |r| r.sluice.as_ref().and_then(|e| e.broker_cpu_seconds)),
    (CPU_PER_GIB_ROW, |r| r.sluice.as_ref().and_then(|e| e.broker_cpu_seconds_per_gb)),
    (KERNEL_CPU_PER_GIB_ROW, |r| r.sluice.as_ref().and_then(|e| e.broker_kernel_cpu_seconds_per_gb)),
    ("broker peak RSS (MiB)", |r| r.sluice.as_ref().and_then(|e| e.broker_peak_rss_bytes).map(mib)),
    ("clients CPU (cores)", |r| r.sluice.as_ref().and_then(cores_of(|e| e.client_cpu_seconds))),
    ("broker CPU (cores)", |r| r.sluice.as_ref().and_then(cores_of(|e| e.broker_cpu_seconds))),
    ("machine busy (cores)", |r| r.sluice.as_ref().and_then(|e| e.machine_busy_cores)),
    ("machine steal (cores)", |r| r.sluice.as_ref().and_then(|e| e.machine_steal_cores)),
    ("broker cgroup limit (MiB)", |r| memory(r).map(|m| mib(m.limit_bytes))),
    ("broker cgroup peak usage (MiB)", |r| memory(r).and_then(|m| m.peak_usage_bytes).map(mib)),
    ("broker cgroup limit hits", |r| memory(r).and_then(|m| m.limit_hits).map(|hits| hits as f64)),
];

/// The row of the producers' p99 ratio, during / before the drain.
const P99_RATIO_ROW: &str = "publish p99 during / before drain";
/// The row of the catch-up read rate.
const CATCH_UP_ROW: &str = "catch-up MiB/s";
/// The rows of the broker's CPU per GiB published: all of it, and the kernel's part.
const CPU_PER_GIB_ROW: &str = "broker CPU s per GiB";
const KERNEL_CPU_PER_GIB_ROW: &str = "broker kernel CPU s per GiB";
/// The CPU criterion: Sluice's broker CPU per GiB at most this share of Kafka's.
const CPU_PER_GIB_SHARE_MAX: f64 = 1.0 / 3.0;

/// CPU seconds of the measured phase as cores busy on average.
fn cores_of(seconds: fn(&SluiceExtras) -> Option<f64>) -> impl Fn(&SluiceExtras) -> Option<f64> {
    move |extras| seconds(extras).zip(Some(extras.measured_seconds).filter(|&s| s > 0.0)).map(|(cpu, s)| cpu / s)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn backlog_phases(result: &TestResult) -> Option<&BacklogPhases> {
    result.sluice.as_ref().and_then(|extras| extras.backlog_phases.as_ref())
}

fn build(result: &TestResult) -> Option<&PhaseFigures> {
    backlog_phases(result).and_then(|phases| phases.build.as_ref())
}

fn drain(result: &TestResult) -> Option<&PhaseFigures> {
    backlog_phases(result).and_then(|phases| phases.drain.as_ref())
}

fn memory(result: &TestResult) -> Option<&crate::memcap::MemoryFigures> {
    result.sluice.as_ref().and_then(|extras| extras.broker_memory.as_ref())
}

fn transactions(result: &TestResult) -> Option<&crate::result::TransactionFigures> {
    result.sluice.as_ref().and_then(|extras| extras.transactions.as_ref())
}

fn queue(result: &TestResult) -> Option<&crate::result::QueueFigures> {
    result.sluice.as_ref().and_then(|extras| extras.queue.as_ref())
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

impl Figures {
    fn of(result: &TestResult) -> Figures {
        Figures { values: METRICS.iter().map(|(_, pick)| pick(result)).collect() }
    }
}

/// Min, median and max of `values`; `None` when empty.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 { sorted[middle] } else { (sorted[middle - 1] + sorted[middle]) / 2.0 };
    Some((sorted[0], median, sorted[sorted.len() - 1]))
}

/// Runs `sluice bench compare`.
pub fn run(args: CompareArgs) -> anyhow::Result<()> {
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if args.console_viewer && args.nodes > 1 {
        bail!("--console-viewer watches one node's console: use it with --nodes 1");
    }
    let workload = Workload::load(&args.workload)?;
    let driver = Driver::load(&args.driver)?;
    let sluice_bin = match &args.sluice_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?,
    };
    std::fs::create_dir_all(&args.output_dir).with_context(|| format!("creating {}", args.output_dir.display()))?;
    let durability = durability_line(driver.driver.fsync_each_message(), &args.sluice_arg);
    println!("Durability: {durability}");
    let tls = if args.tls { Some(crate::tls::BenchTls::generate(&args.output_dir.join("tls"))?) } else { None };
    let transport = if tls.is_some() { "TLS (SSL listeners, both brokers)" } else { "plaintext" };
    println!("Transport: {transport}");
    let memory = match args.broker_memory_limit {
        Some(cap) => Some(memory_line(&cap, &args.kafka.kafka_heap)?),
        None => None,
    };
    if let Some(line) = &memory {
        println!("Memory: {line}");
    }
    let backlog = backlog_line(workload.workload.consumer_backlog_size_gb, args.broker_memory_limit);
    let neighbour = args.overrides.neighbour_plan().map(|plan| neighbour_line(&plan, args.no_drop_caches));
    if let Some(line) = &neighbour {
        println!("Neighbour: {line}");
    }
    let console = args.console_viewer.then_some(CONSOLE_VIEWER_LINE);

    let mut runs: Vec<(String, u32, anyhow::Result<TestResult>)> = Vec::new();
    for round in 1..=args.rounds {
        for broker in ["kafka", "sluice"] {
            println!("===== round {round}/{}: {broker} =====", args.rounds);
            if !args.no_drop_caches && !brokers::drop_caches() && round == 1 && broker == "kafka" {
                println!("warning: cannot drop the page cache (not root): runs share a warm cache");
            }
            let outcome = run_one(&args, round, broker, &sluice_bin, &workload, &driver, tls.as_ref());
            match &outcome {
                Ok(result) => {
                    let path = args.output_dir.join(format!("round-{round}-{broker}.json"));
                    result.write(&path)?;
                    println!("Wrote {}", path.display());
                }
                Err(error) => println!("error: {broker} round {round} failed: {error:#}"),
            }
            runs.push((broker.to_string(), round, outcome));
        }
    }

    let header = TableHeader {
        workload: &workload.workload.name,
        driver: &driver.driver.name,
        durability: &durability,
        transport,
        records_per_transaction: driver.driver.records_per_transaction,
        isolation_level: driver.driver.isolation_level(),
        memory: memory.as_deref(),
        backlog: backlog.as_deref(),
        neighbour: neighbour.as_deref(),
        console,
    };
    let table = summary_table(&runs, &header);
    println!("\n{table}");
    std::fs::write(args.output_dir.join("summary.md"), &table)?;
    let charted: Vec<(String, TestResult)> = runs
        .iter()
        .filter_map(|(broker, round, outcome)| outcome.as_ref().ok().map(|r| (format!("{broker}-{round}"), r.clone())))
        .collect();
    if !charted.is_empty() {
        chart::write_all(&charted, &args.output_dir.join("charts"))?;
        println!("Charts in {}", args.output_dir.join("charts").display());
    }
    Ok(())
}

fn run_one(
    args: &CompareArgs,
    round: u32,
    broker: &str,
    sluice_bin: &std::path::Path,
    workload: &crate::workload::LoadedWorkload,
    driver: &crate::driver::LoadedDriver,
    tls: Option<&crate::tls::BenchTls>,
) -> anyhow::Result<TestResult> {
    let nodes = usize::from(args.nodes);
    let console_port = match (broker, args.console_viewer) {
        ("sluice", true) => Some(brokers::free_ports(1)?[0]),
        _ => None,
    };
    let mut sluice_args = args.sluice_arg.clone();
    sluice_args.extend(console_port.map(console_viewer::serve_args).unwrap_or_default());
    let mut process = match broker {
        "kafka" => args.kafka.start(nodes, tls, args.broker_memory_limit)?,
        _ => SluiceBroker::start_cluster(sluice_bin, nodes, &sluice_args, tls, args.broker_memory_limit)?,
    };
    process.keep_logs_in(&args.output_dir, &format!("round-{round}-{broker}"));
    let profile = args.output_dir.join(format!("round-{round}-console-viewer"));
    let _viewer = console_port.map(|port| ConsoleViewer::open(port, &profile)).transpose()?;
    let mut options = args.overrides.run_options();
    options.bootstrap = Some(process.client_bootstrap());
    options.client_settings = tls.map(crate::tls::BenchTls::client_settings).unwrap_or_default();
    options.broker_pids = process.pids();
    options.broker_label = Some(broker.to_string());
    let outcome = if args.overrides.find_peak {
        peak::find_peak(workload, driver, &options)
    } else {
        runner::run_workload(workload, driver, &options)
    };
    let memory = process.memory_figures();
    drop(process);
    let mut result = outcome?;
    if let (Some(extras), Some(memory)) = (result.sluice.as_mut(), memory) {
        extras.broker_memory = Some(memory);
    }
    Ok(result)
}

/// The noisy neighbour of every run, for the summary.
fn neighbour_line(plan: &crate::neighbour::NeighbourPlan, no_drop_caches: bool) -> String {
    let mut parts = Vec::new();
    if plan.cached_bytes > 0 {
        parts.push(format!(
            "{} MiB of clean, unrelated file data in the page cache before each warm-up",
            plan.cached_bytes >> 20
        ));
    }
    if plan.write_bytes > 0 {
        parts.push(format!(
            "another process (dd) writes {} MiB into the page cache {:.0} s into each measured phase",
            plan.write_bytes >> 20,
            plan.write_at.as_secs_f64()
        ));
    }
    let cache =
        if no_drop_caches { "page cache not dropped between runs" } else { "page cache dropped before each run" };
    format!("{} (in {}; {cache})", parts.join("; "), plan.dir.display())
}

/// The memory cap's rule and each broker's limit, for the summary.
fn memory_line(cap: &MemoryCap, kafka_heap: &str) -> anyhow::Result<String> {
    let sluice = cap.for_sluice();
    let kafka = cap.for_kafka(kafka_heap)?;
    Ok(format!(
        "each broker node in a memory cgroup limited to a page-cache budget of {} MiB plus its resident \
         allowance: Sluice {} MiB, Kafka heap {kafka_heap} (pre-touched) + {} MiB JVM non-heap; limits: Sluice {} MiB, \
         Kafka {} MiB",
        cap.page_cache_budget >> 20,
        sluice.resident_allowance >> 20,
        crate::memcap::JVM_NON_HEAP_ALLOWANCE >> 20,
        sluice.limit() >> 20,
        kafka.limit() >> 20,
    ))
}

/// The backlog's size, and its multiple of the page-cache budget when capped.
fn backlog_line(backlog_gb: f64, cap: Option<MemoryCap>) -> Option<String> {
    if backlog_gb <= 0.0 {
        return None;
    }
    let bytes = backlog_gb * (1u64 << 30) as f64;
    let multiple = match cap {
        Some(cap) => format!(" = {:.1}x the page-cache budget", bytes / cap.page_cache_budget as f64),
        None => " (brokers not memory-capped: it may be read from the page cache)".to_string(),
    };
    Some(format!("{:.0} MiB{multiple}", bytes / (1024.0 * 1024.0)))
}

/// What the summary says about the runs above its table.
struct TableHeader<'a> {
    workload: &'a str,
    driver: &'a str,
    durability: &'a str,
    transport: &'a str,
    records_per_transaction: Option<u32>,
    isolation_level: &'a str,
    /// The memory cap, when the brokers had one.
    memory: Option<&'a str>,
    /// The backlog of a catch-up workload.
    backlog: Option<&'a str>,
    /// The noisy neighbour, when the runs had one.
    neighbour: Option<&'a str>,
    /// The console watched during Sluice's runs, when it was.
    console: Option<&'a str>,
}

/// What the summary says of `--console-viewer`.
const CONSOLE_VIEWER_LINE: &str =
    "Sluice served its web console, open on the overview in a headless Chromium throughout each run";

/// What the summary says of each broker's durability. Extra `sluice serve` arguments
/// (`--sluice-arg`, e.g. `--durability-level=2`) may change Sluice's, so they are named.
fn durability_line(fsync_each_message: bool, sluice_args: &[String]) -> String {
    let base = if fsync_each_message {
        "topic flush.messages=1 (fsync per message) on both brokers"
    } else {
        "Kafka default (page cache, no fsync); Sluice at its own default"
    };
    match sluice_args.is_empty() {
        true => base.to_string(),
        false => format!("{base}, as changed by its serve arguments `{}`", sluice_args.join(" ")),
    }
}

fn summary_table(runs: &[(String, u32, anyhow::Result<TestResult>)], header: &TableHeader<'_>) -> String {
    let figures_of = |broker: &str| -> Vec<Figures> {
        runs.iter()
            .filter(|(b, _, _)| b == broker)
            .filter_map(|(_, _, outcome)| outcome.as_ref().ok().map(Figures::of))
            .collect()
    };
    let kafka = figures_of("kafka");
    let sluice = figures_of("sluice");
    let failed = runs.iter().filter(|(_, _, outcome)| outcome.is_err()).count();
    let mut table = String::new();
    let _ = writeln!(table, "Workload: {}; driver: {}", header.workload, header.driver);
    let _ = writeln!(table, "Durability: {}", header.durability);
    let _ = writeln!(table, "Transport: {}", header.transport);
    if let Some(records) = header.records_per_transaction {
        let _ = writeln!(
            table,
            "Transactions: {records} records each, one transactional.id per producer; consumers' isolation.level {}",
            header.isolation_level
        );
    }
    if let Some(memory) = header.memory {
        let _ = writeln!(table, "Memory: {memory}");
    }
    if let Some(backlog) = header.backlog {
        let _ = writeln!(table, "Backlog: {backlog}");
    }
    if let Some(console) = header.console {
        let _ = writeln!(table, "Console: {console}");
    }
    if let Some(neighbour) = header.neighbour {
        let _ = writeln!(table, "Neighbour: {neighbour}");
    }
    let _ = writeln!(
        table,
        "Runs: kafka {} ok, sluice {} ok, {failed} failed; median (min .. max) across rounds\n",
        kafka.len(),
        sluice.len()
    );
    let _ = writeln!(table, "| figure | Kafka | Sluice | Sluice / Kafka |");
    let _ = writeln!(table, "|---|---|---|---|");
    for (index, (name, _)) in METRICS.iter().enumerate() {
        let column = |figures: &[Figures]| -> Vec<f64> { figures.iter().filter_map(|f| f.values[index]).collect() };
        let k = spread(&column(&kafka));
        let s = spread(&column(&sluice));
        // A figure no run has (peak rate of a fixed-rate run, transactions of plain
        // producers) gets no row.
        if k.is_none() && s.is_none() {
            continue;
        }
        let cell = |spread: Option<(f64, f64, f64)>| match spread {
            Some((min, median, max)) => format!("{} ({} .. {})", num(median), num(min), num(max)),
            None => "-".to_string(),
        };
        let ratio = match (k, s) {
            (Some((_, km, _)), Some((_, sm, _))) if km > 0.0 => format!("{:.2}", sm / km),
            _ => "-".to_string(),
        };
        let _ = writeln!(table, "| {name} | {} | {} | {ratio} |", cell(k), cell(s));
    }
    if let Some(verdict) = catch_up_verdict(&kafka, &sluice) {
        let _ = writeln!(table, "\n{verdict}");
    }
    if let Some(verdict) = cpu_verdict(&kafka, &sluice) {
        let _ = writeln!(table, "\n{verdict}");
    }
    if let Some(note) = steal_note(runs) {
        let _ = writeln!(table, "\n{note}");
    }
    table
}

/// Steal time (cores, averaged over a measured phase) above which a round is called noisy.
const STEAL_NOISY_CORES: f64 = 0.05;

/// Names the rounds in which the hypervisor gave this machine's cores to other guests, whose
/// latencies then measure those neighbours as well as the broker.
fn steal_note(runs: &[(String, u32, anyhow::Result<TestResult>)]) -> Option<String> {
    let noisy: Vec<String> = runs
        .iter()
        .filter_map(|(broker, round, outcome)| {
            let steal = outcome.as_ref().ok()?.sluice.as_ref()?.machine_steal_cores?;
            (steal > STEAL_NOISY_CORES).then(|| format!("{broker} round {round} ({steal:.2} cores)"))
        })
        .collect();
    (!noisy.is_empty()).then(|| {
        format!(
            "Noisy host: the hypervisor ran other guests on this machine's cores (steal time) in {}; \
             read those rounds' latencies with care.",
            noisy.join(", ")
        )
    })
}

/// The median of one summary row across runs.
fn median(figures: &[Figures], row: &str) -> Option<f64> {
    let index = METRICS.iter().position(|(name, _)| *name == row)?;
    spread(&figures.iter().filter_map(|f| f.values[index]).collect::<Vec<_>>()).map(|(_, median, _)| median)
}

/// The CPU criterion from the medians: broker CPU per GiB at most
/// [`CPU_PER_GIB_SHARE_MAX`] of Kafka's. Beside it, Sluice's kernel time alone as a share of
/// Kafka's whole: mostly the kernel's work of moving the bytes (loopback TCP both ways, block
/// I/O), which Kafka's kernel time shows to be of the same size for any broker; a share above
/// the bound says the criterion is out of reach on this machine, not only missed.
fn cpu_verdict(kafka: &[Figures], sluice: &[Figures]) -> Option<String> {
    let (s, k) = (median(sluice, CPU_PER_GIB_ROW)?, median(kafka, CPU_PER_GIB_ROW)?);
    if k <= 0.0 {
        return None;
    }
    let share = s / k;
    let mut text = format!(
        "CPU criterion: broker CPU s per GiB <= 1/3 of Kafka's: Sluice {} vs Kafka {} = {share:.2} ({})",
        num(s),
        num(k),
        if share <= CPU_PER_GIB_SHARE_MAX { "met" } else { "not met" }
    );
    if let (Some(sk), Some(kk)) = (median(sluice, KERNEL_CPU_PER_GIB_ROW), median(kafka, KERNEL_CPU_PER_GIB_ROW)) {
        let _ = write!(
            text,
            "; in the kernel: Sluice {} vs Kafka {}, Sluice's alone {:.2} of Kafka's whole",
            num(sk),
            num(kk),
            sk / k
        );
    }
    Some(text)
}

/// The catch-up criterion from the medians, when the runs drained a backlog.
fn catch_up_verdict(kafka: &[Figures], sluice: &[Figures]) -> Option<String> {
    let sluice_ratio = median(sluice, P99_RATIO_ROW)?;
    let mut text = format!(
        "Catch-up criterion: publish p99 during / before drain <= {CATCH_UP_P99_RATIO_MAX}: Sluice {:.2} ({})",
        sluice_ratio,
        if sluice_ratio <= CATCH_UP_P99_RATIO_MAX { "met" } else { "not met" }
    );
    if let Some(kafka_ratio) = median(kafka, P99_RATIO_ROW) {
        let _ = write!(text, ", Kafka {kafka_ratio:.2}");
    }
    if let (Some(s), Some(k)) = (median(sluice, CATCH_UP_ROW), median(kafka, CATCH_UP_ROW)) {
        let _ = write!(
            text,
            "; catch-up MiB/s >= Kafka's: Sluice {} vs Kafka {} = {:.2}x ({})",
            num(s),
            num(k),
            s / k.max(1e-9),
            if s >= k { "met" } else { "not met" }
        );
    }
    Some(text)
}

fn num(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_rounds() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some((1.0, 2.0, 3.0)));
        assert_eq!(spread(&[4.0, 1.0]), Some((1.0, 2.5, 4.0)));
        assert_eq!(spread(&[]), None);
    }

    fn header(records_per_transaction: Option<u32>) -> TableHeader<'static> {
        TableHeader {
            workload: "w",
            driver: "d",
            durability: "default",
            transport: "plaintext",
            records_per_transaction,
            isolation_level: "read_committed",
            memory: None,
            backlog: None,
            neighbour: None,
            console: None,
        }
    }

    #[test]
    fn the_durability_line_names_sluice_serve_arguments() {
        let plain = durability_line(false, &[]);
        assert_eq!(plain, "Kafka default (page cache, no fsync); Sluice at its own default");
        let level_2 = durability_line(false, &["--durability-level=2".to_string()]);
        assert!(level_2.starts_with(&plain), "{level_2}");
        assert!(level_2.ends_with("as changed by its serve arguments `--durability-level=2`"), "{level_2}");
        assert!(durability_line(true, &[]).starts_with("topic flush.messages=1"));
    }

    #[test]
    fn table_has_ratio() {
        let result = |rate: f64| TestResult { publish_rate: vec![rate], ..TestResult::default() };
        let runs = vec![
            ("kafka".to_string(), 1, Ok(result(100.0))),
            ("sluice".to_string(), 1, Ok(result(150.0))),
            ("kafka".to_string(), 2, Err(anyhow::anyhow!("x"))),
        ];
        let table = summary_table(&runs, &header(None));
        assert!(table.contains("| publish rate (msg/s) | 100 (100 .. 100) | 150 (150 .. 150) | 1.50 |"), "{table}");
        assert!(table.contains("1 failed"));
        assert!(!table.contains("peak stable rate"), "no run has it: {table}");
        assert!(!table.contains("transactions/s"), "no run has it: {table}");
    }

    #[test]
    fn rounds_with_steal_time_are_named() {
        let result = |steal: f64| TestResult {
            publish_rate: vec![100.0],
            sluice: Some(SluiceExtras { machine_steal_cores: Some(steal), ..SluiceExtras::default() }),
            ..TestResult::default()
        };
        let quiet = vec![("kafka".to_string(), 1, Ok(result(0.01))), ("sluice".to_string(), 1, Ok(result(0.0)))];
        let table = summary_table(&quiet, &header(None));
        assert!(table.contains("| machine steal (cores) |"), "{table}");
        assert!(!table.contains("Noisy host"), "{table}");
        let noisy = vec![("kafka".to_string(), 1, Ok(result(0.01))), ("sluice".to_string(), 2, Ok(result(0.2)))];
        let table = summary_table(&noisy, &header(None));
        assert!(table.contains("Noisy host") && table.contains("sluice round 2 (0.20 cores)"), "{table}");
        assert!(!table.contains("kafka round 1"), "{table}");
    }

    #[test]
    fn table_has_catch_up_rows_and_the_criterion() {
        let result = |before: f64, during: f64, catch_up: f64| {
            let phase = |p99: f64| crate::result::PhaseFigures { publish_latency_99pct: p99, ..Default::default() };
            let mut phases =
                BacklogPhases { build: Some(phase(before)), drain: Some(phase(during)), ..Default::default() };
            phases.set_ratio();
            let memory =
                crate::memcap::MemoryFigures { limit_bytes: 768 << 20, limit_hits: Some(3), ..Default::default() };
            let extras = crate::result::SluiceExtras {
                backlog_phases: Some(phases),
                backlog_drain_mb_per_second: Some(catch_up),
                broker_memory: Some(memory),
                ..Default::default()
            };
            TestResult { sluice: Some(extras), ..TestResult::default() }
        };
        let runs = vec![
            ("kafka".to_string(), 1, Ok(result(10.0, 40.0, 50.0))),
            ("sluice".to_string(), 1, Ok(result(10.0, 12.0, 60.0))),
        ];
        let mut header = header(None);
        header.memory = Some("cap rule");
        header.backlog = Some("2048 MiB = 4.0x the page-cache budget");
        let table = summary_table(&runs, &header);
        assert!(
            table
                .contains("| publish p99 before drain (ms) | 10.00 (10.00 .. 10.00) | 10.00 (10.00 .. 10.00) | 1.00 |"),
            "{table}"
        );
        assert!(
            table
                .contains("| publish p99 during drain (ms) | 40.00 (40.00 .. 40.00) | 12.00 (12.00 .. 12.00) | 0.30 |"),
            "{table}"
        );
        assert!(
            table.contains("| publish p99 during / before drain | 4.00 (4.00 .. 4.00) | 1.20 (1.20 .. 1.20) | 0.30 |"),
            "{table}"
        );
        assert!(
            table.contains("| catch-up MiB/s | 50.00 (50.00 .. 50.00) | 60.00 (60.00 .. 60.00) | 1.20 |"),
            "{table}"
        );
        assert!(table.contains("| broker cgroup limit (MiB) | 768 (768 .. 768) |"), "{table}");
        assert!(table.contains("Memory: cap rule\nBacklog: 2048 MiB = 4.0x"), "{table}");
        assert!(
            table.contains(
                "Sluice 1.20 (met), Kafka 4.00; catch-up MiB/s >= Kafka's: Sluice 60.00 vs Kafka 50.00 = 1.20x (met)"
            ),
            "{table}"
        );
        // Over the bound and slower than Kafka: not met.
        let runs = vec![
            ("kafka".to_string(), 1, Ok(result(10.0, 12.0, 80.0))),
            ("sluice".to_string(), 1, Ok(result(10.0, 20.0, 60.0))),
        ];
        let table = summary_table(&runs, &header);
        assert!(table.contains("Sluice 2.00 (not met)"), "{table}");
        assert!(table.contains("= 0.75x (not met)"), "{table}");
        // No backlog, no rows and no criterion.
        let plain = vec![("sluice".to_string(), 1, Ok(TestResult::default()))];
        let table = summary_table(&plain, &super::tests::header(None));
        assert!(!table.contains("drain") && !table.contains("Catch-up"), "{table}");
    }

    #[test]
    fn table_states_the_cpu_criterion_and_the_kernel_floor() {
        let result = |total: f64, kernel: Option<f64>| {
            let extras = SluiceExtras {
                broker_cpu_seconds_per_gb: Some(total),
                broker_kernel_cpu_seconds_per_gb: kernel,
                ..SluiceExtras::default()
            };
            TestResult { sluice: Some(extras), ..TestResult::default() }
        };
        let runs = vec![
            ("kafka".to_string(), 1, Ok(result(6.0, Some(3.0)))),
            ("sluice".to_string(), 1, Ok(result(4.5, Some(2.7)))),
        ];
        let table = summary_table(&runs, &header(None));
        assert!(table.contains("| broker kernel CPU s per GiB | 3.00 (3.00 .. 3.00) | 2.70 (2.70 .. 2.70) | 0.90 |"));
        assert!(
            table.contains(
                "CPU criterion: broker CPU s per GiB <= 1/3 of Kafka's: Sluice 4.50 vs Kafka 6.00 = 0.75 \
                 (not met); in the kernel: Sluice 2.70 vs Kafka 3.00, Sluice's alone 0.45 of Kafka's whole"
            ),
            "{table}"
        );
        // Results from before the kernel split: the verdict without it.
        let runs =
            vec![("kafka".to_string(), 1, Ok(result(90.0, None))), ("sluice".to_string(), 1, Ok(result(27.0, None)))];
        let table = summary_table(&runs, &header(None));
        assert!(table.contains("Sluice 27.00 vs Kafka 90.00 = 0.30 (met)\n"), "{table}");
        assert!(!table.contains("in the kernel"), "{table}");
    }

    #[test]
    fn backlog_line_says_the_multiple_of_the_budget() {
        let cap: MemoryCap = "512m".parse().unwrap();
        assert_eq!(backlog_line(2.0, Some(cap)).unwrap(), "2048 MiB = 4.0x the page-cache budget");
        assert!(backlog_line(2.0, None).unwrap().contains("not memory-capped"));
        assert_eq!(backlog_line(0.0, Some(cap)), None);
        let line = memory_line(&cap, "1g").unwrap();
        assert!(line.contains("limits: Sluice 832 MiB, Kafka 2048 MiB"), "{line}");
    }

    #[test]
    fn table_has_transactions_when_runs_have_them() {
        let result = |tx_rate: f64| {
            let transactions =
                crate::result::TransactionFigures { aggregated_transaction_rate: tx_rate, ..Default::default() };
            let extras = crate::result::SluiceExtras { transactions: Some(transactions), ..Default::default() };
            TestResult { sluice: Some(extras), ..TestResult::default() }
        };
        let runs = vec![("kafka".to_string(), 1, Ok(result(200.0))), ("sluice".to_string(), 1, Ok(result(300.0)))];
        let table = summary_table(&runs, &header(Some(100)));
        assert!(table.contains("| transactions/s | 200 (200 .. 200) | 300 (300 .. 300) | 1.50 |"), "{table}");
        assert!(table.contains("Transactions: 100 records each"), "{table}");
    }
}
