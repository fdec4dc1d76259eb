//! End to end: the smoke workload (short, small rate, a small backlog) against a real
//! `sluice serve` started by the bench, then the result JSON is checked.
//!
//! The `sluice` binary is taken from `$SLUICE_BIN`, else `target/release/sluice` or
//! `target/debug/sluice` of the workspace. Set `SLUICE_BENCH_KAFKA_TEST=1` to also run
//! the same workload against Apache Kafka (installed from Maven Central on first use).
//! The transactional driver runs the same workload once more, with producers committing
//! every 100 records and read_committed consumers. The catch-up smoke checks the
//! producers' latency per backlog phase; the memory cap (a cgroup, root only) is checked
//! on its own by starting a capped broker, without a run.

use std::path::{Path, PathBuf};

use sluice_bench::result::TestResult;
use sluice_bench::{KafkaArgs, Overrides, RunArgs};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sluice_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("SLUICE_BIN") {
        return Some(PathBuf::from(bin));
    }
    ["target/release/sluice", "target/debug/sluice"]
        .iter()
        .map(|relative| workspace().join(relative))
        .find(|path| path.is_file())
}

fn smoke_args(output_dir: &Path) -> RunArgs {
    RunArgs {
        drivers: vec![workspace().join("bench/local/drivers/local-latency.yaml")],
        workloads: vec![workspace().join("bench/local/workloads/smoke.yaml")],
        output: None,
        output_dir: output_dir.to_path_buf(),
        charts: true,
        start_sluice: false,
        sluice_bin: None,
        start_kafka: false,
        kafka: KafkaArgs {
            kafka_version: sluice_bench::brokers::KAFKA_VERSION_DEFAULT.into(),
            cache_dir: None,
            kafka_heap: "512m".into(),
        },
        nodes: 1,
        broker_pid: Vec::new(),
        broker_memory_limit: None,
        overrides: Overrides::default(),
    }
}

fn check(result: &TestResult) {
    assert!(!result.publish_rate.is_empty());
    let extras = result.sluice.as_ref().expect("sluice extras");
    // Every rate positive, allowing one stalled sample on a loaded machine; consumers are
    // stopped on purpose while the backlog builds, which spans that many more samples.
    let stalled_allowed = |stopped_seconds: f64| 1 + (stopped_seconds / extras.sample_period_seconds).ceil() as usize;
    let positive =
        |rates: &[f64], allowed: usize| rates.iter().filter(|rate| **rate > 0.0).count() + allowed >= rates.len();
    assert!(positive(&result.publish_rate, stalled_allowed(0.0)), "{:?}", result.publish_rate);
    let backlog_build = extras.backlog_build_seconds.unwrap_or(0.0);
    assert!(positive(&result.consume_rate, stalled_allowed(backlog_build)), "{:?}", result.consume_rate);
    assert!(result.publish_rate_mean() > 100.0, "{:?}", result.publish_rate);
    assert!(result.consume_rate_mean() > 100.0, "{:?}", result.consume_rate);
    assert_eq!(extras.publish_throughput_mb.len(), result.publish_rate.len());
    assert!(extras.backlog_build_seconds.is_some(), "backlog was not built");
    assert!(extras.backlog_drain_seconds.is_some(), "backlog was not drained");
    // The 2 MiB backlog is 2,048 messages; after the drain only in-flight ones remain.
    assert!(*result.backlog.last().unwrap() < 2_048, "{:?}", result.backlog);
    assert!(extras.broker_cpu_seconds.unwrap() > 0.0);
    // The kernel's part of the broker's CPU per GiB: a part, present whenever the whole is.
    let (whole, kernel) = (extras.broker_cpu_seconds_per_gb.unwrap(), extras.broker_kernel_cpu_seconds_per_gb.unwrap());
    assert!((0.0..=whole).contains(&kernel), "kernel {kernel} of {whole} CPU s per GiB");
    assert!(extras.broker_peak_rss_bytes.unwrap() > 0);
    let ordered = |name: &str, values: [f64; 7]| {
        assert!(values[0] > 0.0, "{name}: {values:?}");
        assert!(values.windows(2).all(|pair| pair[0] <= pair[1]), "{name}: {values:?}");
    };
    ordered(
        "publish",
        [
            result.aggregated_publish_latency_50pct,
            result.aggregated_publish_latency_75pct,
            result.aggregated_publish_latency_95pct,
            result.aggregated_publish_latency_99pct,
            result.aggregated_publish_latency_999pct,
            result.aggregated_publish_latency_9999pct,
            result.aggregated_publish_latency_max,
        ],
    );
    ordered(
        "end to end",
        [
            result.aggregated_end_to_end_latency_50pct,
            result.aggregated_end_to_end_latency_75pct,
            result.aggregated_end_to_end_latency_95pct,
            result.aggregated_end_to_end_latency_99pct,
            result.aggregated_end_to_end_latency_999pct,
            result.aggregated_end_to_end_latency_9999pct,
            result.aggregated_end_to_end_latency_max,
        ],
    );
    let quantiles = &result.aggregated_end_to_end_latency_quantiles.0;
    assert!(quantiles.windows(2).all(|pair| pair[0].1 <= pair[1].1));
}

