//! OMB workload files, read as they are.
//!
//! A workload YAML names the shape of a run: topics, partitions, producers, consumers,
//! message size and the producer rate. Every upstream field is accepted, plus the fork
//! extensions listed in `shared/OMB.md` (`partitionsPerTopicList`, `producersPerTopicList`,
//! `producerRateList`, `sampleRateMillis` / `logIntervalMillis`, `consumerOnly`). Keys we
//! do not know are reported as warnings, never as errors, because upstream ignores them.
//!
//! One Sluice extension: a `queue` section ([`QueueSpec`]) makes each subscription a share
//! group (KIP-932) whose consumers work a fixed time per record and accept each one, the
//! queue-style workload of RabbitMQ's benchmarks. Upstream OMB ignores the key.
//!
//! ```no_run
//! let loaded = sluice_bench::workload::Workload::load("bench/workloads/1-topic-100-partitions-1kb.yaml").unwrap();
//! assert_eq!(loaded.workload.topics, 1);
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

/// The default sample period of OMB's stats printer.
pub const SAMPLE_PERIOD_MS_DEFAULT: u64 = 10_000;

/// How producers pick a record key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum KeyDistributor {
    /// A null key: the client's partitioner spreads records.
    #[default]
    NoKey,
    /// Round robin over a fixed pool of random keys.
    KeyRoundRobin,
    /// Key index = monotonic nanoseconds modulo the pool size.
    RandomNano,
}

/// One OMB workload, with upstream field names (camelCase in YAML).
///
/// Durations and the backlog size are read as floating point so that scaled variants
/// for one machine can use fractions; upstream files with integers parse unchanged.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Copied into the result's `workload` field.
    pub name: String,
    /// Number of topics.
    pub topics: u32,
    /// Partitions per topic.
    #[serde(default)]
    pub partitions_per_topic: u32,
    /// Fork extension: one partition count per topic.
    #[serde(default)]
    pub partitions_per_topic_list: Option<Vec<u32>>,
    /// Key selection.
    #[serde(default)]
    pub key_distributor: KeyDistributor,
    /// Message size in bytes; must equal the payload file's length.
    pub message_size: u32,
    /// Build a pool of part-random payloads instead of reading `payloadFile`.
    #[serde(default)]
    pub use_randomized_payloads: bool,
    /// Share of random bytes in each randomized payload (the rest are zeros).
    #[serde(default)]
    pub random_bytes_ratio: f64,
    /// Number of randomized payloads in the pool.
    #[serde(default)]
    pub randomized_payload_pool_size: u32,
    /// The payload file, relative to the workload file's folder or its parent.
    #[serde(default)]
    pub payload_file: Option<String>,
    /// Subscriptions per topic: one consumer group each.
    pub subscriptions_per_topic: u32,
    /// Producers per topic, each its own client.
    #[serde(default)]
    pub producers_per_topic: u32,
    /// Fork extension: one producer count per topic.
    #[serde(default)]
    pub producers_per_topic_list: Option<Vec<u32>>,
    /// Consumers per subscription, each its own client.
    pub consumer_per_subscription: u32,
    /// Total producer rate in messages per second; 0 = discover the sustainable rate.
    #[serde(default)]
    pub producer_rate: f64,
    /// Fork extension: `[[minuteFromStart, rate], ...]`, linearly interpolated.
    #[serde(default)]
    pub producer_rate_list: Option<Vec<[f64; 2]>>,
    /// Pause consumers until this many GiB are waiting, then drain.
    #[serde(default, rename = "consumerBacklogSizeGB")]
    pub consumer_backlog_size_gb: f64,
    /// Share of the backlog that must be drained before the measured tail phase.
    #[serde(default = "backlog_drain_ratio_default")]
    pub backlog_drain_ratio: f64,
    /// Measured phase length.
    pub test_duration_minutes: f64,
    /// Warm-up length; its latencies are discarded.
    #[serde(default = "warmup_duration_minutes_default")]
    pub warmup_duration_minutes: f64,
    /// Fork extension: the sample period.
    #[serde(default)]
    pub sample_rate_millis: Option<u64>,
    /// Fork extension: the sample period, under its other name.
    #[serde(default)]
    pub log_interval_millis: Option<u64>,
    /// Fork extension: consumers only (reading what an earlier run wrote).
    #[serde(default)]
    pub consumer_only: bool,
    /// Sluice extension: queue semantics (share groups, work time, acceptance per record).
    #[serde(default)]
    pub queue: Option<QueueSpec>,
    /// Keys we do not know; warned about.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_norway::Value>,
}

