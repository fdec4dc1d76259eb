//! The result file: OMB's `TestResult` JSON, same field names, order and units.
//!
//! Publish and end-to-end latencies are milliseconds (fractional, from microsecond
//! histograms), publish delay is whole microseconds, rates are messages per second,
//! as upstream, so OMB's own chart script can read our files and we can read theirs.
//! What OMB does not have (the clock used for end-to-end latency, the consumer mode,
//! broker CPU and memory, transaction rates and commit latency, the producers' latency
//! per backlog phase, the broker's memory cap) goes in one extra object, `sluice`, at the
//! end.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::stats::{quantile_curve, LatencySet, Summary};

/// A latency-by-quantile map: percentile (0..100) -> value, written as a JSON object
/// whose keys are the percentiles printed as Java prints doubles (`"50.0"`, `"99.9"`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quantiles(pub Vec<(f64, f64)>);

impl Serialize for Quantiles {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (percentile, value) in &self.0 {
            map.serialize_entry(&format!("{percentile:?}"), value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Quantiles {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, f64>::deserialize(deserializer)?;
        let mut pairs: Vec<(f64, f64)> =
            map.into_iter().filter_map(|(key, value)| key.parse::<f64>().ok().map(|p| (p, value))).collect();
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Quantiles(pairs))
    }
}

/// What we add to OMB's result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct SluiceExtras {
    /// Which clock stamped end-to-end latency, in words.
    pub end_to_end_clock: String,
    /// `subscribe` (consumer groups) or `assign` (partitions split by the bench).
    pub consumer_mode: String,
    /// Seconds between samples.
    pub sample_period_seconds: f64,
    /// Publish throughput per sample, MiB/s.
    pub publish_throughput_mb: Vec<f64>,
    /// Consume throughput per sample, MiB/s.
    pub consume_throughput_mb: Vec<f64>,
    /// The target rate per sample (changes under rate discovery).
    pub target_rate: Vec<f64>,
    /// Messages published in the measured phase.
    pub measured_messages_sent: u64,
    /// Bytes published in the measured phase.
    pub measured_bytes_sent: u64,
    /// Length of the measured phase, seconds.
    pub measured_seconds: f64,
    /// Backlog build and drain, when the workload asked for one.
    pub backlog_build_seconds: Option<f64>,
    /// Seconds from resuming consumers until the backlog was drained.
    pub backlog_drain_seconds: Option<f64>,
    /// Catch-up read rate while draining, MiB/s.
    pub backlog_drain_mb_per_second: Option<f64>,
    /// Broker process CPU seconds (user + system) during the measured phase.
    pub broker_cpu_seconds: Option<f64>,
    /// Broker peak resident memory (VmHWM) in bytes at the end of the run.
    pub broker_peak_rss_bytes: Option<u64>,
    /// Broker CPU seconds per GiB published in the measured phase.
    pub broker_cpu_seconds_per_gb: Option<f64>,
    /// The kernel's part of `broker_cpu_seconds_per_gb` (system time: the broker's syscalls,
    /// its sockets' TCP work, block I/O). Absent in older result files.
    pub broker_kernel_cpu_seconds_per_gb: Option<f64>,
    /// CPU seconds of the bench process during the measured phase: every producer and
    /// consumer of the run (they run in it), so a machine the clients saturate shows.
    pub client_cpu_seconds: Option<f64>,
    /// Cores busy on the whole machine during the measured phase, on average (all
    /// processes: broker, clients and anything else), of [`SluiceExtras::machine_cores`].
    pub machine_busy_cores: Option<f64>,
    /// Cores the hypervisor gave to other guests while this machine wanted them (steal
    /// time), on average over the measured phase; part of `machine_busy_cores`. Rounds
    /// with much of it measured the host's neighbours as well as the broker.
    pub machine_steal_cores: Option<f64>,
    /// The machine's online cores.
    pub machine_cores: Option<u32>,
    /// Which broker was measured, when the bench knows (`sluice`, `kafka`).
    pub broker: Option<String>,
    /// Peak stable throughput (msg/s) found by `--find-peak`; this result is its best trial.
    pub peak_stable_rate: Option<f64>,
    /// The peak search's trials: `[target msg/s, published msg/s, stable (1) or not (0)]`.
    pub peak_trials: Vec<[f64; 3]>,
    /// Transactional producers' figures; absent for plain producers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transactions: Option<TransactionFigures>,
    /// Share consumers' figures (queue workloads); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueFigures>,
    /// Producers' latency and the broker's disk reads per backlog phase (workloads with
    /// `consumerBacklogSizeGB`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlog_phases: Option<BacklogPhases>,
    /// The broker's memory cgroup (`--broker-memory-limit`); absent when uncapped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker_memory: Option<crate::memcap::MemoryFigures>,
    /// The noisy neighbour of the run (`--neighbour-cached`, `--neighbour-writes`); absent
    /// when there was none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<crate::neighbour::NeighbourFigures>,
}

