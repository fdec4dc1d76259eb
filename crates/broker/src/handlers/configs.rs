//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics (broker configs
//! are static and described read-only).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse as IncrementalResult;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::admin::{SOURCE_DEFAULT, SOURCE_TOPIC};
use super::Failure;
use super::{message, str_bytes};
use crate::metadata_writes::MetadataWriter;
use crate::Broker;
use sluice_meta::topic_config::{self, ConfigType};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// A consumer or share group's configs (KIP-848, KIP-932).
pub(super) const RESOURCE_GROUP: i8 = 32;
const SOURCE_STATIC_BROKER: i8 = 4;
/// DescribeConfigs v3 added config types.
const CONFIG_TYPE_VERSION: i16 = 3;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

pub(super) fn describe(broker: &Arc<Broker>, request: DescribeConfigsRequest, version: i16) -> DescribeConfigsResponse {
    let mut response = DescribeConfigsResponse::default();
    for resource in request.resources {
        let mut result = DescribeConfigsResult::default();
        result.resource_type = resource.resource_type;
        result.resource_name = resource.resource_name.clone();
        let wanted = |name: &str| {
            resource.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == name))
        };
        let entries = match resource.resource_type {
            RESOURCE_TOPIC => match broker.topics.get(resource.resource_name.as_str()) {
                None => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic {:?} does not exist", resource.resource_name.as_str()),
                )),
                Some(topic) => Ok(broker
                    .config()
                    .topic_defaults
                    .describe(&topic.configs)
                    .into_iter()
                    .filter(|c| wanted(c.name))
                    .map(|c| {
                        let source = if c.is_default { SOURCE_DEFAULT } else { SOURCE_TOPIC };
                        let mut entry = entry(c.name, &c.value, source, c.config_type, version, false);
                        if request.include_synonyms {
                            if !c.is_default {
                                entry.synonyms.push(synonym(c.name, &c.value, SOURCE_TOPIC));
                            }
                            entry.synonyms.push(synonym(c.name, &c.default, SOURCE_DEFAULT));
                        }
                        entry
                    })
                    .collect()),
            },
            RESOURCE_BROKER => Ok(broker_configs(broker)
                .into_iter()
                .filter(|(name, _, _)| wanted(name))
                .map(|(name, value, config_type)| entry(name, &value, SOURCE_STATIC_BROKER, config_type, version, true))
                .collect()),
            RESOURCE_GROUP => Ok(group_configs(broker, resource.resource_name.as_str())
                .into_iter()
                .filter(|(name, _, _)| wanted(name))
                .map(|(name, value, is_default)| {
                    let source = if is_default { SOURCE_DEFAULT } else { SOURCE_GROUP };
                    entry(name, &value, source, group_config_type(name), version, false)
                })
                .collect()),
            other => Err((ResponseError::InvalidRequest, format!("resource type {other} is not supported"))),
        };
        match entries {
            Ok(configs) => result.configs = configs,
            Err((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text);
            }
        }
        response.results.push(result);
    }
    response
}

fn entry(
    name: &str,
    value: &str,
    source: i8,
    config_type: ConfigType,
    version: i16,
    read_only: bool,
) -> DescribeConfigsResourceResult {
    let mut entry = DescribeConfigsResourceResult::default();
    entry.name = str_bytes(name);
    entry.value = Some(str_bytes(value));
    entry.read_only = read_only;
    entry.config_source = source;
    if version >= CONFIG_TYPE_VERSION {
        entry.config_type = config_type as i8;
    }
    entry
}

fn synonym(name: &str, value: &str, source: i8) -> DescribeConfigsSynonym {
    let mut synonym = DescribeConfigsSynonym::default();
    synonym.name = str_bytes(name);
    synonym.value = Some(str_bytes(value));
    synonym.source = source;
    synonym
}

/// The broker's static settings, in Kafka's names where one exists.
fn broker_configs(broker: &Broker) -> Vec<(&'static str, String, ConfigType)> {
    let config = broker.config();
    vec![
        ("broker.id", config.node_id.to_string(), ConfigType::Int),
        ("node.id", config.node_id.to_string(), ConfigType::Int),
        ("log.dirs", config.data_dir.display().to_string(), ConfigType::String),
        ("num.partitions", config.num_partitions.to_string(), ConfigType::Int),
        ("auto.create.topics.enable", config.auto_create_topics.to_string(), ConfigType::Boolean),
        ("socket.request.max.bytes", config.max_request_bytes.to_string(), ConfigType::Int),
        ("max.connections", config.max_connections.to_string(), ConfigType::Int),
        ("message.max.bytes", config.topic_defaults.max_message_bytes.to_string(), ConfigType::Int),
        ("log.segment.bytes", config.topic_defaults.segment_bytes.to_string(), ConfigType::Int),
        ("log.retention.ms", config.topic_defaults.retention_ms.to_string(), ConfigType::Long),
        ("log.retention.bytes", config.topic_defaults.retention_bytes.to_string(), ConfigType::Long),
        ("log.flush.interval.messages", config.topic_defaults.flush_messages.to_string(), ConfigType::Long),
        ("log.flush.interval.ms", config.topic_defaults.flush_ms.to_string(), ConfigType::Long),
    ]
}