/// The `queue` section of a workload (a Sluice extension):
///
/// ```yaml
/// queue:
///   workMillis: 10          # each consumer "works" every record this long, then accepts it
///   maxRecordsPerFetch: 10  # ShareFetch MaxRecords, as RabbitMQ's consumer prefetch (qos)
/// ```
///
/// Each subscription is then one share group (`share.auto.offset.reset=earliest`) instead
/// of a consumer group, and `consumerPerSubscription` is the number of its members, each
/// one worker: a subscription sustains at most `consumers x 1000 / workMillis` msg/s.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueSpec {
    /// Work per record in milliseconds (a sleep), before the record is accepted.
    pub work_millis: f64,
    /// Records one ShareFetch may acquire for a consumer.
    #[serde(default = "max_records_per_fetch_default")]
    pub max_records_per_fetch: u32,
}

/// Records per ShareFetch unless the workload says otherwise.
pub const MAX_RECORDS_PER_FETCH_DEFAULT: u32 = 10;

fn max_records_per_fetch_default() -> u32 {
    MAX_RECORDS_PER_FETCH_DEFAULT
}

/// Longest work time per record the workload may ask for.
pub const WORK_MS_MAX: f64 = 1_000.0;
/// Most records one ShareFetch may ask for.
pub const RECORDS_PER_FETCH_MAX: u32 = 1_000;
/// Longest a consumer may spend working one fetch's records: it must stay well inside
/// the acquisition lock (30 s on both brokers by default) and the heartbeat interval
/// (5 s), as the consumer heartbeats between fetches.
pub const WORK_PER_FETCH_MS_MAX: f64 = 4_000.0;

impl QueueSpec {
    /// The work time per record.
    pub fn work(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.work_millis / 1000.0)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if !(0.0..=WORK_MS_MAX).contains(&self.work_millis) {
            bail!("queue.workMillis must be within 0..={WORK_MS_MAX}");
        }
        if !(1..=RECORDS_PER_FETCH_MAX).contains(&self.max_records_per_fetch) {
            bail!("queue.maxRecordsPerFetch must be within 1..={RECORDS_PER_FETCH_MAX}");
        }
        let work_per_fetch_ms = self.work_millis * f64::from(self.max_records_per_fetch);
        if work_per_fetch_ms > WORK_PER_FETCH_MS_MAX {
            bail!(
                "queue: maxRecordsPerFetch x workMillis = {work_per_fetch_ms} ms of work per fetch, over \
                 {WORK_PER_FETCH_MS_MAX} ms (records would outlive their acquisition lock or the heartbeat)"
            );
        }
        Ok(())
    }
}

fn backlog_drain_ratio_default() -> f64 {
    1.0
}

fn warmup_duration_minutes_default() -> f64 {
    1.0
}

/// A parsed workload with the place it came from and the warnings raised while reading it.
#[derive(Debug, Clone)]
pub struct LoadedWorkload {
    /// The workload.
    pub workload: Workload,
    /// The file it was read from, for resolving `payloadFile`.
    pub path: PathBuf,
    /// Human-readable warnings (unknown keys, suspicious values).
    pub warnings: Vec<String>,
}