/// A catch-up run's phases: what the producers saw before the drain (consumers paused
/// while the backlog builds), during it, and after it. The catch-up criterion reads
/// `drain.publishLatency99pct / build.publishLatency99pct` (at most 1.5) and the
/// catch-up MiB/s (`backlogDrainMbPerSecond`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct BacklogPhases {
    /// Consumers paused, producers at the workload's rate, until the backlog has its size.
    pub build: Option<PhaseFigures>,
    /// Consumers reading the backlog from its start while producers go on.
    pub drain: Option<PhaseFigures>,
    /// After the drain, one more test duration (consumers tailing).
    pub tail: Option<PhaseFigures>,
    /// Publish p99 during the drain over publish p99 before it.
    pub drain_to_build_publish_p99: Option<f64>,
}

impl BacklogPhases {
    /// Sets the ratio from the phases present.
    pub fn set_ratio(&mut self) {
        self.drain_to_build_publish_p99 = match (&self.build, &self.drain) {
            (Some(build), Some(drain)) if build.publish_latency_99pct > 0.0 => {
                Some(drain.publish_latency_99pct / build.publish_latency_99pct)
            }
            _ => None,
        };
    }
}

/// One backlog phase's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct PhaseFigures {
    /// Length, seconds.
    pub seconds: f64,
    /// Messages acknowledged to the producers.
    pub messages_sent: u64,
    /// Messages consumed (every subscription's copy).
    pub messages_received: u64,
    /// Publish rate, msg/s.
    pub publish_rate: f64,
    /// Consume rate, MiB/s.
    pub consume_mb_per_second: f64,
    /// Publish latency, ms.
    pub publish_latency_avg: f64,
    /// Median publish latency, ms.
    #[serde(rename = "publishLatency50pct")]
    pub publish_latency_50pct: f64,
    /// 99th percentile publish latency, ms.
    #[serde(rename = "publishLatency99pct")]
    pub publish_latency_99pct: f64,
    /// 99.9th percentile publish latency, ms.
    #[serde(rename = "publishLatency999pct")]
    pub publish_latency_999pct: f64,
    /// Longest publish, ms.
    pub publish_latency_max: f64,
    /// 99th percentile publish delay (behind the send schedule), us.
    #[serde(rename = "publishDelayLatency99pct")]
    pub publish_delay_latency_99pct: u64,
    /// Bytes the broker processes read from the block layer in the phase (`read_bytes`
    /// of `/proc/PID/io`, summed over nodes): the catch-up read's cold part.
    pub broker_disk_read_bytes: Option<u64>,
}

impl PhaseFigures {
    /// Fills the publish latencies from the phase's histograms.
    pub fn set_latency(&mut self, latency: &LatencySet) {
        let publish = Summary::of(&latency.publish_us);
        self.publish_latency_avg = publish.mean / 1000.0;
        self.publish_latency_50pct = ms(publish.p50);
        self.publish_latency_99pct = ms(publish.p99);
        self.publish_latency_999pct = ms(publish.p999);
        self.publish_latency_max = ms(publish.max);
        self.publish_delay_latency_99pct = Summary::of(&latency.publish_delay_us).p99;
    }
}