/// Benchmarks in one process run one at a time: concurrent runs would share the 2 cores
/// and the disk and measure each other.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_and_check(args: RunArgs) -> TestResult {
    let _serial = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let written = sluice_bench::run_workloads(args).expect("bench run");
    assert_eq!(written.len(), 1);
    let result = TestResult::load(&written[0]).unwrap();
    check(&result);
    let charts = written[0].with_extension("charts");
    assert!(charts.join("index.html").is_file(), "no chart page in {}", charts.display());
    result
}

#[test]
fn smoke_workload_against_sluice() {
    let bin = sluice_bin().expect("no sluice binary: run `cargo build --release -p sluice-cli` or set SLUICE_BIN");
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.start_sluice = true;
    args.sluice_bin = Some(bin);
    run_and_check(args);
    // The broker's log stays with the results, to its end (the broker stopped first).
    assert_eq!(kept_logs(dir.path()), 1);
}

/// How many broker logs a run kept in `dir`; each must hold its broker's last line.
fn kept_logs(dir: &Path) -> usize {
    let logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .collect();
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(text.contains("shutdown complete"), "{} does not end with the shutdown:\n{text}", log.display());
    }
    logs.len()
}

#[test]
fn transactional_smoke_workload_against_sluice() {
    let bin = sluice_bin().expect("no sluice binary: run `cargo build --release -p sluice-cli` or set SLUICE_BIN");
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.drivers = vec![workspace().join("bench/local/drivers/local-throughput-transactions.yaml")];
    args.start_sluice = true;
    args.sluice_bin = Some(bin);
    let result = run_and_check(args);
    let transactions = result.sluice.and_then(|extras| extras.transactions).expect("transaction figures");
    assert_eq!(transactions.records_per_transaction, 100);
    assert!(transactions.measured_transactions > 0, "{transactions:?}");
    assert_eq!(transactions.measured_aborts, 0, "{transactions:?}");
    assert!(transactions.aggregated_transaction_rate > 0.0, "{transactions:?}");
    assert!(transactions.aggregated_commit_latency_50pct > 0.0, "{transactions:?}");
}

#[test]
fn smoke_workload_against_a_three_node_sluice_cluster() {
    let bin = sluice_bin().expect("no sluice binary: run `cargo build --release -p sluice-cli` or set SLUICE_BIN");
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.drivers = vec![workspace().join("bench/local/drivers/local-cluster-latency.yaml")];
    args.start_sluice = true;
    args.sluice_bin = Some(bin);
    args.nodes = 3;
    run_and_check(args);
    assert_eq!(kept_logs(dir.path()), 3);
}

