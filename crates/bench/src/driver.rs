//! OMB Kafka driver files, read as they are.
//!
//! A driver YAML carries the client and topic settings as Java-properties text blocks
//! (`topicConfig`, `commonConfig`, `producerConfig`, `consumerConfig`). We parse those
//! blocks into ordered key/value lists; `crate::kafka` maps them onto librdkafka,
//! dropping (with a warning) the Java-client-only keys librdkafka does not know.
//!
//! Transactions: upstream OMB's Kafka driver has no transaction setting, so we read the
//! one of Redpanda's OMB fork (its transactional Kafka driver, `driver-redpanda`'s `tx`
//! package): a top-level `requestsPerTransaction: N` makes every producer a transactional
//! producer that commits after each N records. The same file then still runs on that fork;
//! upstream OMB ignores the key (and runs non-transactionally). A `transactional.id` in
//! `producerConfig` is used as the prefix of each producer's own id (one id per producer,
//! as two producers sharing an id would fence each other).
//!
//! ```no_run
//! let loaded = sluice_bench::driver::Driver::load("bench/drivers/kafka-throughput.yaml").unwrap();
//! assert_eq!(loaded.driver.name, "Kafka");
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

/// A Kafka driver file with upstream field names.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverFile {
    /// Copied into the result's `driver` field.
    pub name: String,
    /// The Java driver class; ignored (we always drive a Kafka-protocol broker).
    #[serde(default)]
    pub driver_class: Option<String>,
    /// Replication factor of the created topics.
    #[serde(default = "replication_factor_default")]
    pub replication_factor: i32,
    /// Delete earlier benchmark topics before creating new ones.
    #[serde(default)]
    pub reset: bool,
    /// Topic configs (Java properties text).
    #[serde(default)]
    pub topic_config: String,
    /// Settings merged into producer, consumer and admin clients.
    #[serde(default)]
    pub common_config: String,
    /// Producer settings.
    #[serde(default)]
    pub producer_config: String,
    /// Consumer settings.
    #[serde(default)]
    pub consumer_config: String,
    /// Records per transaction (Redpanda's OMB fork); unset = no transactions.
    #[serde(default)]
    pub requests_per_transaction: Option<u32>,
    /// Keys we do not know; warned about.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_norway::Value>,
}

fn replication_factor_default() -> i32 {
    1
}

/// A driver file with its properties blocks parsed.
#[derive(Debug, Clone)]
pub struct Driver {
    /// The driver's name.
    pub name: String,
    /// Replication factor asked for.
    pub replication_factor: i32,
    /// Delete earlier benchmark topics first.
    pub reset: bool,
    /// Topic configs.
    pub topic_config: Vec<(String, String)>,
    /// Common client settings.
    pub common_config: Vec<(String, String)>,
    /// Producer settings.
    pub producer_config: Vec<(String, String)>,
    /// Consumer settings.
    pub consumer_config: Vec<(String, String)>,
    /// Transactional producers committing every this many records; `None` = plain producers.
    pub records_per_transaction: Option<u32>,
}

/// librdkafka's default `isolation.level` (the Java client's is `read_uncommitted`).
pub const ISOLATION_LEVEL_DEFAULT: &str = "read_committed";
/// Producer setting whose value prefixes each producer's `transactional.id`.
pub const TRANSACTIONAL_ID_KEY: &str = "transactional.id";

/// A parsed driver with the place it came from and its warnings.
#[derive(Debug, Clone)]
pub struct LoadedDriver {
    /// The driver.
    pub driver: Driver,
    /// The file it was read from.
    pub path: PathBuf,
    /// Human-readable warnings.
    pub warnings: Vec<String>,
}