/// What the share consumers of a queue workload did in the measured phase. Their
/// deliveries are also the result's consume rate and end-to-end latency (taken when a
/// record's work starts).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct QueueFigures {
    /// Work per record, ms (a sleep before the record is accepted).
    pub work_millis: f64,
    /// ShareFetch MaxRecords of each consumer.
    pub max_records_per_fetch: u32,
    /// Share groups (one per subscription).
    pub share_groups: u32,
    /// Consumers (share-group members, one worker each) over all groups.
    pub consumers: u32,
    /// Acceptances confirmed by the broker per second, per sample.
    pub acknowledge_rate: Vec<f64>,
    /// Records delivered to the workers (redeliveries included).
    pub measured_delivered: u64,
    /// Records delivered with a delivery count above 1.
    pub measured_redelivered: u64,
    /// Acceptances the broker confirmed.
    pub measured_acknowledged: u64,
    /// Acknowledgements refused or lost with a share session.
    pub measured_acknowledge_errors: u64,
    /// ShareFetch requests answered.
    pub measured_fetches: u64,
    /// Consumers that started over (rejoined as new members) after an error.
    pub measured_restarts: u64,
    /// Acceptances confirmed per second over the measured phase.
    pub aggregated_acknowledge_rate: f64,
}

/// What transactional producers did: rates and the commit call's latency (ms, as OMB's
/// publish latency).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct TransactionFigures {
    /// Records each transaction carries (the driver's `requestsPerTransaction`).
    pub records_per_transaction: u32,
    /// Committed transactions per second, per sample.
    pub transaction_rate: Vec<f64>,
    /// Transactions committed in the measured phase.
    pub measured_transactions: u64,
    /// Transactions aborted in the measured phase.
    pub measured_aborts: u64,
    /// Committed transactions per second over the measured phase.
    pub aggregated_transaction_rate: f64,
    /// Commit call latency of the measured phase, ms.
    pub aggregated_commit_latency_avg: f64,
    /// Median commit latency, ms.
    #[serde(rename = "aggregatedCommitLatency50pct")]
    pub aggregated_commit_latency_50pct: f64,
    /// 99th percentile commit latency, ms.
    #[serde(rename = "aggregatedCommitLatency99pct")]
    pub aggregated_commit_latency_99pct: f64,
    /// 99.9th percentile commit latency, ms.
    #[serde(rename = "aggregatedCommitLatency999pct")]
    pub aggregated_commit_latency_999pct: f64,
    /// Longest commit, ms.
    pub aggregated_commit_latency_max: f64,
    /// Commit latency by percentile, ms.
    pub aggregated_commit_latency_quantiles: Quantiles,
}

impl TransactionFigures {
    /// Fills the aggregated commit latencies from the measured phase's histogram.
    pub fn set_commit_latency(&mut self, commit_us: &Histogram<u64>) {
        let commit = Summary::of(commit_us);
        self.aggregated_commit_latency_avg = commit.mean / 1000.0;
        self.aggregated_commit_latency_50pct = ms(commit.p50);
        self.aggregated_commit_latency_99pct = ms(commit.p99);
        self.aggregated_commit_latency_999pct = ms(commit.p999);
        self.aggregated_commit_latency_max = ms(commit.max);
        self.aggregated_commit_latency_quantiles = curve_ms(commit_us);
    }
}

/// OMB's `TestResult`, field for field.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
#[allow(missing_docs)]
pub struct TestResult {
    pub workload: String,
    pub driver: String,
    pub message_size: u64,
    pub topics: u32,
    pub partitions: u32,
    pub producers_per_topic: u32,
    pub consumers_per_topic: u32,

    pub publish_rate: Vec<f64>,
    pub publish_error_rate: Vec<f64>,
    pub consume_rate: Vec<f64>,
    pub backlog: Vec<i64>,

    pub publish_latency_avg: Vec<f64>,
    #[serde(rename = "publishLatency50pct")]
    pub publish_latency_50pct: Vec<f64>,
    #[serde(rename = "publishLatency75pct")]
    pub publish_latency_75pct: Vec<f64>,
    #[serde(rename = "publishLatency95pct")]
    pub publish_latency_95pct: Vec<f64>,
    #[serde(rename = "publishLatency99pct")]
    pub publish_latency_99pct: Vec<f64>,
    #[serde(rename = "publishLatency999pct")]
    pub publish_latency_999pct: Vec<f64>,
    #[serde(rename = "publishLatency9999pct")]
    pub publish_latency_9999pct: Vec<f64>,
    pub publish_latency_max: Vec<f64>,