#[test]
fn smoke_workload_against_kafka() {
    if std::env::var_os("SLUICE_BENCH_KAFKA_TEST").is_none() {
        eprintln!("SKIPPED: set SLUICE_BENCH_KAFKA_TEST=1 to run against Apache Kafka");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.start_kafka = true;
    run_and_check(args);
}

/// The queue workload (share groups, 2 ms of work per record, explicit acceptance) for a
/// few seconds against a started Sluice: records are delivered, every one accepted and
/// confirmed by the broker, none redelivered, and the result has the queue figures.
#[test]
fn queue_smoke_workload_against_sluice() {
    let bin = sluice_bin().expect("no sluice binary: run `cargo build --release -p sluice-cli` or set SLUICE_BIN");
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.workloads = vec![workspace().join("bench/local/workloads/queue-smoke.yaml")];
    args.charts = false;
    args.start_sluice = true;
    args.sluice_bin = Some(bin);
    let _serial = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let written = sluice_bench::run_workloads(args).expect("bench run");
    let result = TestResult::load(&written[0]).unwrap();
    let extras = result.sluice.as_ref().expect("sluice extras");
    assert_eq!(extras.consumer_mode, "share");
    let queue = extras.queue.as_ref().expect("queue figures");
    assert_eq!((queue.work_millis, queue.max_records_per_fetch), (2.0, 5));
    assert_eq!((queue.share_groups, queue.consumers), (2, 6));
    // 200 msg/s for about 5 s: nearly all delivered and accepted within the phase.
    let sent = extras.measured_messages_sent;
    assert!(sent > 500, "sent {sent}");
    assert!(queue.measured_delivered * 10 >= sent * 9, "delivered {} of {sent}", queue.measured_delivered);
    assert!(queue.measured_acknowledged * 10 >= sent * 9, "acknowledged {} of {sent}", queue.measured_acknowledged);
    assert_eq!(queue.measured_acknowledge_errors, 0, "{queue:?}");
    assert_eq!(queue.measured_redelivered, 0, "{queue:?}");
    assert_eq!(queue.measured_restarts, 0, "{queue:?}");
    assert!(queue.aggregated_acknowledge_rate > 100.0, "{queue:?}");
    assert_eq!(queue.acknowledge_rate.len(), result.publish_rate.len());
    assert!(result.consume_rate_mean() > 100.0, "{:?}", result.consume_rate);
    // End-to-end latency is taken when a record's work starts: at least the publish path.
    assert!(result.aggregated_end_to_end_latency_50pct > 0.0);
    assert!(result.aggregated_end_to_end_latency_99pct >= result.aggregated_end_to_end_latency_50pct);
    assert!(result.aggregated_publish_latency_99pct > 0.0);
}

/// The catch-up workload's shape in seconds: the producers' figures are split at the
/// phase changes (build with consumers paused, drain, tail), the drain read the whole
/// backlog, the ratio is the two p99s', and an uncapped run records no memory cap.
#[test]
fn catch_up_smoke_workload_records_each_backlog_phase() {
    let bin = sluice_bin().expect("no sluice binary: run `cargo build --release -p sluice-cli` or set SLUICE_BIN");
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.workloads = vec![workspace().join("bench/local/workloads/catchup-smoke.yaml")];
    args.charts = false;
    args.start_sluice = true;
    args.sluice_bin = Some(bin);
    let _serial = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let written = sluice_bench::run_workloads(args).expect("bench run");
    let result = TestResult::load(&written[0]).unwrap();
    let extras = result.sluice.as_ref().expect("sluice extras");
    assert_eq!(extras.broker_memory, None, "not capped");
    let phases = extras.backlog_phases.as_ref().expect("backlog phases");
    let build = phases.build.as_ref().expect("build phase");
    let drain = phases.drain.as_ref().expect("drain phase");
    let tail = phases.tail.as_ref().expect("tail phase");
    // 8 MiB of 1 KiB messages: the build ends once that many wait, the drain reads them.
    let backlog_messages = 8 * 1024;
    assert!(build.messages_sent >= build.messages_received + backlog_messages * 9 / 10, "{build:?}");
    assert!(drain.messages_received >= backlog_messages * 9 / 10, "{drain:?}");
    assert!(drain.consume_mb_per_second > 0.0, "{drain:?}");
    assert_eq!(Some(drain.seconds), extras.backlog_drain_seconds);
    for phase in [build, drain, tail] {
        assert!(phase.seconds > 0.0 && phase.messages_sent > 0, "{phase:?}");
        assert!(phase.publish_latency_50pct > 0.0, "{phase:?}");
        assert!(phase.publish_latency_50pct <= phase.publish_latency_99pct, "{phase:?}");
        assert!(phase.publish_latency_99pct <= phase.publish_latency_999pct, "{phase:?}");
        assert!(phase.broker_disk_read_bytes.is_some(), "the broker's pid is known: {phase:?}");
    }
    let ratio = phases.drain_to_build_publish_p99.expect("ratio");
    assert!((ratio - drain.publish_latency_99pct / build.publish_latency_99pct).abs() < 1e-9);
    // The phases cover the measured phase but for its last sample, and no message twice.
    let in_phases = build.messages_sent + drain.messages_sent + tail.messages_sent;
    assert!(in_phases <= extras.measured_messages_sent, "{in_phases} > {}", extras.measured_messages_sent);
    let seconds = build.seconds + drain.seconds + tail.seconds;
    assert!(
        seconds <= extras.measured_seconds && seconds + 1.5 >= extras.measured_seconds,
        "{seconds} {}",
        extras.measured_seconds
    );
    assert!(in_phases as f64 >= extras.measured_messages_sent as f64 * (seconds / extras.measured_seconds) * 0.8);
}

/// A noisy neighbour: clean file data in the page cache before the warm-up, and a `dd`
/// writing during the measured phase; the result says what it did and when, and its
/// files are gone once the run ends.
#[test]
fn smoke_workload_with_a_noisy_neighbour_records_it_and_cleans_up() {
    let bin = sluice_bin().expect("no sluice binary: run `cargo build --release -p sluice-cli` or set SLUICE_BIN");
    let dir = tempfile::tempdir().unwrap();
    let neighbour_dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.charts = false;
    args.start_sluice = true;
    args.sluice_bin = Some(bin);
    args.overrides.neighbour_cached = Some(16 << 20);
    args.overrides.neighbour_writes = Some(32 << 20);
    args.overrides.neighbour_writes_at = 1.0;
    args.overrides.neighbour_dir = Some(neighbour_dir.path().to_path_buf());
    let _serial = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let written = sluice_bench::run_workloads(args).expect("bench run");
    let result = TestResult::load(&written[0]).unwrap();
    check(&result);
    let extras = result.sluice.as_ref().expect("sluice extras");
    let neighbour = extras.neighbour.as_ref().expect("neighbour figures");
    assert_eq!(neighbour.dir, neighbour_dir.path().display().to_string());
    assert_eq!(neighbour.cached_bytes, 16 << 20);
    assert!(neighbour.cache_fill_seconds > 0.0, "{neighbour:?}");
    assert_eq!(neighbour.written_bytes, 32 << 20, "{neighbour:?}");
    let start = neighbour.write_start_seconds.expect("the writer started");
    assert!(start >= 1.0 && start < extras.measured_seconds, "{neighbour:?}");
    assert!(neighbour.write_seconds.is_some_and(|s| s > 0.0), "{neighbour:?}");
    let left: Vec<_> = std::fs::read_dir(neighbour_dir.path()).unwrap().collect();
    assert!(left.is_empty(), "neighbour files left behind: {left:?}");
}

/// A peak search runs many trials; a neighbour belongs to one fixed-rate run.
#[test]
fn a_peak_search_with_a_neighbour_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.start_sluice = true;
    args.sluice_bin = sluice_bin();
    args.overrides.find_peak = true;
    args.overrides.neighbour_writes = Some(1 << 20);
    let error = sluice_bench::run_workloads(args).unwrap_err();
    assert!(format!("{error:#}").contains("--find-peak"), "{error:#}");
}