/// AlterConfigs replaces a topic's whole set of overrides.
pub(super) async fn alter(broker: &Arc<Broker>, request: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut response = AlterConfigsResponse::default();
    for resource in request.resources {
        let changes: Vec<Change> = resource
            .configs
            .iter()
            .map(|c| (c.name.to_string(), OP_SET, c.value.as_ref().map(|v| v.to_string())))
            .collect();
        let mut result = AlterConfigsResourceResponse::default();
        (result.error_code, result.error_message) =
            outcome(broker, resource.resource_type, &resource.resource_name, &changes, true, request.validate_only)
                .await;
        result.resource_type = resource.resource_type;
        result.resource_name = resource.resource_name;
        response.responses.push(result);
    }
    response
}

pub(super) async fn incremental_alter(
    broker: &Arc<Broker>,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut response = IncrementalAlterConfigsResponse::default();
    for resource in request.resources {
        let changes: Vec<Change> = resource
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.config_operation, c.value.as_ref().map(|v| v.to_string())))
            .collect();
        let mut result = IncrementalResult::default();
        (result.error_code, result.error_message) =
            outcome(broker, resource.resource_type, &resource.resource_name, &changes, false, request.validate_only)
                .await;
        result.resource_type = resource.resource_type;
        result.resource_name = resource.resource_name;
        response.responses.push(result);
    }
    response
}

/// (name, operation, value) of one requested change.
type Change = (String, i8, Option<String>);

/// Applies one resource's changes and returns its error code and message.
async fn outcome(
    broker: &Arc<Broker>,
    resource_type: i8,
    name: &StrBytes,
    changes: &[Change],
    replace_all: bool,
    validate_only: bool,
) -> (i16, Option<StrBytes>) {
    let name = name.as_str();
    // Sluice has no replication throttles, so removing them (what kafka-reassign-partitions
    // --verify does once a move completes) succeeds with nothing to do.
    let kept: Vec<Change> = changes.iter().filter(|change| !is_throttle_removal(change)).cloned().collect();
    if resource_type == RESOURCE_BROKER && kept.is_empty() && !changes.is_empty() {
        return (0, None);
    }
    let changes = &kept[..];
    let applied = if resource_type == RESOURCE_GROUP {
        alter_group(broker, name, changes, replace_all, validate_only).await
    } else if validate_only {
        new_overrides(broker, resource_type, name, changes, replace_all).map(|_| ())
    } else {
        alter_topic(broker, resource_type, name, changes, replace_all).await
    };
    match applied {
        Ok(()) => (0, None),
        Err((error, text)) => (error.code(), message(text)),
    }
}

/// Kafka's replication throttle settings (brokers' rates, topics' throttled replica lists).
const THROTTLE_CONFIGS: &[&str] = &[
    "leader.replication.throttled.rate",
    "follower.replication.throttled.rate",
    "replica.alter.log.dirs.io.max.bytes.per.second",
    "leader.replication.throttled.replicas",
    "follower.replication.throttled.replicas",
];

fn is_throttle_removal((key, operation, _): &Change) -> bool {
    *operation == OP_DELETE && THROTTLE_CONFIGS.contains(&key.as_str())
}

/// Kafka's DescribeConfigs source for a group config.
const SOURCE_GROUP: i8 = 8;