    pub publish_delay_latency_avg: Vec<f64>,
    #[serde(rename = "publishDelayLatency50pct")]
    pub publish_delay_latency_50pct: Vec<u64>,
    #[serde(rename = "publishDelayLatency75pct")]
    pub publish_delay_latency_75pct: Vec<u64>,
    #[serde(rename = "publishDelayLatency95pct")]
    pub publish_delay_latency_95pct: Vec<u64>,
    #[serde(rename = "publishDelayLatency99pct")]
    pub publish_delay_latency_99pct: Vec<u64>,
    #[serde(rename = "publishDelayLatency999pct")]
    pub publish_delay_latency_999pct: Vec<u64>,
    #[serde(rename = "publishDelayLatency9999pct")]
    pub publish_delay_latency_9999pct: Vec<u64>,
    pub publish_delay_latency_max: Vec<u64>,

    pub aggregated_publish_latency_avg: f64,
    #[serde(rename = "aggregatedPublishLatency50pct")]
    pub aggregated_publish_latency_50pct: f64,
    #[serde(rename = "aggregatedPublishLatency75pct")]
    pub aggregated_publish_latency_75pct: f64,
    #[serde(rename = "aggregatedPublishLatency95pct")]
    pub aggregated_publish_latency_95pct: f64,
    #[serde(rename = "aggregatedPublishLatency99pct")]
    pub aggregated_publish_latency_99pct: f64,
    #[serde(rename = "aggregatedPublishLatency999pct")]
    pub aggregated_publish_latency_999pct: f64,
    #[serde(rename = "aggregatedPublishLatency9999pct")]
    pub aggregated_publish_latency_9999pct: f64,
    pub aggregated_publish_latency_max: f64,

    pub aggregated_publish_delay_latency_avg: f64,
    #[serde(rename = "aggregatedPublishDelayLatency50pct")]
    pub aggregated_publish_delay_latency_50pct: u64,
    #[serde(rename = "aggregatedPublishDelayLatency75pct")]
    pub aggregated_publish_delay_latency_75pct: u64,
    #[serde(rename = "aggregatedPublishDelayLatency95pct")]
    pub aggregated_publish_delay_latency_95pct: u64,
    #[serde(rename = "aggregatedPublishDelayLatency99pct")]
    pub aggregated_publish_delay_latency_99pct: u64,
    #[serde(rename = "aggregatedPublishDelayLatency999pct")]
    pub aggregated_publish_delay_latency_999pct: u64,
    #[serde(rename = "aggregatedPublishDelayLatency9999pct")]
    pub aggregated_publish_delay_latency_9999pct: u64,
    pub aggregated_publish_delay_latency_max: u64,

    pub aggregated_publish_latency_quantiles: Quantiles,
    pub aggregated_publish_delay_latency_quantiles: Quantiles,

    pub end_to_end_latency_avg: Vec<f64>,
    #[serde(rename = "endToEndLatency50pct")]
    pub end_to_end_latency_50pct: Vec<f64>,
    #[serde(rename = "endToEndLatency75pct")]
    pub end_to_end_latency_75pct: Vec<f64>,
    #[serde(rename = "endToEndLatency95pct")]
    pub end_to_end_latency_95pct: Vec<f64>,
    #[serde(rename = "endToEndLatency99pct")]
    pub end_to_end_latency_99pct: Vec<f64>,
    #[serde(rename = "endToEndLatency999pct")]
    pub end_to_end_latency_999pct: Vec<f64>,
    #[serde(rename = "endToEndLatency9999pct")]
    pub end_to_end_latency_9999pct: Vec<f64>,
    pub end_to_end_latency_max: Vec<f64>,

    pub aggregated_end_to_end_latency_quantiles: Quantiles,