impl Driver {
    /// Reads a driver file.
    pub fn load(path: impl AsRef<Path>) -> anyhow::Result<LoadedDriver> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).with_context(|| format!("reading driver {}", path.display()))?;
        let (driver, warnings) = Self::parse(&text).with_context(|| format!("parsing driver {}", path.display()))?;
        Ok(LoadedDriver { driver, path: path.to_path_buf(), warnings })
    }

    /// Parses driver YAML text.
    pub fn parse(text: &str) -> anyhow::Result<(Driver, Vec<String>)> {
        let file: DriverFile = serde_norway::from_str(text)?;
        let warnings = file.unknown.keys().map(|key| format!("unknown driver key `{key}` ignored")).collect();
        let producer_config = parse_properties(&file.producer_config);
        match file.requests_per_transaction {
            Some(0) => bail!("requestsPerTransaction must be at least 1"),
            None if lookup(&producer_config, TRANSACTIONAL_ID_KEY).is_some() => bail!(
                "producerConfig sets {TRANSACTIONAL_ID_KEY} but requestsPerTransaction is missing: \
                 say how many records each transaction carries"
            ),
            _ => {}
        }
        let driver = Driver {
            name: file.name,
            replication_factor: file.replication_factor,
            reset: file.reset,
            topic_config: parse_properties(&file.topic_config),
            common_config: parse_properties(&file.common_config),
            producer_config,
            consumer_config: parse_properties(&file.consumer_config),
            records_per_transaction: file.requests_per_transaction,
        };
        Ok((driver, warnings))
    }

    /// The value of `key` in the topic config, if set.
    pub fn topic_setting(&self, key: &str) -> Option<&str> {
        lookup(&self.topic_config, key)
    }

    /// The value of `key` in the common config, if set.
    pub fn common_setting(&self, key: &str) -> Option<&str> {
        lookup(&self.common_config, key)
    }

    /// Sets (or replaces) `bootstrap.servers` in the common config.
    pub fn set_bootstrap(&mut self, servers: &str) {
        self.common_config.retain(|(key, _)| key != "bootstrap.servers");
        self.common_config.push(("bootstrap.servers".into(), servers.into()));
    }

    /// The value of `key` in the consumer config, if set.
    pub fn consumer_setting(&self, key: &str) -> Option<&str> {
        lookup(&self.consumer_config, key)
    }

    /// The consumers' `isolation.level`: the driver's, else librdkafka's default.
    pub fn isolation_level(&self) -> &str {
        self.consumer_setting("isolation.level").unwrap_or(ISOLATION_LEVEL_DEFAULT)
    }

    /// The `transactional.id` set in the producer config, if any (a prefix for us).
    pub fn transactional_id_prefix(&self) -> Option<&str> {
        lookup(&self.producer_config, TRANSACTIONAL_ID_KEY)
    }

    /// True when the topic config asks for an fsync per message (durability level 1).
    pub fn fsync_each_message(&self) -> bool {
        self.topic_setting("flush.messages") == Some("1")
    }
}

fn lookup<'a>(list: &'a [(String, String)], key: &str) -> Option<&'a str> {
    list.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Parses a Java-properties text block: `key=value` or `key: value` lines; `#` and `!`
/// start comments. Line continuations and escapes are not used by OMB files.
pub fn parse_properties(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let split = line.find(['=', ':']);
        let (key, value) = match split {
            Some(at) => (&line[..at], &line[at + 1..]),
            None => (line, ""),
        };
        out.push((key.trim().to_string(), value.trim().to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_blocks() {
        let props = parse_properties("# comment\nacks=all\n  linger.ms = 1\nbatch.size: 1048576\n\n");
        assert_eq!(
            props,
            vec![
                ("acks".to_string(), "all".to_string()),
                ("linger.ms".to_string(), "1".to_string()),
                ("batch.size".to_string(), "1048576".to_string()),
            ]
        );
    }

    #[test]
    fn driver_fields() {
        let (driver, warnings) = Driver::parse(
            "name: Kafka\ndriverClass: x.Y\nreplicationFactor: 3\nreset: true\n\
             topicConfig: |\n  min.insync.replicas=2\n  flush.messages=1\n\
             commonConfig: |\n  bootstrap.servers=localhost:9092\n\
             producerConfig: |\n  acks=all\nconsumerConfig: |\n  auto.offset.reset=earliest\n\
             extra: 1\n",
        )
        .unwrap();
        assert_eq!(warnings.len(), 1);
        assert_eq!(driver.replication_factor, 3);
        assert!(driver.reset);
        assert!(driver.fsync_each_message());
        assert_eq!(driver.common_setting("bootstrap.servers"), Some("localhost:9092"));
        assert_eq!(driver.records_per_transaction, None);
    }

    #[test]
    fn transactions_setting() {
        let base = "name: tx\ncommonConfig: |\n  bootstrap.servers=localhost:9092\n";
        let (driver, warnings) = Driver::parse(&format!(
            "{base}requestsPerTransaction: 100\nproducerConfig: |\n  acks=all\n  transactional.id=omb\n"
        ))
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(driver.records_per_transaction, Some(100));
        assert_eq!(driver.transactional_id_prefix(), Some("omb"));
        assert!(Driver::parse(&format!("{base}requestsPerTransaction: 0\n")).is_err());
        let error = Driver::parse(&format!("{base}producerConfig: |\n  transactional.id=omb\n")).unwrap_err();
        assert!(error.to_string().contains("requestsPerTransaction"), "{error}");
    }
}
