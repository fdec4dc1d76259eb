//! `sluice bench compare`: the same workload against Apache Kafka and Sluice, alternately.
//!
//! Each round starts each broker fresh (new data dir, page cache dropped when we may),
//! runs the workload with the same clients and settings, and stops the broker: Kafka,
//! then Sluice, N rounds (A B A B). The table gives each figure's median with min and
//! max across rounds for both brokers and the ratio of the medians (Sluice / Kafka).
//! Broker CPU seconds and peak RSS come from `/proc`, so CPU per GiB is a figure for both.
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

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::brokers::{self, SluiceBroker};
use crate::driver::Driver;
use crate::result::TestResult;
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
    /// Kafka settings.
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Run overrides.
    #[command(flatten)]
    pub overrides: Overrides,
}

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
    ("broker CPU (s)", |r| r.sluice.as_ref().and_then(|e| e.broker_cpu_seconds)),
    ("broker CPU s per GiB", |r| r.sluice.as_ref().and_then(|e| e.broker_cpu_seconds_per_gb)),
    ("broker peak RSS (MiB)", |r| {
        r.sluice.as_ref().and_then(|e| e.broker_peak_rss_bytes).map(|b| b as f64 / (1024.0 * 1024.0))
    }),
];

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
    let workload = Workload::load(&args.workload)?;
    let driver = Driver::load(&args.driver)?;
    let sluice_bin = match &args.sluice_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?,
    };
    std::fs::create_dir_all(&args.output_dir).with_context(|| format!("creating {}", args.output_dir.display()))?;
    let durability = if driver.driver.fsync_each_message() {
        "topic flush.messages=1 (fsync per message) on both brokers"
    } else {
        "Kafka default (page cache, no fsync); Sluice at its own default"
    };
    println!("Durability: {durability}");
    let tls = if args.tls { Some(crate::tls::BenchTls::generate(&args.output_dir.join("tls"))?) } else { None };
    let transport = if tls.is_some() { "TLS (SSL listeners, both brokers)" } else { "plaintext" };
    println!("Transport: {transport}");

    let mut runs: Vec<(String, u32, anyhow::Result<TestResult>)> = Vec::new();
    for round in 1..=args.rounds {
        for broker in ["kafka", "sluice"] {
            println!("===== round {round}/{}: {broker} =====", args.rounds);
            if !args.no_drop_caches && !brokers::drop_caches() && round == 1 && broker == "kafka" {
                println!("warning: cannot drop the page cache (not root): runs share a warm cache");
            }
            let outcome = run_one(&args, broker, &sluice_bin, &workload, &driver, tls.as_ref());
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
        durability,
        transport,
        records_per_transaction: driver.driver.records_per_transaction,
        isolation_level: driver.driver.isolation_level(),
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
    broker: &str,
    sluice_bin: &std::path::Path,
    workload: &crate::workload::LoadedWorkload,
    driver: &crate::driver::LoadedDriver,
    tls: Option<&crate::tls::BenchTls>,
) -> anyhow::Result<TestResult> {
    let nodes = usize::from(args.nodes);
    let process = match broker {
        "kafka" => args.kafka.start(nodes, tls)?,
        _ => SluiceBroker::start_cluster(sluice_bin, nodes, &args.sluice_arg, tls)?,
    };
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
    if outcome.is_err() {
        for log in process.log_paths() {
            println!("broker log: {}", log.display());
        }
    }
    drop(process);
    outcome
}

/// What the summary says about the runs above its table.
struct TableHeader<'a> {
    workload: &'a str,
    driver: &'a str,
    durability: &'a str,
    transport: &'a str,
    records_per_transaction: Option<u32>,
    isolation_level: &'a str,
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
    table
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
        }
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