impl Workload {
    /// Reads and checks a workload file.
    pub fn load(path: impl AsRef<Path>) -> anyhow::Result<LoadedWorkload> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).with_context(|| format!("reading workload {}", path.display()))?;
        let (workload, warnings) =
            Self::parse(&text).with_context(|| format!("parsing workload {}", path.display()))?;
        Ok(LoadedWorkload { workload, path: path.to_path_buf(), warnings })
    }

    /// Parses workload YAML text; returns the workload and its warnings.
    pub fn parse(text: &str) -> anyhow::Result<(Workload, Vec<String>)> {
        let workload: Workload = serde_norway::from_str(text)?;
        let mut warnings: Vec<String> =
            workload.unknown.keys().map(|key| format!("unknown workload key `{key}` ignored")).collect();
        workload.validate(&mut warnings)?;
        Ok((workload, warnings))
    }

    fn validate(&self, warnings: &mut Vec<String>) -> anyhow::Result<()> {
        if self.topics == 0 {
            bail!("topics must be at least 1");
        }
        if self.message_size == 0 {
            bail!("messageSize must be at least 1");
        }
        if let Some(list) = &self.partitions_per_topic_list {
            if list.len() != self.topics as usize {
                bail!("partitionsPerTopicList has {} entries for {} topics", list.len(), self.topics);
            }
        } else if self.partitions_per_topic == 0 {
            bail!("partitionsPerTopic must be at least 1");
        }
        if let Some(list) = &self.producers_per_topic_list {
            if list.len() != self.topics as usize {
                bail!("producersPerTopicList has {} entries for {} topics", list.len(), self.topics);
            }
        }
        if self.consumer_backlog_size_gb > 0.0 && self.producer_rate <= 0.0 {
            bail!("cannot discover the sustainable rate (producerRate 0) while building a backlog");
        }
        if !(0.0..=1.0).contains(&self.backlog_drain_ratio) {
            bail!("backlogDrainRatio must be within 0.0..=1.0");
        }
        if self.use_randomized_payloads && self.randomized_payload_pool_size == 0 {
            warnings.push("useRandomizedPayloads with randomizedPayloadPoolSize 0: using a pool of 1".into());
        }
        if !self.use_randomized_payloads && self.payload_file.is_none() {
            warnings.push("no payloadFile: using zero bytes of messageSize".into());
        }
        if self.test_duration_minutes <= 0.0 {
            bail!("testDurationMinutes must be positive");
        }
        if let Some(queue) = &self.queue {
            queue.validate()?;
        }
        Ok(())
    }

    /// The partition count of topic `topic_index`.
    pub fn partitions_of(&self, topic_index: usize) -> u32 {
        match &self.partitions_per_topic_list {
            Some(list) => list[topic_index],
            None => self.partitions_per_topic,
        }
    }

    /// The producer count of topic `topic_index`.
    pub fn producers_of(&self, topic_index: usize) -> u32 {
        match &self.producers_per_topic_list {
            Some(list) => list[topic_index],
            None => self.producers_per_topic,
        }
    }

    /// The sample period, with the fork names taken into account.
    pub fn sample_period_ms(&self) -> u64 {
        self.sample_rate_millis.or(self.log_interval_millis).unwrap_or(SAMPLE_PERIOD_MS_DEFAULT).max(100)
    }

    /// The producer rate `minutes` after the start of the load; `None` means rate discovery.
    pub fn rate_at(&self, minutes: f64) -> Option<f64> {
        if let Some(list) = self.producer_rate_list.as_ref().filter(|list| !list.is_empty()) {
            return Some(interpolate(list, minutes));
        }
        (self.producer_rate > 0.0).then_some(self.producer_rate)
    }

    /// The backlog size to build, in bytes (GiB as OMB counts them).
    pub fn backlog_bytes(&self) -> u64 {
        (self.consumer_backlog_size_gb * 1024.0 * 1024.0 * 1024.0) as u64
    }
}