    pub aggregated_end_to_end_latency_avg: f64,
    #[serde(rename = "aggregatedEndToEndLatency50pct")]
    pub aggregated_end_to_end_latency_50pct: f64,
    #[serde(rename = "aggregatedEndToEndLatency75pct")]
    pub aggregated_end_to_end_latency_75pct: f64,
    #[serde(rename = "aggregatedEndToEndLatency95pct")]
    pub aggregated_end_to_end_latency_95pct: f64,
    #[serde(rename = "aggregatedEndToEndLatency99pct")]
    pub aggregated_end_to_end_latency_99pct: f64,
    #[serde(rename = "aggregatedEndToEndLatency999pct")]
    pub aggregated_end_to_end_latency_999pct: f64,
    #[serde(rename = "aggregatedEndToEndLatency9999pct")]
    pub aggregated_end_to_end_latency_9999pct: f64,
    pub aggregated_end_to_end_latency_max: f64,

    /// Our additions; absent from OMB's files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sluice: Option<SluiceExtras>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// One sample period's figures, as the collector measured them.
#[derive(Debug, Clone, Copy)]
pub struct SampleRates {
    /// Published messages per second.
    pub publish_rate: f64,
    /// Failed sends per second.
    pub publish_error_rate: f64,
    /// Consumed messages per second.
    pub consume_rate: f64,
    /// Messages not yet consumed by every subscription.
    pub backlog: i64,
}

impl TestResult {
    /// Appends one sample period.
    pub fn push_sample(&mut self, rates: SampleRates, period: &LatencySet) {
        self.publish_rate.push(rates.publish_rate);
        self.publish_error_rate.push(rates.publish_error_rate);
        self.consume_rate.push(rates.consume_rate);
        self.backlog.push(rates.backlog.max(0));

        let publish = Summary::of(&period.publish_us);
        self.publish_latency_avg.push(publish.mean / 1000.0);
        self.publish_latency_50pct.push(ms(publish.p50));
        self.publish_latency_75pct.push(ms(publish.p75));
        self.publish_latency_95pct.push(ms(publish.p95));
        self.publish_latency_99pct.push(ms(publish.p99));
        self.publish_latency_999pct.push(ms(publish.p999));
        self.publish_latency_9999pct.push(ms(publish.p9999));
        self.publish_latency_max.push(ms(publish.max));

        let delay = Summary::of(&period.publish_delay_us);
        self.publish_delay_latency_avg.push(delay.mean);
        self.publish_delay_latency_50pct.push(delay.p50);
        self.publish_delay_latency_75pct.push(delay.p75);
        self.publish_delay_latency_95pct.push(delay.p95);
        self.publish_delay_latency_99pct.push(delay.p99);
        self.publish_delay_latency_999pct.push(delay.p999);
        self.publish_delay_latency_9999pct.push(delay.p9999);
        self.publish_delay_latency_max.push(delay.max);

        let e2e = Summary::of(&period.end_to_end_us);
        self.end_to_end_latency_avg.push(e2e.mean / 1000.0);
        self.end_to_end_latency_50pct.push(ms(e2e.p50));
        self.end_to_end_latency_75pct.push(ms(e2e.p75));
        self.end_to_end_latency_95pct.push(ms(e2e.p95));
        self.end_to_end_latency_99pct.push(ms(e2e.p99));
        self.end_to_end_latency_999pct.push(ms(e2e.p999));
        self.end_to_end_latency_9999pct.push(ms(e2e.p9999));
        self.end_to_end_latency_max.push(ms(e2e.max));
    }