/// `--broker-memory-limit` starts the broker inside a memory cgroup with the limit of the
/// rule (budget + Sluice's allowance), reports it, and removes the cgroup after the
/// broker stopped. Needs root and memory cgroups (CI here); skipped with a message
/// elsewhere.
#[test]
fn capped_sluice_runs_inside_its_memory_cgroup() {
    use sluice_bench::memcap::{self, MemoryCap};
    let bin = sluice_bin().expect("no sluice binary: run `cargo build --release -p sluice-cli` or set SLUICE_BIN");
    // SAFETY: geteuid(2) has no preconditions.
    if memcap::memory_cgroup_parent().is_err() || unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root and memory cgroups");
        return;
    }
    let cap: MemoryCap = "64m".parse().unwrap();
    let set = sluice_bench::brokers::SluiceBroker::start_cluster(&bin, 1, &[], None, Some(cap)).expect("capped start");
    let figures = set.memory_figures().expect("memory figures");
    assert_eq!(figures.limit_bytes, (64 << 20) + memcap::SLUICE_RESIDENT_ALLOWANCE);
    assert_eq!(figures.page_cache_budget_bytes, 64 << 20);
    assert!(figures.peak_usage_bytes.is_some_and(|peak| peak > 0 && peak <= figures.limit_bytes), "{figures:?}");
    let pid = set.pids()[0];
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(own.contains("sluice-bench-"), "broker not in a bench cgroup: {own}");
    let cgroup_dir = {
        let line = own.lines().find(|line| line.contains("sluice-bench-")).unwrap();
        let relative = line.splitn(3, ':').nth(2).unwrap().to_string();
        let parent = memcap::memory_cgroup_parent().unwrap();
        let name = relative.rsplit('/').next().unwrap().to_string();
        parent.dir.join(name)
    };
    assert!(cgroup_dir.join("cgroup.procs").is_file(), "{}", cgroup_dir.display());
    drop(set);
    assert!(!cgroup_dir.exists(), "cgroup {} left behind", cgroup_dir.display());
}

/// A cap needs a broker the bench starts.
#[test]
fn memory_limit_without_a_started_broker_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = smoke_args(dir.path());
    args.broker_memory_limit = Some("512m".parse().unwrap());
    let error = sluice_bench::run_workloads(args).unwrap_err();
    assert!(format!("{error:#}").contains("--start-sluice"), "{error:#}");
}