/// Linear interpolation over `[[minute, rate], ...]` sorted by minute; flat outside.
fn interpolate(points: &[[f64; 2]], minutes: f64) -> f64 {
    assert!(!points.is_empty());
    let first = points[0];
    if minutes <= first[0] {
        return first[1];
    }
    for pair in points.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if minutes <= b[0] {
            let span = b[0] - a[0];
            if span <= 0.0 {
                return b[1];
            }
            return a[1] + (b[1] - a[1]) * (minutes - a[0]) / span;
        }
    }
    points[points.len() - 1][1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected_warnings: usize) -> Workload {
        let (workload, warnings) = Workload::parse(text).unwrap();
        assert_eq!(warnings.len(), expected_warnings, "{warnings:?}");
        workload
    }

    #[test]
    fn parses_upstream_fields_and_defaults() {
        let workload = check(
            "name: w\ntopics: 1\npartitionsPerTopic: 100\nmessageSize: 1024\n\
             payloadFile: payload/payload-1Kb.data\nsubscriptionsPerTopic: 1\n\
             consumerPerSubscription: 1\nproducersPerTopic: 1\nproducerRate: 50000\n\
             consumerBacklogSizeGB: 0\ntestDurationMinutes: 15\n",
            0,
        );
        assert_eq!(workload.partitions_of(0), 100);
        assert_eq!(workload.warmup_duration_minutes, 1.0);
        assert_eq!(workload.backlog_drain_ratio, 1.0);
        assert_eq!(workload.key_distributor, KeyDistributor::NoKey);
        assert_eq!(workload.sample_period_ms(), 10_000);
        assert_eq!(workload.rate_at(3.0), Some(50_000.0));
    }

    #[test]
    fn unknown_keys_warn_not_fail() {
        let workload = check(
            "name: w\ntopics: 1\npartitionsPerTopic: 1\nmessageSize: 10\npayloadFile: x\n\
             subscriptionsPerTopic: 1\nconsumerPerSubscription: 1\nproducersPerTopic: 1\n\
             producerRate: 1\ntestDurationMinutes: 1\nsomethingNew: 3\n",
            1,
        );
        assert!(workload.unknown.contains_key("somethingNew"));
    }

    #[test]
    fn fork_fields() {
        let workload = check(
            "name: w\ntopics: 2\npartitionsPerTopicList: [3, 5]\nproducersPerTopicList: [1, 2]\n\
             keyDistributor: KEY_ROUND_ROBIN\nmessageSize: 10\npayloadFile: x\n\
             subscriptionsPerTopic: 1\nconsumerPerSubscription: 1\n\
             producerRateList: [[0, 100], [10, 200]]\nsampleRateMillis: 1000\n\
             testDurationMinutes: 0.5\nwarmupDurationMinutes: 0\n",
            0,
        );
        assert_eq!(workload.partitions_of(1), 5);
        assert_eq!(workload.producers_of(1), 2);
        assert_eq!(workload.rate_at(5.0), Some(150.0));
        assert_eq!(workload.rate_at(20.0), Some(200.0));
        assert_eq!(workload.sample_period_ms(), 1000);
    }

    #[test]
    fn queue_section() {
        let base = "name: w\ntopics: 2\npartitionsPerTopic: 1\nmessageSize: 10\npayloadFile: x\n\
                    subscriptionsPerTopic: 1\nconsumerPerSubscription: 8\nproducersPerTopic: 2\n\
                    producerRate: 1000\ntestDurationMinutes: 1\n";
        assert_eq!(check(base, 0).queue, None);
        let workload = check(&format!("{base}queue:\n  workMillis: 10\n"), 0);
        let queue = workload.queue.expect("queue section");
        assert_eq!(queue.max_records_per_fetch, MAX_RECORDS_PER_FETCH_DEFAULT);
        assert_eq!(queue.work(), std::time::Duration::from_millis(10));
        let queue = check(&format!("{base}queue:\n  workMillis: 2.5\n  maxRecordsPerFetch: 100\n"), 0).queue;
        assert_eq!(queue.map(|q| q.max_records_per_fetch), Some(100));
        for bad in
            ["workMillis: -1", "workMillis: 10\n  maxRecordsPerFetch: 0", "workMillis: 100\n  maxRecordsPerFetch: 500"]
        {
            let error = Workload::parse(&format!("{base}queue:\n  {bad}\n")).unwrap_err();
            assert!(format!("{error:#}").contains("queue"), "{bad}: {error:#}");
        }
        // A misspelt key in the section is an error, not a silently ignored setting.
        assert!(Workload::parse(&format!("{base}queue:\n  workMilis: 10\n")).is_err());
    }

    #[test]
    fn rejects_backlog_with_rate_discovery() {
        let error = Workload::parse(
            "name: w\ntopics: 1\npartitionsPerTopic: 1\nmessageSize: 10\n\
             subscriptionsPerTopic: 1\nconsumerPerSubscription: 1\nproducersPerTopic: 1\n\
             producerRate: 0\nconsumerBacklogSizeGB: 1\ntestDurationMinutes: 1\n",
        )
        .unwrap_err();
        assert!(error.to_string().contains("discover"), "{error}");
    }
}