/// The share-group configs Sluice serves: (name, value, whether it is the default).
fn group_configs(broker: &Broker, group_id: &str) -> Vec<(&'static str, String, bool)> {
    let set = broker.shares.group_configs(group_id);
    let config = broker.config();
    let defaults = [
        (sluice_coordinator::share::CONFIG_AUTO_OFFSET_RESET, "latest".to_string()),
        (sluice_coordinator::share::CONFIG_LOCK_DURATION_MS, config.group_share_record_lock_duration_ms.to_string()),
        (sluice_coordinator::share::CONFIG_DELIVERY_COUNT_LIMIT, config.group_share_delivery_count_limit.to_string()),
        (sluice_coordinator::share::CONFIG_RENEW_ACKNOWLEDGE_ENABLE, "true".to_string()),
        (sluice_coordinator::share::CONFIG_HEARTBEAT_INTERVAL_MS, config.group_share_heartbeat_interval_ms.to_string()),
        (sluice_coordinator::share::CONFIG_SESSION_TIMEOUT_MS, config.group_share_session_timeout_ms.to_string()),
        (sluice_coordinator::share::CONFIG_ISOLATION_LEVEL, "read_uncommitted".to_string()),
    ];
    let mut configs: Vec<(&'static str, String, bool)> = defaults
        .into_iter()
        .map(|(name, default)| match set.get(name) {
            Some(value) => (name, value.clone(), false),
            None => (name, default, true),
        })
        .collect();
    if let Some(topic) = set.get(sluice_coordinator::share::dead_letter::CONFIG_DEAD_LETTER_TOPIC) {
        configs.push((sluice_coordinator::share::dead_letter::CONFIG_DEAD_LETTER_TOPIC, topic.clone(), false));
    }
    configs
}

fn group_config_type(name: &str) -> ConfigType {
    if name == sluice_coordinator::share::CONFIG_AUTO_OFFSET_RESET
        || name == sluice_coordinator::share::CONFIG_ISOLATION_LEVEL
        || name == sluice_coordinator::share::dead_letter::CONFIG_DEAD_LETTER_TOPIC
    {
        ConfigType::String
    } else if name == sluice_coordinator::share::CONFIG_RENEW_ACKNOWLEDGE_ENABLE {
        ConfigType::Boolean
    } else {
        ConfigType::Int
    }
}

/// IncrementalAlterConfigs / AlterConfigs on a GROUP resource: the share-group configs
/// (`share.auto.offset.reset`, `share.record.lock.duration.ms`, `share.delivery.count.limit`,
/// `share.renew.acknowledge.enable`, `share.heartbeat.interval.ms`, `share.session.timeout.ms`,
/// `share.isolation.level`), durable before the answer.
async fn alter_group(
    broker: &Arc<Broker>,
    group_id: &str,
    changes: &[Change],
    replace_all: bool,
    validate_only: bool,
) -> Result<(), Failure> {
    sluice_coordinator::group::validate_group_id(group_id)
        .map_err(|_| (ResponseError::InvalidGroupId, format!("invalid group id {group_id:?}")))?;
    let mut configs = if replace_all { BTreeMap::new() } else { broker.shares.group_configs(group_id) };
    for (key, operation, value) in changes {
        let valid = match (key.as_str(), value.as_deref()) {
            (_, None) => true,
            (sluice_coordinator::share::CONFIG_AUTO_OFFSET_RESET, Some(v)) => v == "latest" || v == "earliest",
            (sluice_coordinator::share::CONFIG_LOCK_DURATION_MS, Some(v)) => {
                v.parse::<i64>().is_ok_and(|ms| (1_000..=3_600_000).contains(&ms))
            }
            (sluice_coordinator::share::CONFIG_DELIVERY_COUNT_LIMIT, Some(v)) => {
                v.parse::<i16>().is_ok_and(|n| (2..=10).contains(&n))
            }
            (sluice_coordinator::share::CONFIG_RENEW_ACKNOWLEDGE_ENABLE, Some(v)) => v == "true" || v == "false",
            // Kafka's bounds: group.share.{min,max}.heartbeat.interval.ms and
            // group.share.{min,max}.session.timeout.ms at their defaults.
            (sluice_coordinator::share::CONFIG_HEARTBEAT_INTERVAL_MS, Some(v)) => {
                v.parse::<i32>().is_ok_and(|ms| (5_000..=15_000).contains(&ms))
            }
            (sluice_coordinator::share::CONFIG_SESSION_TIMEOUT_MS, Some(v)) => {
                v.parse::<i64>().is_ok_and(|ms| (45_000..=60_000).contains(&ms))
            }
            (sluice_coordinator::share::CONFIG_ISOLATION_LEVEL, Some("read_committed")) => {
                return Err((
                    ResponseError::InvalidConfig,
                    "share.isolation.level=read_committed is not supported: share groups read up to the high watermark"
                        .into(),
                ))
            }
            (sluice_coordinator::share::CONFIG_ISOLATION_LEVEL, Some(v)) => v == "read_uncommitted",
            (sluice_coordinator::share::dead_letter::CONFIG_DEAD_LETTER_TOPIC, Some(v)) => {
                sluice_meta::topics::validate_topic_name(v).is_ok()
            }
            (other, _) => {
                return Err((ResponseError::InvalidConfig, format!("unknown or unsupported group config {other:?}")))
            }
        };
        if !valid {
            return Err((ResponseError::InvalidConfig, format!("invalid value {value:?} for group config {key}")));
        }
        match (*operation, value) {
            (OP_SET, Some(value)) => {
                configs.insert(key.clone(), value.clone());
            }
            (OP_DELETE, _) | (OP_SET, None) => {
                configs.remove(key);
            }
            _ => return Err((ResponseError::InvalidConfig, format!("{key} is not a list: no APPEND or SUBTRACT"))),
        }
    }
    if validate_only {
        return Ok(());
    }
    MetadataWriter::of(broker)?.set_group_configs(group_id, configs).await
}

/// The controller (a single node: its own registry) stores the overrides; every node applies
/// them to its replicas' logs when it applies the metadata (`cluster_link`). An incremental
/// change is a compare-and-set on the overrides it was computed from: if another request
/// changed them meanwhile (or this node's metadata was behind), it is computed again from
/// newer ones.
async fn alter_topic(
    broker: &Arc<Broker>,
    resource_type: i8,
    name: &str,
    changes: &[Change],
    replace_all: bool,
) -> Result<(), Failure> {
    let writer = MetadataWriter::of(broker)?;
    let deadline = tokio::time::Instant::now() + crate::cluster_link::ADMIN_TIMEOUT;
    loop {
        let (previous, configs) = new_overrides(broker, resource_type, name, changes, replace_all)?;
        let expected = (!replace_all).then_some(previous);
        match writer.set_topic_configs(name, configs.clone(), expected).await {
            Ok(()) => {
                tracing::info!(topic = name, ?configs, "altered topic configs");
                return Ok(());
            }
            Err((ResponseError::InvalidUpdateVersion, _)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(CONFIG_CONFLICT_BACKOFF).await;
            }
            Err(failure) => return Err(failure),
        }
    }
}

/// Pause before recomputing a config change refused as concurrent: time for this node to
/// apply the metadata that changed the overrides.
const CONFIG_CONFLICT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(20);

/// A topic's config overrides, by name.
type Overrides = BTreeMap<String, String>;

/// Validates all changes and returns the topic's overrides now and once they are applied.
fn new_overrides(
    broker: &Broker,
    resource_type: i8,
    name: &str,
    changes: &[Change],
    replace_all: bool,
) -> Result<(Overrides, Overrides), Failure> {
    if resource_type != RESOURCE_TOPIC {
        return Err((
            ResponseError::InvalidRequest,
            "only topic configs can be altered; broker configs are static".into(),
        ));
    }
    let topic = broker
        .topics
        .get(name)
        .ok_or_else(|| (ResponseError::UnknownTopicOrPartition, format!("topic {name:?} does not exist")))?;
    if sluice_meta::topics::is_internal(name) {
        return Err((
            ResponseError::InvalidRequest,
            format!("{name} is internal: its configs are the broker's offsets_topic_* settings"),
        ));
    }
    let mut configs = if replace_all { BTreeMap::new() } else { topic.configs.clone() };
    for (key, operation, value) in changes {
        apply_one(&mut configs, key, *operation, value.as_deref(), &broker.config().topic_defaults)?;
    }
    topic_config::check_tiering(
        &broker.config().topic_defaults,
        Some(&topic.configs),
        &configs,
        broker.tiered.is_some(),
    )
    .map_err(|e| (ResponseError::InvalidConfig, e))?;
    Ok((topic.configs.clone(), configs))
}

fn apply_one(
    configs: &mut BTreeMap<String, String>,
    key: &str,
    operation: i8,
    value: Option<&str>,
    defaults: &topic_config::TopicDefaults,
) -> Result<(), Failure> {
    let invalid = |text: String| (ResponseError::InvalidConfig, text);
    topic_config::validate(key, None).map_err(invalid)?;
    match operation {
        OP_SET => {
            let value = value.ok_or_else(|| invalid(format!("null value for {key}")))?;
            topic_config::validate(key, Some(value)).map_err(invalid)?;
            configs.insert(key.to_string(), value.to_string());
        }
        OP_DELETE => {
            configs.remove(key);
        }
        OP_APPEND | OP_SUBTRACT => {
            if !topic_config::is_list(key) {
                return Err(invalid(format!("{key} is not a list config; APPEND and SUBTRACT need one")));
            }
            let current = configs.get(key).cloned().unwrap_or_else(|| {
                defaults
                    .describe(&BTreeMap::new())
                    .into_iter()
                    .find(|c| c.name == key)
                    .map(|c| c.value)
                    .unwrap_or_default()
            });
            let mut items: Vec<String> = current.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect();
            for item in value.unwrap_or_default().split(',').filter(|s| !s.is_empty()) {
                if operation == OP_APPEND && !items.iter().any(|i| i == item) {
                    items.push(item.to_string());
                } else if operation == OP_SUBTRACT {
                    items.retain(|i| i != item);
                }
            }
            let joined = items.join(",");
            topic_config::validate(key, Some(&joined)).map_err(invalid)?;
            configs.insert(key.to_string(), joined);
        }
        other => return Err((ResponseError::InvalidRequest, format!("unknown config operation {other}"))),
    }
    Ok(())
}