    /// Fills the aggregated fields from the cumulative histograms of the measured phase.
    pub fn set_aggregated(&mut self, cumulative: &LatencySet) {
        let publish = Summary::of(&cumulative.publish_us);
        self.aggregated_publish_latency_avg = publish.mean / 1000.0;
        self.aggregated_publish_latency_50pct = ms(publish.p50);
        self.aggregated_publish_latency_75pct = ms(publish.p75);
        self.aggregated_publish_latency_95pct = ms(publish.p95);
        self.aggregated_publish_latency_99pct = ms(publish.p99);
        self.aggregated_publish_latency_999pct = ms(publish.p999);
        self.aggregated_publish_latency_9999pct = ms(publish.p9999);
        self.aggregated_publish_latency_max = ms(publish.max);

        let delay = Summary::of(&cumulative.publish_delay_us);
        self.aggregated_publish_delay_latency_avg = delay.mean;
        self.aggregated_publish_delay_latency_50pct = delay.p50;
        self.aggregated_publish_delay_latency_75pct = delay.p75;
        self.aggregated_publish_delay_latency_95pct = delay.p95;
        self.aggregated_publish_delay_latency_99pct = delay.p99;
        self.aggregated_publish_delay_latency_999pct = delay.p999;
        self.aggregated_publish_delay_latency_9999pct = delay.p9999;
        self.aggregated_publish_delay_latency_max = delay.max;

        let e2e = Summary::of(&cumulative.end_to_end_us);
        self.aggregated_end_to_end_latency_avg = e2e.mean / 1000.0;
        self.aggregated_end_to_end_latency_50pct = ms(e2e.p50);
        self.aggregated_end_to_end_latency_75pct = ms(e2e.p75);
        self.aggregated_end_to_end_latency_95pct = ms(e2e.p95);
        self.aggregated_end_to_end_latency_99pct = ms(e2e.p99);
        self.aggregated_end_to_end_latency_999pct = ms(e2e.p999);
        self.aggregated_end_to_end_latency_9999pct = ms(e2e.p9999);
        self.aggregated_end_to_end_latency_max = ms(e2e.max);

        self.aggregated_publish_latency_quantiles = curve_ms(&cumulative.publish_us);
        self.aggregated_publish_delay_latency_quantiles =
            Quantiles(quantile_curve(&cumulative.publish_delay_us).into_iter().map(|(p, v)| (p, v as f64)).collect());
        self.aggregated_end_to_end_latency_quantiles = curve_ms(&cumulative.end_to_end_us);
    }

    /// Reads a result file (ours or OMB's).
    pub fn load(path: &Path) -> anyhow::Result<TestResult> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading result {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing result {}", path.display()))
    }

    /// Writes the result as pretty JSON.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text).with_context(|| format!("writing result {}", path.display()))
    }

    /// Mean of the publish rate samples.
    pub fn publish_rate_mean(&self) -> f64 {
        mean(&self.publish_rate)
    }

    /// Mean of the consume rate samples.
    pub fn consume_rate_mean(&self) -> f64 {
        mean(&self.consume_rate)
    }
}

fn curve_ms(histogram: &Histogram<u64>) -> Quantiles {
    Quantiles(quantile_curve(histogram).into_iter().map(|(p, v)| (p, ms(v))).collect())
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// OMB's result file name: `<workload>-<driver>-<yyyy-MM-dd-HH-mm-ss>.json` (UTC here),
/// with characters unsafe in file names replaced.
pub fn result_file_name(workload: &str, driver: &str, unix_seconds: u64) -> String {
    let clean = |text: &str| -> String {
        text.chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '-' })
            .collect()
    };
    format!("{}-{}-{}.json", clean(workload), clean(driver), utc_stamp(unix_seconds))
}

