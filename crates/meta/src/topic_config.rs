//! Topic configs in Kafka's names: which keys Sluice understands, their types, defaults and
//! valid values, and how a topic's overrides become the storage [`LogConfig`].
//!
//! Unknown keys and values Sluice does not implement (e.g. `compression.type=gzip`) are
//! rejected with INVALID_CONFIG rather than accepted and silently ignored.

use std::collections::BTreeMap;

use serde::Deserialize;
use sluice_storage::LogConfig;

use crate::durability::{DurabilityLevel, ReplicationConfig};

/// DescribeConfigs config_type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
}

/// Broker-wide defaults for topic configs (`[topic_defaults]` in the TOML file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicDefaults {
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub segment_bytes: i64,
    pub segment_ms: i64,
    pub max_message_bytes: i64,
    /// 1 = fsync before acknowledging (Sluice's default durability).
    pub flush_messages: i64,
    pub flush_ms: i64,
    pub min_insync_replicas: i64,
    /// `sluice.durability.level`: 1 = replicated and fsynced on each ISR member before
    /// acknowledging, 2 = replicated, fsync async, 3 = leader fsynced, replication async,
    /// 4 = neither (see ARCHITECTURE.md).
    pub durability_level: i64,
    /// `message.timestamp.before.max.ms`
    pub message_timestamp_before_max_ms: i64,
    /// `message.timestamp.after.max.ms`
    pub message_timestamp_after_max_ms: i64,
    /// `message.timestamp.type`: `CreateTime` (the producer's) or `LogAppendTime` (the broker's)
    pub message_timestamp_type: String,
    /// `cleanup.policy`: `delete`, `compact` or both, comma-separated
    pub cleanup_policy: String,
    /// `delete.retention.ms`
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`
    pub max_compaction_lag_ms: i64,
    /// `local.retention.ms` of tiered topics (Kafka's `log.local.retention.ms`); -2 = `retention.ms`
    pub local_retention_ms: i64,
    /// `local.retention.bytes` of tiered topics (Kafka's `log.local.retention.bytes`); -2 = `retention.bytes`
    pub local_retention_bytes: i64,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        let log = LogConfig::default();
        TopicDefaults {
            retention_ms: log.retention_ms,
            retention_bytes: log.retention_bytes,
            segment_bytes: log.segment_bytes as i64,
            segment_ms: log.segment_ms,
            max_message_bytes: log.max_message_bytes as i64,
            flush_messages: log.flush_messages as i64,
            flush_ms: log.flush_ms,
            min_insync_replicas: 1,
            durability_level: DURABILITY_LEVEL_CONFIG_DEFAULT,
            message_timestamp_before_max_ms: log.timestamp_before_max_ms,
            message_timestamp_after_max_ms: log.timestamp_after_max_ms,
            message_timestamp_type: MESSAGE_TIMESTAMP_TYPES[0].to_string(),
            cleanup_policy: CLEANUP_POLICIES[1].to_string(),
            delete_retention_ms: log.delete_retention_ms,
            min_cleanable_dirty_ratio: log.min_cleanable_dirty_ratio,
            min_compaction_lag_ms: log.min_compaction_lag_ms,
            max_compaction_lag_ms: log.max_compaction_lag_ms,
            local_retention_ms: LOCAL_RETENTION_AS_TOTAL,
            local_retention_bytes: LOCAL_RETENTION_AS_TOTAL,
        }
    }
}

struct ConfigDef {
    name: &'static str,
    config_type: ConfigType,
    /// Inclusive numeric range, or the allowed strings.
    check: Check,
    default: fn(&TopicDefaults) -> String,
}

enum Check {
    Range(i64, i64),
    OneOf(&'static [&'static str]),
    /// A non-empty comma-separated list of distinct values from the set.
    SubsetOf(&'static [&'static str]),
    /// A number in [0, 1].
    Ratio,
}

/// `cleanup.policy` values.
const CLEANUP_POLICIES: &[&str] = &["compact", "delete"];

const SEGMENT_BYTES_MIN: i64 = 1024;
/// `message.timestamp.type` values (the first is the default).
const MESSAGE_TIMESTAMP_TYPES: &[&str] = &["CreateTime", "LogAppendTime"];
pub const DURABILITY_LEVEL_CONFIG: &str = "sluice.durability.level";
const DURABILITY_LEVEL_CONFIG_DEFAULT: i64 = 1;

/// `local.retention.ms` / `local.retention.bytes` value meaning "as the whole log's".
const LOCAL_RETENTION_AS_TOTAL: i64 = -2;

const DEFS: &[ConfigDef] = &[
    ConfigDef {
        name: "cleanup.policy",
        config_type: ConfigType::List,
        check: Check::SubsetOf(CLEANUP_POLICIES),
        default: |d| d.cleanup_policy.clone(),
    },
    ConfigDef {
        name: "compression.type",
        config_type: ConfigType::String,
        check: Check::OneOf(&["producer"]),
        default: |_| "producer".into(),
    },
    ConfigDef {
        name: "delete.retention.ms",
        config_type: ConfigType::Long,
        check: Check::Range(0, i64::MAX),
        default: |d| d.delete_retention_ms.to_string(),
    },
    ConfigDef {
        name: "flush.messages",
        config_type: ConfigType::Long,
        check: Check::Range(1, i64::MAX),
        default: |d| d.flush_messages.to_string(),
    },
    ConfigDef {
        name: "flush.ms",
        config_type: ConfigType::Long,
        check: Check::Range(0, i64::MAX),
        default: |d| d.flush_ms.to_string(),
    },
    ConfigDef {
        name: "local.retention.bytes",
        config_type: ConfigType::Long,
        check: Check::Range(LOCAL_RETENTION_AS_TOTAL, i64::MAX),
        default: |d| d.local_retention_bytes.to_string(),
    },
    ConfigDef {
        name: "local.retention.ms",
        config_type: ConfigType::Long,
        check: Check::Range(LOCAL_RETENTION_AS_TOTAL, i64::MAX),
        default: |d| d.local_retention_ms.to_string(),
    },
    ConfigDef {
        name: "max.message.bytes",
        config_type: ConfigType::Int,
        check: Check::Range(0, i32::MAX as i64),
        default: |d| d.max_message_bytes.to_string(),
    },
    ConfigDef {
        name: "message.timestamp.after.max.ms",
        config_type: ConfigType::Long,
        check: Check::Range(0, i64::MAX),
        default: |d| d.message_timestamp_after_max_ms.to_string(),
    },
    ConfigDef {
        name: "message.timestamp.before.max.ms",
        config_type: ConfigType::Long,
        check: Check::Range(0, i64::MAX),
        default: |d| d.message_timestamp_before_max_ms.to_string(),
    },
    ConfigDef {
        name: "message.timestamp.type",
        config_type: ConfigType::String,
        check: Check::OneOf(MESSAGE_TIMESTAMP_TYPES),
        default: |d| d.message_timestamp_type.clone(),
    },
    ConfigDef {
        name: "max.compaction.lag.ms",
        config_type: ConfigType::Long,
        check: Check::Range(1, i64::MAX),
        default: |d| d.max_compaction_lag_ms.to_string(),
    },
    ConfigDef {
        name: "min.cleanable.dirty.ratio",
        config_type: ConfigType::Double,
        check: Check::Ratio,
        default: |d| d.min_cleanable_dirty_ratio.to_string(),
    },
    ConfigDef {
        name: "min.compaction.lag.ms",
        config_type: ConfigType::Long,
        check: Check::Range(0, i64::MAX),
        default: |d| d.min_compaction_lag_ms.to_string(),
    },
    ConfigDef {
        name: "min.insync.replicas",
        config_type: ConfigType::Int,
        check: Check::Range(1, i32::MAX as i64),
        default: |d| d.min_insync_replicas.to_string(),
    },
    ConfigDef {
        name: crate::tiering::REMOTE_STORAGE_ENABLE,
        config_type: ConfigType::Boolean,
        check: Check::OneOf(&["false", "true"]),
        default: |_| "false".into(),
    },
    ConfigDef {
        name: "retention.bytes",
        config_type: ConfigType::Long,
        check: Check::Range(-1, i64::MAX),
        default: |d| d.retention_bytes.to_string(),
    },
    ConfigDef {
        name: "retention.ms",
        config_type: ConfigType::Long,
        check: Check::Range(-1, i64::MAX),
        default: |d| d.retention_ms.to_string(),
    },
    ConfigDef {
        name: "segment.bytes",
        config_type: ConfigType::Int,
        check: Check::Range(SEGMENT_BYTES_MIN, i32::MAX as i64),
        default: |d| d.segment_bytes.to_string(),
    },
    ConfigDef {
        name: "segment.ms",
        config_type: ConfigType::Long,
        check: Check::Range(1, i64::MAX),
        default: |d| d.segment_ms.to_string(),
    },
    ConfigDef {
        name: DURABILITY_LEVEL_CONFIG,
        config_type: ConfigType::Int,
        check: Check::Range(1, 4),
        default: |d| d.durability_level.to_string(),
    },
    ConfigDef {
        name: "unclean.leader.election.enable",
        config_type: ConfigType::Boolean,
        check: Check::OneOf(&["true", "false"]),
        default: |_| "false".into(),
    },
];

fn def(name: &str) -> Option<&'static ConfigDef> {
    DEFS.iter().find(|d| d.name == name)
}

fn check_value(def: &ConfigDef, value: &str) -> Result<(), String> {
    match &def.check {
        Check::Range(min, max) => match value.trim().parse::<i64>() {
            Ok(n) if n >= *min && n <= *max => Ok(()),
            Ok(n) => Err(format!("invalid value {n} for configuration {}: must be in [{min}, {max}]", def.name)),
            Err(_) => Err(format!("invalid value {value:?} for configuration {}: expected a number", def.name)),
        },
        Check::OneOf(allowed) if allowed.contains(&value.trim()) => Ok(()),
        Check::OneOf(allowed) => Err(format!(
            "invalid value {value:?} for configuration {}: Sluice supports only {}",
            def.name,
            allowed.join(", ")
        )),
        Check::SubsetOf(allowed) => {
            let items = list_items(value);
            let distinct: std::collections::BTreeSet<&str> = items.iter().copied().collect();
            if !items.is_empty() && distinct.len() == items.len() && items.iter().all(|i| allowed.contains(i)) {
                Ok(())
            } else {
                Err(format!(
                    "invalid value {value:?} for configuration {}: a list of distinct values from {}",
                    def.name,
                    allowed.join(", ")
                ))
            }
        }
        Check::Ratio => match value.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(()),
            _ => Err(format!("invalid value {value:?} for configuration {}: must be a number in [0, 1]", def.name)),
        },
    }
}

fn list_items(value: &str) -> Vec<&str> {
    value.split(',').map(str::trim).filter(|item| !item.is_empty()).collect()
}

/// Validates one override; the error is the message sent to the client.
pub fn validate(name: &str, value: Option<&str>) -> Result<(), String> {
    let def = def(name).ok_or_else(|| format!("unknown topic config name: {name}"))?;
    match value {
        None => Ok(()),
        Some(value) => check_value(def, value),
    }
}

/// Kafka's rules between a tiered topic's configs, checked when a topic is created
/// (`before` = `None`) and when its configs change: no compaction, local retention within
/// the whole log's, and no way back once tiered (its remote part would be orphaned).
/// `tiering_available` is false when the broker cannot tier (disabled, or a cluster).
pub fn check_tiering(
    defaults: &TopicDefaults,
    before: Option<&BTreeMap<String, String>>,
    after: &BTreeMap<String, String>,
    tiering_available: bool,
) -> Result<(), String> {
    let tiered = crate::tiering::tiers;
    if before.is_some_and(tiered) && !tiered(after) {
        return Err("remote.storage.enable cannot be turned off once a topic is tiered".into());
    }
    if !tiered(after) {
        return Ok(());
    }
    if !tiering_available {
        return Err("remote.storage.enable=true needs tiered storage, which is off on this broker: \
             [tiered_storage] enabled = false, or a cluster without tiered_storage.url (a store every node shares)"
            .into());
    }
    let log = defaults.log_config(after);
    if log.cleanup_compact {
        return Err("remote.storage.enable=true is not supported with cleanup.policy=compact".into());
    }
    for (name, local, total) in [
        ("local.retention.ms", log.local_retention_ms, log.retention_ms),
        ("local.retention.bytes", log.local_retention_bytes, log.retention_bytes),
    ] {
        let total_name = name.trim_start_matches("local.");
        if total >= 0 && local < 0 {
            return Err(format!("{name} cannot be -1 (unlimited) when {total_name} is {total}"));
        }
        if total >= 0 && local > total {
            return Err(format!("{name} ({local}) must be at most {total_name} ({total})"));
        }
    }
    Ok(())
}

/// Whether `name` is a list-typed config (for APPEND/SUBTRACT).
pub fn is_list(name: &str) -> bool {
    def(name).is_some_and(|d| d.config_type == ConfigType::List)
}

impl TopicDefaults {
    pub fn validate(&self) -> Result<(), String> {
        for def in DEFS {
            check_value(def, &(def.default)(self)).map_err(|e| format!("topic_defaults: {e}"))?;
        }
        Ok(())
    }

    /// The storage settings for a topic with these overrides (validated beforehand).
    pub fn log_config(&self, overrides: &BTreeMap<String, String>) -> LogConfig {
        let number = |name: &str, default: i64| {
            overrides.get(name).and_then(|v| v.trim().parse::<i64>().ok()).unwrap_or(default)
        };
        let level = self.durability(overrides);
        let retention_ms = number("retention.ms", self.retention_ms);
        let retention_bytes = number("retention.bytes", self.retention_bytes);
        let local = |name: &str, default: i64, total: i64| match number(name, default) {
            LOCAL_RETENTION_AS_TOTAL => total,
            value => value,
        };
        let flush_messages = number("flush.messages", self.flush_messages) as u64;
        let policy = overrides.get("cleanup.policy").unwrap_or(&self.cleanup_policy);
        LogConfig {
            // Levels 2 and 4 acknowledge from the page cache: fsync by flush.ms or roll.
            flush_messages: if level.fsyncs() { flush_messages } else { flush_messages.max(i64::MAX as u64) },
            segment_bytes: number("segment.bytes", self.segment_bytes) as u64,
            segment_ms: number("segment.ms", self.segment_ms),
            retention_ms,
            retention_bytes,
            remote_storage: crate::tiering::tiers(overrides),
            local_retention_ms: local("local.retention.ms", self.local_retention_ms, retention_ms),
            local_retention_bytes: local("local.retention.bytes", self.local_retention_bytes, retention_bytes),
            max_message_bytes: number("max.message.bytes", self.max_message_bytes) as usize,
            flush_ms: number("flush.ms", self.flush_ms),
            timestamp_before_max_ms: number("message.timestamp.before.max.ms", self.message_timestamp_before_max_ms),
            timestamp_after_max_ms: number("message.timestamp.after.max.ms", self.message_timestamp_after_max_ms),
            log_append_time: overrides.get("message.timestamp.type").unwrap_or(&self.message_timestamp_type).trim()
                == "LogAppendTime",
            cleanup_delete: list_items(policy).contains(&"delete"),
            cleanup_compact: list_items(policy).contains(&"compact"),
            delete_retention_ms: number("delete.retention.ms", self.delete_retention_ms),
            min_cleanable_dirty_ratio: overrides
                .get("min.cleanable.dirty.ratio")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(self.min_cleanable_dirty_ratio),
            min_compaction_lag_ms: number("min.compaction.lag.ms", self.min_compaction_lag_ms),
            max_compaction_lag_ms: number("max.compaction.lag.ms", self.max_compaction_lag_ms),
        }
    }

    /// The topic's `sluice.durability.level`.
    pub fn durability(&self, overrides: &BTreeMap<String, String>) -> DurabilityLevel {
        let level = overrides.get(DURABILITY_LEVEL_CONFIG).and_then(|v| v.trim().parse::<i64>().ok());
        DurabilityLevel::from_level(level.unwrap_or(self.durability_level) as u8).expect("validated level")
    }

    /// The replication settings for a topic with these overrides (validated beforehand).
    pub fn replication_config(&self, overrides: &BTreeMap<String, String>) -> ReplicationConfig {
        let min_insync = overrides.get("min.insync.replicas").and_then(|v| v.trim().parse::<i64>().ok());
        ReplicationConfig {
            level: self.durability(overrides),
            min_insync_replicas: min_insync.unwrap_or(self.min_insync_replicas).max(1) as usize,
            log: self.log_config(overrides),
        }
    }

    /// Every known config with its effective value and whether it is overridden.
    pub fn describe(&self, overrides: &BTreeMap<String, String>) -> Vec<DescribedConfig> {
        DEFS.iter()
            .map(|def| {
                let default = (def.default)(self);
                let value = overrides.get(def.name).cloned();
                DescribedConfig {
                    name: def.name,
                    is_default: value.is_none(),
                    value: value.unwrap_or_else(|| default.clone()),
                    default,
                    config_type: def.config_type,
                }
            })
            .collect()
    }
}

pub struct DescribedConfig {
    pub name: &'static str,
    pub value: String,
    pub default: String,
    pub is_default: bool,
    pub config_type: ConfigType,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_validate_and_apply() {
        assert!(validate("retention.ms", Some("1000")).is_ok());
        assert!(validate("retention.ms", Some("-2")).is_err());
        assert!(validate("retention.ms", Some("abc")).is_err());
        assert!(validate("cleanup.policy", Some("compact")).is_ok());
        assert!(validate("cleanup.policy", Some("compact,delete")).is_ok());
        assert!(validate("cleanup.policy", Some("compact,compact")).is_err());
        assert!(validate("cleanup.policy", Some("")).is_err());
        assert!(validate("cleanup.policy", Some("shrink")).is_err());
        assert!(validate("min.cleanable.dirty.ratio", Some("0.25")).is_ok());
        assert!(validate("min.cleanable.dirty.ratio", Some("1.5")).is_err());
        let compacted = BTreeMap::from([("cleanup.policy".to_string(), "delete, compact".to_string())]);
        let log = TopicDefaults::default().log_config(&compacted);
        assert!(log.cleanup_compact && log.cleanup_delete);
        assert!(!TopicDefaults::default().log_config(&BTreeMap::new()).cleanup_compact);
        assert!(validate("no.such.config", Some("1")).is_err());
        let defaults = TopicDefaults::default();
        defaults.validate().unwrap();
        let overrides = BTreeMap::from([("flush.messages".to_string(), "100".to_string())]);
        let log = defaults.log_config(&overrides);
        assert_eq!(log.flush_messages, 100);
        assert!(!log.fsync_before_ack());
        assert!(defaults.log_config(&BTreeMap::new()).fsync_before_ack());
        assert!(!defaults.log_config(&BTreeMap::new()).log_append_time);
        let log_append_time = BTreeMap::from([("message.timestamp.type".to_string(), "LogAppendTime".to_string())]);
        assert!(validate("message.timestamp.type", Some("LogAppendTime")).is_ok());
        assert!(validate("message.timestamp.type", Some("AppendTime")).is_err());
        assert!(defaults.log_config(&log_append_time).log_append_time);
    }

    #[test]
    fn durability_levels_map_to_local_fsync_and_replication() {
        let defaults = TopicDefaults::default();
        assert!(validate(DURABILITY_LEVEL_CONFIG, Some("5")).is_err());
        assert!(validate(DURABILITY_LEVEL_CONFIG, Some("0")).is_err());
        for (level, fsyncs, waits) in [("1", true, true), ("2", false, true), ("3", true, false), ("4", false, false)] {
            let overrides = BTreeMap::from([(DURABILITY_LEVEL_CONFIG.to_string(), level.to_string())]);
            let config = defaults.replication_config(&overrides);
            assert_eq!(config.log.fsync_before_ack(), fsyncs, "level {level}");
            assert_eq!(config.level.waits_for_replicas(), waits, "level {level}");
        }
    }
}