/// `yyyy-MM-dd-HH-mm-ss` in UTC.
pub fn utc_stamp(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64;
    let seconds_of_day = unix_seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}-{:02}-{:02}-{:02}",
        seconds_of_day / 3600,
        seconds_of_day / 60 % 60,
        seconds_of_day % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's method).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::ClientStats;

    /// OMB's TestResult fields in declaration order.
    const UPSTREAM_FIELDS: &[&str] = &[
        "workload",
        "driver",
        "messageSize",
        "topics",
        "partitions",
        "producersPerTopic",
        "consumersPerTopic",
        "publishRate",
        "publishErrorRate",
        "consumeRate",
        "backlog",
        "publishLatencyAvg",
        "publishLatency50pct",
        "publishLatency75pct",
        "publishLatency95pct",
        "publishLatency99pct",
        "publishLatency999pct",
        "publishLatency9999pct",
        "publishLatencyMax",
        "publishDelayLatencyAvg",
        "publishDelayLatency50pct",
        "publishDelayLatency75pct",
        "publishDelayLatency95pct",
        "publishDelayLatency99pct",
        "publishDelayLatency999pct",
        "publishDelayLatency9999pct",
        "publishDelayLatencyMax",
        "aggregatedPublishLatencyAvg",
        "aggregatedPublishLatency50pct",
        "aggregatedPublishLatency75pct",
        "aggregatedPublishLatency95pct",
        "aggregatedPublishLatency99pct",
        "aggregatedPublishLatency999pct",
        "aggregatedPublishLatency9999pct",
        "aggregatedPublishLatencyMax",
        "aggregatedPublishDelayLatencyAvg",
        "aggregatedPublishDelayLatency50pct",
        "aggregatedPublishDelayLatency75pct",
        "aggregatedPublishDelayLatency95pct",
        "aggregatedPublishDelayLatency99pct",
        "aggregatedPublishDelayLatency999pct",
        "aggregatedPublishDelayLatency9999pct",
        "aggregatedPublishDelayLatencyMax",
        "aggregatedPublishLatencyQuantiles",
        "aggregatedPublishDelayLatencyQuantiles",
        "endToEndLatencyAvg",
        "endToEndLatency50pct",
        "endToEndLatency75pct",
        "endToEndLatency95pct",
        "endToEndLatency99pct",
        "endToEndLatency999pct",
        "endToEndLatency9999pct",
        "endToEndLatencyMax",
        "aggregatedEndToEndLatencyQuantiles",
        "aggregatedEndToEndLatencyAvg",
        "aggregatedEndToEndLatency50pct",
        "aggregatedEndToEndLatency75pct",
        "aggregatedEndToEndLatency95pct",
        "aggregatedEndToEndLatency99pct",
        "aggregatedEndToEndLatency999pct",
        "aggregatedEndToEndLatency9999pct",
        "aggregatedEndToEndLatencyMax",
    ];

    fn sample_result() -> TestResult {
        let client = ClientStats::default();
        for value in [900, 1_500, 2_500, 40_000] {
            client.record_sent(1024, value);
            client.record_publish_delay(value / 10);
            client.record_received(1024, Some(value * 2));
        }
        let mut period = LatencySet::default();
        client.drain_period_into(&mut period);
        let mut result = TestResult { workload: "w".into(), driver: "d".into(), ..TestResult::default() };
        let rates = SampleRates { publish_rate: 4.0, publish_error_rate: 0.0, consume_rate: 4.0, backlog: 0 };
        result.push_sample(rates, &period);
        result.set_aggregated(&period);
        result
    }

    #[test]
    fn json_field_names_and_order_match_upstream() {
        let text = serde_json::to_string(&sample_result()).unwrap();
        // Top-level keys in written order (quantile maps hold no `"...": [` / nested objects with letters).
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut positions: Vec<(usize, &str)> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|key| (text.find(&format!("\"{key}\":")).unwrap(), key.as_str()))
            .collect();
        positions.sort();
        let keys: Vec<&str> = positions.into_iter().map(|(_, key)| key).collect();
        assert_eq!(keys, UPSTREAM_FIELDS, "no extras unless set");
    }

    #[test]
    fn json_units_and_quantile_keys() {
        let result = sample_result();
        // 1,500 us publish latency reads as 1.5 ms; delay stays in us.
        assert_eq!(result.publish_latency_50pct, vec![1.5]);
        assert_eq!(result.aggregated_publish_delay_latency_50pct, 150);
        let value = serde_json::to_value(&result).unwrap();
        let quantiles = value["aggregatedPublishLatencyQuantiles"].as_object().unwrap();
        assert!(quantiles.contains_key("100.0"), "{quantiles:?}");
        let back: TestResult = serde_json::from_value(value).unwrap();
        assert_eq!(back, result);
    }

    #[test]
    fn file_name_format() {
        // 2021-03-04 05:06:07 UTC
        assert_eq!(
            result_file_name("1 producer / 1 consumer", "Kafka", 1_614_834_367),
            "1-producer---1-consumer-Kafka-2021-03-04-05-06-07.json"
        );
    }
}
